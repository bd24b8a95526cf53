// What a call to carve-served costs: round-trip latency per call (p50, p99) and calls/s, for
// allocate and free through AllocationClient against a real carve-served process, beside
//   - the floor: the same-sized messages bounced off an echo process over the same kind of
//     socket (what any Unix-socket server costs at least), and
//   - the decision alone: BorrowingAllocator in this process (what the server computes per call);
// then N client processes at once against one server (calls/s of the whole machine); and the way
// small allocations should go, a CachingPool on the client's side over its leases, beside the
// same pool in one process over a local card (target: within 2x).
//
// The server runs DGX-1's topology with 8 shared-memory cards of 256 MiB. Latencies are taken
// per call with steady_clock (about 20 ns each, not subtracted).
#include "compare.hpp"
#include "service/service_process.hpp"

#include <carve/mr.hpp>
#include <carve/service.hpp>

#include <benchmark/benchmark.h>

#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace {

using namespace carve::service;
using clock_type = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr std::size_t KiB = std::size_t{1} << 10;

carve::test::ServedProcess& server() {
  static carve::test::ServedProcess s({"--topology", std::string("nvidia-smi:") + CARVE_BENCH_TOPOLOGY, "--card-memory",
                                       "256MiB", "--max-clients", "64"});
  return s;
}

AllocationClient connect(const std::string& name) {
  auto c = AllocationClient::connect(ClientOptions{server().socket(), name, 30s});
  if (!c) {
    std::fprintf(stderr, "cannot connect: %s\n", c.error().message.c_str());
    std::exit(1);
  }
  return std::move(*c);
}

double percentile(std::vector<double>& v, double p) {
  if (v.empty()) {
    return 0.0;
  }
  const auto k = static_cast<std::size_t>(p * static_cast<double>(v.size() - 1));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

// Per-call latencies of one benchmark run, reported as counters (microseconds).
struct Latencies {
  std::vector<double> first;  // allocate (or the request of a pair)
  std::vector<double> second; // free
  void report(benchmark::State& state, double seconds) {
    const double calls = static_cast<double>(first.size() + second.size());
    state.counters["calls_per_s"] = calls / seconds;
    state.counters["p50_us"] = percentile(first, 0.50);
    state.counters["p99_us"] = percentile(first, 0.99);
    if (!second.empty()) {
      state.counters["free_p50_us"] = percentile(second, 0.50);
      state.counters["free_p99_us"] = percentile(second, 0.99);
    }
  }
};

template <class F>
double timed_us(F&& f) {
  const auto t0 = clock_type::now();
  f();
  return std::chrono::duration<double, std::micro>(clock_type::now() - t0).count();
}

// The floor: a request-sized message to an echo process and a reply-sized message back.
void socket_echo(benchmark::State& state) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    state.SkipWithError("socketpair");
    return;
  }
  const std::size_t reply_size = encode(Reply{Allocated{}}, 1).size();
  const pid_t echo = carve::test::fork_child([&] {
    ::close(sv[0]);
    std::vector<std::uint8_t> in(max_message_size);
    const std::vector<std::uint8_t> out(reply_size, 1);
    while (::recv(sv[1], in.data(), in.size(), 0) > 0) {
      if (::send(sv[1], out.data(), out.size(), MSG_NOSIGNAL) < 0) {
        break;
      }
    }
    return 0;
  });
  ::close(sv[1]);
  const std::vector<std::uint8_t> request = encode(Request{Allocate{4096, 0}}, 1);
  std::vector<std::uint8_t> in(max_message_size);
  Latencies lat;
  const auto start = clock_type::now();
  for (auto _ : state) {
    lat.first.push_back(timed_us([&] {
      (void)::send(sv[0], request.data(), request.size(), MSG_NOSIGNAL);
      (void)::recv(sv[0], in.data(), in.size(), 0);
    }));
  }
  lat.report(state, std::chrono::duration<double>(clock_type::now() - start).count());
  ::close(sv[0]);
  carve::test::wait_exit(echo);
}

// allocate then free, one region at a time, `bytes` each, for card 0.
void service_pair(benchmark::State& state, std::size_t bytes) {
  AllocationClient c = connect("bench");
  Latencies lat;
  const auto start = clock_type::now();
  for (auto _ : state) {
    void* p = nullptr;
    lat.first.push_back(timed_us([&] {
      auto r = c.lease(bytes, 0, 256);
      p = r ? r->ptr : nullptr;
    }));
    if (p == nullptr) {
      state.SkipWithError("allocate failed");
      return;
    }
    lat.second.push_back(timed_us([&] { (void)c.free(p); }));
  }
  lat.report(state, std::chrono::duration<double>(clock_type::now() - start).count());
}

// A call with no allocation: the server looks the region up and answers.
void service_query(benchmark::State& state) {
  AllocationClient c = connect("bench");
  auto r = c.lease(4 * KiB, 0, 256);
  if (!r) {
    state.SkipWithError("allocate failed");
    return;
  }
  Latencies lat;
  const auto start = clock_type::now();
  for (auto _ : state) {
    lat.first.push_back(timed_us([&] { (void)c.query(r->ptr); }));
  }
  lat.report(state, std::chrono::duration<double>(clock_type::now() - start).count());
  (void)c.free(r->ptr);
}

// The decision and the card's work (a segment of its own) without any IPC, for the same requests.
void in_process(benchmark::State& state) {
  const auto topo = carve::Topology::from_nvidia_smi(carve::test::read_text(CARVE_BENCH_TOPOLOGY));
  carve::BorrowingAllocator<carve::SharedMemoryCard> alloc(topo,
                                                           [](int) { return carve::SharedMemoryCard(256 << 20); });
  Latencies lat;
  const auto start = clock_type::now();
  for (auto _ : state) {
    carve::BorrowHandle h;
    lat.first.push_back(timed_us([&] { h = *alloc.borrow_explained(0, 4 * KiB, carve::default_alignment); }));
    lat.second.push_back(timed_us([&] { (void)alloc.give_back(h); }));
  }
  lat.report(state, std::chrono::duration<double>(clock_type::now() - start).count());
}

// Small allocate+free from a CachingPool: over the server's leases (a client-side pool, which
// goes to the server only for a new lease), or over a card in this process.
template <class Pool>
void pool_pair(benchmark::State& state, Pool& pool) {
  for (auto _ : state) {
    void* p = pool.allocate(256, 256);
    benchmark::DoNotOptimize(p);
    pool.deallocate(p, 256, 256);
  }
}
void client_side_pool(benchmark::State& state) {
  AllocationClient c = connect("pool");
  carve::CachingPool pool(carve::ref(c));
  pool_pair(state, pool);
}
void in_process_pool(benchmark::State& state) {
  carve::CachingPool pool(carve::SharedMemoryCard(256 << 20));
  pool_pair(state, pool);
}

// N client processes, each `calls_each` / 2 allocate+free pairs on random cards, all at once.
void many_clients(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  constexpr int pairs_each = 4000;
  carve::test::TempDir dir;
  Latencies lat;
  double seconds = 0.0;
  for (auto _ : state) {
    const auto start = clock_type::now();
    std::vector<pid_t> pids;
    for (int k = 0; k < n; ++k) {
      pids.push_back(carve::test::fork_child([&, k] {
        AllocationClient c = connect("load");
        std::mt19937 rng(static_cast<unsigned>(k));
        std::vector<double> us;
        us.reserve(2 * pairs_each);
        for (int i = 0; i < pairs_each; ++i) {
          void* p = nullptr;
          us.push_back(timed_us([&] {
            auto r = c.lease(512 + rng() % (64 * KiB), static_cast<int>(rng() % 8), 256);
            p = r ? r->ptr : nullptr;
          }));
          if (p == nullptr) {
            return 1;
          }
          us.push_back(timed_us([&] { (void)c.free(p); }));
        }
        std::ofstream f(dir.path() / std::to_string(k), std::ios::binary);
        f.write(reinterpret_cast<const char*>(us.data()), static_cast<std::streamsize>(us.size() * sizeof(double)));
        return f ? 0 : 2;
      }));
    }
    for (const pid_t p : pids) {
      if (carve::test::wait_exit(p) != 0) {
        state.SkipWithError("a client failed");
        return;
      }
    }
    seconds += std::chrono::duration<double>(clock_type::now() - start).count();
    for (int k = 0; k < n; ++k) {
      std::ifstream f(dir.path() / std::to_string(k), std::ios::binary);
      std::vector<double> us(2 * pairs_each);
      f.read(reinterpret_cast<char*>(us.data()), static_cast<std::streamsize>(us.size() * sizeof(double)));
      lat.first.insert(lat.first.end(), us.begin(), us.end());
    }
  }
  lat.report(state, seconds);
}

// Keeps the median of every counter of every benchmark, beside MedianCollector's times.
class CounterCollector : public carve::bench::MedianCollector {
public:
  void ReportRuns(const std::vector<Run>& runs) override {
    MedianCollector::ReportRuns(runs);
    for (const Run& run : runs) {
      const bool median = run.run_type == Run::RT_Aggregate && run.aggregate_name == "median";
      const bool single = run.run_type == Run::RT_Iteration && run.repetitions <= 1;
      if ((median || single) && !run.error_occurred) {
        for (const auto& [name, counter] : run.counters) {
          counters_[run.run_name.str()][name] = counter.value;
        }
      }
    }
  }
  double get(const std::string& run, const std::string& counter) const {
    const auto r = counters_.find(run);
    if (r == counters_.end()) {
      return 0.0;
    }
    const auto c = r->second.find(counter);
    return c == r->second.end() ? 0.0 : c->second;
  }

private:
  std::map<std::string, std::map<std::string, double>> counters_;
};

} // namespace

int main(int argc, char** argv) {
  if (!server().listening()) {
    std::fprintf(stderr, "carve-served did not start:\n%s\n", server().output().c_str());
    return 1;
  }
  benchmark::RegisterBenchmark("roundtrip/socket echo (floor)", socket_echo)->UseRealTime();
  benchmark::RegisterBenchmark("roundtrip/carve-served query", service_query)->UseRealTime();
  benchmark::RegisterBenchmark("roundtrip/carve-served allocate+free 4KiB", [](benchmark::State& s) {
    service_pair(s, 4 * KiB);
  })->UseRealTime();
  benchmark::RegisterBenchmark("roundtrip/carve-served allocate+free 64MiB", [](benchmark::State& s) {
    service_pair(s, 64u << 20);
  })->UseRealTime();
  benchmark::RegisterBenchmark("in-process/BorrowingAllocator allocate+free 4KiB", in_process)->UseRealTime();
  benchmark::RegisterBenchmark("pool/client-side CachingPool over leases 256B", client_side_pool);
  benchmark::RegisterBenchmark("pool/in-process CachingPool<SharedMemoryCard> 256B", in_process_pool);
  benchmark::RegisterBenchmark("load/clients", many_clients)
      ->Arg(1)
      ->Arg(2)
      ->Arg(8)
      ->Iterations(1)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);

  CounterCollector c;
  carve::bench::run_with_medians(argc, argv, c);

  const auto row = [&](const char* label, const std::string& run, const char* p50, const char* p99) {
    if (c.get(run, "calls_per_s") > 0.0) {
      std::printf("  %-44s p50 %7.1f us   p99 %7.1f us   %9.0f calls/s\n", label, c.get(run, p50), c.get(run, p99),
                  c.get(run, "calls_per_s"));
    }
  };
  std::printf("\nround trips per call (medians of the runs):\n");
  row("socket echo, the floor", "roundtrip/socket echo (floor)/real_time", "p50_us", "p99_us");
  row("carve-served query", "roundtrip/carve-served query/real_time", "p50_us", "p99_us");
  row("carve-served allocate 4 KiB", "roundtrip/carve-served allocate+free 4KiB/real_time", "p50_us", "p99_us");
  row("carve-served free 4 KiB", "roundtrip/carve-served allocate+free 4KiB/real_time", "free_p50_us", "free_p99_us");
  row("carve-served allocate 64 MiB", "roundtrip/carve-served allocate+free 64MiB/real_time", "p50_us", "p99_us");
  row("carve-served free 64 MiB", "roundtrip/carve-served allocate+free 64MiB/real_time", "free_p50_us", "free_p99_us");
  row("in-process allocate (no IPC)", "in-process/BorrowingAllocator allocate+free 4KiB/real_time", "p50_us", "p99_us");
  for (const char* n : {"1", "2", "8"}) {
    const std::string run = std::string("load/clients/") + n + "/iterations:1/real_time";
    row((std::string(n) + " client process(es) at once, per call").c_str(), run, "p50_us", "p99_us");
  }
  const double floor = c.get("roundtrip/socket echo (floor)/real_time", "p50_us");
  const double alloc = c.get("roundtrip/carve-served allocate+free 4KiB/real_time", "p50_us");
  if (floor > 0.0 && alloc > 0.0) {
    // No target: every region is a fresh segment (a memfd created, mapped on both sides and its
    // descriptor passed), the price of isolation; small allocations belong in a client-side pool.
    std::printf("  allocate p50 / socket floor p50 = %.2fx\n", alloc / floor);
  }
  std::printf("\nsmall allocate+free through a pool (medians of the runs):\n");
  carve::bench::print_overhead(c, "client-side pool over leases / in-process pool",
                               "pool/client-side CachingPool over leases 256B",
                               "pool/in-process CachingPool<SharedMemoryCard> 256B", 2.0);
  const double pooled = c.ns("pool/client-side CachingPool over leases 256B").value_or(0.0);
  if (pooled > 0.0 && alloc > 0.0) {
    std::printf("  round trip allocate p50 / client-side pool allocate+free = %.0fx\n", alloc * 1000.0 / pooled);
  }
  const double eight = c.get("load/clients/8/iterations:1/real_time", "calls_per_s");
  if (eight > 0.0) {
    std::printf("  8 clients: %.0f calls/s   (target >= 50000: %s)\n", eight, eight >= 50000.0 ? "met" : "MISSED");
  }
  return server().stop() == 0 ? 0 : 1;
}
