// carve's GPU parts that need kernels, measured on the cards of this machine:
//
// Device queue: a SizeTieredQueue (three tiers, round robin, MpmcRing lanes at device scope) in
//   global memory, 1M requests pushed by 1M threads of one kernel, popped by 1M threads of the
//   next, then pushed and popped by the two halves of one kernel; beside the same three kernels
//   on one MpmcRing (a single FIFO, no tiers). Kernel time by CUDA events, median of 5 runs.
//   Checks: every push succeeded, every request popped exactly once and whole, the queue empty.
//   A kind stops repeating its runs after 15 s, and a popper waits at most 5 s for its request.
//   Target: per request within 3x of the single ring (source: carve's host numbers, where one
//   thread's classify + push + pop through SizeTieredQueue costs 2.4x one MpmcRing,
//   benchmarks/queue.md).
//
// Borrowing across the visible cards (two or more): a BorrowingAllocator over every card
//   (CudaDeviceResource, LargestBandwidth, CudaPeerAccess, topology from the CUDA runtime). For
//   each requesting card, a kernel on it first reads 256 MiB on every peer it can map (cudaMalloc
//   there, the bandwidth each path really gives), then 256 MiB borrowed through peers(card): the
//   lender the picker chose, its score, and what the kernel got. Checks: the kernel's sum of the
//   borrowed bytes is right, the block came from another card. Targets: the borrowed read at least
//   80% of the path bandwidth the picker scored (the topology's link figures), and at least 90%
//   of the best peer measured here (the picker's job is the widest path); a borrow + give_back of
//   64 MiB costs at most 6 us more than cudaMalloc + cudaFree of it on the lender (source:
//   carve's host numbers, the same decision with a segment in one process at 5.8 us p50,
//   docs/service.md).
//
// Needs a GPU; without one it says so and exits with 77.
#include "gpu_targets.hpp"

#include <carve/borrow.hpp>
#include <carve/mr/cuda_device_resource.hpp>
#include <carve/queue.hpp>
#include <carve/topology.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <new>
#include <optional>
#include <string>
#include <vector>

namespace {

using carve::bench::Aim;
using carve::bench::Checks;
using carve::bench::cuda_check;
using carve::bench::KernelTimer;
using carve::bench::percentile;

// ---- device queue ----------------------------------------------------------------------------

struct Request {
  std::uint32_t id;
  std::uint32_t vectors;
};

struct Vectors {
  __host__ __device__ std::uint64_t operator()(const Request& r) const noexcept { return r.vectors; }
};

using TieredQueue =
    carve::SizeTieredQueue<Request, Vectors, carve::RingLanes<cuda::thread_scope_device>, carve::RoundRobin>;
using Ring = carve::MpmcRing<Request, cuda::thread_scope_device>;

constexpr std::uint32_t requests = 1u << 20;
// How long a popper of the mixed kernel waits for a request before it counts a failure, and how
// long one queue kind repeats its runs: the program ends within a minute or two whatever the card.
constexpr std::uint64_t pop_patience_ns = 5'000'000'000;
constexpr std::chrono::seconds repeat_budget{15};

// Sizes 1..1100 vectors: about 12% in the first tier (< 128), 35% in the second, the rest third.
__host__ __device__ std::uint32_t vectors_of(std::uint32_t id) { return (id * 37U) % 1100U + 1U; }

// The two queues behind one set of kernels: build, push one, pop one.
__device__ int construct(TieredQueue* at) {
  const carve::TierThresholds t{128, 512};
  auto* q = new (at) TieredQueue(t, requests); // every request fits in any tier
  return q->status() ? 0 : static_cast<int>(q->status().error()) + 1;
}
__device__ int construct(Ring* at) {
  auto* q = new (at) Ring(requests);
  return q->capacity() == requests ? 0 : 1;
}
__device__ bool push_one(TieredQueue& q, std::uint32_t id) {
  return q.try_push(Request{id, vectors_of(id)}).has_value();
}
__device__ bool push_one(Ring& q, std::uint32_t id) {
  Request r{id, vectors_of(id)};
  return q.try_push(r, 0);
}
__device__ cuda::std::optional<Request> pop_one(TieredQueue& q) {
  auto r = q.try_pop();
  return r ? cuda::std::optional<Request>(*r) : cuda::std::nullopt;
}
__device__ cuda::std::optional<Request> pop_one(Ring& q) {
  auto r = q.try_pop();
  return r ? cuda::std::optional<Request>(r->value) : cuda::std::nullopt;
}

template <class Q>
__global__ void build(Q* at, int* status) {
  *status = construct(at);
}

template <class Q>
__global__ void destroy(Q* q) {
  q->~Q();
}

// counters: [0] failed pushes, [1] requests that came out altered, [2] pops that found nothing.
template <class Q>
__global__ void push_all(Q* q, unsigned* counters) {
  const std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < requests && !push_one(*q, i)) {
    atomicAdd(&counters[0], 1U);
  }
}

__device__ void count_popped(const Request& r, unsigned* seen, unsigned* counters) {
  if (r.id >= requests || r.vectors != vectors_of(r.id)) {
    atomicAdd(&counters[1], 1U);
    return;
  }
  atomicAdd(&seen[r.id], 1U);
}

template <class Q>
__global__ void pop_all(Q* q, unsigned* seen, unsigned* counters) {
  const std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= requests) {
    return;
  }
  if (const auto r = pop_one(*q)) {
    count_popped(*r, seen, counters);
  } else {
    atomicAdd(&counters[2], 1U);
  }
}

// Even threads push, odd threads pop (retrying with a PollBackoff until one came), in one kernel:
// every block brings as many pushes as pops, so resident poppers always have pushes to wait for.
template <class Q>
__global__ void push_and_pop(Q* q, unsigned* seen, unsigned* counters) {
  const std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  const std::uint32_t k = i / 2;
  if (k >= requests) {
    return;
  }
  if (i % 2 == 0) {
    if (!push_one(*q, k)) {
      atomicAdd(&counters[0], 1U);
    }
    return;
  }
  // Its request's push may queue behind many others: a popper gives up only after pop_patience_ns.
  carve::PollBackoff idle(100, 2'000);
  for (const std::uint64_t start = carve::bench::device_ns(); carve::bench::device_ns() - start < pop_patience_ns;) {
    if (const auto r = pop_one(*q)) {
      count_popped(*r, seen, counters);
      return;
    }
    idle.wait();
  }
  atomicAdd(&counters[2], 1U);
}

// Kernel times of one queue kind (microseconds, medians) and whether every run checked out.
struct QueueTimes {
  double push_us = 0;
  double pop_us = 0;
  double mixed_us = 0;
  bool sound = true;
};

template <class Q>
QueueTimes time_queue(const char* what, Checks& checks) {
  constexpr unsigned block = 256;
  constexpr unsigned grid = requests / block;
  void* storage = nullptr;
  unsigned* counters = nullptr;
  unsigned* seen = nullptr;
  int* status = nullptr;
  cuda_check(cudaMalloc(&storage, sizeof(Q)), "cudaMalloc");
  cuda_check(cudaMalloc(&counters, 3 * sizeof(unsigned)), "cudaMalloc");
  cuda_check(cudaMalloc(&seen, requests * sizeof(unsigned)), "cudaMalloc");
  cuda_check(cudaMalloc(&status, sizeof(int)), "cudaMalloc");
  auto* q = static_cast<Q*>(storage);
  KernelTimer timer;
  const auto timed = [&](auto launch) { return timer.us(launch); };
  // Every request exactly once and whole, nothing left over.
  const auto verify = [&](const std::string& phase) {
    unsigned c[3];
    cuda_check(cudaMemcpy(c, counters, sizeof c, cudaMemcpyDeviceToHost), "copy");
    std::vector<unsigned> s(requests);
    cuda_check(cudaMemcpy(s.data(), seen, requests * sizeof(unsigned), cudaMemcpyDeviceToHost), "copy");
    const bool once = std::all_of(s.begin(), s.end(), [](unsigned x) { return x == 1; });
    const std::string where = std::string(what) + ", " + phase;
    const bool pushed = checks.expect(c[0] == 0, where + ": every push succeeded");
    const bool whole = checks.expect(c[1] == 0, where + ": every request came out whole");
    const bool popped = checks.expect(c[2] == 0 && once, where + ": every request popped exactly once");
    return pushed && whole && popped;
  };
  std::vector<double> push, pop, mixed;
  QueueTimes t;
  const auto began = std::chrono::steady_clock::now();
  for (int rep = 0; rep < 5; ++rep) {
    if (rep > 0 && std::chrono::steady_clock::now() - began > repeat_budget) {
      std::printf("  %s: %d runs (stopped repeating after %lld s)\n", what, rep,
                  static_cast<long long>(std::chrono::duration_cast<std::chrono::seconds>(repeat_budget).count()));
      break;
    }
    build<Q><<<1, 1>>>(q, status);
    int built = -1;
    cuda_check(cudaMemcpy(&built, status, sizeof built, cudaMemcpyDeviceToHost), "build");
    if (!checks.expect(built == 0, std::string(what) + ": built on the device (device heap large enough)")) {
      t.sound = false;
      break;
    }
    cuda_check(cudaMemset(counters, 0, 3 * sizeof(unsigned)), "reset");
    cuda_check(cudaMemset(seen, 0, requests * sizeof(unsigned)), "reset");
    push.push_back(timed([&] { push_all<Q><<<grid, block>>>(q, counters); }));
    pop.push_back(timed([&] { pop_all<Q><<<grid, block>>>(q, seen, counters); }));
    t.sound = verify("push then pop") && t.sound;
    cuda_check(cudaMemset(counters, 0, 3 * sizeof(unsigned)), "reset");
    cuda_check(cudaMemset(seen, 0, requests * sizeof(unsigned)), "reset");
    mixed.push_back(timed([&] { push_and_pop<Q><<<2 * grid, block>>>(q, seen, counters); }));
    t.sound = verify("pushes and pops in one kernel") && t.sound;
    destroy<Q><<<1, 1>>>(q);
    cuda_check(cudaDeviceSynchronize(), "destroy");
  }
  t.push_us = percentile(push, 0.5);
  t.pop_us = percentile(pop, 0.5);
  t.mixed_us = percentile(mixed, 0.5);
  const auto per_request = [](double us) { return us * 1000.0 / requests; };
  std::printf("  %-34s push %8.1f us (%5.2f ns/request)  pop %8.1f us (%5.2f)  both in one kernel %8.1f us (%5.2f)\n",
              what, t.push_us, per_request(t.push_us), t.pop_us, per_request(t.pop_us), t.mixed_us,
              per_request(t.mixed_us));
  cudaFree(storage);
  cudaFree(counters);
  cudaFree(seen);
  cudaFree(status);
  return t;
}

void device_queue() {
  // The rings' cells come from the device heap: 3 tiers of 1M cells for the queue, 1M for the ring.
  cuda_check(cudaDeviceSetLimit(cudaLimitMallocHeapSize, std::size_t{512} << 20), "device heap size");
  std::printf("device queue: %u requests, 256 threads per block, medians of 5\n", requests);
  Checks checks;
  const QueueTimes ring = time_queue<Ring>("one MpmcRing (no tiers)", checks);
  const QueueTimes tiered = time_queue<TieredQueue>("SizeTieredQueue, 3 tiers, round robin", checks);
  constexpr const char* source =
      "carve's host numbers: one thread's classify + push + pop through SizeTieredQueue costs 2.4x one MpmcRing "
      "(benchmarks/queue.md)";
  const bool sound = ring.sound && tiered.sound;
  const auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
  carve::bench::target("device queue push, SizeTieredQueue over one MpmcRing", ratio(tiered.push_us, ring.push_us), "x",
                       Aim::at_most, 3.0, source, sound);
  carve::bench::target("device queue pop, SizeTieredQueue over one MpmcRing", ratio(tiered.pop_us, ring.pop_us), "x",
                       Aim::at_most, 3.0, source, sound);
  carve::bench::target("device queue pushes and pops in one kernel, SizeTieredQueue over one MpmcRing",
                       ratio(tiered.mixed_us, ring.mixed_us), "x", Aim::at_most, 3.0, source, sound);
}

// ---- borrowing across cards ------------------------------------------------------------------

using Borrower = carve::BorrowingAllocator<carve::CudaDeviceResource, carve::LargestBandwidth, carve::CudaPeerAccess>;

constexpr std::size_t read_bytes = std::size_t{256} << 20;
constexpr std::size_t borrow_bytes = std::size_t{64} << 20;

// Every 16-byte word of `p` summed as four 32-bit numbers, into *sum.
__global__ void read_all(const uint4* p, std::size_t n, unsigned long long* sum) {
  unsigned long long s = 0;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    const uint4 v = p[i];
    s += std::uint64_t{v.x} + v.y + v.z + v.w;
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    s += __shfl_down_sync(0xffffffffU, s, offset);
  }
  if ((threadIdx.x & 31U) == 0) {
    atomicAdd(sum, s);
  }
}

// A kernel on `reader` reads `bytes` at `p` (every byte 1): GB/s, median of 5 after one warm-up,
// and whether every run's sum was right.
struct Read {
  double gbps = 0;
  bool right = true;
};

Read read_from(int reader, const void* p, std::size_t bytes) {
  cuda_check(cudaSetDevice(reader), "cudaSetDevice");
  cudaDeviceProp prop{};
  cuda_check(cudaGetDeviceProperties(&prop, reader), "device properties");
  unsigned long long* sum = nullptr;
  cuda_check(cudaMalloc(&sum, sizeof *sum), "cudaMalloc");
  KernelTimer timer;
  const std::size_t words = bytes / sizeof(uint4);
  const unsigned long long expected = static_cast<unsigned long long>(words) * 4ULL * 0x01010101ULL;
  const auto grid = static_cast<unsigned>(prop.multiProcessorCount * 8);
  std::vector<double> gbps;
  Read r;
  for (int rep = 0; rep < 6; ++rep) {
    cuda_check(cudaMemset(sum, 0, sizeof *sum), "reset");
    const double us =
        timer.us([&] { read_all<<<grid, 256>>>(static_cast<const uint4*>(p), words, sum); }, "read kernel");
    unsigned long long got = 0;
    cuda_check(cudaMemcpy(&got, sum, sizeof got, cudaMemcpyDeviceToHost), "copy");
    r.right = r.right && got == expected;
    if (rep > 0) {
      gbps.push_back(static_cast<double>(bytes) / (us * 1e3));
    }
  }
  r.gbps = percentile(gbps, 0.5);
  cudaFree(sum);
  return r;
}

void fill_ones(int device, void* p, std::size_t bytes) {
  cuda_check(cudaSetDevice(device), "cudaSetDevice");
  cuda_check(cudaMemset(p, 1, bytes), "cudaMemset");
  cuda_check(cudaDeviceSynchronize(), "cudaMemset");
}

double microseconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

void borrowing(int devices) {
  if (devices < 2) {
    std::printf("borrowing: one visible card, nothing to borrow from; not measured\n");
    return;
  }
  const carve::Topology topology = carve::discover_topology();
  Borrower borrower(
      topology, [](int d) { return carve::CudaDeviceResource(d); }, {}, 1024, carve::CudaPeerAccess());
  std::optional<carve::BorrowDecision> last;
  borrower.on_decision([&](const carve::BorrowDecision& d) { last = d; });
  std::printf("borrowing: %d cards; a kernel on each reads 256 MiB on every peer it can map, then 256 MiB borrowed\n",
              devices);
  constexpr const char* scored_source = "80% of the path bandwidth the picker scored (the topology's link figures)";
  constexpr const char* best_source = "90% of the best peer measured in this run (the picker's job: the widest path)";
  constexpr const char* cost_source =
      "carve's host numbers: the same decision with a segment in one process, 5.8 us p50 (docs/service.md)";
  for (int r = 0; r < devices; ++r) {
    Checks checks;
    double best = 0;
    int best_card = -1;
    for (int l = 0; l < devices; ++l) {
      if (l == r || !borrower.peer_access().can_access(r, l)) {
        continue;
      }
      cuda_check(cudaSetDevice(r), "cudaSetDevice");
      if (const cudaError_t e = cudaDeviceEnablePeerAccess(l, 0); e != cudaSuccess) {
        cudaGetLastError(); // "already enabled" is fine; anything else shows in the read below
      }
      void* p = nullptr;
      cuda_check(cudaSetDevice(l), "cudaSetDevice");
      cuda_check(cudaMalloc(&p, read_bytes), "cudaMalloc on the peer");
      fill_ones(l, p, read_bytes);
      const Read direct = read_from(r, p, read_bytes);
      checks.expect(direct.right, "GPU" + std::to_string(r) + " reading GPU" + std::to_string(l) + ": right sum");
      std::printf("  GPU%d reads GPU%d: %.1f GB/s (topology: %.1f GB/s)\n", r, l, direct.gbps,
                  borrower.picker().bandwidth(r, l));
      if (direct.gbps > best) {
        best = direct.gbps;
        best_card = l;
      }
      cuda_check(cudaSetDevice(l), "cudaSetDevice");
      cudaFree(p);
    }
    if (best_card < 0) {
      std::printf("  GPU%d can map no peer: nothing to borrow\n", r);
      continue;
    }
    last.reset();
    auto peers = borrower.peers(r);
    const auto block = peers.try_allocate(read_bytes, 256);
    if (!checks.expect(block.has_value() && last.has_value(), "GPU" + std::to_string(r) + " borrows 256 MiB")) {
      std::printf("  %s\n", peers.explain_no_pick(read_bytes).c_str());
      continue;
    }
    const carve::BorrowDecision decision = *last;
    checks.expect(decision.lender != r, "the borrowed block is on another card");
    fill_ones(decision.lender, *block, read_bytes);
    const Read borrowed = read_from(r, *block, read_bytes);
    checks.expect(borrowed.right, "the borrowed bytes sum right");
    peers.deallocate(*block, read_bytes, 256);

    // What a borrow adds to the allocation itself: borrow + give_back against cudaMalloc +
    // cudaFree of the same bytes on the same lender (warm: peer access is on by now).
    std::vector<double> borrow_us, malloc_us;
    for (int rep = 0; rep < 21; ++rep) {
      auto t0 = std::chrono::steady_clock::now();
      const auto h = borrower.peers(r).try_allocate(borrow_bytes, 256);
      if (!checks.expect(h.has_value(), "a 64 MiB borrow")) {
        break;
      }
      borrower.peers(r).deallocate(*h, borrow_bytes, 256);
      borrow_us.push_back(microseconds_since(t0));
      cuda_check(cudaSetDevice(decision.lender), "cudaSetDevice");
      t0 = std::chrono::steady_clock::now();
      void* p = nullptr;
      cuda_check(cudaMalloc(&p, borrow_bytes), "cudaMalloc");
      cuda_check(cudaFree(p), "cudaFree");
      malloc_us.push_back(microseconds_since(t0));
    }
    const double borrow_p50 = percentile(borrow_us, 0.5);
    const double malloc_p50 = percentile(malloc_us, 0.5);
    std::printf("  GPU%d borrows from GPU%d (picker's score %.1f GB/s; best measured GPU%d at %.1f GB/s): %.1f GB/s; "
                "borrow + give_back %.1f us, cudaMalloc + cudaFree %.1f us\n",
                r, decision.lender, decision.bandwidth_gbps, best_card, best, borrowed.gbps, borrow_p50, malloc_p50);
    const std::string name = "borrowed read GPU" + std::to_string(r) + " <- GPU" + std::to_string(decision.lender);
    carve::bench::target(name + " over the picker's score", borrowed.gbps, "GB/s", Aim::at_least,
                         0.8 * decision.bandwidth_gbps, scored_source, checks.ok());
    carve::bench::target(name + " over the best peer measured", borrowed.gbps, "GB/s", Aim::at_least, 0.9 * best,
                         best_source, checks.ok());
    carve::bench::target("borrow + give_back of 64 MiB for GPU" + std::to_string(r) + ", beyond cudaMalloc + cudaFree",
                         borrow_p50 - malloc_p50, "us", Aim::at_most, 6.0, cost_source, checks.ok());
  }
}

} // namespace

int main() {
  // Each line reaches the report's file as it is printed, whatever happens later.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const int devices = carve::bench::require_devices("gpu_system");
  for (int d = 0; d < devices; ++d) {
    cudaDeviceProp prop{};
    cuda_check(cudaGetDeviceProperties(&prop, d), "device properties");
    std::printf("GPU%d: %s, %d SMs, %.1f GiB\n", d, prop.name, prop.multiProcessorCount,
                static_cast<double>(prop.totalGlobalMem) / (1 << 30));
  }
  cuda_check(cudaSetDevice(0), "cudaSetDevice");
  device_queue();
  try {
    borrowing(devices);
  } catch (const carve::Exception& e) { // discovering the topology or opening a card failed
    std::printf("FAILED: borrowing: %s\n", e.what());
    return 1;
  }
  return carve::bench::failed_checks() == 0 ? 0 : 1;
}
