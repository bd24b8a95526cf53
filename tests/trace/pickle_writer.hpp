// Pickles written opcode by opcode, for inputs no pickler writes: a dict shared by thousands of
// references, sizes that overflow when summed. Without framing: str as BINUNICODE, containers as
// EMPTY_LIST/EMPTY_DICT and a MARK closed by APPENDS/SETITEMS. The protocol decides ints, bools and
// pairs, as the picklers that write PyTorch's snapshots do:
// - 4 (the default; Python 3.8 to 3.13's pickle.dump in torch.cuda.memory._dump_snapshot): int as
//   LONG1 of 8 bytes, NEWTRUE/NEWFALSE, TUPLE2;
// - 2 (PyTorch's C++ pickler, the snapshot C++ code writes): an int that fits 32 bits as BININT, a
//   larger one as LONG1 of 8 bytes, NEWTRUE/NEWFALSE, TUPLE2;
// - 1 (and 0, as Python writes them): an int that fits 32 bits as BININT, a larger one as LONG
//   text ("L139637976727552L\n"), a bool as INT text ("I01\n"), a pair as MARK ... TUPLE.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace carve::test {

class PickleWriter {
public:
  explicit PickleWriter(int protocol = 4) : protocol_(protocol) {
    if (protocol >= 2) {
      out_ += '\x80';
      out_ += static_cast<char>(protocol);
    }
  }

  PickleWriter& str(std::string_view s) {
    out_ += 'X';
    little_endian(s.size(), 4);
    out_ += s;
    return *this;
  }
  PickleWriter& integer(std::int64_t v) {
    if (protocol_ != 4 && v >= INT32_MIN && v <= INT32_MAX) {
      out_ += 'J';
      little_endian(static_cast<std::uint32_t>(static_cast<std::int32_t>(v)), 4);
    } else if (protocol_ < 2) {
      out_ += "L" + std::to_string(v) + "L\n";
    } else {
      out_ += "\x8a\x08";
      little_endian(static_cast<std::uint64_t>(v), 8);
    }
    return *this;
  }
  /// An int written as LONG text, `digits` its decimal digits (a '-' first for a negative one), as
  /// protocols 0 and 1 write any int above 2^31 - 1: in any protocol, since the reader reads any
  /// opcode in any protocol, as Python does.
  PickleWriter& long_text(std::string_view digits) {
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
    integer(a).integer(b);
    return raw("\x86");
  }
  /// An empty list and a MARK: its items follow, then list_end.
  PickleWriter& list() { return raw("]("); }
  PickleWriter& list_end() { return raw("e"); }
  /// An empty dict and a MARK: keys and values follow, then dict_end.
  PickleWriter& dict() { return raw("}("); }
  PickleWriter& dict_end() { return raw("u"); }
  /// The value on top pushed `n` times more: `n` references to it, not copies.
  PickleWriter& dup(std::size_t n) {
    out_.append(n, '2');
    return *this;
  }
  /// The value on top stored at memo index `index` (BINPUT), as every pickler does with what it
  /// may meet again; get pushes it again (BINGET): Python's way of sharing one frames list.
  PickleWriter& put(unsigned char index) { return raw("q" + std::string(1, static_cast<char>(index))); }
  PickleWriter& get(unsigned char index) { return raw("h" + std::string(1, static_cast<char>(index))); }
  /// A key and its int value, in a dict.
  PickleWriter& item(std::string_view key, std::int64_t v) { return str(key).integer(v); }
  /// A key and its str value, in a dict.
  PickleWriter& item(std::string_view key, std::string_view v) { return str(key).str(v); }
  PickleWriter& raw(std::string_view opcodes) {
    out_ += opcodes;
    return *this;
  }
  /// The pickle, STOP appended.
  std::string stop() const { return out_ + "."; }

private:
  void little_endian(std::uint64_t v, int bytes) {
    for (int k = 0; k < bytes; ++k, v >>= 8) {
      out_ += static_cast<char>(v & 0xff);
    }
  }

  int protocol_;
  std::string out_;
};

} // namespace carve::test
