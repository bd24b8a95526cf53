/// @file carve/sim/run_result.hpp
/// What one simulated run measures.
#pragma once

#include <carve/sim/compute_unit.hpp>
#include <carve/slot/storage/slot_range.hpp>

#include <cstdint>
#include <vector>

namespace carve::sim {

/// Where and when a workgroup was dispatched.
struct Placement {
  std::uint64_t cycle = 0; ///< when it was dispatched
  std::uint32_t cu = 0;    ///< which compute unit
  SlotRange range{0, 0};   ///< for the bound (PooledCu) only the count is meaningful
};

/// The state every `sample_every` cycles: queue length and idle slots over time.
struct Series {
  std::uint32_t sample_every = 0;       ///< cycles between samples
  std::vector<std::uint32_t> remaining; ///< workgroups not yet finished (queued, running or yet to arrive)
  std::vector<float> free_slots;        ///< free slots per compute unit
  std::vector<std::uint8_t> waiting;    ///< 1 when workgroups were waiting in the queue
};

/// One call the simulator made on a compute unit's allocator, kept so that the allocator's cost
/// can be timed afterwards without the simulator around it (see cost.hpp).
struct AllocatorOp {
  /// Which call.
  enum class Kind : std::uint8_t { probe, allocate, release };
  Kind kind;        ///< which call
  std::uint32_t cu; ///< on which compute unit
  Request request;  ///< probe, allocate
  SlotRange range;  ///< release
};

/// Everything one run of the dispatcher measured.
struct RunResult {
  std::uint64_t makespan = 0;      ///< cycle at which the last workgroup is released
  std::uint64_t last_dispatch = 0; ///< cycle at which the queue emptied for good
  std::uint64_t decisions = 0;     ///< placement attempts (one workgroup tried on the compute units)

  // While workgroups wait in the queue (time-weighted means over those cycles):
  std::uint64_t waiting_cycles = 0; ///< cycles during which workgroups waited in the queue
  double idle_slots = 0;            ///< free slots per compute unit: memory nobody can use
  double free_runs = 0;             ///< maximal free runs per compute unit
  double largest_run_share = 0;     ///< largest free run / free slots, per compute unit with free slots

  std::uint64_t blocked_cycles = 0;               ///< cycles the queue head could not be placed
  std::uint64_t fragmentation_blocked_cycles = 0; ///< ... although a compute unit had enough free slots
  std::uint32_t fragmentation_blocked_groups = 0; ///< workgroups that ever waited that way

  // Placements per slot (contiguous units only; the bound has no slot identity).
  std::vector<std::uint64_t> wear; ///< placements per slot index, summed over compute units
  double wear_max_over_mean = 0;   ///< over every (unit, slot)
  double wear_cv = 0;              ///< coefficient of variation over every (unit, slot)
  double wear_low_half = 0;        ///< share of slot placements in the lower half of the slots

  std::vector<Placement> placements; ///< per workgroup, in the order given
  Series series;                     ///< sampled when DispatchOptions::sample_every is set
  std::vector<AllocatorOp> ops;      ///< only when asked for
};

} // namespace carve::sim
