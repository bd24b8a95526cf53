/// @file carve/core/format_bytes.hpp
/// Byte counts as people read them, for messages and reports.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace carve {

/// `bytes` in binary units with one decimal: 1536 is "1.5 KiB", 3 GiB is "3.0 GiB"; exact below
/// 1 KiB ("512 B").
inline std::string format_bytes(std::uint64_t bytes) {
  static constexpr const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 5) {
    value /= 1024;
    ++unit;
  }
  char text[32];
  if (unit == 0) {
    std::snprintf(text, sizeof text, "%llu B", static_cast<unsigned long long>(bytes));
  } else {
    std::snprintf(text, sizeof text, "%.1f %s", value, units[unit]);
  }
  return text;
}

} // namespace carve
