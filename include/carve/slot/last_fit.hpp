// carve/slot/last_fit.hpp — the highest start that fits: allocations grow down from the top.
#pragma once

#include <carve/core/config.hpp>
#include <carve/slot/fit_policy.hpp>
#include <carve/slot/slot_bitmap.hpp>

namespace carve {

struct LastFit {
  static constexpr const char* name = "last-fit";

  template <std::uint32_t N>
  CARVE_HOST_DEVICE constexpr cuda::std::optional<std::uint32_t> find(const SlotBitmap<N>& bitmap,
                                                                      std::uint32_t m) const noexcept {
    return bitmap.highest_run_start(m);
  }
};
static_assert(FitPolicy<LastFit>);

} // namespace carve
