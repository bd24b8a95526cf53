// Latency of the embedding-lookup pipeline with one FIFO and with SizeTieredQueue (thresholds
// 128 and 512 vectors) under round-robin (the scheme's manager) and strict priority with aging,
// at the same offered load, cold and warm page cache, in one run. Targets: small queries' p99
// at least 3x lower with tiers than with the FIFO; total QPS within 5%.
//
//   bench_embedding_latency [--tables 8] [--table-mib 32] [--devices 2] [--seconds 10]
//                           [--qps N | --load 0.75] [--cache cold|warm|both] [--io pread|io_uring]
//                           [--loaders-per-device 2] [--in-flight 4] [--aging-ms 100]
//                           [--dir /var/tmp] [--svg latency.svg] [--csv latency.csv] [--seed 1]
//                           [--median 100] [--sigma 1] [--max-vectors 1024]     (--help: all)
//
// The flags are parsed by examples/embedding_lookup/options.hpp, shared with the example; a bad
// value exits with status 2 and a message naming the flag.
// The dataset is generated under --dir and removed at exit. Without --qps the offered load is
// --load times the capacity measured first (queries pushed as fast as possible through the FIFO
// pipeline), separately for each cache state. Cold: files opened with O_DIRECT after
// POSIX_FADV_DONTNEED, so every read goes to the device; warm: every file read once before the
// run, then buffered reads. --benchmark_* flags (from `dev.sh bench`) are ignored.
#include <latency_plot.hpp>
#include <options.hpp>
#include <pipeline.hpp>
#include <workload.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

using namespace embedding;

namespace {

using Queue = carve::SizeTieredQueue<Query, QueryVectors>;
using PriorityQueue = carve::SizeTieredQueue<Query, QueryVectors, carve::RingLanes<>, carve::StrictPriority>;

struct Options {
  WorkloadOptions w; // --tables --table-mib --devices --qps --median --sigma --max-vectors ... (options.hpp)
  double seconds = 10;
  double load = 0.75;
  std::string cache = "both";
  std::string svg, csv;
  bool cold() const { return cache != "warm"; }
  bool warm() const { return cache != "cold"; }
};

Flags flags_for(Options& o) {
  o.w.dir = "/var/tmp";
  Flags flags("bench_embedding_latency", "Latency per query size of the embedding-lookup pipeline with one FIFO and "
                                         "with SizeTieredQueue, at the same offered load, in one run.");
  add_workload_flags(flags, o.w, "offered load in queries per second (0: --load times the measured capacity)");
  flags.real("--seconds", o.seconds, 0.1, 3600, "length of each timed run");
  flags.real("--load", o.load, 0.01, 10, "offered load as a fraction of the measured capacity (without --qps)");
  flags.choice("--cache", o.cache, {"cold", "warm", "both"}, "page-cache state: cold (O_DIRECT) and/or warm");
  flags.text("--svg", o.svg, "write the latency plot here");
  flags.text("--csv", o.csv, "write the percentiles here");
  flags.ignore_prefix("--benchmark_"); // from dev.sh bench
  return flags;
}

// One run of `count` queries at `qps` (0: as fast as possible) through a fresh pipeline.
template <class Queue>
RunSummary run(const std::string& label, std::unique_ptr<Queue> queue, DeviceMap& map, const Options& o, double qps,
               std::uint64_t count, const carve::TierThresholds& classes) {
  std::vector<Result> results;
  results.reserve(count);
  std::mutex mutex;
  double seconds = 0;
  {
    Pipeline<Queue> p(std::move(queue), map, o.w.devices, o.w.pipeline(), [&](Result&& r) {
      const std::lock_guard lock(mutex);
      results.push_back(std::move(r));
    });
    QueryGenerator gen(map.specs(), o.w.sizes, o.w.seed);
    const auto t0 = Clock::now();
    submit_poisson(gen, count, qps, [&](Query q) { (void)p.submit(std::move(q)); });
    p.finish();
    seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  return summarize(label, results, classes, seconds);
}

std::unique_ptr<Queue> fifo() { return std::make_unique<Queue>(fifo_thresholds(), 1 << 16); }
std::unique_ptr<Queue> tiered() { return std::make_unique<Queue>(carve::TierThresholds{128, 512}, 1 << 16); }
std::unique_ptr<PriorityQueue> prioritised(double aging_ms) {
  return std::make_unique<PriorityQueue>(carve::TierThresholds{128, 512}, 1 << 16,
                                         carve::StrictPriority::with_aging(static_cast<std::uint64_t>(aging_ms * 1e6)));
}

} // namespace

int main(int argc, char** argv) {
  Options o;
  const Flags flags = flags_for(o);
  if (const std::optional<int> status = flags.parse_or_exit(argc, argv)) {
    return *status;
  }
  const TempDir dir(o.w.dir);
  DatasetConfig cfg = o.w.dataset(dir.path());
  std::printf("dataset: %u tables x %llu MiB (%.2f GiB) of float32 vectors (dim 64/96/128) on %u devices under %s\n",
              o.w.tables, static_cast<unsigned long long>(o.w.table_mib),
              static_cast<double>(o.w.tables * o.w.table_mib) / 1024.0, o.w.devices, dir.path().c_str());
  std::printf("queries: vectors lognormal (median %s, sigma %s, at most %u), Poisson arrivals\n",
              flag_number(o.w.sizes.median).c_str(), flag_number(o.w.sizes.sigma).c_str(), o.w.sizes.max);
  const auto g0 = Clock::now();
  (void)generate_dataset(cfg);
  std::printf("generated in %.1f s; loaders: %u per device, %u queries in flight, reads: %s%s\n",
              std::chrono::duration<double>(Clock::now() - g0).count(), o.w.loaders_per_device, o.w.in_flight,
              to_string(o.w.io_mode()),
              o.w.io_mode() == IoMode::io_uring && !io_uring_available() ? " (not available here: pread)" : "");

  const carve::TierThresholds classes{128, 512};
  std::vector<PlotPanel> panels;
  std::string csv = "cache,queue,tier,count,p50_ms,p99_ms,p999_ms,qps\n";
  struct Verdict {
    std::string cache, queue;
    double small_fifo_p99, small_tiered_p99, fifo_qps, tiered_qps;
  };
  std::vector<Verdict> verdicts;
  for (const bool cold : {true, false}) {
    if ((cold && !o.cold()) || (!cold && !o.warm())) {
      continue;
    }
    const std::string cache = cold ? "cold (O_DIRECT)" : "warm (page cache)";
    cfg.direct_io = cold;
    auto map = open_dataset(cfg);
    const auto prepare = [&] {
      if (cold) {
        drop_page_cache(*map);
      } else {
        warm_page_cache(*map);
      }
    };
    prepare();
    double qps = o.w.qps;
    if (qps <= 0) {
      // Capacity: queries pushed all at once; a short burst first sizes a burst of about 2 s.
      const RunSummary probe = run("capacity", fifo(), *map, o, 0, 200, classes);
      const auto burst = static_cast<std::uint64_t>(std::max(200.0, 2 * probe.qps));
      prepare();
      const RunSummary cap = run("capacity", fifo(), *map, o, 0, burst, classes);
      qps = o.load * cap.qps;
      std::printf("\n%s: capacity %.0f q/s (%llu queries pushed at once); offered load %.0f q/s (%.0f%%)\n",
                  cache.c_str(), cap.qps, static_cast<unsigned long long>(burst), qps, o.load * 100);
    } else {
      std::printf("\n%s: offered load %.0f q/s\n", cache.c_str(), qps);
    }
    const auto count = static_cast<std::uint64_t>(qps * o.seconds);
    prepare();
    const RunSummary f = run("one FIFO", fifo(), *map, o, qps, count, classes);
    print_summary(f, classes);
    prepare();
    const RunSummary t = run("SizeTieredQueue, round-robin", tiered(), *map, o, qps, count, classes);
    print_summary(t, classes);
    prepare();
    char label[96];
    std::snprintf(label, sizeof label, "SizeTieredQueue, strict+aging %g ms", o.w.aging_ms);
    const RunSummary sp = run(label, prioritised(o.w.aging_ms), *map, o, qps, count, classes);
    print_summary(sp, classes);
    verdicts.push_back({cache, "round-robin", f.tiers[0].p99_ms, t.tiers[0].p99_ms, f.qps, t.qps});
    verdicts.push_back({cache, "strict priority + aging", f.tiers[0].p99_ms, sp.tiers[0].p99_ms, f.qps, sp.qps});

    PlotPanel panel{cache + ", " + std::to_string(static_cast<int>(qps)) + " q/s offered", {}};
    const char* colors[] = {"#1b9e77", "#d95f02", "#7570b3"};
    const char* names[] = {"<= 128 vectors", "129-512", "> 512"};
    for (std::size_t tier = 0; tier < 3; ++tier) {
      panel.series.push_back(
          {std::string("tiered, strict+aging ") + names[tier], sp.latencies_ms[tier], colors[tier], false});
      panel.series.push_back({std::string("one FIFO ") + names[tier], f.latencies_ms[tier], colors[tier], true});
    }
    panels.push_back(std::move(panel));
    for (const auto& [name, s] :
         {std::pair{"fifo", &f}, std::pair{"round-robin", &t}, std::pair{"strict-aging", &sp}}) {
      for (std::size_t tier = 0; tier < s->tiers.size(); ++tier) {
        char line[256];
        std::snprintf(line, sizeof line, "%s,%s,%zu,%llu,%.4f,%.4f,%.4f,%.1f\n", cold ? "cold" : "warm", name, tier,
                      static_cast<unsigned long long>(s->tiers[tier].count), s->tiers[tier].p50_ms,
                      s->tiers[tier].p99_ms, s->tiers[tier].p999_ms, s->qps);
        csv += line;
      }
    }
  }

  std::printf("\nsmall queries (<= 128 vectors), p99, one FIFO / SizeTieredQueue, and total QPS:\n");
  for (const Verdict& v : verdicts) {
    const double ratio = v.small_tiered_p99 > 0 ? v.small_fifo_p99 / v.small_tiered_p99 : 0;
    const double qps_change = v.fifo_qps > 0 ? (v.tiered_qps - v.fifo_qps) / v.fifo_qps * 100 : 0;
    std::printf("  %-18s %-24s p99 %9.3f / %8.3f ms = %6.1fx (target >= 3x: %s)   QPS %.0f vs %.0f (%+.1f%%, "
                "target within 5%%: %s)\n",
                v.cache.c_str(), v.queue.c_str(), v.small_fifo_p99, v.small_tiered_p99, ratio,
                ratio >= 3 ? "met" : "MISSED", v.fifo_qps, v.tiered_qps, qps_change,
                std::abs(qps_change) <= 5 ? "met" : "MISSED");
  }
  if (!o.svg.empty()) {
    write_latency_svg(o.svg,
                      "Embedding lookups: latency by query size, SizeTieredQueue strict priority + aging (solid) "
                      "vs one FIFO (dashed)",
                      panels);
    std::printf("plot: %s\n", o.svg.c_str());
  }
  if (!o.csv.empty()) {
    std::ofstream(o.csv) << csv;
    std::printf("table: %s\n", o.csv.c_str());
  }
  return 0;
}
