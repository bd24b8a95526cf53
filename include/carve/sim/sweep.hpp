/// @file carve/sim/sweep.hpp
/// Many seeds x many policies, on all cores.
///
/// Each seed names one workload; every policy runs on that same workload, so results pair up
/// by seed. Work is handed out a seed at a time to `threads` std::threads; results land in a
/// table indexed by (seed, policy), so no two threads ever write the same place.
///
/// @code
/// std::vector<carve::sim::PolicyRunner> policies = {
///     carve::sim::contiguous<128, carve::FirstFit>(),
///     carve::sim::contiguous<128, carve::BoundaryNearestFit>(),
///     carve::sim::bound<128>()};
/// auto table = carve::sim::sweep(policies, seeds, [&](std::uint64_t seed) { return generate(spec, seed); }, opts);
/// @endcode
#pragma once

#include <carve/sim/compute_unit.hpp>
#include <carve/sim/cost.hpp>
#include <carve/sim/dispatcher.hpp>
#include <carve/sim/run_result.hpp>
#include <carve/sim/workload.hpp>
#include <carve/slot/policy/fit_policy.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace carve::sim {

/// One policy (or the bound) as something the sweep can run.
struct PolicyRunner {
  std::string name;      ///< shown in reports
  bool is_bound = false; ///< the contiguity-free bound, not a policy
  /// Runs a workload; with `measure_cost` also replays the allocator calls and returns the
  /// nanoseconds per decision in `ns_per_decision`.
  std::function<RunResult(const std::vector<Workgroup>&, const DispatchOptions&, bool measure_cost,
                          double& ns_per_decision)>
      run;
};

/// A carve fit policy (any FitPolicyFor<Fit, N>, hinted or not) on ContiguousCu<N, Fit>.
template <std::uint32_t N, class Fit>
requires FitPolicyFor<sized_fit_t<Fit, N>, N> PolicyRunner contiguous(Fit fit = Fit{},
                                                                      std::string name = policy_name<Fit>()) {
  return {std::move(name), false,
          [fit](const std::vector<Workgroup>& w, const DispatchOptions& options, bool measure_cost, double& ns) {
            DispatchOptions o = options;
            o.record_ops = measure_cost;
            RunResult r = simulate(w, o, ContiguousCu<N, Fit>(fit));
            ns = measure_cost ? replay_ns_per_decision<N, Fit>(r.ops, o.cus, r.decisions, fit) : 0.0;
            r.ops.clear();
            r.ops.shrink_to_fit();
            return r;
          }};
}

/// `runner` told its hints as `hints` say (whatever the sweep's DispatchOptions::hints), shown
/// as `name`: one hinted policy measured under several hint sources in one sweep.
inline PolicyRunner with_hints(PolicyRunner runner, HintOptions hints, std::string name) {
  runner.name = std::move(name);
  runner.run = [inner = std::move(runner.run), hints](const std::vector<Workgroup>& w, const DispatchOptions& options,
                                                      bool measure_cost, double& ns) {
    DispatchOptions o = options;
    o.hints = hints;
    return inner(w, o, measure_cost, ns);
  };
  return runner;
}

/// The bound: the same dispatcher on slots that need not be contiguous.
template <std::uint32_t N>
PolicyRunner bound(std::string name = "bound") {
  return {std::move(name), true, [](const std::vector<Workgroup>& w, const DispatchOptions& options, bool, double& ns) {
            ns = 0.0;
            return simulate(w, options, PooledCu<N>{});
          }};
}

/// How a sweep runs.
struct SweepOptions {
  DispatchOptions dispatch{};   ///< for every run
  unsigned threads = 0;         ///< 0: one per hardware thread
  bool measure_cost = true;     ///< replay allocator calls to time them
  bool keep_placements = false; ///< keep RunResult::placements (large for long workloads)
  /// Called on the calling thread about ten times a second while the sweep runs.
  std::function<void(std::size_t done, std::size_t total)> progress;
};

/// One (seed, policy) run of a sweep.
struct SweepCell {
  RunResult result;           ///< what the run measured
  double ns_per_decision = 0; ///< the allocator's cost per decision, when measured
};

/// result[s][p]: seed seeds[s] under policies[p]. Exceptions from a run are rethrown here.
inline std::vector<std::vector<SweepCell>> sweep(const std::vector<PolicyRunner>& policies,
                                                 const std::vector<std::uint64_t>& seeds,
                                                 const std::function<std::vector<Workgroup>(std::uint64_t)>& workload,
                                                 const SweepOptions& options) {
  std::vector<std::vector<SweepCell>> table(seeds.size(), std::vector<SweepCell>(policies.size()));
  std::atomic<std::size_t> next{0};
  std::atomic<std::size_t> done{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex error_mutex;

  const auto worker = [&] {
    for (std::size_t s = next++; s < seeds.size() && !failed; s = next++) {
      try {
        const std::vector<Workgroup> w = workload(seeds[s]);
        for (std::size_t p = 0; p < policies.size(); ++p) {
          SweepCell& cell = table[s][p];
          cell.result = policies[p].run(w, options.dispatch, options.measure_cost, cell.ns_per_decision);
          if (!options.keep_placements) {
            cell.result.placements.clear();
            cell.result.placements.shrink_to_fit();
          }
          ++done;
        }
      } catch (...) {
        const std::lock_guard lock(error_mutex);
        if (!error) {
          error = std::current_exception();
        }
        failed = true;
      }
    }
  };

  unsigned threads = options.threads != 0 ? options.threads : std::max(1u, std::thread::hardware_concurrency());
  threads = static_cast<unsigned>(std::min<std::size_t>(threads, std::max<std::size_t>(seeds.size(), 1)));
  {
    // jthreads: whatever throws here (a progress callback, a thread that cannot start), every
    // thread started is joined on the way out, with `failed` set so that they stop soon.
    std::vector<std::jthread> pool;
    try {
      for (unsigned k = 1; k < threads; ++k) {
        pool.emplace_back(worker);
      }
      if (options.progress) {
        // The calling thread reports progress while the pool works, then joins in.
        pool.emplace_back(worker);
        const std::size_t total = seeds.size() * policies.size();
        while (done < total && !failed) {
          options.progress(done, total);
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
        pool.back().join();
        options.progress(done, total);
      } else {
        worker();
      }
    } catch (...) {
      failed = true;
      throw;
    }
  }
  if (error) {
    std::rethrow_exception(error);
  }
  return table;
}

} // namespace carve::sim
