/// @file carve/fmt.hpp
/// fmt formatters for carve's value types: SlotBitmap, SlotRange and Errc.
///
/// Optional: needs the fmt library, which `<carve/carve.hpp>` does not pull in. Width, fill and
/// alignment work as for strings.
///
/// @code
/// fmt::print("{}\n", bitmap);   // 0111_1001_1111_1100   (slot 0 first, 1 = free)
/// fmt::print("{}\n", range);    // [7, 11)
/// fmt::print("{}\n", errc);     // no space
/// @endcode
#pragma once

#include <carve/carve.hpp>

#include <fmt/format.h>

#include <cstdint>
#include <string>

// The specialisations below are fmt's extension points, described in the file's comment; the
// reference leaves them out, as it does std::is_error_code_enum<carve::Errc>.
/// @cond
template <std::uint32_t N>
struct fmt::formatter<carve::SlotBitmap<N>> : fmt::formatter<fmt::string_view> {
  template <class FormatContext>
  auto format(const carve::SlotBitmap<N>& bitmap, FormatContext& ctx) const {
    std::string bits;
    bits.reserve(N + N / 4);
    for (std::uint32_t slot = 0; slot < N; ++slot) {
      if (slot != 0 && slot % 4 == 0) {
        bits += '_';
      }
      bits += bitmap.is_free(slot) ? '1' : '0';
    }
    return fmt::formatter<fmt::string_view>::format(bits, ctx);
  }
};

template <>
struct fmt::formatter<carve::SlotRange> : fmt::formatter<fmt::string_view> {
  template <class FormatContext>
  auto format(const carve::SlotRange& range, FormatContext& ctx) const {
    return fmt::formatter<fmt::string_view>::format(fmt::format("[{}, {})", range.first, range.end()), ctx);
  }
};

template <>
struct fmt::formatter<carve::Errc> : fmt::formatter<fmt::string_view> {
  template <class FormatContext>
  auto format(carve::Errc e, FormatContext& ctx) const {
    return fmt::formatter<fmt::string_view>::format(carve::to_string(e), ctx);
  }
};
/// @endcond
