// Pickles written opcode by opcode, for inputs no pickler writes (a dict shared by thousands of
// references, sizes that overflow when summed) and in the forms of the picklers that write
// PyTorch's snapshots. The form decides how:
// - Form::plain (the default): str as BINUNICODE, every int as LONG1 of 8 bytes in protocol 4 (a
//   form no pickler writes but any reader must read), NEWTRUE/NEWFALSE, TUPLE2, every container
//   EMPTY_LIST/EMPTY_DICT and a MARK closed by APPENDS/SETITEMS;
// - Form::python, protocols 4 and 5 (Python's pickle.dump in torch.cuda.memory._dump_snapshot:
//   protocol 4 up to Python 3.13, 5 from 3.14), byte for byte what Python writes for the same
//   document whose equal strs are one object (PyTorch's snapshot code makes each key and action
//   once): FRAMEs of 64 KiB (or `frame_bytes`) cut where a value begins; a MEMOIZE after every
//   list, dict and pair and after a str's first time, a str met again a BINGET (LONG_BINGET past
//   memo index 255); str as SHORT_BINUNICODE below 256 bytes; an int in its shortest form:
//   BININT1, BININT2, BININT, else LONG1 of as few bytes as two's complement needs; containers
//   batched as the C pickler (pickle.dumps) batches them: nothing after an empty one,
//   APPEND/SETITEM after a lone item, else MARK ... APPENDS/SETITEMS per 1000 (and a dict whose
//   last batch was full one more, empty). Strs of 64 KiB or more, which Python writes outside its
//   frames and no snapshot holds, are refused;
// - protocol 2 (PyTorch's C++ pickler, the snapshot C++ code writes): BININT1, BININT2, BININT, else
//   LONG1 of 8 bytes, containers as in the plain form;
// - protocol 1 (as Python writes it): BININT1, BININT2, BININT, else LONG text
//   ("L139637976727552L\n"), a bool as INT text ("I01\n"), a pair as MARK ... TUPLE, containers as
//   in the plain form.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace carve::test {

class PickleWriter {
public:
  enum class Form { plain, python };

  explicit PickleWriter(int protocol = 4, Form form = Form::plain, std::size_t frame_bytes = std::size_t{64} << 10)
      : protocol_(protocol), python_(form == Form::python && protocol >= 4), frame_bytes_(frame_bytes) {
    if (protocol >= 2) {
      out_ += '\x80';
      out_ += static_cast<char>(protocol);
    }
    body_ = out_.size();
  }

  PickleWriter& str(std::string_view s) {
    if (python_) {
      if (const auto known = strs_.find(std::string(s)); known != strs_.end()) {
        return memo_get(known->second); // the same str object again
      }
    }
    value();
    if (python_ && s.size() >= frame_bytes_limit) {
      throw std::logic_error("PickleWriter: a str of 64 KiB or more, which Python writes outside its frames");
    }
    if (python_ && s.size() < 256) {
      out_ += '\x8c';
      out_ += static_cast<char>(s.size());
    } else {
      out_ += 'X';
      little_endian(s.size(), 4);
    }
    out_ += s;
    memoize();
    if (python_) {
      strs_.emplace(std::string(s), last_memo_);
    }
    return *this;
  }
  PickleWriter& integer(std::int64_t v) {
    value();
    if (protocol_ == 4 && !python_) {
      out_ += "\x8a\x08";
      little_endian(static_cast<std::uint64_t>(v), 8);
    } else if (v >= 0 && v <= 0xff) {
      out_ += 'K';
      little_endian(static_cast<std::uint64_t>(v), 1);
    } else if (v >= 0 && v <= 0xffff) {
      out_ += 'M';
      little_endian(static_cast<std::uint64_t>(v), 2);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
      out_ += 'J';
      little_endian(static_cast<std::uint32_t>(static_cast<std::int32_t>(v)), 4);
    } else if (protocol_ < 2) {
      out_ += "L" + std::to_string(v) + "L\n";
    } else {
      const int bytes = python_ ? shortest_twos_complement(v) : 8;
      out_ += '\x8a';
      out_ += static_cast<char>(bytes);
      little_endian(static_cast<std::uint64_t>(v), bytes);
    }
    return *this;
  }
  /// An int written as LONG text, `digits` its decimal digits (a '-' first for a negative one), as
  /// protocols 0 and 1 write any int above 2^31 - 1: in any protocol, since the reader reads any
  /// opcode in any protocol, as Python does.
  PickleWriter& long_text(std::string_view digits) {
    value();
    out_ += "L" + std::string(digits) + "L\n";
    return *this;
  }
  /// 2^64 - 1, as the protocol writes it (LONG1 of 9 bytes, or LONG text): what PyTorch writes
  /// for the line of a C++ frame it has no line for.
  PickleWriter& unknown_line() {
    return protocol_ < 2 ? long_text("18446744073709551615")
                         : raw(std::string_view("\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00", 11));
  }
  PickleWriter& none() { return raw("N"); }
  PickleWriter& boolean(bool b) {
    if (protocol_ < 2) {
      return raw(b ? "I01\n" : "I00\n");
    }
    return raw(b ? "\x88" : "\x89");
  }
  /// BINFLOAT: a double, big-endian.
  PickleWriter& floating(double d) {
    value();
    out_ += 'G';
    const auto bits = std::bit_cast<std::uint64_t>(d);
    for (int k = 7; k >= 0; --k) {
      out_ += static_cast<char>(bits >> (8 * k) & 0xff);
    }
    return *this;
  }
  /// A tuple of two ints, as a segment's segment_pool_id.
  PickleWriter& pair(std::int64_t a, std::int64_t b) {
    if (protocol_ < 2) {
      raw("(").integer(a).integer(b);
      return raw("t");
    }
    value();
    ++inside_value_; // its ints are parts of one item, not items
    integer(a).integer(b);
    --inside_value_;
    out_ += '\x86';
    return memoize();
  }
  /// A list: its items follow, then list_end.
  PickleWriter& list() { return open(']'); }
  PickleWriter& list_end() { return close(']'); }
  /// A dict: keys and values follow, then dict_end.
  PickleWriter& dict() { return open('}'); }
  PickleWriter& dict_end() { return close('}'); }
  /// The value on top pushed `n` times more: `n` references to it, not copies.
  PickleWriter& dup(std::size_t n) {
    if (python_ && !open_.empty()) {
      throw std::logic_error("PickleWriter::dup: pushes that Python's form cannot count as items");
    }
    out_.append(n, '2');
    return *this;
  }
  /// The value just written kept under `key`; get(key) pushes it again (BINGET): the picklers'
  /// way of sharing one frames list. Python's form memoized it as it was written, so put only
  /// remembers its index; the others store it at memo index `key` (BINPUT).
  PickleWriter& put(unsigned char key) {
    if (python_) {
      if (last_memo_ == no_memo) {
        throw std::logic_error("PickleWriter::put: the value just written has no memo index (not a str, list, "
                               "dict or pair)");
      }
      named_[key] = last_memo_;
      return *this;
    }
    return raw("q" + std::string(1, static_cast<char>(key)));
  }
  PickleWriter& get(unsigned char key) { return memo_get(python_ ? named_.at(key) : key); }
  /// A key and its int value, in a dict.
  PickleWriter& item(std::string_view key, std::int64_t v) { return str(key).integer(v); }
  /// A key and its str value, in a dict.
  PickleWriter& item(std::string_view key, std::string_view v) { return str(key).str(v); }
  PickleWriter& raw(std::string_view opcodes) {
    value();
    out_ += opcodes;
    return *this;
  }
  /// The pickle, STOP appended (and, in Python's form, cut into frames).
  std::string stop() const {
    if (!open_.empty()) {
      throw std::logic_error("PickleWriter::stop: a list or dict is still open");
    }
    if (!python_) {
      return out_ + ".";
    }
    std::string framed = out_.substr(0, body_);
    std::size_t from = body_;
    const auto frame = [&](std::size_t to, bool last) {
      std::string data = out_.substr(from, to - from) + (last ? "." : "");
      if (data.size() >= 4) { // Python writes no FRAME for less
        framed += '\x95';
        for (int k = 0; k < 8; ++k) {
          framed += static_cast<char>(data.size() >> (8 * k) & 0xff);
        }
      }
      framed += data;
      from = to;
    };
    for (const std::size_t at : starts_) {
      if (at - from >= frame_bytes_) {
        frame(at, false);
      }
    }
    frame(out_.size(), true);
    return framed;
  }

private:
  static constexpr std::uint64_t no_memo = UINT64_MAX;
  static constexpr std::size_t frame_bytes_limit = std::size_t{64} << 10; // Python frames no longer str

  // An open list or dict. Python's form writes its items into a buffer of their own and batches
  // them when it closes; the other forms keep nothing.
  struct Open {
    std::string out;                 // the enclosing buffer, set aside
    std::vector<std::size_t> starts; // its value starts
    std::vector<std::size_t> items;  // its items' starts, where it is a container's
    std::uint64_t memo = no_memo;
    char kind = 0; // ']' a list, '}' a dict
  };

  // A value begins here: where Python may close a frame, and (in a container) an item begins;
  // none has a memo index until it is memoized.
  void value() {
    last_memo_ = no_memo;
    if (python_ && (starts_.empty() || starts_.back() != out_.size())) {
      starts_.push_back(out_.size());
    }
    if (python_ && inside_value_ == 0 && !open_.empty()) {
      items_.push_back(out_.size());
    }
  }
  PickleWriter& memo_get(std::uint64_t index) {
    value();
    if (index < 256) {
      out_ += 'h';
      out_ += static_cast<char>(index);
    } else {
      out_ += 'j';
      little_endian(index, 4);
    }
    last_memo_ = python_ ? index : no_memo;
    return *this;
  }
  PickleWriter& memoize() {
    last_memo_ = no_memo;
    if (python_) {
      out_ += '\x94';
      last_memo_ = memo_++;
    }
    return *this;
  }
  PickleWriter& open(char empty) {
    value();
    if (!python_) {
      out_ += empty;
      out_ += '(';
      open_.push_back(Open{{}, {}, {}, no_memo, empty});
      return *this;
    }
    open_.push_back(Open{std::move(out_), std::move(starts_), std::move(items_), memo_++, empty});
    out_.clear();
    starts_.clear();
    items_.clear();
    return *this;
  }
  // Closes the innermost list (']') or dict ('}').
  PickleWriter& close(char empty) {
    if (open_.empty() || open_.back().kind != empty) {
      throw std::logic_error("PickleWriter: list_end or dict_end that does not close what is open");
    }
    Open o = std::move(open_.back());
    open_.pop_back();
    last_memo_ = o.memo;
    if (!python_) {
      out_ += empty == ']' ? 'e' : 'u';
      return *this;
    }
    const std::string body = std::move(out_);
    const std::vector<std::size_t> body_starts = std::move(starts_);
    const std::vector<std::size_t> items = std::move(items_);
    out_ = std::move(o.out);
    starts_ = std::move(o.starts);
    items_ = std::move(o.items);
    const std::size_t unit = empty == ']' ? 1 : 2; // a list's item; a dict's key and value
    if (items.size() % unit != 0) {
      throw std::logic_error("PickleWriter::dict_end: a key without its value");
    }
    out_ += empty;
    out_ += '\x94'; // MEMOIZE: o.memo, taken at open, before its items' indices
    // The C pickler's batch_list_exact and batch_dict_exact: a lone unit is followed by
    // APPEND/SETITEM; otherwise each batch of up to 1000 is MARK ... APPENDS/SETITEMS, and a
    // dict's loop writes one more (empty) batch after a full one.
    const std::size_t units = items.size() / unit;
    if (units == 1) {
      append_body(body, body_starts, 0, body.size());
      out_ += empty == ']' ? 'a' : 's';
      return *this;
    }
    if (units == 0) {
      return *this;
    }
    std::size_t first = 0;
    std::size_t n = 0;
    do { // a list's loop runs while items are left, a dict's while its last batch was full
      n = std::min<std::size_t>(1000, units - first);
      const std::size_t from = n == 0 ? body.size() : items[first * unit];
      const std::size_t to = first + n < units ? items[(first + n) * unit] : body.size();
      out_ += '(';
      append_body(body, body_starts, from, to);
      out_ += empty == ']' ? 'e' : 'u';
      first += n;
    } while (empty == ']' ? first < units : n == 1000);
    return *this;
  }
  // Bytes [from, to) of a closed container's body appended here, with the value starts among them.
  void append_body(const std::string& body, const std::vector<std::size_t>& body_starts, std::size_t from,
                   std::size_t to) {
    for (const std::size_t at : body_starts) {
      if (at >= from && at < to) {
        starts_.push_back(out_.size() + at - from);
      }
    }
    out_.append(body, from, to - from);
  }
  static int shortest_twos_complement(std::int64_t v) {
    int bytes = 1;
    while (bytes < 8 && (v >> (8 * bytes - 1)) != 0 && (v >> (8 * bytes - 1)) != -1) {
      ++bytes;
    }
    return bytes;
  }
  void little_endian(std::uint64_t v, int bytes) {
    for (int k = 0; k < bytes; ++k, v >>= 8) {
      out_ += static_cast<char>(v & 0xff);
    }
  }

  int protocol_;
  bool python_;
  std::size_t frame_bytes_;
  std::size_t body_ = 0;                         // where the frames begin: after PROTO
  std::string out_;                              // unframed
  std::vector<std::size_t> starts_;              // where values begin (Python's form)
  std::uint64_t memo_ = 0;                       // MEMOIZE's next index
  std::uint64_t last_memo_ = no_memo;            // the memo index of the value just written
  std::vector<Open> open_;                       // the lists and dicts open now, innermost last
  std::vector<std::size_t> items_;               // the innermost open container's items' starts
  int inside_value_ = 0;                         // writing the parts of one value (a pair's ints)
  std::map<unsigned char, std::uint64_t> named_; // put's keys (Python's form)
  std::map<std::string, std::uint64_t> strs_;    // each str's memo index (Python's form)
};

} // namespace carve::test
