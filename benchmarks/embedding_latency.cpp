// Latency of the embedding-lookup pipeline with one FIFO and with SizeTieredQueue (thresholds
// 128 and 512 vectors) under round-robin (the scheme's manager), deficit round-robin with turns
// by each tier's work (DeficitRoundRobin::small_first, the turn-taking variant) and strict
// priority with aging, at the same offered load, cold and warm page cache, in one run. Targets:
// small queries' p99 at least 3x lower with tiers than with the FIFO; total QPS within 5%.
//
// Each configuration runs --repeat times (default 5), the queues alternating within each
// repetition in a rotating order, so that a drift of the shared machine's speed hits all of
// them alike; the summary gives each ratio's median over the repetitions and its spread (lowest
// and highest), not one run.
//
//   bench_embedding_latency [--tables 8] [--table-mib 32] [--devices 2] [--seconds 2]
//                           [--repeat 5] [--qps N | --load 0.75] [--cache cold|warm|both]
//                           [--io pread|io_uring] [--loaders-per-device 2] [--in-flight 4]
//                           [--aging-ms 100] [--dir /var/tmp] [--svg latency.svg]
//                           [--csv latency.csv] [--seed 1] [--median 100] [--sigma 1]
//                           [--max-vectors 1024]                               (--help: all)
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

#include <algorithm>
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
using DeficitQueue = carve::SizeTieredQueue<Query, QueryVectors, carve::RingLanes<>, carve::DeficitRoundRobin>;

struct Options {
  WorkloadOptions w; // --tables --table-mib --devices --qps --median --sigma --max-vectors ... (options.hpp)
  double seconds = 2;
  std::uint32_t repeat = 5;
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
  flags.integer("--repeat", o.repeat, 1, 1000, "runs of each queue per cache state, alternating");
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

std::unique_ptr<DeficitQueue> deficit(const Options& o) {
  const carve::TierThresholds tiers{128, 512};
  return std::make_unique<DeficitQueue>(tiers, 1 << 16, small_first_drr(o.w.sizes, tiers));
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
  // One repetition: small queries' p99 and QPS per queue (FIFO, round-robin, deficit RR, strict).
  struct Rep {
    double small_p99[4] = {};
    double qps[4] = {};
  };
  struct Verdict {
    std::string cache, queue;
    std::vector<double> ratios;      // FIFO's small p99 / this queue's, per repetition
    std::vector<double> qps_changes; // this queue's QPS against the FIFO's, percent
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
    char sp_label[96];
    std::snprintf(sp_label, sizeof sp_label, "SizeTieredQueue, strict+aging %g ms", o.w.aging_ms);
    const std::string drr_label = [&] {
      std::string l = "SizeTieredQueue, deficit RR, quanta";
      for (const std::uint64_t q : small_first_drr(o.w.sizes, classes).quanta()) {
        l += " " + std::to_string(q);
      }
      return l;
    }();
    // Every repetition runs each queue once, in an order that rotates from one repetition to
    // the next; the last repetition's runs are printed in full and plotted.
    constexpr int queues = 4;
    std::vector<RunSummary> last(queues);
    std::vector<Rep> reps;
    for (std::uint32_t rep = 0; rep < o.repeat; ++rep) {
      Rep r;
      for (int k = 0; k < queues; ++k) {
        const int which = static_cast<int>((static_cast<std::uint32_t>(k) + rep) % queues);
        prepare();
        RunSummary s = which == 0   ? run("one FIFO", fifo(), *map, o, qps, count, classes)
                       : which == 1 ? run("SizeTieredQueue, round-robin", tiered(), *map, o, qps, count, classes)
                       : which == 2 ? run(drr_label, deficit(o), *map, o, qps, count, classes)
                                    : run(sp_label, prioritised(o.w.aging_ms), *map, o, qps, count, classes);
        r.small_p99[which] = s.tiers[0].p99_ms;
        r.qps[which] = s.qps;
        last[static_cast<std::size_t>(which)] = std::move(s);
      }
      std::printf("  %s, repetition %u of %u: small p99 FIFO %.3f, round-robin %.3f, deficit RR %.3f, strict+aging "
                  "%.3f ms\n",
                  cold ? "cold" : "warm", rep + 1, o.repeat, r.small_p99[0], r.small_p99[1], r.small_p99[2],
                  r.small_p99[3]);
      reps.push_back(r);
    }
    for (const RunSummary& s : last) {
      print_summary(s, classes);
    }
    const RunSummary& f = last[0];
    const RunSummary& t = last[1];
    const RunSummary& d = last[2];
    const RunSummary& sp = last[3];
    for (int which = 1; which < queues; ++which) {
      Verdict v{cache,
                which == 1   ? "round-robin"
                : which == 2 ? "deficit RR, small first"
                             : "strict priority + aging",
                {},
                {}};
      for (const Rep& r : reps) {
        v.ratios.push_back(r.small_p99[which] > 0 ? r.small_p99[0] / r.small_p99[which] : 0);
        v.qps_changes.push_back(r.qps[0] > 0 ? (r.qps[which] - r.qps[0]) / r.qps[0] * 100 : 0);
      }
      verdicts.push_back(std::move(v));
    }

    PlotPanel panel{cache + ", " + std::to_string(static_cast<int>(qps)) + " q/s offered", {}};
    const char* colors[] = {"#1b9e77", "#d95f02", "#7570b3"};
    const char* names[] = {"<= 128 vectors", "129-512", "> 512"};
    for (std::size_t tier = 0; tier < 3; ++tier) {
      panel.series.push_back(
          {std::string("tiered, strict+aging ") + names[tier], sp.latencies_ms[tier], colors[tier], false});
      panel.series.push_back({std::string("one FIFO ") + names[tier], f.latencies_ms[tier], colors[tier], true});
    }
    panels.push_back(std::move(panel));
    for (const auto& [name, s] : {std::pair{"fifo", &f}, std::pair{"round-robin", &t}, std::pair{"deficit-rr", &d},
                                  std::pair{"strict-aging", &sp}}) {
      for (std::size_t tier = 0; tier < s->tiers.size(); ++tier) {
        char line[256];
        std::snprintf(line, sizeof line, "%s,%s,%zu,%llu,%.4f,%.4f,%.4f,%.1f\n", cold ? "cold" : "warm", name, tier,
                      static_cast<unsigned long long>(s->tiers[tier].count), s->tiers[tier].p50_ms,
                      s->tiers[tier].p99_ms, s->tiers[tier].p999_ms, s->qps);
        csv += line;
      }
    }
  }

  std::printf("\nsmall queries (<= 128 vectors), p99, one FIFO / SizeTieredQueue, median over %u alternating runs "
              "(spread: lowest-highest), and total QPS change:\n",
              o.repeat);
  for (const Verdict& v : verdicts) {
    const double ratio = median(v.ratios);
    const double qps_change = median(v.qps_changes);
    const auto [rlo, rhi] = std::minmax_element(v.ratios.begin(), v.ratios.end());
    const auto [qlo, qhi] = std::minmax_element(v.qps_changes.begin(), v.qps_changes.end());
    std::printf("  %-18s %-24s p99 ratio %5.1fx (%.1fx-%.1fx; target >= 3x: %s)   QPS %+.1f%% (%+.1f%% to %+.1f%%; "
                "target within 5%%: %s)\n",
                v.cache.c_str(), v.queue.c_str(), ratio, *rlo, *rhi, ratio >= 3 ? "met" : "MISSED", qps_change, *qlo,
                *qhi, std::abs(qps_change) <= 5 ? "met" : "MISSED");
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
