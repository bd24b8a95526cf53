/// @file carve/tier/byte_size.hpp
/// Sizes written the way people write them: "80GiB", "1.5 TiB", "512MB", "4096".
///
/// Binary (KiB, MiB, GiB, TiB) and decimal (kB, MB, GB, TB) units; no unit means bytes.
#pragma once

#include <carve/tier/spill_tier.hpp>

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>

namespace carve {

/// The bytes `text` names: a whole number exactly, a fraction ("1.5 TiB") rounded to a whole byte;
/// spaces around the number and unit are allowed.
/// Throws carve::Exception (invalid_argument) naming the text for anything else: no number, an
/// unknown unit, a negative size, or one past 2^64 - 1.
inline std::uint64_t parse_bytes(std::string_view text) {
  const std::string s(text);
  const auto bad = [&](const char* why) { return Exception(Errc::invalid_argument, "size '" + s + "': " + why); };
  std::size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) {
    ++i;
  }
  if (i < s.size() && s[i] == '-') {
    throw bad("a size cannot be negative");
  }
  std::size_t end = i;
  while (end < s.size() && (std::isdigit(static_cast<unsigned char>(s[end])) || s[end] == '.')) {
    ++end;
  }
  if (end == i) {
    throw bad("expected a number");
  }
  std::string unit;
  for (std::size_t k = end; k < s.size(); ++k) {
    if (!std::isspace(static_cast<unsigned char>(s[k]))) {
      unit += s[k];
    }
  }
  struct Unit {
    const char* name;
    std::uint64_t bytes;
  };
  static constexpr Unit units[] = {{"", 1},
                                   {"B", 1},
                                   {"KiB", std::uint64_t{1} << 10},
                                   {"MiB", std::uint64_t{1} << 20},
                                   {"GiB", std::uint64_t{1} << 30},
                                   {"TiB", std::uint64_t{1} << 40},
                                   {"kB", 1'000},
                                   {"KB", 1'000},
                                   {"MB", 1'000'000},
                                   {"GB", 1'000'000'000},
                                   {"TB", 1'000'000'000'000}};
  const std::string_view number(s.data() + i, end - i);
  for (const Unit& u : units) {
    if (unit != u.name) {
      continue;
    }
    if (number.find('.') == std::string_view::npos) { // whole: exact to the last byte
      std::uint64_t whole = 0;
      const auto [at, ec] = std::from_chars(number.data(), number.data() + number.size(), whole);
      if (ec == std::errc::result_out_of_range || (ec == std::errc{} && whole > UINT64_MAX / u.bytes)) {
        throw bad("too large");
      }
      if (ec != std::errc{} || at != number.data() + number.size()) {
        throw bad("malformed number");
      }
      return whole * u.bytes;
    }
    double value = 0;
    try {
      std::size_t used = 0;
      value = std::stod(std::string(number), &used);
      if (used != number.size()) {
        throw bad("malformed number");
      }
    } catch (const std::logic_error&) {
      throw bad("malformed number");
    }
    const double bytes = std::round(value * static_cast<double>(u.bytes));
    if (bytes >= 18446744073709551616.0) {
      throw bad("too large");
    }
    return static_cast<std::uint64_t>(bytes);
  }
  throw bad("unknown unit (use B, KiB, MiB, GiB, TiB, kB, MB, GB or TB)");
}

} // namespace carve
