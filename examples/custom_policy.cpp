// Writing your own fit policy: any type with a `find(bitmap, m)` that returns the start to use.
// This one keeps small requests at the low end and large ones at the high end, so the two
// kinds do not fragment each other's space.
#include <carve/slot.hpp>

#include <cstdio>

template <std::uint32_t LargeFrom>
struct SplitBySizeFit {
  static constexpr const char* name = "split-by-size";

  template <std::uint32_t N>
  CARVE_HOST_DEVICE constexpr cuda::std::optional<std::uint32_t> find(const carve::SlotBitmap<N>& bitmap,
                                                                      std::uint32_t m) const noexcept {
    return m >= LargeFrom ? bitmap.highest_run_start(m) : bitmap.lowest_run_start(m);
  }
};
static_assert(carve::FitPolicy<SplitBySizeFit<8>>); // checked at compile time, like carve's own

int main() {
  carve::SlotAllocator<64, SplitBySizeFit<8>> slots;
  for (const std::uint32_t m : {2u, 16u, 3u, 9u, 1u}) {
    const auto r = slots.allocate(m);
    if (!r) {
      std::printf("allocate(%u): %s\n", m, carve::to_string(r.error()));
      return 1;
    }
    std::printf("%-14s allocate(%2u) -> [%2u, %2u)\n", carve::policy_name<SplitBySizeFit<8>>(), m, r->first,
                r->first + r->count);
  }
  return 0;
}
