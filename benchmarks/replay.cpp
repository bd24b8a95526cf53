// What each allocate+free costs on the host when a real model's allocations are replayed: carve's
// pools beside the model of PyTorch's caching allocator (both modes), in one run, over the same
// address-only card or address-only HostMemoryMapper (the VMM driver's host twin without memory),
// with the device calls' time taken out so that bookkeeping is compared with bookkeeping. The
// target: every carve pool at most 1.0x pytorch-model. The expandable pool with bring_holes_home,
// off by default while it misses that, is timed beside them.
//
//   bench_replay                          the shared real snapshot (../shared/traces), else the
//                                         test's own small snapshot
//   bench_replay --trace=FILE             any trace carve_replay reads
#include "compare.hpp"

#include "contenders.hpp" // examples/carve_replay
#include "replay.hpp"

#include <carve/trace/trace_file.hpp>

#include <benchmark/benchmark.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

namespace {

using namespace carve;
using namespace carve::bench;

std::string trace_path(int& argc, char** argv) {
  std::string path = std::filesystem::exists(CARVE_BENCH_REAL_TRACE) ? CARVE_BENCH_REAL_TRACE : CARVE_BENCH_SMALL_TRACE;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--trace=", 0) == 0) {
      path = a.substr(8);
      for (int j = i; j + 1 < argc; ++j) {
        argv[j] = argv[j + 1];
      }
      --argc;
      break;
    }
  }
  return path;
}

// Whole replays per repetition: building the allocators, which is not timed, dominates the run.
constexpr int replays = 25;

// A benchmark's name in the results: Google Benchmark adds the iterations and timing it was given.
std::string timed(const std::string& name) {
  return "replay/" + name + "/iterations:" + std::to_string(replays) + "/manual_time";
}

} // namespace

int main(int argc, char** argv) {
  const std::string path = trace_path(argc, argv);
  const auto loaded = trace::read_trace_file(path);
  if (!loaded) {
    std::fprintf(stderr, "bench_replay: %s\n", loaded.error().describe().c_str());
    return 2;
  }
  static const trace::AllocationTrace t = *loaded;
  static const replay::StreamNumbers streams = replay::number_streams(t);
  std::printf("bench_replay: %s, %llu allocations\n", path.c_str(), static_cast<unsigned long long>(t.blocks.size()));

  // expandable-pool:home=1: ExpandablePoolOptions::bring_holes_home, off by default, beside the default.
  const std::vector<std::string> names = {"caching-pool",  "stream-ordered-pool",      "expandable-pool",
                                          "pytorch-model", "pytorch-expandable-model", "expandable-pool:home=1"};
  static const std::vector<replay::Contender> all = [] {
    auto contenders = replay::all_contenders();
    contenders.push_back(replay::configured("expandable-pool:home=1"));
    return contenders;
  }();
  const std::uint64_t card = std::max<std::uint64_t>(4 * t.peak_live_bytes(), std::uint64_t{1} << 30);
  for (const std::string& name : names) {
    const replay::Contender* c = nullptr;
    for (const auto& each : all) {
      c = each.name == name ? &each : c;
    }
    benchmark::RegisterBenchmark(("replay/" + name).c_str(),
                                 [c, card](benchmark::State& state) {
                                   for (auto _ : state) {
                                     const auto subject = c->make(card, streams.count);
                                     // Building and tearing down the allocator is not timed; the
                                     // replay's own time per allocate+free is, device calls out.
                                     state.SetIterationTime(replay::replay(t, streams, *subject).ns_per_op * 1e-9);
                                   }
                                 })
        ->UseManualTime()
        ->Iterations(replays)
        ->Unit(benchmark::kNanosecond);
  }

  MedianCollector collector;
  run_with_medians(argc, argv, collector);
  std::printf("\nhost cost per allocate+free on %s (device calls taken out), each beside pytorch-model:\n",
              path.c_str());
  for (const std::string& name : {std::string("caching-pool"), std::string("stream-ordered-pool"),
                                  std::string("expandable-pool"), std::string("expandable-pool:home=1")}) {
    print_overhead(collector, name + " / pytorch-model", timed(name), timed("pytorch-model"), 1.0);
  }
  print_overhead(collector, "expandable-pool / pytorch-expandable-model", timed("expandable-pool"),
                 timed("pytorch-expandable-model"), 1.0);
}
