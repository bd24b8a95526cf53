/// @file carve/sim/cost.hpp
/// What the allocator's decisions cost, timed apart from the simulator.
///
/// Timing each call inside the simulation would measure the clock more than the allocator (a
/// clock read costs about as much as a find on 128 slots). Instead the run records every call
/// it made (DispatchOptions::record_ops) and the calls are replayed here, in order, on fresh
/// allocators, as one timed loop. The replay repeats the run's exact sequence, so failed
/// searches of a blocked head and the releases between decisions are included, as in use.
#pragma once

#include <carve/sim/compute_unit.hpp>
#include <carve/sim/run_result.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <vector>

namespace carve::sim {

/// Nanoseconds per decision (placement attempt) for the recorded `ops` of a run on `cus` units
/// of ContiguousCu<N, Fit>: the fastest of `repeats` replays, divided by `decisions`.
template <std::uint32_t N, class Fit>
double replay_ns_per_decision(const std::vector<AllocatorOp>& ops, std::uint32_t cus, std::uint64_t decisions,
                              const Fit& fit = Fit{}, int repeats = 3) {
  using Unit = ContiguousCu<N, Fit>;
  if (decisions == 0 || ops.empty()) {
    return 0.0;
  }
  double best = std::numeric_limits<double>::infinity();
  std::uint64_t sink = 0;
  for (int rep = 0; rep < repeats; ++rep) {
    std::vector<typename Unit::allocator_type> allocators(cus, typename Unit::allocator_type(fit));
    const auto start = std::chrono::steady_clock::now();
    for (const AllocatorOp& op : ops) {
      auto& a = allocators[op.cu];
      switch (op.kind) {
      case AllocatorOp::Kind::probe:
        sink += Unit::find(a, op.request).value_or(0);
        break;
      case AllocatorOp::Kind::allocate:
        if (const auto r = Unit::allocate(a, op.request)) {
          sink += r->first;
        }
        break;
      case AllocatorOp::Kind::release:
        sink += a.deallocate(op.range).has_value() ? 1u : 0u;
        break;
      }
    }
    const std::chrono::duration<double, std::nano> elapsed = std::chrono::steady_clock::now() - start;
    best = std::min(best, elapsed.count());
  }
  // Keeps the replayed results observable, so the loop cannot be optimised away.
  asm volatile("" : : "r"(sink));
  return best / static_cast<double>(decisions);
}

} // namespace carve::sim
