/// @file carve/tier/byte_size.hpp
/// Sizes written the way people write them: "80GiB", "1.5 TiB", "512MB", "4096".
///
/// Binary (KiB, MiB, GiB, TiB) and decimal (kB, MB, GB, TB) units; no unit means bytes.
#pragma once

#include <carve/tier/spill_tier.hpp>

#include <cctype>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>

namespace carve {

/// The bytes `text` names, rounded to a whole byte; spaces around the number and unit are allowed.
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
  double value = 0;
  try {
    std::size_t used = 0;
    value = std::stod(s.substr(i, end - i), &used);
    if (used != end - i) {
      throw bad("malformed number");
    }
  } catch (const std::logic_error&) {
    throw bad("malformed number");
  }
  std::string unit;
  for (std::size_t k = end; k < s.size(); ++k) {
    if (!std::isspace(static_cast<unsigned char>(s[k]))) {
      unit += s[k];
    }
  }
  struct Unit {
    const char* name;
    double bytes;
  };
  static constexpr Unit units[] = {
      {"", 1},     {"B", 1},    {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0},
      {"kB", 1e3}, {"KB", 1e3}, {"MB", 1e6},     {"GB", 1e9},        {"TB", 1e12}};
  for (const Unit& u : units) {
    if (unit == u.name) {
      const double bytes = std::round(value * u.bytes);
      if (bytes >= 18446744073709551616.0) {
        throw bad("too large");
      }
      return static_cast<std::uint64_t>(bytes);
    }
  }
  throw bad("unknown unit (use B, KiB, MiB, GiB, TiB, kB, MB, GB or TB)");
}

} // namespace carve
