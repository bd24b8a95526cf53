// ConcurrentSlotAllocator on host threads, side by side with SlotAllocator alone (one thread)
// and SlotAllocator behind a std::mutex (two threads): the costs of being lock-free.
//
// Each iteration is one allocate plus, once a thread holds 8 allocations (or an allocate
// failed), one deallocate of its oldest: a steady allocate/free stream over N = 128 slots
// under boundary-nearest, request sizes from a fixed pseudo-random sequence of 1..8.
#include "compare.hpp"

#include <carve/slot.hpp>

#include <benchmark/benchmark.h>

#include <array>
#include <cstdio>
#include <deque>
#include <mutex>
#include <random>
#include <string>

namespace {

constexpr std::uint32_t N = 128;
using Fit = carve::BoundaryNearestFit;

struct Sequential {
  carve::SlotAllocator<N, Fit> slots;
  auto allocate(std::uint32_t m) { return slots.allocate(m); }
  auto deallocate(carve::SlotRange r) { return slots.deallocate(r); }
};

struct Locked {
  std::mutex mutex;
  carve::SlotAllocator<N, Fit> slots;
  auto allocate(std::uint32_t m) {
    const std::lock_guard lock(mutex);
    return slots.allocate(m);
  }
  auto deallocate(carve::SlotRange r) {
    const std::lock_guard lock(mutex);
    return slots.deallocate(r);
  }
};

struct LockFree {
  carve::ConcurrentSlotAllocator<N, Fit, cuda::thread_scope_system> slots;
  auto allocate(std::uint32_t m) { return slots.allocate(m); }
  auto deallocate(carve::SlotRange r) { return slots.deallocate(r); }
};

const std::array<std::uint32_t, 1024>& sizes() {
  static const auto table = [] {
    std::array<std::uint32_t, 1024> t{};
    std::mt19937 rng(12345);
    for (auto& m : t) {
      m = 1 + rng() % 8;
    }
    return t;
  }();
  return table;
}

template <class Impl>
void stream(benchmark::State& state) {
  static Impl impl; // shared by the benchmark's threads
  std::deque<carve::SlotRange> held;
  std::size_t i = static_cast<std::size_t>(state.thread_index()) * 389;
  for (auto _ : state) {
    const auto r = impl.allocate(sizes()[i++ % sizes().size()]);
    if (r) {
      held.push_back(*r);
    }
    if (!held.empty() && (held.size() > 8 || !r)) {
      (void)impl.deallocate(held.front());
      held.pop_front();
    }
  }
  for (const auto r : held) {
    (void)impl.deallocate(r);
  }
}

} // namespace

BENCHMARK(stream<Sequential>)->Name("stream/1-thread/slot-allocator")->Threads(1)->UseRealTime();
BENCHMARK(stream<LockFree>)->Name("stream/1-thread/concurrent")->Threads(1)->UseRealTime();
BENCHMARK(stream<Locked>)->Name("stream/2-threads/mutex+slot-allocator")->Threads(2)->UseRealTime();
BENCHMARK(stream<LockFree>)->Name("stream/2-threads/concurrent")->Threads(2)->UseRealTime();

int main(int argc, char** argv) {
  carve::bench::MedianCollector c;
  carve::bench::run_with_medians(argc, argv, c);
  std::printf("\nallocate+free stream, N = 128, boundary-nearest, medians (per thread per iteration):\n");
  carve::bench::print_ratio(c, "1 thread: slot allocator / concurrent (concurrent within 2x)",
                            "stream/1-thread/slot-allocator/real_time/threads:1",
                            "stream/1-thread/concurrent/real_time/threads:1", 0.5);
  carve::bench::print_ratio(c, "2 threads: mutex+slot allocator / concurrent",
                            "stream/2-threads/mutex+slot-allocator/real_time/threads:2",
                            "stream/2-threads/concurrent/real_time/threads:2", 1.0);
  return 0;
}
