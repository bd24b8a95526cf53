/// @file carve/slot/policy/last_fit.hpp
/// The highest start that fits: allocations grow down from the top.
#pragma once

#include <carve/core/config.hpp>
#include <carve/slot/policy/fit_policy.hpp>
#include <carve/slot/search/run_search.hpp>
#include <carve/slot/storage/slot_bitmap.hpp>
#include <carve/slot/storage/word_source.hpp>

namespace carve {

/// Last fit: the highest start of m free slots.
struct LastFit {
  /// Shown in reports and tools.
  static constexpr const char* name = "last-fit";

  /// The start in `words`, or nullopt when nothing fits or m == 0.
  template <WordSource Words>
  CARVE_HOST_DEVICE constexpr cuda::std::optional<std::uint32_t> find_in(const Words& words, std::uint32_t /*slots*/,
                                                                         std::uint32_t m) const noexcept {
    return runs::highest_start(words, m);
  }

  /// The choice given both extreme candidates (for the cooperative searches in warp_scan.hpp).
  CARVE_HOST_DEVICE static constexpr cuda::std::optional<std::uint32_t> pick(runs::StartBounds b, std::uint32_t,
                                                                             std::uint32_t) noexcept {
    return b.found ? cuda::std::optional<std::uint32_t>(b.highest) : cuda::std::nullopt;
  }

  /// The start in `bitmap`, or nullopt when nothing fits or m == 0.
  template <std::uint32_t N>
  CARVE_HOST_DEVICE constexpr cuda::std::optional<std::uint32_t> find(const SlotBitmap<N>& bitmap,
                                                                      std::uint32_t m) const noexcept {
    return find_in(bitmap.words(), N, m);
  }
};
static_assert(WordSearchingFitPolicy<LastFit> && BoundsFitPolicy<LastFit>);

} // namespace carve
