// Pickles written opcode by opcode, for inputs no pickler writes: a dict shared by thousands of
// references, sizes that overflow when summed. Protocol 4 without framing: str as BINUNICODE, int
// as LONG1 of 8 bytes, containers as EMPTY_LIST/EMPTY_DICT and a MARK closed by APPENDS/SETITEMS.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace carve::test {

class PickleWriter {
public:
  PickleWriter() : out_("\x80\x04", 2) {}

  PickleWriter& str(std::string_view s) {
    out_ += 'X';
    little_endian(s.size(), 4);
    out_ += s;
    return *this;
  }
  PickleWriter& integer(std::int64_t v) {
    out_ += "\x8a\x08";
    little_endian(static_cast<std::uint64_t>(v), 8);
    return *this;
  }
  /// 2^64 - 1, as LONG1 of 9 bytes (as Python pickles it): what PyTorch writes for the line of a
  /// C++ frame it has no line for.
  PickleWriter& unknown_line() { return raw(std::string_view("\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00", 11)); }
  PickleWriter& none() { return raw("N"); }
  PickleWriter& boolean(bool b) { return raw(b ? "\x88" : "\x89"); }
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

  std::string out_;
};

} // namespace carve::test
