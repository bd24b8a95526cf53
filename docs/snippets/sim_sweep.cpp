// The simulator as a library: three placements on the same 20 workloads, paired by seed.
#include <carve/sim.hpp>
#include <carve/slot.hpp> // the fit policies

#include <cstdio>
#include <vector>

int main() {
  const std::vector policies{carve::sim::contiguous<128, carve::FirstFit>(),
                             carve::sim::contiguous<128, carve::BoundaryNearestFit>(), carve::sim::bound<128>()};
  const carve::sim::WorkloadSpec spec; // 1000 workgroups, sizes uniform 1..32, run times 10..100 cycles
  std::vector<std::uint64_t> seeds;
  for (std::uint64_t s = 1; s <= 20; ++s) seeds.push_back(s);

  carve::sim::SweepOptions options; // every hardware thread
  options.measure_cost = false;     // no replay to time the allocator calls
  const auto table = carve::sim::sweep(
      policies, seeds, [&](std::uint64_t seed) { return carve::sim::generate(spec, seed); }, options);

  for (std::size_t p = 0; p < policies.size(); ++p) {
    double makespan = 0;
    for (const auto& row : table) makespan += static_cast<double>(row[p].result.makespan);
    std::printf("%-18s mean makespan %.1f cycles\n", policies[p].name.c_str(),
                makespan / static_cast<double>(seeds.size()));
  }
  // No contiguous policy can finish before the bound.
  for (const auto& row : table) {
    if (row[2].result.makespan > row[0].result.makespan || row[2].result.makespan > row[1].result.makespan) return 1;
  }
  return 0;
}
