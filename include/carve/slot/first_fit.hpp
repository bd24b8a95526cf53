// carve/slot/first_fit.hpp — the lowest start that fits (the classic address-ordered first fit).
#pragma once

#include <carve/core/config.hpp>
#include <carve/slot/fit_policy.hpp>
#include <carve/slot/slot_bitmap.hpp>

namespace carve {

struct FirstFit {
  static constexpr const char* name = "first-fit";

  template <std::uint32_t N>
  CARVE_HOST_DEVICE constexpr cuda::std::optional<std::uint32_t> find(const SlotBitmap<N>& bitmap,
                                                                      std::uint32_t m) const noexcept {
    return bitmap.lowest_run_start(m);
  }
};
static_assert(FitPolicy<FirstFit>);

} // namespace carve
