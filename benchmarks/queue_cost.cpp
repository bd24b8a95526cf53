// What a SizeTieredQueue costs per request: classify + push + pop on one and two threads, side
// by side in one run with single FIFO queues: carve's own MpmcRing, moodycamel::ConcurrentQueue
// and boost::lockfree::queue. Targets: within 2x of moodycamel on one thread, under every drain
// policy; <= 100 ns per request on 2 threads. Shapes:
//   pipeline/  one thread classifies and pushes, the other pops: the scheduler and manager of
//              examples/embedding_lookup. A thread that finds the queue full or empty waits
//              with carve::PollBackoff. Wall time per request.
//   pipeline-tight/  the same, retrying after 1, 2, 4 ... 64 pauses: what a consumer that polls
//              an empty queue tightly does to its producer where cores pass lines slowly.
//   mixed/     both threads push and pop through the same queue (and, with one thread, the cost
//              of a request alone), retrying tightly: an empty pop here means a push is in
//              flight, not that the thread is idle. Wall time over both threads' requests.
//              Rows "-retry-at-once": carve's rings retrying a lost race at once, beside their
//              default wait (carve::LostRaceBackoff); only this shape has threads racing.
//   one-thread/ one thread classifies, pushes and pops each request, under every drain policy,
//              beside the FIFOs. Run with --benchmark_enable_random_interleaving=true
//              for alternating repetitions.
//
// Requests are 16-byte lookups whose sizes follow the DeepRecSys-like distribution of
// examples/embedding_lookup (60% small, 35% medium, 5% large with thresholds 128 and 512).
#include "compare.hpp"

#include <carve/queue.hpp>
#include <query_sizes.hpp>

#include <benchmark/benchmark.h>
#include <boost/lockfree/queue.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <thread>

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

// The drain policy a tiered queue is built with: its default, unless a specialisation says.
template <class Drain>
Drain drain_for_bench() {
  return Drain{};
}
template <>
carve::WeightedRoundRobin drain_for_bench() {
  return carve::WeightedRoundRobin({4, 2, 1});
}
template <>
carve::DeficitRoundRobin drain_for_bench() {
  return carve::DeficitRoundRobin({128, 512, 1024});
}

// Strict priority with a 2 ms age bound: the policy the README recommends for latency targets.
struct StrictAging : carve::StrictPriority {
  StrictAging() : carve::StrictPriority(carve::StrictPriority::with_aging(2'000'000)) {}
};

template <class Drain, class Lanes = carve::RingLanes<>>
struct Tiered {
  carve::SizeTieredQueue<Lookup, Vectors, Lanes, Drain> q{carve::TierThresholds{128, 512}, capacity,
                                                          drain_for_bench<Drain>()};
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

template <class Lane = carve::MpmcRing<Lookup>>
struct Ring {
  Lane ring{capacity};
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

// How long one core takes to get a cache line back from the other by compare-exchange: what
// every contended push and pop pays. On a VM this depends on where the host runs the two
// virtual CPUs at the time, and that changes from one second to the next, so every benchmark
// measures it just before its timed loop (counter "handoff_ns") and the summary prints it beside
// the number it explains.
double handoff_ns(std::uint64_t handoffs) {
  alignas(carve::interference_size) std::atomic<std::uint64_t> turn{0};
  const auto play = [&turn, handoffs](std::uint64_t first) {
    for (std::uint64_t mine = first; mine < handoffs; mine += 2) {
      std::uint64_t expected = mine;
      while (!turn.compare_exchange_weak(expected, mine + 1)) {
        expected = mine;
      }
    }
  };
  const auto start = std::chrono::steady_clock::now();
  std::thread other(play, 1);
  play(0);
  other.join();
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count() /
         static_cast<double>(handoffs);
}

// Every thread pushes one request and pops one (whichever the queue hands out) per iteration,
// over a backlog of state.range(0) requests queued before timing starts.
template <class Impl>
void mixed(benchmark::State& state) {
  static Impl* impl = nullptr;
  if (state.thread_index() == 0) {
    state.counters["handoff_ns"] = handoff_ns(20'000); // the other benchmark thread waits for the loop
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
    carve::bench::spin_until([&] { return impl->push(l); });
    carve::bench::spin_until([&] { return impl->pop(out); });
    sum += out.vectors;
  }
  carve::bench::consume(static_cast<std::uint32_t>(sum));
  if (state.thread_index() == 0) {
    delete impl;
    impl = nullptr;
  }
}

// One thread classifies, pushes and pops each request, over a backlog of state.range(0) requests:
// what the queue itself costs, with no other core in the way.
template <class Impl>
void one_thread(benchmark::State& state) {
  const auto impl = std::make_unique<Impl>();
  for (std::size_t k = 0; k < static_cast<std::size_t>(state.range(0)); ++k) {
    impl->push(Lookup{k, sizes()[(k * 7) % sizes().size()], 0});
  }
  std::size_t i = 0;
  std::uint64_t sum = 0;
  Lookup out{};
  for (auto _ : state) {
    const Lookup l{i, sizes()[i % sizes().size()], static_cast<std::uint32_t>(i & 7)};
    ++i;
    if (!impl->push(l) || !impl->pop(out)) {
      state.SkipWithError("a push or pop failed on one thread");
      break;
    }
    sum += out.vectors;
  }
  carve::bench::consume(static_cast<std::uint32_t>(sum));
  // CPU time per request: on a machine shared with other work, time the thread spent switched
  // out is not the queue's.
  state.counters["per_item"] = carve::bench::per_item(1);
}

// How a pipeline thread that finds the queue full or empty waits before it looks again.
enum class Idle {
  poll_backoff, // carve::PollBackoff's defaults: 8 us, doubling up to 64 us
  tight,        // carve::bench::spin_until: 1, 2, 4 ... 64 pauses (about 26 ns each here)
};

// Retries `attempt` until it succeeds; returns the failed attempts.
template <Idle idle, class Attempt>
std::uint64_t retry(Attempt attempt) {
  if constexpr (idle == Idle::tight) {
    return carve::bench::spin_until(attempt);
  } else {
    carve::PollBackoff backoff;
    std::uint64_t failed = 0;
    while (!attempt()) {
      ++failed;
      backoff.wait();
    }
    return failed;
  }
}

// One producer thread pushes exactly as many requests as the timed loop pops, waiting as `idle`
// says while the queue is full, as a scheduler with nothing else to do would; the consumer
// waits the same way while it is empty. Counters "full" and "empty": failed pushes and pops per
// request, which say which side waited.
template <class Impl, Idle idle>
void pipeline(benchmark::State& state) {
  const auto queue = std::make_unique<Impl>(); // on the heap: not beside the consumer's stack
  Impl& impl = *queue;
  const auto requests = static_cast<std::size_t>(state.max_iterations);
  state.counters["handoff_ns"] = handoff_ns(20'000);
  std::uint64_t full = 0;
  std::thread producer([&impl, &full, requests] {
    std::uint64_t failed = 0;
    for (std::size_t i = 0; i < requests; ++i) {
      const Lookup l{i, sizes()[i % sizes().size()], static_cast<std::uint32_t>(i & 7)};
      failed += retry<idle>([&] { return impl.push(l); });
    }
    full = failed;
  });
  std::uint64_t sum = 0;
  std::uint64_t empty = 0;
  Lookup out{};
  for (auto _ : state) {
    empty += retry<idle>([&] { return impl.pop(out); });
    sum += out.vectors;
  }
  producer.join();
  carve::bench::consume(static_cast<std::uint32_t>(sum));
  state.counters["full"] = benchmark::Counter(static_cast<double>(full), benchmark::Counter::kAvgIterations);
  state.counters["empty"] = benchmark::Counter(static_cast<double>(empty), benchmark::Counter::kAvgIterations);
  if constexpr (requires { impl.q.stats(); }) {
    // How long small requests sat in the queue: the latency that the way of waiting trades.
    const carve::WaitHistogramSnapshot small = impl.q.stats().tier[0].wait;
    state.counters["small_wait_p50_us"] = small.quantile_ns(0.5) / 1000;
    state.counters["small_wait_p99_us"] = small.quantile_ns(0.99) / 1000;
  }
}

using RoundRobinTiers = Tiered<carve::RoundRobin>;
using StrictTiers = Tiered<carve::StrictPriority>;
using MoodycamelTiers = Tiered<carve::RoundRobin, carve::MoodycamelLanes>;
// Rings that retry a lost race at once, as carve's did before: the mixed shape's side by side.
using RetryAtOnceLanes = carve::RingLanes<cuda::thread_scope_system, carve::RetryAtOnce>;
using RoundRobinTiersRetryAtOnce = Tiered<carve::RoundRobin, RetryAtOnceLanes>;
using StrictTiersRetryAtOnce = Tiered<carve::StrictPriority, RetryAtOnceLanes>;

void one_thread_args(benchmark::internal::Benchmark* b) { b->ArgName("backlog")->Arg(0)->Arg(256); }

// The one-thread rows: every drain policy, beside the single FIFOs.
struct OneThreadRow {
  const char* name;
  const char* label;
};
const std::array<OneThreadRow, 9> one_thread_rows = {{
    {"tiered/round-robin", "SizeTieredQueue round-robin"},
    {"tiered/weighted-round-robin", "SizeTieredQueue weighted RR 4/2/1"},
    {"tiered/deficit-round-robin", "SizeTieredQueue deficit RR"},
    {"tiered/strict-priority", "SizeTieredQueue strict priority"},
    {"tiered/strict-aging", "SizeTieredQueue strict + aging 2 ms"},
    {"tiered/priority-tag", "SizeTieredQueue priority tag"},
    {"fifo/carve-mpmc-ring", "one FIFO, carve-mpmc-ring"},
    {"fifo/moodycamel", "one FIFO, moodycamel"},
    {"fifo/boost-lockfree", "one FIFO, boost-lockfree"},
}};

template <class Impl>
void register_one_thread(const char* name) {
  benchmark::RegisterBenchmark((std::string("one-thread/") + name).c_str(), one_thread<Impl>)->Apply(one_thread_args);
}

void mixed_args(benchmark::internal::Benchmark* b) {
  b->ArgName("backlog")->Arg(0)->Arg(256)->Threads(1)->Threads(2)->UseRealTime();
}

template <class Impl>
void both_shapes(const std::string& name) {
  benchmark::RegisterBenchmark(("pipeline/" + name).c_str(), pipeline<Impl, Idle::poll_backoff>)->UseRealTime();
  benchmark::RegisterBenchmark(("pipeline-tight/" + name).c_str(), pipeline<Impl, Idle::tight>)->UseRealTime();
  benchmark::RegisterBenchmark(("mixed/" + name).c_str(), mixed<Impl>)->Apply(mixed_args);
}

const std::array<const char*, 3> fifos = {"carve-mpmc-ring", "moodycamel", "boost-lockfree"};

} // namespace

int main(int argc, char** argv) {
  register_one_thread<RoundRobinTiers>(one_thread_rows[0].name);
  register_one_thread<Tiered<carve::WeightedRoundRobin>>(one_thread_rows[1].name);
  register_one_thread<Tiered<carve::DeficitRoundRobin>>(one_thread_rows[2].name);
  register_one_thread<StrictTiers>(one_thread_rows[3].name);
  register_one_thread<Tiered<StrictAging>>(one_thread_rows[4].name);
  register_one_thread<Tiered<carve::PriorityTag>>(one_thread_rows[5].name);
  register_one_thread<Ring<>>(one_thread_rows[6].name);
  register_one_thread<Moodycamel>(one_thread_rows[7].name);
  register_one_thread<BoostLockfree>(one_thread_rows[8].name);
  both_shapes<RoundRobinTiers>("tiered/round-robin");
  both_shapes<StrictTiers>("tiered/strict-priority");
  both_shapes<MoodycamelTiers>("tiered/moodycamel-lanes");
  both_shapes<Ring<>>("fifo/carve-mpmc-ring");
  both_shapes<Moodycamel>("fifo/moodycamel");
  both_shapes<BoostLockfree>("fifo/boost-lockfree");
  // A lost race only happens when both threads push (or pop) the same ring: the mixed shape.
  benchmark::RegisterBenchmark("mixed/tiered/round-robin-retry-at-once", mixed<RoundRobinTiersRetryAtOnce>)
      ->Apply(mixed_args);
  benchmark::RegisterBenchmark("mixed/tiered/strict-priority-retry-at-once", mixed<StrictTiersRetryAtOnce>)
      ->Apply(mixed_args);
  benchmark::RegisterBenchmark("mixed/fifo/carve-mpmc-ring-retry-at-once", mixed<Ring<RetryAtOnceLanes::lane<Lookup>>>)
      ->Apply(mixed_args);

  carve::bench::MedianCollector c;
  carve::bench::run_with_medians(argc, argv, c);
  // The hand-off each benchmark measured just before it ran: what its number should be read with.
  const auto handoff = [&c](const std::string& name) {
    const auto h = c.counter(name, "handoff_ns");
    return h ? std::to_string(static_cast<long>(*h)) : std::string("?");
  };
  // Two counters of a row through `format`, or "" when the row lacks them.
  const auto counter_pair = [&c](const std::string& name, const char* a, const char* b, const char* format) {
    const auto x = c.counter(name, a);
    const auto y = c.counter(name, b);
    char text[96] = "";
    if (x && y) {
      std::snprintf(text, sizeof text, format, *x, *y);
    }
    return std::string(text);
  };
  // Pipeline rows: which side waited (failed pushes and pops per request).
  const auto waits = [&](const std::string& name) {
    return counter_pair(name, "full", "empty", "   full %.3f, empty %.3f");
  };
  // Pipeline rows of tiered queues: how long small requests waited in the queue.
  const auto small_waits = [&](const std::string& name) {
    return counter_pair(name, "small_wait_p50_us", "small_wait_p99_us",
                        "   small requests waited p50 %.1f us, p99 %.1f us");
  };
  const auto tiered_row = [&](const char* label, const std::string& name) {
    if (const auto t = c.ns(name)) {
      std::printf("  %-39s %8.2f ns   hand-off %4s ns   (target <= 100 ns: %s)%s%s\n", label, *t, handoff(name).c_str(),
                  *t <= 100.0 ? "met" : "MISSED", waits(name).c_str(), small_waits(name).c_str());
    }
  };
  const auto fifo_rows = [&](const std::string& tiered_name, const std::string& shape, const std::string& suffix) {
    const auto tiered = c.ns(tiered_name);
    for (const char* fifo : fifos) {
      const std::string name = shape + "fifo/" + fifo + suffix;
      if (const auto f = c.ns(name); f && tiered) {
        std::printf("  %-39s %8.2f ns   hand-off %4s ns   (round-robin tiers cost %+.2f ns over it)%s\n",
                    (std::string("one FIFO, ") + fifo).c_str(), *f, handoff(name).c_str(), *tiered - *f,
                    waits(name).c_str());
      }
    }
  };

  std::printf("\nclassify + push + pop per request on one thread, medians (CPU ns), and each queue's time over\n"
              "moodycamel::ConcurrentQueue's in the same run (target: tiers within 2x, every drain policy):\n");
  for (const char* backlog : {"0", "256"}) {
    const std::string suffix = std::string("/backlog:") + backlog;
    const auto moodycamel = c.ns("one-thread/fifo/moodycamel" + suffix);
    std::printf(" backlog %s:\n", backlog);
    for (const OneThreadRow& row : one_thread_rows) {
      const auto t = c.ns(std::string("one-thread/") + row.name + suffix);
      if (!t || !moodycamel) {
        continue;
      }
      const double ratio = *t / *moodycamel;
      const bool tiered = std::string(row.name).rfind("tiered/", 0) == 0;
      std::printf("  %-39s %8.2f ns   %5.2fx moodycamel%s\n", row.label, *t, ratio,
                  tiered ? (ratio <= 2.0 ? "   (target <= 2x: met)" : "   (target <= 2x: MISSED)") : "");
    }
  }

  std::printf("\nclassify + push + pop per request, 2 threads, medians (ns), each beside the time a cache line\n"
              "took to move between the two cores (compare-exchange hand-off) just before that benchmark ran:\n");
  struct PipelineShape {
    const char* name;
    const char* idle;
  };
  for (const PipelineShape shape :
       {PipelineShape{"pipeline", "an idle thread waits with carve::PollBackoff"},
        PipelineShape{"pipeline-tight", "an idle thread retries after 1, 2, 4 ... 64 pauses"}}) {
    const std::string prefix = std::string(shape.name) + "/";
    std::printf(" %s (one thread classifies and pushes, one pops; %s):\n", shape.name, shape.idle);
    tiered_row("SizeTieredQueue round-robin", prefix + "tiered/round-robin/real_time");
    tiered_row("SizeTieredQueue strict priority", prefix + "tiered/strict-priority/real_time");
    fifo_rows(prefix + "tiered/round-robin/real_time", prefix, "/real_time");
  }
  for (const char* backlog : {"0", "256"}) {
    const std::string suffix = std::string("/backlog:") + backlog + "/real_time/threads:2";
    std::printf(" mixed (both threads push and pop), backlog %s:\n", backlog);
    tiered_row("SizeTieredQueue round-robin", "mixed/tiered/round-robin" + suffix);
    tiered_row("SizeTieredQueue strict priority", "mixed/tiered/strict-priority" + suffix);
    fifo_rows("mixed/tiered/round-robin" + suffix, "mixed/", suffix);
    struct AtOnce {
      const char* queue;
      const char* label;
    };
    for (const AtOnce row : {AtOnce{"tiered/round-robin", "round-robin, lost races retried at once"},
                             AtOnce{"tiered/strict-priority", "strict priority, retried at once"},
                             AtOnce{"fifo/carve-mpmc-ring", "carve-mpmc-ring, retried at once"}}) {
      const std::string waits_after_loss = std::string("mixed/") + row.queue + suffix;
      const std::string at_once = std::string("mixed/") + row.queue + "-retry-at-once" + suffix;
      if (const auto w = c.ns(waits_after_loss), r = c.ns(at_once); w && r) {
        std::printf("  %-39s %8.2f ns   hand-off %4s ns   (%.1fx the time with the default wait)\n", row.label, *r,
                    handoff(at_once).c_str(), *r / *w);
      }
    }
  }
  return 0;
}
