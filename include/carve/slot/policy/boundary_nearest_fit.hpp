/// @file carve/slot/policy/boundary_nearest_fit.hpp
/// The fit closest to either end of the slot space.
///
/// Let i be the lowest start of m free slots and j the highest. i lies i slots from the low end;
/// a run at j ends N - j - m slots from the high end. The nearer one wins, ties going low:
/// i when i + j <= N - m, else j. Allocations pack against both ends, so wear is spread over
/// both and free space collects in the middle, where it stays contiguous.
///
/// Only the two extreme candidates matter, so the search stops at the first fit from each end
/// instead of building the whole run-start mask (see runs::start_bounds).
#pragma once

#include <carve/core/config.hpp>
#include <carve/slot/policy/fit_policy.hpp>
#include <carve/slot/search/run_search.hpp>
#include <carve/slot/storage/slot_bitmap.hpp>
#include <carve/slot/storage/word_source.hpp>

namespace carve {

/// Boundary-nearest fit: the lowest or the highest fitting start, whichever lies nearer its end.
struct BoundaryNearestFit {
  /// Shown in reports and tools.
  static constexpr const char* name = "boundary-nearest";

  /// The rule, given both extreme candidates: the low one when i + j <= N - m, else the high one.
  CARVE_HOST_DEVICE static constexpr cuda::std::optional<std::uint32_t> pick(runs::StartBounds b, std::uint32_t slots,
                                                                             std::uint32_t m) noexcept {
    if (!b.found) {
      return cuda::std::nullopt;
    }
    return b.lowest + b.highest <= slots - m ? b.lowest : b.highest;
  }

  /// The start in the first `slots` slots of `words`, or nullopt when nothing fits or m == 0.
  template <WordSource Words>
  CARVE_HOST_DEVICE constexpr cuda::std::optional<std::uint32_t> find_in(const Words& words, std::uint32_t slots,
                                                                         std::uint32_t m) const noexcept {
    return pick(runs::start_bounds(words, m), slots, m);
  }

  /// The start in `bitmap`, or nullopt when nothing fits or m == 0.
  template <std::uint32_t N>
  CARVE_HOST_DEVICE constexpr cuda::std::optional<std::uint32_t> find(const SlotBitmap<N>& bitmap,
                                                                      std::uint32_t m) const noexcept {
    return find_in(bitmap.words(), N, m);
  }
};
static_assert(WordSearchingFitPolicy<BoundaryNearestFit> && BoundsFitPolicy<BoundaryNearestFit>);

} // namespace carve
