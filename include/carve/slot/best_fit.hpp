// carve/slot/best_fit.hpp — the start of the smallest maximal free run that holds m.
//
// Keeps large runs intact for large requests. Ties go to the lowest run, and a run of exactly m
// ends the search early. Cost is one walk over the free runs: O(words + runs).
#pragma once

#include <carve/core/config.hpp>
#include <carve/slot/fit_policy.hpp>
#include <carve/slot/slot_bitmap.hpp>

namespace carve {

struct BestFit {
  static constexpr const char* name = "best-fit";

  template <std::uint32_t N>
  CARVE_HOST_DEVICE constexpr cuda::std::optional<std::uint32_t> find(const SlotBitmap<N>& bitmap,
                                                                      std::uint32_t m) const noexcept {
    if (m == 0) {
      return cuda::std::nullopt;
    }
    cuda::std::optional<std::uint32_t> best;
    std::uint32_t best_count = 0;
    for (const SlotRange run : bitmap.free_runs()) {
      if (run.count >= m && (!best || run.count < best_count)) {
        best = run.first;
        best_count = run.count;
        if (run.count == m) {
          break;
        }
      }
    }
    return best;
  }
};
static_assert(FitPolicy<BestFit>);

} // namespace carve
