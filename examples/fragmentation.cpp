// The same random stream of workgroups under each fit policy, with the bitmap printed after
// every step (1 = free, slot 0 first). Shows where each policy puts work and where the holes go.
#include <carve/fmt.hpp>
#include <carve/slot.hpp>

#include <fmt/core.h>

#include <random>
#include <vector>

template <class Fit>
void replay(std::uint64_t seed) {
  carve::SlotAllocator<48, Fit> slots;
  std::vector<carve::SlotRange> live;
  std::mt19937_64 rng(seed);
  fmt::print("{}:\n", carve::policy_name<Fit>());
  for (int step = 0; step < 16; ++step) {
    if (live.size() > 2 && rng() % 3 == 0) {
      const std::size_t k = rng() % live.size();
      (void)slots.deallocate(live[k]);
      fmt::print("  free  {:>8}  {}\n", live[k], slots.bitmap());
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
      continue;
    }
    const auto m = static_cast<std::uint32_t>(1 + rng() % 9);
    if (const auto r = slots.allocate(m)) {
      live.push_back(*r);
      fmt::print("  alloc {:>8}  {}\n", *r, slots.bitmap());
    } else {
      fmt::print("  alloc {:>8}  {} ({})\n", m, slots.bitmap(), r.error());
    }
  }
  fmt::print("  largest free run {} of {} free\n\n", slots.largest_free_run(), slots.free_count());
}

int main() {
  replay<carve::FirstFit>(7);
  replay<carve::BestFit>(7);
  replay<carve::BoundaryNearestFit>(7);
}
