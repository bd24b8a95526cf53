// What a placement decision costs on the simulator's own states: each policy's find on every
// request the dispatcher made in a run of the default workload (1000 workgroups, sizes 1-32,
// run times 10-100, 128 slots), and the whole recorded allocator sequence replayed per decision.
//
// release-aligned walks every free run and reads the neighbours' expected releases, so it should
// cost about what best-fit (also a walk over the free runs) costs; the printed targets check that.
#include "compare.hpp"

#include <carve/sim.hpp>
#include <carve/slot.hpp>

#include <benchmark/benchmark.h>

#include <cstdio>
#include <string>
#include <vector>

namespace {

using namespace carve;
using namespace carve::bench;
constexpr std::uint32_t N = 128;

template <class Fit>
struct Snapshot {
  SlotAllocator<N, Fit> state;
  sim::Request request;
};

template <class Fit>
const sim::RunResult& recorded_run() {
  static const sim::RunResult run = [] {
    sim::DispatchOptions o;
    o.record_ops = true;
    return sim::simulate(sim::generate(sim::WorkloadSpec{}, 1), o, sim::ContiguousCu<N, Fit>{});
  }();
  return run;
}

// The allocator's state before every allocate call of the recorded run.
template <class Fit>
const std::vector<Snapshot<Fit>>& snapshots() {
  static const std::vector<Snapshot<Fit>> s = [] {
    std::vector<Snapshot<Fit>> out;
    SlotAllocator<N, Fit> a;
    for (const sim::AllocatorOp& op : recorded_run<Fit>().ops) {
      if (op.kind == sim::AllocatorOp::Kind::allocate) {
        out.push_back({a, op.request});
        (void)sim::ContiguousCu<N, Fit>::allocate(a, op.request);
      } else if (op.kind == sim::AllocatorOp::Kind::release) {
        (void)a.deallocate(op.range);
      }
    }
    return out;
  }();
  return s;
}

template <class Fit>
void find(benchmark::State& state) {
  const auto& inputs = snapshots<Fit>();
  for (auto _ : state) {
    for (const Snapshot<Fit>& s : inputs) {
      consume(sim::ContiguousCu<N, Fit>::find(s.state, s.request).value_or(N));
    }
  }
  state.counters["per_item"] = per_item(inputs.size());
}

template <class Fit>
void replay(benchmark::State& state) {
  const sim::RunResult& run = recorded_run<Fit>();
  for (auto _ : state) {
    benchmark::DoNotOptimize(sim::replay_ns_per_decision<N, Fit>(run.ops, 1, run.decisions, Fit{}, 1));
  }
  state.counters["per_item"] = per_item(run.decisions);
}

template <class Fit>
void register_policy() {
  const std::string name = policy_name<Fit>();
  benchmark::RegisterBenchmark(("find/" + name).c_str(), find<Fit>);
  benchmark::RegisterBenchmark(("decision/" + name).c_str(), replay<Fit>);
}

} // namespace

int main(int argc, char** argv) {
  register_policy<FirstFit>();
  register_policy<BestFit>();
  register_policy<BoundaryNearestFit>();
  register_policy<ReleaseAlignedFit>();

  MedianCollector c;
  run_with_medians(argc, argv, c);

  std::printf("\nN = 128, the simulator's default workload, medians per find / per decision:\n");
  print_bound(c, "release-aligned find", "find/release-aligned", 60.0);
  print_ratio(c, "best-fit find / release-aligned find (within 2x of best-fit)", "find/best-fit",
              "find/release-aligned", 0.5);
  // The price of the better placements, for the README (no target).
  for (const char* what : {"find", "decision"}) {
    const auto ra = c.ns(std::string(what) + "/release-aligned");
    const auto bn = c.ns(std::string(what) + "/boundary-nearest");
    if (ra && bn) {
      std::printf("  %-58s %9.2f ns / %7.2f ns = %8.2fx\n",
                  (std::string("release-aligned / boundary-nearest, per ") + what).c_str(), *ra, *bn, *ra / *bn);
    }
  }
  return 0;
}
