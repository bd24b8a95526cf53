/// @file carve/trace/pickle_text.hpp
/// The text inside a pickle, read as Python writes it: protocol 0's arguments (numbers, quoted and
/// escaped strings) and the bytes of every str, which come from an untrusted file and must be
/// checked before a caller relies on them; and the opcodes' names, for messages. Kept apart from
/// the opcode machine (carve/trace/pickle_reader.hpp), since none of it touches the stack, the
/// memo or the arena: each function reads one argument's text (or names an opcode) and answers.
///
/// What read_pickle reads here differs from what `pickle.loads` reads in these ways, each
/// deliberate (the rest are in pickle_reader.hpp):
/// - str is UTF-8, a lone surrogate (which a Python str can hold) in its three-byte form, the
///   "surrogatepass" encoding pickle itself writes;
/// - Python 2 strings (STRING, BINSTRING, SHORT_BINSTRING) read as str and must be ASCII, as with
///   the unpickler's default encoding; an octal escape above \377 is refused, not truncated;
/// - protocol 0's numbers are read as Python writes them (INT, LONG, PUT, GET: '-' and digits;
///   FLOAT: repr's forms), not as everything int() and float() take ('+', spaces, underscores, a
///   float that underflows); INT and LONG with a leading zero ("010", "-0") are refused, since
///   CPython's C unpickler reads them as octal or a bool and its Python one as decimal;
/// - INT and LONG beyond 64-bit signed (protocols 0 and 1 write any int above 2^31 - 1 as LONG
///   text) are read as their sign alone, as LONG1 and LONG4 are: a snapshot's fields carve needs
///   fit in 64 bits, and one it reads past (a C++ frame's line of 2^64 - 1) must not refuse it.
///
/// A function that finds its text malformed returns false and sets `error` to what is wrong, in
/// words that follow the opcode's name: the machine reports "<name> <error>", which keeps the
/// name lookup (a table walk) off the path of every well-formed argument.
#pragma once

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

namespace carve::trace::detail {

/// False, with `error` set to `what`.
inline bool pickle_text_error(std::string& error, std::string what) {
  error = std::move(what);
  return false;
}

/// A hex digit's value; 16 for any other character.
inline std::uint32_t pickle_hex_digit(char c) noexcept {
  const auto lower = static_cast<char>(c | 0x20);
  return c >= '0' && c <= '9'           ? static_cast<std::uint32_t>(c - '0')
         : lower >= 'a' && lower <= 'f' ? static_cast<std::uint32_t>(lower - 'a' + 10)
                                        : 16;
}

/// Byte `b` as a message shows it, "0x0a".
inline std::string pickle_hex(unsigned char b) {
  static constexpr char digits[] = "0123456789abcdef";
  return std::string("0x") + digits[b >> 4] + digits[b & 15];
}

/// Text quoted in a message, cut at 40 bytes so that a hostile line cannot make a huge one.
inline std::string pickle_clip(std::string_view s) {
  return std::string(s.substr(0, 40)) + (s.size() > 40 ? "..." : "");
}

// Opcodes.

/// The name pickletools gives opcode `op`; empty for a byte that is no opcode.
inline std::string_view pickle_opcode_name(unsigned char op) noexcept {
  // The printable opcodes as "<opcode><name>", then the names of 0x80 .. 0x98 in order.
  static constexpr std::string_view printable = "(MARK )EMPTY_TUPLE .STOP 0POP 1POP_MARK 2DUP BBINBYTES "
                                                "CSHORT_BINBYTES FFLOAT GBINFLOAT IINT JBININT KBININT1 LLONG "
                                                "MBININT2 NNONE PPERSID QBINPERSID RREDUCE SSTRING TBINSTRING "
                                                "USHORT_BINSTRING VUNICODE XBINUNICODE ]EMPTY_LIST aAPPEND bBUILD "
                                                "cGLOBAL dDICT eAPPENDS gGET hBINGET iINST jLONG_BINGET lLIST oOBJ "
                                                "pPUT qBINPUT rLONG_BINPUT sSETITEM tTUPLE uSETITEMS }EMPTY_DICT";
  static constexpr std::string_view high = "PROTO NEWOBJ EXT1 EXT2 EXT4 TUPLE1 TUPLE2 TUPLE3 NEWTRUE NEWFALSE "
                                           "LONG1 LONG4 SHORT_BINUNICODE BINUNICODE8 BINBYTES8 EMPTY_SET ADDITEMS "
                                           "FROZENSET NEWOBJ_EX STACK_GLOBAL MEMOIZE FRAME BYTEARRAY8 NEXT_BUFFER "
                                           "READONLY_BUFFER";
  const std::string_view table = op >= 0x80 ? high : printable;
  std::size_t index = op >= 0x80 ? op - 0x80U : 0;
  for (std::size_t at = 0; at < table.size();) {
    const std::size_t end = std::min(table.find(' ', at), table.size());
    const std::string_view word = table.substr(at, end - at);
    if (op >= 0x80 ? index-- == 0 : static_cast<unsigned char>(word[0]) == op) {
      return op >= 0x80 ? word : word.substr(1);
    }
    at = end + 1;
  }
  return {};
}

// Numbers.

/// An optional '-' and decimal digits, within 64-bit signed. Beyond it: refused, or, where `big` is
/// given, true with `*big` set and `out` 1 for a negative number, 0 for a positive one (the digits
/// checked all the same).
inline bool pickle_decimal(std::string_view s, std::int64_t& out, std::string& error, bool* big = nullptr) {
  const bool negative = s.starts_with('-');
  const std::string_view digits = s.substr(negative ? 1 : 0);
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string_view::npos) {
    return pickle_text_error(error, "text \"" + pickle_clip(s) + "\" is not a decimal integer");
  }
  const std::uint64_t limit = (std::uint64_t{1} << 63) - (negative ? 0 : 1);
  std::uint64_t magnitude = 0;
  for (const char c : digits) {
    const auto d = static_cast<std::uint64_t>(c - '0');
    if (magnitude > (limit - d) / 10) {
      if (big == nullptr) {
        return pickle_text_error(error, "integer " + pickle_clip(s) + " beyond 64-bit signed");
      }
      *big = true;
      out = negative ? 1 : 0;
      return true;
    }
    magnitude = magnitude * 10 + d;
  }
  out = static_cast<std::int64_t>(negative ? 0 - magnitude : magnitude);
  return true;
}

/// What INT or LONG text holds: an int within 64-bit signed, INT's bool, or an int beyond (its
/// sign alone kept, as PickleDocument's big_integer).
enum class PickleIntText : std::uint8_t { integer, boolean, big };

/// INT and LONG text (`op` 'I' or 'L'): an optional '-' and decimal digits, LONG's perhaps
/// followed by Python 2's 'L'; or INT's "00" and "01", False and True as protocols 0 and 1 write
/// them (a bool, not an int, is what Python reads). `value`: the int; the bool as 0 or 1; for a
/// big one, 1 if negative, else 0.
inline bool pickle_int_text(unsigned char op, std::string_view s, std::int64_t& value, PickleIntText& form,
                            std::string& error) {
  if (op == 'I' && (s == "00" || s == "01")) {
    form = PickleIntText::boolean;
    value = s == "01" ? 1 : 0;
    return true;
  }
  if (op == 'L' && s.ends_with('L')) {
    s.remove_suffix(1);
  }
  const std::string_view digits = s.substr(s.starts_with('-') ? 1 : 0);
  if (!digits.empty() && digits[0] == '0' && s != "0") {
    return pickle_text_error(error, "text \"" + pickle_clip(s) +
                                        "\" has a leading zero, which Python's unpicklers read differently");
  }
  bool big = false;
  form = PickleIntText::integer;
  if (!pickle_decimal(s, value, error, &big)) {
    return false;
  }
  form = big ? PickleIntText::big : PickleIntText::integer;
  return true;
}

/// PUT and GET text: a decimal memo index.
inline bool pickle_memo_index(std::string_view s, std::uint64_t& out, std::string& error) {
  std::int64_t v = 0;
  if (!pickle_decimal(s, v, error)) {
    return false;
  }
  out = static_cast<std::uint64_t>(v);
  return v >= 0 || pickle_text_error(error, "of a negative memo index");
}

/// FLOAT text, as Python's repr writes it ("1.5", "1e+300", "inf", "nan").
inline bool pickle_float_text(std::string_view s, double& out, std::string& error) {
  double d = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), d);
  if (ec != std::errc() || end != s.data() + s.size()) {
    return pickle_text_error(error, "text \"" + pickle_clip(s) + "\" is not a number within a double's range");
  }
  out = d;
  return true;
}

// Strings.

/// STRING: a Python 2 str literal in quotes, its escapes undone into `out` as Python's
/// escape_decode does (an unknown escape keeps its backslash). Whether `out` is ASCII is
/// pickle_ascii's question.
inline bool pickle_quoted_string(std::string_view s, std::string& out, std::string& error) {
  if (s.size() < 2 || s.front() != s.back() || (s.front() != '\'' && s.front() != '"')) {
    return pickle_text_error(error, "text is not quoted");
  }
  static constexpr std::string_view escapes = "\\'\"abfnrtv", meanings = "\\'\"\a\b\f\n\r\t\v";
  for (std::size_t k = 1, at = 0; k + 1 < s.size(); ++k) {
    if (s[k] != '\\') {
      out += s[k];
    } else if (++k + 1 == s.size()) {
      return pickle_text_error(error, "text ends in a lone backslash");
    } else if ((at = escapes.find(s[k])) != std::string_view::npos) {
      out += meanings[at];
    } else if (s[k] == 'x' || (s[k] >= '0' && s[k] <= '7')) { // \xhh, or 1 to 3 octal digits
      const std::uint32_t base = s[k] == 'x' ? 16 : 8;
      const std::size_t first = base == 16 ? k + 1 : k;
      std::uint32_t value = 0;
      for (k = first; k + 1 < s.size() && k - first < (base == 16 ? 2U : 3U) && pickle_hex_digit(s[k]) < base; ++k) {
        value = value * base + pickle_hex_digit(s[k]);
      }
      if ((base == 16 && k - first < 2) || value > 0xff) {
        return pickle_text_error(error, "text has a \\x escape without two hex digits or an octal one above \\377");
      }
      out += static_cast<char>(value);
      --k;
    } else {
      out += '\\';
      out += s[k];
    }
  }
  return true;
}

/// A Python 2 str (STRING, BINSTRING, SHORT_BINSTRING): ASCII, as Python's default encoding for
/// them requires.
inline bool pickle_ascii(std::string_view s, std::string& error) {
  for (const char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) {
      return pickle_text_error(error, "holds byte " + pickle_hex(static_cast<unsigned char>(c)) +
                                          ", and a Python 2 string is ASCII");
    }
  }
  return true;
}

/// Code point `cp` appended to `text` in UTF-8, a surrogate in its three-byte form as with
/// "surrogatepass".
inline void pickle_put_utf8(std::string& text, std::uint32_t cp) {
  static constexpr std::uint32_t lead[] = {0, 0xc0, 0xe0, 0xf0};
  const int tail = cp < 0x80 ? 0 : cp < 0x800 ? 1 : cp < 0x10000 ? 2 : 3;
  text += static_cast<char>(lead[tail] | cp >> (6 * tail));
  for (int t = tail; t-- > 0;) {
    text += static_cast<char>(0x80 | (cp >> (6 * t) & 0x3f));
  }
}

/// UNICODE: raw-unicode-escape text, as Python decodes it, appended to `text` in UTF-8: bytes are
/// Latin-1 code points, and a backslash followed by u or U starts an escape of 4 or 8 hex digits
/// (followed by anything else, the backslash and that character stand for themselves). On failure
/// `text` holds part of it.
inline bool pickle_raw_unicode_escape(std::string_view s, std::string& text, std::string& error) {
  for (std::size_t k = 0; k < s.size(); ++k) {
    const auto c = static_cast<unsigned char>(s[k]);
    if (c != '\\' || k + 1 == s.size() || (s[k + 1] != 'u' && s[k + 1] != 'U')) {
      pickle_put_utf8(text, c);
      if (c == '\\' && k + 1 < s.size()) {
        pickle_put_utf8(text, static_cast<unsigned char>(s[++k]));
      }
      continue;
    }
    const std::size_t digits = s[++k] == 'u' ? 4 : 8;
    std::uint32_t cp = 0;
    for (std::size_t d = 0; d < digits; ++d) {
      if (++k == s.size() || pickle_hex_digit(s[k]) > 15) {
        return pickle_text_error(error, "text has a \\u or \\U escape without its hex digits");
      }
      cp = cp * 16 + pickle_hex_digit(s[k]);
    }
    if (cp > 0x10ffff) {
      return pickle_text_error(error, "text escapes a code point beyond U+10FFFF");
    }
    pickle_put_utf8(text, cp);
  }
  return true;
}

/// BINUNICODE and its short and 8-byte forms: UTF-8 as Python decodes it with "surrogatepass":
/// encoded surrogates (ED A0 80 .. ED BF BF) allowed, overlong forms and code points beyond
/// U+10FFFF not.
inline bool pickle_utf8(std::string_view s, std::string& error) {
  for (std::size_t k = 0; k < s.size();) {
    const std::size_t at = k;
    const auto lead = static_cast<unsigned char>(s[k++]);
    // The continuation bytes that follow, and the first one's range, which rules out overlong
    // forms and code points beyond U+10FFFF. No sequence starts with 0x80 .. 0xc1 or 0xf5 .. 0xff.
    const std::size_t tail = lead < 0x80 ? 0 : lead < 0xe0 ? 1 : lead < 0xf0 ? 2 : 3;
    const unsigned low = lead == 0xe0 ? 0xa0 : lead == 0xf0 ? 0x90 : 0x80;
    const unsigned high = lead == 0xf4 ? 0x8f : 0xbf;
    bool ok = lead < 0x80 || (lead >= 0xc2 && lead <= 0xf4);
    for (std::size_t t = 0; ok && t < tail; ++t, ++k) {
      const unsigned c = k < s.size() ? static_cast<unsigned char>(s[k]) : 0;
      ok = c >= (t == 0 ? low : 0x80) && c <= (t == 0 ? high : 0xbf);
    }
    if (!ok) {
      return pickle_text_error(error, "text is not UTF-8 (a bad sequence at its byte " + std::to_string(at) + ")");
    }
  }
  return true;
}

} // namespace carve::trace::detail
