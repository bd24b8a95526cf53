// Latency of the embedding-lookup pipeline with one FIFO and with SizeTieredQueue (thresholds
// 128 and 512 vectors) under round-robin (the scheme's manager) and strict priority with aging,
// at the same offered load, cold and warm page cache, in one run. Targets: small queries' p99
// at least 3x lower with tiers than with the FIFO; total QPS within 5%.
//
//   bench_embedding_latency [--tables 8] [--table-mib 32] [--devices 2] [--seconds 10]
//                           [--qps N | --load 0.75] [--cache cold|warm|both] [--io pread|io_uring]
//                           [--loaders-per-device 2] [--in-flight 4] [--aging-ms 100]
//                           [--dir /var/tmp] [--svg latency.svg] [--csv latency.csv] [--seed 1]
//
// The dataset is generated under --dir and removed at exit. Without --qps the offered load is
// --load times the capacity measured first (queries pushed as fast as possible through the FIFO
// pipeline), separately for each cache state. Cold: files opened with O_DIRECT after
// POSIX_FADV_DONTNEED, so every read goes to the device; warm: every file read once before the
// run, then buffered reads. --benchmark_* flags (from `dev.sh bench`) are ignored.
#include <latency_plot.hpp>
#include <pipeline.hpp>
#include <workload.hpp>

#include <carve/carve.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

using namespace embedding;

namespace {

using Queue = carve::SizeTieredQueue<Query, QueryVectors>;
using PriorityQueue = carve::SizeTieredQueue<Query, QueryVectors, carve::RingLanes<>, carve::StrictPriority>;

struct Options {
  std::uint32_t tables = 8;
  std::uint64_t table_mib = 32;
  std::uint32_t devices = 2;
  double seconds = 10;
  double qps = 0;
  double load = 0.75;
  double aging_ms = 100;
  bool cold = true, warm = true;
  IoMode io = IoMode::pread;
  std::uint32_t loaders_per_device = 2;
  std::uint32_t in_flight = 4;
  std::string dir = "/var/tmp";
  std::string svg, csv;
  std::uint64_t seed = 1;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--benchmark_", 0) == 0) {
      continue;
    }
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        throw std::invalid_argument(a + " needs a value");
      }
      return argv[++i];
    };
    const auto number = [&](double min) {
      const std::string v = value();
      char* end = nullptr;
      const double x = std::strtod(v.c_str(), &end);
      if (end == v.c_str() || *end != '\0' || !(x >= min)) {
        throw std::invalid_argument(a + " " + v + ": expected a number >= " + std::to_string(min));
      }
      return x;
    };
    if (a == "--tables") {
      o.tables = static_cast<std::uint32_t>(number(1));
    } else if (a == "--table-mib") {
      o.table_mib = static_cast<std::uint64_t>(number(1));
    } else if (a == "--devices") {
      o.devices = static_cast<std::uint32_t>(number(2));
    } else if (a == "--seconds") {
      o.seconds = number(0.1);
    } else if (a == "--qps") {
      o.qps = number(1);
    } else if (a == "--load") {
      o.load = number(0.01);
    } else if (a == "--cache") {
      const std::string v = value();
      o.cold = v == "cold" || v == "both";
      o.warm = v == "warm" || v == "both";
      if (!o.cold && !o.warm) {
        throw std::invalid_argument("--cache " + v + ": expected cold, warm or both");
      }
    } else if (a == "--io") {
      const std::string v = value();
      if (v != "pread" && v != "io_uring") {
        throw std::invalid_argument("--io " + v + ": expected pread or io_uring");
      }
      o.io = v == "pread" ? IoMode::pread : IoMode::io_uring;
    } else if (a == "--loaders-per-device") {
      o.loaders_per_device = static_cast<std::uint32_t>(number(1));
    } else if (a == "--in-flight") {
      o.in_flight = static_cast<std::uint32_t>(number(1));
    } else if (a == "--aging-ms") {
      o.aging_ms = number(0);
    } else if (a == "--dir") {
      o.dir = value();
    } else if (a == "--svg") {
      o.svg = value();
    } else if (a == "--csv") {
      o.csv = value();
    } else if (a == "--seed") {
      o.seed = static_cast<std::uint64_t>(number(0));
    } else {
      throw std::invalid_argument("unknown argument " + a);
    }
  }
  return o;
}

// One run of `count` queries at `qps` (0: as fast as possible) through a fresh pipeline.
template <class Queue>
RunSummary run(const std::string& label, std::unique_ptr<Queue> queue, DeviceMap& map, const Options& o, double qps,
               std::uint64_t count, const carve::TierThresholds& classes) {
  std::vector<Result> results;
  results.reserve(count);
  std::mutex mutex;
  PipelineConfig pc;
  pc.loaders_per_device = o.loaders_per_device;
  pc.in_flight = o.in_flight;
  pc.io = o.io;
  double seconds = 0;
  {
    Pipeline<Queue> p(std::move(queue), map, o.devices, pc, [&](Result&& r) {
      const std::lock_guard lock(mutex);
      results.push_back(std::move(r));
    });
    QueryGenerator gen(map.specs(), QuerySizes{}, o.seed);
    const auto t0 = Clock::now();
    submit_poisson(gen, count, qps, [&](Query q) { (void)p.submit(std::move(q)); });
    p.finish();
    seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  return summarize(label, results, classes, seconds);
}

std::unique_ptr<Queue> fifo() { return std::make_unique<Queue>(fifo_thresholds(), 1 << 16); }
std::unique_ptr<Queue> tiered() { return Queue::make({128, 512}, 1 << 16); }
std::unique_ptr<PriorityQueue> prioritised(double aging_ms) {
  return PriorityQueue::make({128, 512}, 1 << 16,
                             carve::StrictPriority::with_aging(static_cast<std::uint64_t>(aging_ms * 1e6)));
}

} // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    o = parse(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_embedding_latency: %s\n", e.what());
    return 2;
  }
  const TempDir dir(o.dir);
  DatasetConfig cfg;
  cfg.root = dir.path();
  cfg.devices = o.devices;
  cfg.tables = o.tables;
  cfg.table_bytes = o.table_mib << 20;
  std::printf("dataset: %u tables x %llu MiB (%.2f GiB) of float32 vectors (dim 64/96/128) on %u devices under %s\n",
              o.tables, static_cast<unsigned long long>(o.table_mib),
              static_cast<double>(o.tables * o.table_mib) / 1024.0, o.devices, dir.path().c_str());
  const auto g0 = Clock::now();
  (void)generate_dataset(cfg);
  std::printf("generated in %.1f s; loaders: %u per device, %u queries in flight, reads: %s%s\n",
              std::chrono::duration<double>(Clock::now() - g0).count(), o.loaders_per_device, o.in_flight,
              to_string(o.io), o.io == IoMode::io_uring && !io_uring_available() ? " (not available here: pread)" : "");

  const auto classes = *carve::TierThresholds::create({128, 512});
  std::vector<PlotPanel> panels;
  std::string csv = "cache,queue,tier,count,p50_ms,p99_ms,p999_ms,qps\n";
  struct Verdict {
    std::string cache, queue;
    double small_fifo_p99, small_tiered_p99, fifo_qps, tiered_qps;
  };
  std::vector<Verdict> verdicts;
  for (const bool cold : {true, false}) {
    if ((cold && !o.cold) || (!cold && !o.warm)) {
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
    double qps = o.qps;
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
    std::snprintf(label, sizeof label, "SizeTieredQueue, strict+aging %g ms", o.aging_ms);
    const RunSummary sp = run(label, prioritised(o.aging_ms), *map, o, qps, count, classes);
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
