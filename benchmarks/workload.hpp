// Bitmaps as they look in use: snapshots of a random allocate/free process, paired with the
// request size to look up.
#pragma once

#include <carve/slot.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace carve::bench {

template <std::uint32_t N>
struct FindInput {
  SlotBitmap<N> bitmap;
  std::uint32_t m;
};

// Request sizes: uniform in [1, max], or log-uniform in [1, max] (as many 1-2 slot requests
// as 512-1024 slot ones, for sweeps where m goes up to N).
struct SizeDistribution {
  std::uint32_t max;
  bool log_uniform;

  std::uint32_t operator()(std::mt19937_64& rng) const {
    if (!log_uniform) {
      return std::uniform_int_distribution<std::uint32_t>(1, max)(rng);
    }
    const double x = std::uniform_real_distribution<double>(0.0, std::log(max + 1.0))(rng);
    return std::clamp(static_cast<std::uint32_t>(std::exp(x)), 1u, max);
  }
};

// Runs allocate/free under Fit, holding occupancy around a drifting target between 40% and 95%,
// and appends a snapshot every few steps once the process is warm.
template <std::uint32_t N, class Fit>
void snapshot_process(std::vector<SlotBitmap<N>>& out, std::size_t count, SizeDistribution sizes,
                      std::mt19937_64& rng) {
  SlotAllocator<N, Fit> slots;
  std::vector<SlotRange> live;
  double target = 0.7;
  const std::size_t warmup = 4 * N;
  for (std::size_t step = 0; out.size() < count; ++step) {
    if (step % 64 == 0) {
      target = std::uniform_real_distribution<double>(0.4, 0.95)(rng);
    }
    const double used = 1.0 - static_cast<double>(slots.free_count()) / N;
    bool freed = false;
    if (used > target && !live.empty()) {
      const std::size_t k = std::uniform_int_distribution<std::size_t>(0, live.size() - 1)(rng);
      (void)slots.deallocate(live[k]);
      live[k] = live.back();
      live.pop_back();
      freed = true;
    }
    if (!freed) {
      if (const auto r = slots.allocate(sizes(rng))) {
        live.push_back(*r);
      } else if (!live.empty()) { // full for this size: make room, as a scheduler would
        (void)slots.deallocate(live.front());
        live.front() = live.back();
        live.pop_back();
      }
    }
    if (step >= warmup && step % 7 == 0) {
      out.push_back(slots.bitmap());
    }
  }
}

// `count` lookups over bitmaps from processes run under first fit, best fit and boundary-nearest
// (each leaves a different shape of fragmentation), with request sizes from `queries`.
template <std::uint32_t N>
std::vector<FindInput<N>> fragmented_inputs(std::size_t count, SizeDistribution process_sizes, SizeDistribution queries,
                                            std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<SlotBitmap<N>> bitmaps;
  snapshot_process<N, FirstFit>(bitmaps, count / 3, process_sizes, rng);
  snapshot_process<N, BestFit>(bitmaps, 2 * count / 3, process_sizes, rng);
  snapshot_process<N, BoundaryNearestFit>(bitmaps, count, process_sizes, rng);
  std::shuffle(bitmaps.begin(), bitmaps.end(), rng);
  std::vector<FindInput<N>> inputs;
  inputs.reserve(count);
  for (const auto& b : bitmaps) {
    inputs.push_back({b, queries(rng)});
  }
  return inputs;
}

} // namespace carve::bench
