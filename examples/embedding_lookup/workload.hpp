// Queries as a recommendation service sends them: Poisson arrivals at a given rate, sizes from
// a DeepRecSys-like distribution, uniformly random rows of a random table; and the latency
// summary per tier that the benchmark and the example print.
#pragma once

#include "dataset.hpp"
#include "pipeline.hpp"
#include "query_sizes.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <semaphore>
#include <string>
#include <thread>
#include <vector>

namespace embedding {

class QueryGenerator {
public:
  QueryGenerator(std::vector<TableSpec> tables, QuerySizes sizes, std::uint64_t seed)
      : tables_(std::move(tables)), sizes_(sizes), rng_(seed) {}

  Query next() {
    Query q;
    q.id = next_id_++;
    const TableSpec& t = tables_[rng_() % tables_.size()];
    q.table = t.id;
    const std::uint32_t n = sizes_(rng_);
    q.rows.resize(n);
    for (auto& r : q.rows) {
      r = rng_() % t.rows;
    }
    return q;
  }

  std::mt19937_64& rng() { return rng_; }

private:
  std::vector<TableSpec> tables_;
  QuerySizes sizes_;
  std::mt19937_64 rng_;
  std::uint64_t next_id_ = 0;
};

// Submits `count` queries with exponential gaps at `qps` (each query's arrival is its scheduled
// time, so a late submit is charged to the system, not hidden). qps <= 0: as fast as possible.
template <class Submit>
void submit_poisson(QueryGenerator& gen, std::uint64_t count, double qps, Submit&& submit) {
  std::exponential_distribution<double> gap(qps > 0 ? qps : 1.0);
  auto at = Clock::now();
  std::vector<Query> ready;
  for (std::uint64_t i = 0; i < count; ++i) {
    Query q = gen.next();
    if (qps > 0) {
      at += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(gap(gen.rng())));
      std::this_thread::sleep_until(at);
      q.arrival = at;
    } else {
      q.arrival = Clock::now();
    }
    submit(std::move(q));
  }
}

// Submits `count` queries as a client that keeps at most `outstanding` of them in the system:
// each waits for a slot, which the caller's result sink gives back (slots.release()) as each
// query's result arrives. The offered load then always queues, at whatever rate the machine
// serves at the moment: on a machine shared with other work, an open-loop rate set from a
// capacity measured a second earlier may by now be far below or above what it can serve.
template <class Submit>
void submit_closed_loop(QueryGenerator& gen, std::uint64_t count, std::counting_semaphore<>& slots, Submit&& submit) {
  for (std::uint64_t i = 0; i < count; ++i) {
    slots.acquire();
    Query q = gen.next();
    q.arrival = Clock::now();
    submit(std::move(q));
  }
}

// The work each tier brings per query, in vectors (share of queries x mean size), from a large
// sample of the size distribution: what DeficitRoundRobin::small_first shares turns by.
inline std::vector<double> work_per_tier(const QuerySizes& sizes, const carve::TierThresholds& tiers) {
  std::vector<double> work(tiers.tier_count(), 0.0);
  std::mt19937_64 rng(12345);
  constexpr int draws = 100'000;
  for (int i = 0; i < draws; ++i) {
    const std::uint32_t n = sizes(rng);
    work[tiers.tier_of(n)] += static_cast<double>(n) / draws;
  }
  for (double& w : work) {
    w = std::max(w, 1e-3); // a tier the distribution never reaches still takes turns
  }
  return work;
}

// Deficit round-robin with turns by each tier's work and headroom for the smallest tier
// (carve::DeficitRoundRobin::small_first), quanta of at least `floor` vectors.
inline carve::DeficitRoundRobin small_first_drr(const QuerySizes& sizes, const carve::TierThresholds& tiers,
                                                std::uint64_t floor = 64) {
  const std::vector<double> work = work_per_tier(sizes, tiers);
  return carve::DeficitRoundRobin::small_first(cuda::std::span<const double>(work.data(), work.size()), floor);
}

// The middle value of `v` (the mean of the middle two for an even count); 0 when empty.
inline double median(std::vector<double> v) {
  if (v.empty()) {
    return 0;
  }
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

struct Percentiles {
  std::uint64_t count = 0;
  double p50_ms = 0, p99_ms = 0, p999_ms = 0;
};

inline Percentiles percentiles(std::vector<double> ms) {
  Percentiles p;
  p.count = ms.size();
  if (ms.empty()) {
    return p;
  }
  std::sort(ms.begin(), ms.end());
  const auto at = [&](double q) {
    const auto i = static_cast<std::size_t>(std::ceil(q * static_cast<double>(ms.size()))) - 1;
    return ms[std::min(i, ms.size() - 1)];
  };
  p.p50_ms = at(0.50);
  p.p99_ms = at(0.99);
  p.p999_ms = at(0.999);
  return p;
}

struct RunSummary {
  std::string label;
  double seconds = 0;
  double qps = 0; // completed queries per second
  std::uint64_t ok = 0, errors = 0;
  std::vector<Percentiles> tiers; // by the 128/512 thresholds, whatever queue was used
  Percentiles all;
  std::vector<std::vector<double>> latencies_ms; // per tier, sorted, for plots
};

// Latency per size class (tier of `classes`), from results; `seconds` is the run's wall time.
inline RunSummary summarize(std::string label, const std::vector<Result>& results, const carve::TierThresholds& classes,
                            double seconds) {
  RunSummary s;
  s.label = std::move(label);
  s.seconds = seconds;
  s.latencies_ms.resize(classes.tier_count());
  std::vector<double> all;
  for (const Result& r : results) {
    if (!r.ok) {
      ++s.errors;
      continue;
    }
    ++s.ok;
    const double ms = std::chrono::duration<double, std::milli>(r.done - r.arrival).count();
    s.latencies_ms[classes.tier_of(r.vectors)].push_back(ms);
    all.push_back(ms);
  }
  for (auto& v : s.latencies_ms) {
    s.tiers.push_back(percentiles(v));
    std::sort(v.begin(), v.end());
  }
  s.all = percentiles(all);
  s.qps = seconds > 0 ? static_cast<double>(s.ok + s.errors) / seconds : 0;
  return s;
}

inline void print_summary(const RunSummary& s, const carve::TierThresholds& classes) {
  std::printf("%-34s %8.0f q/s  (%llu ok, %llu errors)\n", s.label.c_str(), s.qps,
              static_cast<unsigned long long>(s.ok), static_cast<unsigned long long>(s.errors));
  for (std::size_t t = 0; t < s.tiers.size(); ++t) {
    const auto tier = static_cast<std::uint32_t>(t);
    char range[40];
    if (t + 1 == s.tiers.size()) {
      std::snprintf(range, sizeof range, "> %llu vectors", static_cast<unsigned long long>(classes.smallest(tier) - 1));
    } else {
      std::snprintf(range, sizeof range, "%llu-%llu vectors",
                    static_cast<unsigned long long>(std::max<std::uint64_t>(1, classes.smallest(tier))),
                    static_cast<unsigned long long>(classes.largest(tier)));
    }
    const Percentiles& p = s.tiers[t];
    std::printf("  %-18s n=%-7llu p50 %9.3f ms   p99 %9.3f ms   p999 %9.3f ms\n", range,
                static_cast<unsigned long long>(p.count), p.p50_ms, p.p99_ms, p.p999_ms);
  }
}

} // namespace embedding
