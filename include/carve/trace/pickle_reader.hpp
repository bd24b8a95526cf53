/// @file carve/trace/pickle_reader.hpp
/// Python pickles of plain data, read without executing anything: a PyTorch memory snapshot
/// (`torch.cuda.memory._dump_snapshot`) is one, a dict of lists of dicts of str, int and bool.
///
/// @code
/// using carve::trace::PickleDocument;
/// carve::Result<PickleDocument> doc = carve::trace::read_pickle(bytes, "snap.pickle"); // or its error
/// if (const auto segments = doc->find(doc->root(), "segments")) { // the root a dict with that str key
///   for (PickleDocument::Id s : doc->items(*segments)) { ... }     // its value's items, if a list
/// }
/// @endcode
///
/// A pickle is a program for a small stack machine. Most of its opcodes build values; a few name
/// Python code (a global, a call, a persistent id, an out-of-band buffer). read_pickle runs the
/// first kind and refuses the second, so no file can name code for a reader to run. It reads what
/// `pickle.loads` reads for None, bool, int, float, str, bytes, bytearray, list, tuple, dict, set
/// and frozenset in protocols 0 to 5, with these differences, each deliberate:
/// - integers beyond 64-bit signed, binary (LONG1, LONG4: what protocols 2 to 5 write, PyTorch's
///   2^64 - 1 for a C++ frame's unknown line among them) or text (INT, LONG: protocols 0 and 1),
///   read as Kind::big_integer, their value not kept;
/// - sets and frozensets read as lists and bytearrays as bytes, their contents in pickle order;
/// - a dict keeps its SETITEMs in order, so a key set twice (no pickler writes one) is there twice
///   and find() returns the later; dict keys and set items are not checked for hashability;
/// - text (str, Python 2 strings, protocol 0's numbers) as carve/trace/pickle_text.hpp lists;
/// - APPEND(S) extends only a list, SETITEM(S) only a dict, ADDITEMS only a set (Python calls
///   whatever append, extend, __setitem__ or add the object has: it would set a list's item by
///   index, or extend a bytearray);
/// - FRAME's length is checked against the input and framing otherwise ignored, as CPython's C
///   unpickler does;
/// - at STOP the stack must hold exactly one value and no MARK be open (Python takes the top value
///   and ignores the rest);
/// - the bytes after STOP are not read, as with `pickle.loads`: bytes_read() says where the pickle
///   ended, for a caller who wants to refuse them or read the next pickle there.
///
/// Errors are Errc::bad_message, "<source>: byte <offset>: <what>" with the offset of the opcode at
/// fault (the input's size for a missing STOP): an opcode that names code, e.g. `byte 1234: opcode
/// GLOBAL (0x63) refused: a pickle of plain data names no code`, or an unknown one; truncated input;
/// stack underflow (reaching below the last MARK counts); a MARK missing or left open; APPEND(S)
/// onto other than a list, SETITEM(S) onto other than a dict, ADDITEMS onto other than a set; an
/// odd item count for DICT or SETITEMS; a memo index read but never stored or beyond 64-bit
/// signed; malformed text (a number, a quoted string, UTF-8).
///
/// Cost: one pass, nothing recursive, so neither nesting depth nor cycles can exhaust the C++
/// stack. Memory is O(input size), at most about 80 bytes per input byte (a pickle of one-byte
/// opcodes, each a 24-byte value in an array that grows by doubling, the old array and the new
/// both held while it moves; a real snapshot takes about 3): every opcode adds at most one value; the containers' items
/// are kept in two arrays, not an allocation each; a length is checked against the bytes left before anything is
/// allocated; and the memo is an array for indices below the input's size (picklers write 0, 1, 2, ...) and an ordered
/// map for the others, so neither a MEMOIZE per byte nor a LONG_BINPUT index of 2^32 - 1 costs more than a few bytes. A
/// caller bounds the memory by bounding the input (read_trace_file in carve/trace/trace_file.hpp refuses a file above 4
/// GiB unless told otherwise).
#pragma once

#include <carve/core/error.hpp>
#include <carve/trace/pickle_document.hpp>
#include <carve/trace/pickle_text.hpp>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace carve::trace {

namespace detail {

/// The pickle machine: the opcodes in order, a stack of values, the MARK positions in it and the
/// memo, building the document's arena as it goes. As in CPython's C unpickler, MARKs are kept
/// apart from the values, and no opcode reaches below the last MARK.
class PickleMachine {
public:
  using Id = PickleDocument::Id;
  using Kind = PickleDocument::Kind;
  using Form = PickleDocument::Form;
  using Value = PickleDocument::Value;

  PickleMachine(std::string_view in, std::string_view source) : in_(in), source_(source) {}

  /// Runs the pickle to its STOP.
  [[nodiscard]] Result<PickleDocument> run() && {
    for (;;) {
      at_ = pos_;
      if (pos_ == in_.size()) {
        return failure("truncated: the input ends before STOP");
      }
      op_ = static_cast<unsigned char>(in_[pos_++]);
      if (op_ == '.') {
        return stop();
      }
      if (!step()) {
        return failure(error_);
      }
    }
  }

private:
  /// STOP: the one value on the stack is the document's root.
  [[nodiscard]] Result<PickleDocument> stop() {
    if (!marks_.empty()) {
      return failure("STOP with a MARK still open");
    }
    if (stack_.size() != 1) {
      return failure("STOP with " + std::to_string(stack_.size()) + " values on the stack, not 1");
    }
    doc_.root_ = stack_.back();
    doc_.bytes_read_ = pos_;
    doc_.join_batches(doc_.items_, item_batches_, false);
    doc_.join_batches(doc_.entries_, entry_batches_, true);
    return std::move(doc_);
  }

  /// One opcode, `op_`, its argument read from `pos_` on. False, with `error_` set, when it fails.
  bool step() {
    std::uint64_t n = 0;
    std::size_t m = 0;
    std::string_view s;
    // One opcode a line, each as pickletools documents it; STOP is run's.
    // clang-format off
    switch (op_) {
    case 0x80: return fixed(1, n) && protocol(n);                                        // PROTO
    case 0x95: return fixed(8, n) && (n <= in_.size() - pos_ || fail(truncated(n)));     // FRAME
    case '(': marks_.push_back(stack_.size()); return true;                              // MARK
    case '0': return pop();                                                              // POP
    case '1': return pop_mark();                                                         // POP_MARK
    case '2': return dup();                                                              // DUP
    case 'N': return push(Value{0, 0, 0, Kind::none, Form::plain});                      // NONE
    case 0x88: return push(Value{1, 0, 0, Kind::boolean, Form::plain});                  // NEWTRUE
    case 0x89: return push(Value{0, 0, 0, Kind::boolean, Form::plain});                  // NEWFALSE
    case 'I': return line(s) && int_text(s);                                             // INT
    case 'L': return line(s) && int_text(s);                                             // LONG
    case 'J': return fixed(4, n) && push_int(static_cast<std::int32_t>(n));              // BININT
    case 'K': return fixed(1, n) && push_int(static_cast<std::int64_t>(n));              // BININT1
    case 'M': return fixed(2, n) && push_int(static_cast<std::int64_t>(n));              // BININT2
    case 0x8a: return counted(1, s) && long_bytes(s);                                    // LONG1
    case 0x8b: return counted(-4, s) && long_bytes(s);                                   // LONG4
    case 'F': return line(s) && float_text(s);                                           // FLOAT
    case 'G': return take(8, s) && binfloat(s);                                          // BINFLOAT
    case 'S': return line(s) && quoted_string(s);                                        // STRING
    case 'T': return counted(-4, s) && ascii(s);                                         // BINSTRING
    case 'U': return counted(1, s) && ascii(s);                                          // SHORT_BINSTRING
    case 'V': return line(s) && raw_unicode_escape(s);                                   // UNICODE
    case 'X': return counted(4, s) && utf8(s);                                           // BINUNICODE
    case 0x8c: return counted(1, s) && utf8(s);                                          // SHORT_BINUNICODE
    case 0x8d: return counted(8, s) && utf8(s);                                          // BINUNICODE8
    case 'B': return counted(4, s) && push_text(Kind::bytes, s);                         // BINBYTES
    case 'C': return counted(1, s) && push_text(Kind::bytes, s);                         // SHORT_BINBYTES
    case 0x8e: return counted(8, s) && push_text(Kind::bytes, s);                        // BINBYTES8
    case 0x96: return counted(8, s) && push_text(Kind::bytes, s);                        // BYTEARRAY8
    case ']': return collect(stack_.size(), Kind::list, Form::plain);                    // EMPTY_LIST
    case 0x8f: return collect(stack_.size(), Kind::list, Form::set);                     // EMPTY_SET
    case ')': return collect(stack_.size(), Kind::tuple, Form::plain);                   // EMPTY_TUPLE
    case '}': return collect(stack_.size(), Kind::dict, Form::plain);                    // EMPTY_DICT
    case 'l': return mark(m) && collect(m, Kind::list, Form::plain);                     // LIST
    case 't': return mark(m) && collect(m, Kind::tuple, Form::plain);                    // TUPLE
    case 'd': return mark(m) && collect(m, Kind::dict, Form::plain);                     // DICT
    case 0x91: return mark(m) && collect(m, Kind::list, Form::frozenset);                // FROZENSET
    case 0x85: return above(1) && collect(stack_.size() - 1, Kind::tuple, Form::plain);  // TUPLE1
    case 0x86: return above(2) && collect(stack_.size() - 2, Kind::tuple, Form::plain);  // TUPLE2
    case 0x87: return above(3) && collect(stack_.size() - 3, Kind::tuple, Form::plain);  // TUPLE3
    case 'a': return above(2) && extend(stack_.size() - 1);                              // APPEND
    case 's': return above(3) && extend(stack_.size() - 2);                              // SETITEM
    case 'e': return mark(m) && extend(m);                                               // APPENDS
    case 'u': return mark(m) && extend(m);                                               // SETITEMS
    case 0x90: return mark(m) && extend(m);                                              // ADDITEMS
    case 'p': return line(s) && memo_index(s, n) && put(n);                              // PUT
    case 'q': return fixed(1, n) && put(n);                                              // BINPUT
    case 'r': return fixed(4, n) && put(n);                                              // LONG_BINPUT
    case 0x94: return put(memo_size_);                                                   // MEMOIZE
    case 'g': return line(s) && memo_index(s, n) && get(n);                              // GET
    case 'h': return fixed(1, n) && get(n);                                              // BINGET
    case 'j': return fixed(4, n) && get(n);                                              // LONG_BINGET
    default: break; // every other opcode pickletools knows names code
    }
    // clang-format on
    if (pickle_opcode_name(op_).empty()) {
      return fail("unknown opcode " + pickle_hex(op_));
    }
    return fail("opcode " + name() + " (" + pickle_hex(op_) + ") refused: a pickle of plain data names no code");
  }

  // Reading arguments.

  /// The next `count` bytes. Errors: fewer are left (checked before anything is allocated, so a
  /// length field of 2^64 - 1 costs nothing).
  bool take(std::uint64_t count, std::string_view& out) {
    if (count > in_.size() - pos_) {
      return fail(truncated(count));
    }
    out = in_.substr(pos_, static_cast<std::size_t>(count));
    pos_ += out.size();
    return true;
  }
  /// An unsigned little-endian argument of `width` bytes.
  bool fixed(std::size_t width, std::uint64_t& out) {
    std::string_view s;
    if (!take(width, s)) {
      return false;
    }
    out = 0;
    for (std::size_t k = width; k-- > 0;) {
      out = out << 8 | static_cast<unsigned char>(s[k]);
    }
    return true;
  }
  /// A length of `width` bytes (-4: 4 bytes that Python reads as signed), then that many bytes.
  bool counted(int width, std::string_view& out) {
    std::uint64_t n = 0;
    if (!fixed(static_cast<std::size_t>(width < 0 ? -width : width), n)) {
      return false;
    }
    return (width > 0 || n < (std::uint64_t{1} << 31) || fail(name() + " with a negative length")) && take(n, out);
  }
  /// The text up to the next newline (protocol 0's arguments), the newline consumed.
  bool line(std::string_view& out) {
    const std::size_t end = in_.find('\n', pos_);
    if (end == std::string_view::npos) {
      return fail("truncated: " + name() + "'s argument has no newline before the end of the input");
    }
    out = in_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return true;
  }

  // Scalars.

  bool protocol(std::uint64_t n) {
    return n <= 5 || fail("protocol " + std::to_string(n) + ", beyond 5, the highest there is");
  }
  bool push(const Value& v) {
    if (doc_.values_.size() >= UINT32_MAX) {
      return fail("more than 2^32 - 1 values");
    }
    doc_.values_.push_back(v);
    stack_.push_back(static_cast<Id>(doc_.values_.size() - 1));
    return true;
  }
  bool push_int(std::int64_t v) { return push(Value{static_cast<std::uint64_t>(v), 0, 0, Kind::integer, Form::plain}); }
  /// Text already appended to the document's text, from `start` on.
  bool push_appended(Kind kind, std::size_t start) {
    return push(Value{start, doc_.text_.size() - start, 0, kind, Form::plain});
  }
  bool push_text(Kind kind, std::string_view s) {
    const std::size_t start = doc_.text_.size();
    doc_.text_.append(s);
    return push_appended(kind, start);
  }

  /// LONG1 and LONG4: little-endian two's complement of any length. Within 64-bit signed (the
  /// bytes beyond the eighth all sign) an integer; beyond, a big_integer, its sign kept.
  bool long_bytes(std::string_view s) {
    const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
    const bool negative = !s.empty() && byte(s.size() - 1) >= 0x80;
    for (std::size_t k = 8; k < s.size(); ++k) {
      if (byte(k) != (negative ? 0xff : 0x00) || (byte(7) >= 0x80) != negative) {
        return push(Value{negative ? 1U : 0U, 0, 0, Kind::big_integer, Form::plain});
      }
    }
    std::uint64_t v = negative ? ~std::uint64_t{0} : 0;
    for (std::size_t k = 0; k < s.size() && k < 8; ++k) {
      v = (v & ~(std::uint64_t{0xff} << (8 * k))) | std::uint64_t{byte(k)} << (8 * k);
    }
    return push_int(static_cast<std::int64_t>(v));
  }

  /// A text reader's answer (pickle_text.hpp), its error put after the opcode's name.
  bool named(bool ok) { return ok || fail(name() + " " + error_); }
  /// INT and LONG text: an int, INT's bool, or a big_integer (`v` its sign, as long_bytes keeps it).
  bool int_text(std::string_view s) {
    std::int64_t v = 0;
    auto form = PickleIntText::integer;
    static constexpr Kind kinds[] = {Kind::integer, Kind::boolean, Kind::big_integer}; // by PickleIntText
    return named(pickle_int_text(op_, s, v, form, error_)) &&
           push(Value{static_cast<std::uint64_t>(v), 0, 0, kinds[static_cast<int>(form)], Form::plain});
  }
  bool memo_index(std::string_view s, std::uint64_t& out) { return named(pickle_memo_index(s, out, error_)); }
  bool float_text(std::string_view s) {
    double d = 0;
    return named(pickle_float_text(s, d, error_)) &&
           push(Value{std::bit_cast<std::uint64_t>(d), 0, 0, Kind::floating, Form::plain});
  }
  /// BINFLOAT: an IEEE double, big-endian unlike every other binary argument.
  bool binfloat(std::string_view s) {
    std::uint64_t bits = 0;
    for (const char c : s) {
      bits = bits << 8 | static_cast<unsigned char>(c);
    }
    return push(Value{bits, 0, 0, Kind::floating, Form::plain});
  }

  // Text.

  bool quoted_string(std::string_view s) {
    std::string out;
    return named(pickle_quoted_string(s, out, error_)) && ascii(out);
  }
  bool ascii(std::string_view s) { return named(pickle_ascii(s, error_)) && push_text(Kind::string, s); }
  bool raw_unicode_escape(std::string_view s) {
    const std::size_t start = doc_.text_.size();
    return named(pickle_raw_unicode_escape(s, doc_.text_, error_)) && push_appended(Kind::string, start);
  }
  bool utf8(std::string_view s) { return named(pickle_utf8(s, error_)) && push_text(Kind::string, s); }

  // Containers and the stack.

  /// The stack position of the last MARK (0 without one): no opcode reaches below it.
  std::size_t fence() const noexcept { return marks_.empty() ? 0 : marks_.back(); }
  /// Errors: fewer than `count` values above the last MARK.
  bool above(std::size_t count) {
    const std::size_t there = stack_.size() - fence();
    return there >= count || fail("stack underflow: " + name() + " takes " + counted_noun(count, "value") +
                                  (marks_.empty() ? "" : " above the last MARK") + ", and there " +
                                  (there == 1 ? "is 1" : "are " + std::to_string(there)));
  }
  /// Pops the last MARK into `at`, the stack position it marked.
  bool mark(std::size_t& at) {
    if (marks_.empty()) {
      return fail("MARK missing: " + name() + " takes the values above a MARK, and none is open");
    }
    at = marks_.back();
    marks_.pop_back();
    return true;
  }
  /// POP: the top value, or, as in both of Python's unpicklers, the last MARK when it is on top.
  bool pop() {
    if (!marks_.empty() && marks_.back() == stack_.size()) {
      marks_.pop_back();
      return true;
    }
    if (!above(1)) {
      return false;
    }
    stack_.pop_back();
    return true;
  }
  /// POP_MARK: the last MARK and the values above it.
  bool pop_mark() {
    std::size_t at = 0;
    if (!mark(at)) {
      return false;
    }
    stack_.resize(at);
    return true;
  }
  /// DUP: the top value pushed again (the same value, not a copy).
  bool dup() {
    if (!above(1)) {
      return false;
    }
    const Id top = stack_.back();
    stack_.push_back(top);
    return true;
  }
  /// A new container of `kind` and `form` holding the stack's values from `first` on, which it
  /// replaces.
  bool collect(std::size_t first, Kind kind, Form form) {
    Value v{0, 0, PickleDocument::no_batch, kind, form};
    return add(v, std::span<const Id>(stack_.data() + first, stack_.size() - first)) && (stack_.resize(first), push(v));
  }
  /// APPEND(S), SETITEM(S), ADDITEMS: the stack's values from `first` on added to the container
  /// just below them (a list, a dict, a set, by opcode), in place, so that every reference to it
  /// (the memo's, a list's that holds it) sees them.
  bool extend(std::size_t first) {
    if (first <= fence()) {
      return fail("stack underflow: " + name() + " finds no container below its MARK");
    }
    Value& target = doc_.values_[stack_[first - 1]];
    const bool dict = op_ == 's' || op_ == 'u';
    const Form form = op_ == 0x90 ? Form::set : Form::plain;
    if (target.kind != (dict ? Kind::dict : Kind::list) || target.form != form) {
      // By Kind, in its order.
      static constexpr std::string_view types[] = {"None",  "a bool", "an int",  "a float", "a str",
                                                   "bytes", "a list", "a tuple", "a dict",  "an int"};
      static_assert(std::size(types) == static_cast<std::size_t>(Kind::big_integer) + 1, "a name for every Kind");
      const std::string_view type = target.form == Form::set         ? "a set"
                                    : target.form == Form::frozenset ? "a frozenset"
                                                                     : types[static_cast<int>(target.kind)];
      return fail(name() + " onto " + std::string(type) + ", not " +
                  (dict                ? "a dict"
                   : form == Form::set ? "a set"
                                       : "a list"));
    }
    return add(target, std::span<const Id>(stack_.data() + first, stack_.size() - first)) &&
           (stack_.resize(first), true);
  }
  /// `values` appended to container `c`'s items, or, for a dict, as its (key, value) pairs.
  bool add(Value& c, std::span<const Id> values) {
    bool added = values.empty();
    if (c.kind != Kind::dict) {
      auto& items = doc_.items_;
      added = added || PickleDocument::add_batch(c, items, item_batches_,
                                                 [&] { items.insert(items.end(), values.begin(), values.end()); });
    } else if (values.size() % 2 != 0) {
      return fail(name() + " with an odd number of items (" + std::to_string(values.size()) +
                  "): keys and values come in pairs");
    } else {
      auto& entries = doc_.entries_;
      added = added || PickleDocument::add_batch(c, entries, entry_batches_, [&] {
                for (std::size_t k = 0; k < values.size(); k += 2) {
                  entries.emplace_back(values[k], values[k + 1]);
                }
              });
    }
    return added || fail("2^32 - 1 batches of items added to containers, the most there can be");
  }

  /// PUT, BINPUT, LONG_BINPUT, MEMOIZE: the top value stored at memo `index`. An index below the
  /// input's size (picklers write 0, 1, 2, ...) in memo_, grown to at most that size, any other
  /// in far_memo_.
  bool put(std::uint64_t index) {
    if (!above(1)) {
      return false;
    }
    if (index < in_.size() && index >= memo_.size()) {
      memo_.reserve(std::max<std::size_t>(index + 1, std::min(2 * memo_.capacity(), in_.size())));
      memo_.resize(static_cast<std::size_t>(index + 1), unset);
    }
    Id& slot =
        index < in_.size() ? memo_[static_cast<std::size_t>(index)] : far_memo_.try_emplace(index, unset).first->second;
    memo_size_ += slot == unset ? 1 : 0;
    slot = stack_.back();
    return true;
  }
  /// GET, BINGET, LONG_BINGET: the value at memo `index` pushed again (the same value, not a copy).
  bool get(std::uint64_t index) {
    const auto far = index < memo_.size() ? far_memo_.end() : far_memo_.find(index);
    const Id v = index < memo_.size()     ? memo_[static_cast<std::size_t>(index)]
                 : far != far_memo_.end() ? far->second
                                          : unset;
    if (v == unset) {
      return fail(name() + " of memo index " + std::to_string(index) + ", where nothing was stored");
    }
    stack_.push_back(v);
    return true;
  }

  // Messages.

  bool fail(std::string what) {
    error_ = std::move(what);
    return false;
  }
  cuda::std::unexpected<Error> failure(const std::string& what) const {
    return carve::fail(Errc::bad_message, std::string(source_) + ": byte " + std::to_string(at_) + ": " + what);
  }
  std::string truncated(std::uint64_t needed) const {
    const std::size_t left = in_.size() - pos_;
    return "truncated: " + name() + " needs " + counted_noun(needed, "byte") + ", and " +
           (left == 1 ? "1 is" : std::to_string(left) + " are") + " left";
  }
  /// "1 byte", "2 bytes".
  static std::string counted_noun(std::uint64_t n, const char* noun) {
    return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
  }
  std::string name() const { return std::string(pickle_opcode_name(op_)); }

  std::string_view in_;
  std::string_view source_;
  std::size_t pos_ = 0;  ///< the next byte to read
  std::size_t at_ = 0;   ///< the offset of the opcode being run, for messages
  unsigned char op_ = 0; ///< the opcode being run
  std::string error_;    ///< what the failed step found wrong
  PickleDocument doc_;
  std::vector<Id> stack_;
  std::vector<std::size_t> marks_;        ///< stack positions, in order
  static constexpr Id unset = UINT32_MAX; ///< in the memo: nothing stored (no value's Id)
  std::vector<Id> memo_;                  ///< by index, those below the input's size
  std::map<std::uint64_t, Id> far_memo_;  ///< the others: ordered, so no choice of indices costs more than log n
  std::uint64_t memo_size_ = 0;           ///< indices stored: MEMOIZE's next
  std::vector<PickleDocument::Batch> item_batches_, entry_batches_;
};

} // namespace detail

/// Decodes `bytes`, a pickle of plain data, up to its first STOP, executing nothing; `source` (a
/// file name) starts every message. Errors: Errc::bad_message (see the file's description).
[[nodiscard]] inline Result<PickleDocument> read_pickle(std::string_view bytes, std::string_view source) {
  return detail::PickleMachine(bytes, source).run();
}

} // namespace carve::trace
