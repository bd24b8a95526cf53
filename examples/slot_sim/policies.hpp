// The policies slot_sim measures. To measure your own, write it as a carve fit policy (see
// examples/custom_policy.cpp; a hinted one gets the expected run time through its hint) and add
// a line to `all_policies`.
#pragma once

#include <carve/sim.hpp>
#include <carve/slot.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace slot_sim {

// A simple idea, written here as any user would write a policy: small requests from the low end,
// large ones (more than N / 8 slots) from the high end, so the two kinds do not break up each
// other's space. It is measured beside carve's policies because it sounds good and often is not.
struct SplitBySizeFit {
  static constexpr const char* name = "split-by-size";

  template <std::uint32_t N>
  constexpr cuda::std::optional<std::uint32_t> find(const carve::SlotBitmap<N>& bitmap, std::uint32_t m) const {
    return m > N / 8 ? bitmap.highest_run_start(m) : bitmap.lowest_run_start(m);
  }
};
static_assert(carve::FitPolicy<SplitBySizeFit>);

// Every policy, first-fit first: it is the reference the others are compared with.
template <std::uint32_t N>
std::vector<carve::sim::PolicyRunner> all_policies() {
  using namespace carve;
  return {
      sim::contiguous<N, FirstFit>(),       sim::contiguous<N, LastFit>(),
      sim::contiguous<N, BestFit>(),        sim::contiguous<N, BoundaryNearestFit>(),
      sim::contiguous<N, SplitBySizeFit>(), sim::contiguous<N, ReleaseAlignedFit>(),
  };
}

inline std::vector<std::string> policy_names() {
  std::vector<std::string> names;
  for (const auto& p : all_policies<64>()) {
    names.push_back(p.name);
  }
  return names;
}

} // namespace slot_sim
