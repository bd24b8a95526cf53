// Side-by-side comparison for Google Benchmark binaries: collects the median time of every
// benchmark in the run, then prints ratios and target checks after the usual console table.
#pragma once

#include <carve/core/cpu_pause.hpp>

#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace carve::bench {

// Keeps a result alive. benchmark::DoNotOptimize also clobbers all memory, which turns every
// loop variable into a store and reload: a few ns per iteration, as much as the searches being
// timed. An empty asm that only reads a register costs nothing.
inline void consume(std::uint32_t value) { asm volatile("" : : "r"(value)); }

// Retries `attempt` until it succeeds, pausing 1, 2, 4, ... 64 times in between: a thread that
// polls a full or empty queue without backing off keeps taking the very cache line the other
// side needs to make progress. Returns the failed attempts: which side waited for which.
template <class Attempt>
inline std::uint64_t spin_until(Attempt attempt) {
  std::uint64_t failed = 0;
  for (unsigned pauses = 1; !attempt(); pauses = pauses < 64 ? 2 * pauses : 64) {
    ++failed;
    for (unsigned i = 0; i < pauses; ++i) {
      carve::cpu_pause();
    }
  }
  return failed;
}

// Store as state.counters["per_item"] when one iteration processes `items` items: it reports
// seconds per item, and the collector below reads it (in ns) in place of the iteration time.
inline benchmark::Counter per_item(std::size_t items) {
  return benchmark::Counter(static_cast<double>(items),
                            benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

class MedianCollector : public benchmark::ConsoleReporter {
public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& run : runs) {
      if (run.error_occurred) {
        continue;
      }
      const bool median = run.run_type == Run::RT_Aggregate && run.aggregate_name == "median";
      const bool single = run.run_type == Run::RT_Iteration && run.repetitions <= 1;
      if (median || single) {
        const auto per = run.counters.find("per_item");
        ns_[run.run_name.str()] =
            per != run.counters.end() ? per->second.value * 1e9 : run.GetAdjustedRealTime() * to_ns(run.time_unit);
        for (const auto& [key, counter] : run.counters) {
          counters_[run.run_name.str() + "#" + key] = counter.value;
        }
      }
    }
  }

  std::optional<double> ns(const std::string& name) const {
    const auto it = ns_.find(name);
    if (it == ns_.end()) {
      return std::nullopt;
    }
    return it->second;
  }

  // A user counter of the same run (its median, with repetitions).
  std::optional<double> counter(const std::string& name, const std::string& key) const {
    const auto it = counters_.find(name + "#" + key);
    if (it == counters_.end()) {
      return std::nullopt;
    }
    return it->second;
  }

private:
  static double to_ns(benchmark::TimeUnit unit) {
    switch (unit) {
    case benchmark::kNanosecond:
      return 1.0;
    case benchmark::kMicrosecond:
      return 1e3;
    case benchmark::kMillisecond:
      return 1e6;
    case benchmark::kSecond:
      return 1e9;
    }
    return 1.0;
  }

  std::map<std::string, double> ns_;
  std::map<std::string, double> counters_;
};

// Prints "label: a / b = ratio (target >= t: met)"; skips quietly when either side was
// filtered out of this run.
inline void print_ratio(const MedianCollector& c, const std::string& label, const std::string& slow,
                        const std::string& fast, double target) {
  const auto s = c.ns(slow);
  const auto f = c.ns(fast);
  if (!s || !f) {
    return;
  }
  const double ratio = *s / *f;
  std::printf("  %-58s %9.2f ns / %7.2f ns = %8.1fx   (target >= %gx: %s)\n", label.c_str(), *s, *f, ratio, target,
              ratio >= target ? "met" : "MISSED");
}

// Prints "label: a / b = ratio (target <= t: met)": what a layer costs over what it wraps.
inline void print_overhead(const MedianCollector& c, const std::string& label, const std::string& layered,
                           const std::string& bare, double max_ratio) {
  const auto l = c.ns(layered);
  const auto b = c.ns(bare);
  if (!l || !b) {
    return;
  }
  const double ratio = *l / *b;
  std::printf("  %-58s %9.2f ns / %7.2f ns = %8.3fx   (target <= %gx: %s)\n", label.c_str(), *l, *b, ratio, max_ratio,
              ratio <= max_ratio ? "met" : "MISSED");
}

inline void print_bound(const MedianCollector& c, const std::string& label, const std::string& name, double max_ns) {
  if (const auto t = c.ns(name)) {
    std::printf("  %-58s %9.2f ns   (target <= %g ns: %s)\n", label.c_str(), *t, max_ns,
                *t <= max_ns ? "met" : "MISSED");
  }
}

// Runs every benchmark with repetitions and median aggregates unless the command line says
// otherwise, then returns the collector for the summary.
inline void run_with_medians(int argc, char** argv, MedianCollector& collector) {
  std::vector<char*> args(argv, argv + argc);
  bool repetitions_given = false;
  for (int i = 1; i < argc; ++i) {
    repetitions_given |= std::string(argv[i]).rfind("--benchmark_repetitions", 0) == 0;
  }
  std::string repetitions = "--benchmark_repetitions=5";
  std::string aggregates = "--benchmark_report_aggregates_only=true";
  if (!repetitions_given) {
    args.push_back(repetitions.data());
    args.push_back(aggregates.data());
  }
  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());
  benchmark::RunSpecifiedBenchmarks(&collector);
  benchmark::Shutdown();
}

} // namespace carve::bench
