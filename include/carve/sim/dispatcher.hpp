/// @file carve/sim/dispatcher.hpp
/// The workgroup dispatcher: a FIFO of workgroups over compute units.
///
/// Time runs in cycles. At each cycle t:
///   1. every workgroup that finishes at t releases its slots (releases come before allocations,
///      so slots freed at t can be taken at t);
///   2. workgroups arriving at t join the back of the queue;
///   3. up to `width` times, the first `window` queued workgroups are tried in order and the
///      first that fits is dispatched (on the compute unit `choice` picks) and leaves the queue.
///      With window 1 a head that fits nowhere blocks everything behind it (head-of-line
///      blocking, a strict FIFO); a larger window backfills past it.
/// A workgroup dispatched at t is released at t + duration. The makespan is the cycle of the
/// last release. A workgroup that waits for a launch (Workgroup::after) arrives `arrival` cycles
/// after that launch's last workgroup is released.
///
/// What a hinted policy is told about a request's run time is HintOptions::mode: the real run
/// time (exact: the upper reference, an oracle no scheduler has), the workload's expected run time
/// (given), a per-kernel or one overall offline mean, or a RunTimePredictor learning from the
/// completions seen so far (learned). Nothing changes between releases and arrivals, so the simulation jumps from
/// one such event to the next: cost grows with the number of workgroups, not of cycles.
#pragma once

#include <carve/core/error.hpp>
#include <carve/sim/compute_unit.hpp>
#include <carve/sim/run_result.hpp>
#include <carve/sim/workload.hpp>
#include <carve/slot/batch/cu_choice.hpp>
#include <carve/slot/policy/run_time_predictor.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <limits>
#include <numeric>
#include <optional>
#include <queue>
#include <stdexcept>
#include <string>
#include <vector>

/// The workgroup scheduling simulator: workloads, compute units, the dispatcher, sweeps over
/// seeds and policies, and their statistics.
namespace carve::sim {

/// Which compute unit gets a workgroup that fits on several.
enum class CuChoice {
  first,           ///< the lowest-numbered unit where it fits
  least_loaded,    ///< the unit with the most free slots
  nearest_boundary ///< the unit where the policy's start lies nearest an end of the slots
                   ///< (ties: most free slots, then lowest number)
};

/// Its name in reports: "first", "least-loaded", "nearest-boundary".
inline const char* to_string(CuChoice c) {
  switch (c) {
  case CuChoice::first:
    return "first";
  case CuChoice::least_loaded:
    return "least-loaded";
  case CuChoice::nearest_boundary:
    return "nearest-boundary";
  }
  return "?";
}

/// Where the run time a hinted policy is told comes from.
enum class HintMode {
  given,      ///< the workload's expected run time (a trace's column, or noisy run times)
  exact,      ///< the real run time: the upper reference, an oracle
  per_kernel, ///< the mean run time of the workgroup's kernel over the whole workload (an offline profile)
  constant,   ///< the mean run time over the whole workload, one value for all
  learned     ///< a RunTimePredictor per kernel, from the completions seen so far
};

/// Its name in reports: "given", "exact", "per-kernel", "constant", "learned".
inline const char* to_string(HintMode m) {
  switch (m) {
  case HintMode::given:
    return "given";
  case HintMode::exact:
    return "exact";
  case HintMode::per_kernel:
    return "per-kernel";
  case HintMode::constant:
    return "constant";
  case HintMode::learned:
    return "learned";
  }
  return "?";
}

/// Kernel types the learned hints keep an estimate for; more share entries (RunTimePredictor).
inline constexpr std::uint32_t predictor_kernels = 64;

/// What hinted policies are told.
struct HintOptions {
  HintMode mode = HintMode::given;      ///< where the run time comes from
  RunTimePredictorSettings predictor{}; ///< for HintMode::learned
};

/// How the dispatcher runs.
struct DispatchOptions {
  HintOptions hints{};               ///< what hinted policies are told
  std::uint32_t cus = 1;             ///< compute units
  std::uint32_t window = 1;          ///< workgroups the dispatcher looks at: 1 is a strict FIFO
  std::uint32_t width = 1;           ///< dispatches per cycle; 0 for no limit
  CuChoice choice = CuChoice::first; ///< which unit gets a workgroup that fits on several
  std::uint32_t sample_every = 0;    ///< cycles between time-series samples; 0 for none
  /// Samples kept at most: a run whose arrivals span far more cycles than `sample_every` x this
  /// keeps only its first samples, so the series never grows with idle time.
  std::uint32_t max_samples = 1u << 16;
  bool record_ops = false; ///< keep every allocator call in RunResult::ops
};

namespace detail {

struct Running {
  std::uint64_t finish;
  std::uint32_t group;
  std::uint32_t cu;
  SlotRange range;

  friend bool operator>(const Running& a, const Running& b) {
    return a.finish != b.finish ? a.finish > b.finish : a.group > b.group;
  }
};

// Per-slot wear statistics over every (unit, slot).
template <class Cu>
void wear_statistics(const std::vector<Cu>& units, RunResult& out) {
  constexpr std::uint32_t n = Cu::slots;
  out.wear.assign(n, 0);
  double sum = 0;
  double sum_sq = 0;
  double max = 0;
  double low = 0;
  for (const Cu& cu : units) {
    for (std::uint32_t s = 0; s < n; ++s) {
      const auto w = static_cast<double>(cu.wear()[s]);
      out.wear[s] += cu.wear()[s];
      sum += w;
      sum_sq += w * w;
      max = std::max(max, w);
      low += s < n / 2 ? w : 0.0;
    }
  }
  const double count = static_cast<double>(units.size()) * n;
  const double mean = sum / count;
  if (mean > 0) {
    out.wear_max_over_mean = max / mean;
    out.wear_cv = std::sqrt(std::max(0.0, sum_sq / count - mean * mean)) / mean;
    out.wear_low_half = low / sum;
  }
}

} // namespace detail

/// Runs `workgroups` through the dispatcher on `options.cus` copies of `prototype`.
/// Throws carve::Exception (invalid_argument) for a workgroup that can never fit or never
/// finishes, and for no compute units or a window of 0.
template <ComputeUnit Cu>
RunResult simulate(const std::vector<Workgroup>& workgroups, const DispatchOptions& options,
                   const Cu& prototype = Cu{}) {
  if (options.cus == 0 || options.window == 0) {
    throw Exception(Errc::invalid_argument, "simulate: need at least one compute unit and a window of at least 1");
  }
  const auto count = static_cast<std::uint32_t>(workgroups.size());
  for (std::uint32_t i = 0; i < count; ++i) {
    const Workgroup& w = workgroups[i];
    if (w.size == 0 || w.size > Cu::slots || w.duration == 0) {
      throw Exception(Errc::invalid_argument, "simulate: workgroup " + std::to_string(i) + " has size " +
                                                  std::to_string(w.size) + " and duration " +
                                                  std::to_string(w.duration) + "; need 1.." +
                                                  std::to_string(Cu::slots) + " slots and at least 1 cycle");
    }
  }

  // Launch bookkeeping: workgroups left per launch, and who waits for which launch.
  std::uint32_t launches = 0;
  for (const Workgroup& w : workgroups) {
    if (w.launch != none) {
      launches = std::max(launches, w.launch + 1);
    }
  }
  std::vector<std::uint32_t> launch_left(launches, 0);
  for (const Workgroup& w : workgroups) {
    if (w.launch != none) {
      ++launch_left[w.launch];
    }
  }
  std::vector<std::vector<std::uint32_t>> waiters(launches);
  for (std::uint32_t i = 0; i < count; ++i) {
    const Workgroup& w = workgroups[i];
    if (w.after == none) {
      continue;
    }
    if (w.after >= launches || launch_left[w.after] == 0 || (w.launch != none && w.after >= w.launch)) {
      throw Exception(Errc::invalid_argument, "simulate: workgroup " + std::to_string(i) + " waits for launch " +
                                                  std::to_string(w.after) +
                                                  ", which has no workgroups or does not come before its own");
    }
    waiters[w.after].push_back(i);
  }

  // Offline profiles for HintMode::per_kernel and constant; checks for given. Units whose
  // policy takes no hint (and the bound) are told nothing, so nothing needs checking for them.
  constexpr bool wants_hints = requires { requires Cu::hinted; };
  const HintMode mode = options.hints.mode;
  std::vector<double> kernel_mean;
  double overall_mean = 0;
  if (wants_hints && (mode == HintMode::per_kernel || mode == HintMode::constant)) {
    std::vector<double> n;
    for (const Workgroup& w : workgroups) {
      const std::uint32_t k = w.kernel == none ? 0 : w.kernel;
      if (mode == HintMode::per_kernel && w.kernel == none) {
        throw Exception(Errc::invalid_argument, "simulate: per-kernel hints need every workgroup's kernel");
      }
      if (k >= kernel_mean.size()) {
        kernel_mean.resize(k + 1, 0.0);
        n.resize(k + 1, 0.0);
      }
      kernel_mean[k] += w.duration;
      n[k] += 1;
      overall_mean += w.duration;
    }
    for (std::size_t k = 0; k < kernel_mean.size(); ++k) {
      kernel_mean[k] = n[k] > 0 ? kernel_mean[k] / n[k] : 0.0;
    }
    overall_mean /= std::max<double>(count, 1);
  }
  if (wants_hints && mode == HintMode::given) {
    for (std::uint32_t i = 0; i < count; ++i) {
      if (workgroups[i].expected == 0) {
        throw Exception(Errc::invalid_argument, "simulate: workgroup " + std::to_string(i) +
                                                    " has no expected run time, which given hints need");
      }
    }
  }
  RunTimePredictor<predictor_kernels> per_kernel(options.hints.predictor);
  RunTimePredictor<1> any_kernel(options.hints.predictor);
  const auto round_hint = [](double v) { return static_cast<std::uint32_t>(std::clamp(std::round(v), 1.0, 4.0e9)); };
  // The run time a hinted policy is told; 0 when there is nothing to tell (no completion learned yet).
  const auto hint_for = [&](const Workgroup& w) -> std::uint32_t {
    if constexpr (!wants_hints) {
      return 0;
    }
    switch (mode) {
    case HintMode::given:
      return w.expected;
    case HintMode::exact:
      return w.duration;
    case HintMode::per_kernel:
      return round_hint(kernel_mean[w.kernel]);
    case HintMode::constant:
      return round_hint(overall_mean);
    case HintMode::learned:
      if (w.kernel != none && per_kernel.observed(w.kernel) != 0) {
        return *per_kernel.predict(w.kernel);
      }
      return any_kernel.predict(0).value_or(0);
    }
    return 0;
  };

  RunResult out;
  out.placements.resize(count);
  out.series.sample_every = options.sample_every;
  std::vector<Cu> units(options.cus, prototype);

  // Arrivals in (cycle, index) order: given ones now, waiting ones when their launch finishes.
  using Arrival = std::pair<std::uint64_t, std::uint32_t>;
  std::priority_queue<Arrival, std::vector<Arrival>, std::greater<>> incoming;
  for (std::uint32_t i = 0; i < count; ++i) {
    if (workgroups[i].after == none) {
      incoming.emplace(workgroups[i].arrival, i);
    }
  }

  std::deque<std::uint32_t> queue;
  std::priority_queue<detail::Running, std::vector<detail::Running>, std::greater<>> running;
  std::vector<bool> fragmentation_blocked(count, false);
  std::uint32_t finished = 0;
  std::uint64_t next_sample = 0;
  double idle_sum = 0;
  double runs_sum = 0;
  double share_sum = 0;
  double share_weight = 0;

  const auto request_for = [&](std::uint32_t g, std::uint64_t now) {
    return Request{workgroups[g].size, now, hint_for(workgroups[g]), workgroups[g].kernel};
  };
  const auto record = [&](AllocatorOp::Kind kind, std::uint32_t cu, const Request& r, SlotRange range) {
    if constexpr (Cu::contiguous) {
      if (options.record_ops) {
        out.ops.push_back(AllocatorOp{kind, cu, r, range});
      }
    }
  };
  const auto place_on = [&](std::uint32_t cu, const Request& r) -> std::optional<SlotRange> {
    const auto range = units[cu].place(r);
    record(AllocatorOp::Kind::allocate, cu, r, SlotRange{0, 0});
    return range;
  };
  // Places a request on the unit the options choose (carve's CU-choice rules, cu_choice.hpp);
  // returns the unit, or nullopt.
  const auto place = [&](const Request& r) -> std::optional<std::pair<std::uint32_t, SlotRange>> {
    if (options.choice == CuChoice::first) {
      // FirstFittingCu's choice, without probing the units after the first that fits.
      for (std::uint32_t c = 0; c < options.cus; ++c) {
        if (const auto range = place_on(c, r)) {
          return std::pair{c, *range};
        }
      }
      return std::nullopt;
    }
    std::optional<CuCandidate> best;
    for (std::uint32_t c = 0; c < options.cus; ++c) {
      const auto start = units[c].probe(r);
      record(AllocatorOp::Kind::probe, c, r, SlotRange{0, 0});
      const std::uint32_t at = start.value_or(0);
      const CuCandidate candidate{c, start.has_value(), at, units[c].free_count(),
                                  start ? std::min(at, Cu::slots - at - r.size) : 0};
      if (!best || (options.choice == CuChoice::least_loaded ? LeastLoadedCu{}.better(candidate, *best)
                                                             : NearestBoundaryCu{}.better(candidate, *best))) {
        best = candidate;
      }
    }
    if (!best || !best->fits) {
      return std::nullopt;
    }
    const auto range = place_on(best->cu, r);
    if (!range) {
      throw Exception(Errc::invalid_placement, "simulate: a probed placement failed");
    }
    return std::pair{best->cu, *range};
  };

  std::uint64_t t = 0;
  for (;;) {
    // 1. Releases first.
    while (!running.empty() && running.top().finish == t) {
      const detail::Running done = running.top();
      running.pop();
      units[done.cu].release(done.range);
      record(AllocatorOp::Kind::release, done.cu, Request{}, done.range);
      ++finished;
      const Workgroup& w = workgroups[done.group];
      if (wants_hints && mode == HintMode::learned) {
        if (w.kernel != none) {
          per_kernel.observe(w.kernel, w.duration);
        }
        any_kernel.observe(0, w.duration);
      }
      if (w.launch != none && --launch_left[w.launch] == 0) {
        for (const std::uint32_t g : waiters[w.launch]) {
          incoming.emplace(t + workgroups[g].arrival, g);
        }
      }
    }
    // 2. Arrivals.
    while (!incoming.empty() && incoming.top().first <= t) {
      queue.push_back(incoming.top().second);
      incoming.pop();
    }
    // 3. Dispatch.
    std::uint32_t dispatched = 0;
    std::optional<std::uint32_t> failed_head;
    while (!queue.empty() && (options.width == 0 || dispatched < options.width)) {
      bool placed = false;
      const std::size_t look = std::min<std::size_t>(options.window, queue.size());
      for (std::size_t k = 0; k < look && !placed; ++k) {
        const std::uint32_t g = queue[k];
        const Request r = request_for(g, t);
        ++out.decisions;
        if (const auto where = place(r)) {
          out.placements[g] = Placement{t, where->first, where->second};
          running.push(detail::Running{t + workgroups[g].duration, g, where->first, where->second});
          queue.erase(queue.begin() + static_cast<std::ptrdiff_t>(k));
          out.last_dispatch = t;
          placed = true;
        } else if (k == 0) {
          failed_head = g;
        }
      }
      if (!placed) {
        break;
      }
      ++dispatched;
    }

    // The next cycle at which anything can change.
    std::uint64_t next = std::numeric_limits<std::uint64_t>::max();
    if (!running.empty()) {
      next = running.top().finish;
    }
    if (!incoming.empty()) {
      next = std::min(next, incoming.top().first);
    }
    if (!queue.empty() && options.width != 0 && dispatched == options.width) {
      next = t + 1; // the dispatcher was busy, not blocked
    }
    if (next == std::numeric_limits<std::uint64_t>::max()) {
      if (!queue.empty()) {
        throw Exception(Errc::invalid_placement, "simulate: workgroups wait with nothing left to release");
      }
      break;
    }

    // Measurements over [t, next), during which nothing changes.
    const auto span = static_cast<double>(next - t);
    std::uint32_t free_total = 0;
    for (const Cu& cu : units) {
      free_total += cu.free_count();
    }
    if (!queue.empty()) {
      out.waiting_cycles += next - t;
      double runs = 0;
      double share = 0;
      std::uint32_t with_free = 0;
      for (const Cu& cu : units) {
        runs += cu.free_run_count();
        if (const std::uint32_t f = cu.free_count(); f != 0) {
          share += static_cast<double>(cu.largest_free_run()) / f;
          ++with_free;
        }
      }
      idle_sum += span * free_total / options.cus;
      runs_sum += span * runs / options.cus;
      if (with_free != 0) {
        share_sum += span * share / with_free;
        share_weight += span;
      }
    }
    if (failed_head && !queue.empty() && queue.front() == *failed_head) {
      out.blocked_cycles += next - t;
      const std::uint32_t m = workgroups[*failed_head].size;
      if (std::any_of(units.begin(), units.end(), [&](const Cu& cu) { return cu.free_count() >= m; })) {
        out.fragmentation_blocked_cycles += next - t;
        if (!fragmentation_blocked[*failed_head]) {
          fragmentation_blocked[*failed_head] = true;
          ++out.fragmentation_blocked_groups;
        }
      }
    }
    if (options.sample_every != 0) {
      for (; next_sample < next && out.series.remaining.size() < options.max_samples;
           next_sample += options.sample_every) {
        out.series.remaining.push_back(count - finished);
        out.series.free_slots.push_back(static_cast<float>(free_total) / static_cast<float>(options.cus));
        out.series.waiting.push_back(queue.empty() ? 0 : 1);
      }
    }
    t = next;
  }

  out.makespan = t;
  if (out.waiting_cycles != 0) {
    idle_sum /= static_cast<double>(out.waiting_cycles);
    runs_sum /= static_cast<double>(out.waiting_cycles);
  }
  out.idle_slots = idle_sum;
  out.free_runs = runs_sum;
  out.largest_run_share = share_weight != 0 ? share_sum / share_weight : 1.0;
  if constexpr (Cu::contiguous) {
    detail::wear_statistics(units, out);
  }
  return out;
}

} // namespace carve::sim
