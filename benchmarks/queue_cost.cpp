// What a SizeTieredQueue costs per request: classify + push + pop, two threads each pushing
// and popping through one shared queue, side by side in one run with single FIFO queues:
// carve's own MpmcRing, moodycamel::ConcurrentQueue and boost::lockfree::queue. Target:
// <= 100 ns per request on 2 threads.
//
// Requests are 16-byte lookups whose sizes follow the DeepRecSys-like distribution of
// examples/embedding_lookup (60% small, 35% medium, 5% large with thresholds 128 and 512).
#include "compare.hpp"

#include <carve/carve.hpp>
#include <query_sizes.hpp>

#include <benchmark/benchmark.h>
#include <boost/lockfree/queue.hpp>

#include <array>
#include <cstdio>
#include <random>
#include <string>

namespace {

struct Lookup {
  std::uint64_t id;
  std::uint32_t vectors;
  std::uint32_t table;
};

struct Vectors {
  std::uint64_t operator()(const Lookup& q) const noexcept { return q.vectors; }
};

constexpr std::size_t capacity = 4096;

const std::array<std::uint32_t, 4096>& sizes() {
  static const auto table = [] {
    std::array<std::uint32_t, 4096> t{};
    std::mt19937_64 rng(2024);
    const embedding::QuerySizes draw;
    for (auto& s : t) {
      s = draw(rng);
    }
    return t;
  }();
  return table;
}

template <class Drain, class Lanes = carve::RingLanes<>>
struct Tiered {
  carve::SizeTieredQueue<Lookup, Vectors, Lanes, Drain> q{*carve::TierThresholds::create({128, 512}), capacity};
  bool push(const Lookup& l) { return q.try_push(Lookup(l)).has_value(); }
  bool pop(Lookup& out) {
    auto r = q.try_pop();
    if (!r) {
      return false;
    }
    out = *r;
    return true;
  }
};

struct Ring {
  carve::MpmcRing<Lookup> ring{capacity};
  bool push(const Lookup& l) {
    Lookup copy = l;
    return ring.try_push(copy, 0);
  }
  bool pop(Lookup& out) {
    auto r = ring.try_pop();
    if (!r) {
      return false;
    }
    out = r->value;
    return true;
  }
};

struct Moodycamel {
  moodycamel::ConcurrentQueue<Lookup> q{capacity};
  bool push(const Lookup& l) { return q.enqueue(l); }
  bool pop(Lookup& out) { return q.try_dequeue(out); }
};

struct BoostLockfree {
  boost::lockfree::queue<Lookup, boost::lockfree::capacity<capacity>> q;
  bool push(const Lookup& l) { return q.bounded_push(l); }
  bool pop(Lookup& out) { return q.pop(out); }
};

// Every thread pushes one request and pops one (whichever the queue hands out) per iteration,
// over a backlog of state.range(0) requests queued before timing starts.
template <class Impl>
void push_pop(benchmark::State& state) {
  static Impl* impl = nullptr;
  if (state.thread_index() == 0) {
    impl = new Impl;
    for (std::size_t k = 0; k < static_cast<std::size_t>(state.range(0)); ++k) {
      impl->push(Lookup{k, sizes()[(k * 7) % sizes().size()], 0});
    }
  }
  // The timed loop starts on all threads together, after thread 0's setup, and ends together.
  std::size_t i = static_cast<std::size_t>(state.thread_index()) * 1009;
  std::uint64_t sum = 0;
  Lookup out{};
  for (auto _ : state) {
    const Lookup l{i, sizes()[i % sizes().size()], static_cast<std::uint32_t>(i & 7)};
    ++i;
    while (!impl->push(l)) {
    }
    while (!impl->pop(out)) {
    }
    sum += out.vectors;
  }
  carve::bench::consume(static_cast<std::uint32_t>(sum));
  if (state.thread_index() == 0) {
    delete impl;
    impl = nullptr;
  }
}

using RoundRobinTiers = Tiered<carve::RoundRobin>;
using StrictTiers = Tiered<carve::StrictPriority>;
using MoodycamelTiers = Tiered<carve::RoundRobin, carve::MoodycamelLanes>;

void args(benchmark::internal::Benchmark* b) {
  b->ArgName("backlog")->Arg(0)->Arg(256)->Threads(1)->Threads(2)->UseRealTime();
}

} // namespace

BENCHMARK(push_pop<RoundRobinTiers>)->Name("tiered/round-robin")->Apply(args);
BENCHMARK(push_pop<StrictTiers>)->Name("tiered/strict-priority")->Apply(args);
BENCHMARK(push_pop<MoodycamelTiers>)->Name("tiered/moodycamel-lanes")->Apply(args);
BENCHMARK(push_pop<Ring>)->Name("fifo/carve-mpmc-ring")->Apply(args);
BENCHMARK(push_pop<Moodycamel>)->Name("fifo/moodycamel")->Apply(args);
BENCHMARK(push_pop<BoostLockfree>)->Name("fifo/boost-lockfree")->Apply(args);

int main(int argc, char** argv) {
  carve::bench::MedianCollector c;
  carve::bench::run_with_medians(argc, argv, c);
  std::printf("\nclassify + push + pop per request and thread, 2 threads, medians (ns):\n");
  for (const char* backlog : {"0", "256"}) {
    const std::string suffix = std::string("/backlog:") + backlog + "/real_time/threads:2";
    carve::bench::print_bound(c, std::string("SizeTieredQueue round-robin, backlog ") + backlog,
                              "tiered/round-robin" + suffix, 100.0);
    carve::bench::print_bound(c, std::string("SizeTieredQueue strict priority, backlog ") + backlog,
                              "tiered/strict-priority" + suffix, 100.0);
    const auto tiered = c.ns("tiered/round-robin" + suffix);
    for (const char* fifo : {"fifo/carve-mpmc-ring", "fifo/moodycamel", "fifo/boost-lockfree"}) {
      if (const auto f = c.ns(fifo + suffix); f && tiered) {
        std::printf("  %-58s %9.2f ns   (tiers cost %+.2f ns over it)\n",
                    (std::string(fifo) + ", backlog " + backlog).c_str(), *f, *tiered - *f);
      }
    }
  }
  return 0;
}
