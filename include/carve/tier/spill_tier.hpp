/// @file carve/tier/spill_tier.hpp
/// The inputs of tier planning: GPUs, tasks and spill tiers.
///
/// Host-only. Sizes are bytes. A spill tier is memory a GPU's overflow can live in, in priority
/// order: system DRAM first, then CXL (far) memory, then a disk directory; more tiers are allowed.
/// Bad input anywhere in tier planning throws carve::Exception (core/error.hpp).
#pragma once

#include <carve/core/error.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace carve {

/// A GPU the planner places subtasks on.
struct TierGpu {
  int ordinal;            ///< the GPU's number, as reports show it
  std::uint64_t capacity; ///< device memory available to the tasks
};

/// A task to place: its memory need, split into one subtask per GPU.
struct TierTask {
  std::uint64_t need;                       ///< total memory the task needs
  std::vector<std::uint64_t> subtasks = {}; ///< one size per GPU, summing to need; empty: split evenly
  std::string name = {};                    ///< for error messages; empty: "task <index>"
};

/// Memory that GPUs' overflow spills into, shared among them by the planner.
struct SpillTier {
  std::string name;                 ///< for reports and errors
  std::uint64_t capacity;           ///< bytes the tier offers to all GPUs together
  int priority;                     ///< strictly increasing along the tier list: 1 is used first
  double bandwidth_gbps = 0;        ///< 0 when unknown
  std::vector<int> numa_nodes = {}; ///< memory tiers: the NUMA nodes that back them
  std::string directory = {};       ///< a disk tier: where its files go
};

} // namespace carve
