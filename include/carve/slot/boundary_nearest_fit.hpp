// carve/slot/boundary_nearest_fit.hpp — the fit closest to either end of the slot space.
//
// Let i be the lowest start of m free slots and j the highest. i lies i slots from the low end;
// a run at j ends N - j - m slots from the high end. The nearer one wins, ties going low:
// i when i + j <= N - m, else j. Allocations pack against both ends, so wear is spread over
// both and free space collects in the middle, where it stays contiguous.
//
// Only the two extreme candidates matter, so the search stops at the first fit from each end
// instead of building the whole run-start mask (see runs::start_bounds).
#pragma once

#include <carve/core/config.hpp>
#include <carve/slot/fit_policy.hpp>
#include <carve/slot/slot_bitmap.hpp>

namespace carve {

struct BoundaryNearestFit {
  static constexpr const char* name = "boundary-nearest";

  template <std::uint32_t N>
  CARVE_HOST_DEVICE constexpr cuda::std::optional<std::uint32_t> find(const SlotBitmap<N>& bitmap,
                                                                      std::uint32_t m) const noexcept {
    const runs::StartBounds b = bitmap.run_start_bounds(m);
    if (!b.found) {
      return cuda::std::nullopt;
    }
    return b.lowest + b.highest <= N - m ? b.lowest : b.highest;
  }
};
static_assert(FitPolicy<BoundaryNearestFit>);

} // namespace carve
