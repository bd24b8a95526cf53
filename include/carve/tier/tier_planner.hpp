/// @file carve/tier/tier_planner.hpp
/// Fair, pre-reserved shares of spill tiers for every GPU.
///
/// Tasks are each split into one subtask per GPU and placed by the rules below; a GPU whose
/// subtasks need more than its memory has an extra to spill. GPUs are planned one after another,
/// each offered from every tier a share = the tier's remaining capacity / the GPUs not yet
/// planned, and its extra is served from tier 1 while the share lasts, then tier 2, and so on.
/// The shares are set aside before any task runs, so no GPU can take over a tier's capacity (and
/// with it the tier's bandwidth) from the others, as happens when memory is simply handed out in
/// the order GPUs ask for it (first_come_first_served, kept here for comparison).
///
/// Placement: tasks are taken largest first (ties keep their input order). With no more tasks
/// than GPUs, subtask k of every task goes to GPU k. With more tasks than GPUs, tasks alternate
/// direction: even tasks put subtask k on GPU k, odd ones on GPU G-1-k, so consecutive tasks start
/// on opposite ends and a large first subtask does not always land on GPU 0.
///
/// Reservation: by default a GPU that uses a tier reserves its whole share of it (what it does
/// not fill stays idle). With `hand_back_unused`, it reserves only what it uses and the rest flows
/// to the GPUs planned after it.
#pragma once

#include <carve/core/checked_math.hpp>
#include <carve/tier/spill_tier.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <string>
#include <unordered_set>
#include <vector>

namespace carve {

/// How the fair-share plan reserves.
struct TierPlanOptions {
  bool hand_back_unused = false; ///< reserve only what a GPU uses of its share, not all of it
};

/// Where one subtask runs.
struct SubtaskPlacement {
  std::size_t task;    ///< index into the task list as given
  std::size_t subtask; ///< k
  std::size_t gpu;     ///< index into the planner's GPU list (ordinal order)
  std::uint64_t bytes; ///< the subtask's size
};

/// One GPU's use of one tier in a plan.
struct GpuTierUse {
  std::uint64_t share;    ///< offered when the GPU was planned
  std::uint64_t used;     ///< bytes of the GPU's extra placed on this tier
  std::uint64_t reserved; ///< bytes set aside for the GPU on this tier (>= used)
};

/// One GPU in a plan: what its subtasks need and where its extra spills.
struct GpuPlan {
  int ordinal;                   ///< the GPU's number
  std::uint64_t capacity;        ///< its memory for the tasks
  std::uint64_t demand;          ///< sum of the GPU's subtasks
  std::uint64_t extra;           ///< demand - capacity, or 0
  std::vector<GpuTierUse> tiers; ///< one per tier, in the plan's tier order
  std::uint64_t unmet;           ///< extra no tier could take
};

/// A plan: the placements and every GPU's use of every tier.
struct TierPlan {
  std::vector<SpillTier> tiers;             ///< the planner's tiers
  std::vector<GpuPlan> gpus;                ///< in ordinal order, as planned
  std::vector<SubtaskPlacement> placements; ///< every subtask of every task
  TierPlanOptions options;                  ///< the planner's options
  std::string method;                       ///< "fair shares" or "first come, first served"

  /// Bytes of extra no tier could take, over all GPUs.
  std::uint64_t unmet() const {
    std::uint64_t total = 0;
    for (const GpuPlan& g : gpus) {
      total += g.unmet;
    }
    return total;
  }
};

/// Plans GPUs' spill over tiers (see the file's description). A value; its calls are const.
class TierPlanner {
public:
  /// GPUs are kept in ordinal order, whatever order they are given in: "GPU k" in the placement
  /// rules and the planning order both mean the k-th ordinal, and gpus() and every plan list them
  /// so. Throws carve::Exception (invalid_argument) for: no GPUs, a GPU without memory, a GPU
  /// ordinal given twice, no tiers, a tier without capacity, or tier priorities that do not
  /// strictly increase.
  TierPlanner(std::vector<TierGpu> gpus, std::vector<SpillTier> tiers, TierPlanOptions options = {})
      : gpus_(std::move(gpus)), tiers_(std::move(tiers)), options_(options) {
    if (gpus_.empty()) {
      throw Exception(Errc::invalid_argument, "tier planner: no GPUs");
    }
    std::stable_sort(gpus_.begin(), gpus_.end(),
                     [](const TierGpu& a, const TierGpu& b) { return a.ordinal < b.ordinal; });
    std::unordered_set<int> ordinals;
    for (const TierGpu& g : gpus_) {
      if (g.capacity == 0) {
        throw Exception(Errc::invalid_argument,
                        "tier planner: GPU " + std::to_string(g.ordinal) + " has no memory (capacity 0)");
      }
      if (!ordinals.insert(g.ordinal).second) {
        throw Exception(Errc::invalid_argument,
                        "tier planner: GPU ordinal " + std::to_string(g.ordinal) + " is given twice");
      }
    }
    if (tiers_.empty()) {
      throw Exception(Errc::invalid_argument, "tier planner: no spill tiers");
    }
    for (std::size_t t = 0; t < tiers_.size(); ++t) {
      if (tiers_[t].capacity == 0) {
        throw Exception(Errc::invalid_argument, "tier planner: tier '" + tiers_[t].name + "' has no capacity");
      }
      if (t > 0 && tiers_[t].priority <= tiers_[t - 1].priority) {
        throw Exception(Errc::invalid_argument, "tier planner: tier priorities must increase along the list ('" +
                                                    tiers_[t - 1].name + "' has " +
                                                    std::to_string(tiers_[t - 1].priority) + ", '" + tiers_[t].name +
                                                    "' has " + std::to_string(tiers_[t].priority) + ")");
      }
    }
  }

  /// The GPUs, in ordinal order.
  const std::vector<TierGpu>& gpus() const noexcept { return gpus_; }
  /// The tiers, in priority order.
  const std::vector<SpillTier>& tiers() const noexcept { return tiers_; }

  /// Where every subtask goes. Throws carve::Exception (invalid_argument) for a task needing
  /// nothing, subtask sizes that are not one per GPU or do not add up to the task's need, or
  /// sizes summing past 2^64 bytes.
  std::vector<SubtaskPlacement> place(const std::vector<TierTask>& tasks) const {
    const std::size_t g = gpus_.size();
    std::vector<std::size_t> order(tasks.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return tasks[a].need > tasks[b].need; });
    const bool alternate = tasks.size() > g;
    std::vector<SubtaskPlacement> placements;
    placements.reserve(tasks.size() * g);
    for (std::size_t rank = 0; rank < order.size(); ++rank) {
      const std::size_t t = order[rank];
      const std::vector<std::uint64_t> sizes = subtask_sizes(tasks[t], t);
      const bool reverse = alternate && rank % 2 == 1;
      for (std::size_t k = 0; k < g; ++k) {
        placements.push_back({t, k, reverse ? g - 1 - k : k, sizes[k]});
      }
    }
    return placements;
  }

  /// The fair-share plan. Throws as place() does.
  TierPlan plan(const std::vector<TierTask>& tasks) const {
    TierPlan p = start_plan(tasks, "fair shares");
    std::vector<std::uint64_t> remaining = capacities();
    for (std::size_t i = 0; i < p.gpus.size(); ++i) {
      const std::uint64_t unplanned = p.gpus.size() - i;
      GpuPlan& gpu = p.gpus[i];
      std::uint64_t left = gpu.extra;
      for (std::size_t t = 0; t < tiers_.size(); ++t) {
        GpuTierUse& use = gpu.tiers[t];
        use.share = remaining[t] / unplanned;
        use.used = std::min(left, use.share);
        use.reserved = use.used == 0 ? 0 : options_.hand_back_unused ? use.used : use.share;
        left -= use.used;
        remaining[t] -= use.reserved;
      }
      gpu.unmet = left;
    }
    return p;
  }

  /// The practice fair shares replace: each GPU in turn takes what it needs from the fastest tier
  /// that still has room, leaving the rest to whoever comes later. Throws as place() does.
  TierPlan first_come_first_served(const std::vector<TierTask>& tasks) const {
    TierPlan p = start_plan(tasks, "first come, first served");
    std::vector<std::uint64_t> remaining = capacities();
    for (GpuPlan& gpu : p.gpus) {
      std::uint64_t left = gpu.extra;
      for (std::size_t t = 0; t < tiers_.size(); ++t) {
        GpuTierUse& use = gpu.tiers[t];
        use.share = remaining[t];
        use.used = std::min(left, remaining[t]);
        use.reserved = use.used;
        left -= use.used;
        remaining[t] -= use.used;
      }
      gpu.unmet = left;
    }
    return p;
  }

private:
  std::vector<std::uint64_t> subtask_sizes(const TierTask& task, std::size_t index) const {
    const std::size_t g = gpus_.size();
    const std::string name = task_name(task, index);
    if (task.need == 0) {
      throw Exception(Errc::invalid_argument, "tier planner: " + name + " needs no memory");
    }
    if (task.subtasks.empty()) {
      // Even split; the first need % G subtasks take one byte more.
      std::vector<std::uint64_t> sizes(g, task.need / g);
      for (std::size_t k = 0; k < task.need % g; ++k) {
        ++sizes[k];
      }
      return sizes;
    }
    if (task.subtasks.size() != g) {
      throw Exception(Errc::invalid_argument, "tier planner: " + name + " has " + std::to_string(task.subtasks.size()) +
                                                  " subtask sizes for " + std::to_string(g) + " GPUs");
    }
    std::uint64_t sum = 0;
    for (const std::uint64_t bytes : task.subtasks) {
      const auto next = checked_add(sum, bytes);
      if (!next) {
        throw too_large("the subtasks of " + name + " add up to");
      }
      sum = *next;
    }
    if (sum != task.need) {
      throw Exception(Errc::invalid_argument, "tier planner: " + name + "'s subtasks add up to " + std::to_string(sum) +
                                                  " bytes, not " + std::to_string(task.need));
    }
    return task.subtasks;
  }

  std::vector<std::uint64_t> capacities() const {
    std::vector<std::uint64_t> c;
    for (const SpillTier& t : tiers_) {
      c.push_back(t.capacity);
    }
    return c;
  }

  static std::string task_name(const TierTask& task, std::size_t index) {
    return task.name.empty() ? "task " + std::to_string(index) : "task '" + task.name + "'";
  }
  // Thrown where a sum of sizes would pass 2^64 bytes: wrapped, it would be a small, wrong size.
  static Exception too_large(const std::string& what) {
    return Exception(Errc::invalid_argument, "tier planner: " + what + " more than 2^64 bytes (16 EiB)");
  }

  TierPlan start_plan(const std::vector<TierTask>& tasks, const char* method) const {
    TierPlan p{tiers_, {}, place(tasks), options_, method};
    for (const TierGpu& g : gpus_) {
      p.gpus.push_back({g.ordinal, g.capacity, 0, 0, std::vector<GpuTierUse>(tiers_.size()), 0});
    }
    // The total over all GPUs bounds every sum a plan reports (TierPlan::unmet among them).
    std::uint64_t total = 0;
    for (const SubtaskPlacement& s : p.placements) {
      GpuPlan& gpu = p.gpus[s.gpu];
      const auto demand = checked_add(gpu.demand, s.bytes);
      const auto sum = checked_add(total, s.bytes);
      if (!demand || !sum) {
        throw too_large((demand ? std::string("the tasks") : "GPU " + std::to_string(gpu.ordinal) + "'s subtasks") +
                        " with " + task_name(tasks[s.task], s.task) + " need");
      }
      gpu.demand = *demand;
      total = *sum;
    }
    for (GpuPlan& g : p.gpus) {
      g.extra = g.demand > g.capacity ? g.demand - g.capacity : 0;
    }
    return p;
  }

  std::vector<TierGpu> gpus_;
  std::vector<SpillTier> tiers_;
  TierPlanOptions options_;
};

} // namespace carve
