// SizeTieredQueue inside kernels: a device-scope queue in global memory, built by a kernel,
// pushed and popped by every thread of a grid (every request popped exactly once, in its own
// tier), the drain order of one device thread equal to the host's, and bad configurations
// reported as carve::Errc on the device.
#include "support/device_test.hpp"

#include <carve/queue.hpp>

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <new>
#include <vector>

namespace {

using carve::test::check;
using carve::test::to_host;

struct Request {
  std::uint32_t id;
  std::uint32_t vectors;
};

struct Vectors {
  __host__ __device__ std::uint64_t operator()(const Request& r) const noexcept { return r.vectors; }
};

template <class Drain>
using DeviceQueue = carve::SizeTieredQueue<Request, Vectors, carve::RingLanes<cuda::thread_scope_device>, Drain>;
using RoundRobinQueue = DeviceQueue<carve::RoundRobin>;
using PriorityQueue = DeviceQueue<carve::StrictPriority>;

constexpr std::uint32_t requests = 1 << 14;
constexpr std::uint32_t per_tier = requests; // every request fits, whatever its tier

__device__ alignas(RoundRobinQueue) unsigned char queue_storage[sizeof(RoundRobinQueue)];
__device__ RoundRobinQueue& shared_queue() { return *reinterpret_cast<RoundRobinQueue*>(queue_storage); }

__host__ __device__ std::uint32_t vectors_of(std::uint32_t id) { return (id * 37U) % 1100U + 1U; }

__global__ void build(int* status) {
  const carve::TierThresholds t{128, 512};
  if (!t.status()) {
    *status = static_cast<int>(t.status().error());
    return;
  }
  auto* q = new (queue_storage) RoundRobinQueue(t, per_tier);
  *status = q->status() ? 0 : static_cast<int>(q->status().error());
}

__global__ void destroy() { shared_queue().~RoundRobinQueue(); }

__global__ void push_all(unsigned* failures) {
  const std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < requests && !shared_queue().try_push(Request{i, vectors_of(i)})) {
    atomicAdd(failures, 1U);
  }
}

// Each thread pops once; `seen[id]` counts how often each request came out, `wrong_tier` counts
// requests whose tier does not match their size.
__global__ void pop_all(unsigned* seen, unsigned* wrong_tier, unsigned* empty) {
  const std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= requests) {
    return;
  }
  const auto r = shared_queue().try_pop();
  if (!r) {
    atomicAdd(empty, 1U);
    return;
  }
  atomicAdd(&seen[r->id], 1U);
  if (r->vectors != vectors_of(r->id)) {
    atomicAdd(wrong_tier, 1U);
  }
}

// Half the threads push, half pop (retrying, with a PollBackoff, until they got one), in the same
// kernel.
__global__ void push_and_pop(unsigned* seen, unsigned* failures) {
  const std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  const std::uint32_t k = i / 2;
  if (k >= requests) {
    return;
  }
  if (i % 2 == 0) {
    if (!shared_queue().try_push(Request{k, vectors_of(k)})) {
      atomicAdd(failures, 1U);
    }
    return;
  }
  carve::PollBackoff idle(100, 2'000); // pushes arrive within microseconds: short waits
  for (int attempt = 0; attempt < 1 << 16; ++attempt) {
    if (const auto r = shared_queue().try_pop()) {
      atomicAdd(&seen[r->id], 1U);
      return;
    }
    idle.wait();
  }
  atomicAdd(failures, 1U); // never got one: the pushes it waited for did not arrive
}

__global__ void sizes(unsigned long long* out) {
  out[0] = shared_queue().size();
  out[1] = shared_queue().size(0);
  out[2] = shared_queue().closed() ? 1 : 0;
}

// A queue is about 15 KiB (each tier's counters on cache lines of their own): a kernel keeps it in
// global memory, as a device queue lives, not on a thread's stack. The one-thread kernels below
// build theirs in these two places and destroy them before they return.
static_assert(sizeof(PriorityQueue) <= sizeof(RoundRobinQueue) && alignof(PriorityQueue) <= alignof(RoundRobinQueue));
__device__ alignas(RoundRobinQueue) unsigned char scratch_storage[2][sizeof(RoundRobinQueue)];

template <class Queue, class... Args>
__device__ Queue& build_scratch(int which, Args... args) {
  return *new (scratch_storage[which]) Queue(args...);
}

// One thread: the drain order under both policies for a scripted push sequence.
template <class Queue>
__host__ __device__ void scripted(Queue& q, std::uint32_t* order, std::uint32_t n) {
  for (std::uint32_t i = 0; i < n; ++i) {
    (void)q.try_push(Request{i, vectors_of(i * 7)});
  }
  for (std::uint32_t i = 0; i < n; ++i) {
    const auto r = q.try_pop();
    order[i] = r ? r->id : 0xffffffffU;
  }
}

constexpr std::uint64_t scripted_capacity = 64;

__global__ void scripted_kernel(std::uint32_t* rr, std::uint32_t* strict, std::uint32_t n) {
  const carve::TierThresholds t{128, 512};
  auto& round_robin = build_scratch<RoundRobinQueue>(0, t, scripted_capacity, carve::RoundRobin{});
  scripted(round_robin, rr, n);
  round_robin.~RoundRobinQueue();
  auto& priority = build_scratch<PriorityQueue>(1, t, scripted_capacity, carve::StrictPriority{});
  scripted(priority, strict, n);
  priority.~PriorityQueue();
}

// Bad input on the device, which cannot throw: objects that refuse every call with the Errc.
__global__ void bad_input(int* errors) {
  errors[0] = static_cast<int>(carve::TierThresholds{512, 128}.status().error());
  const carve::TierThresholds ok{128};
  auto& zero = build_scratch<RoundRobinQueue>(0, ok, std::uint64_t{0});
  errors[1] = static_cast<int>(zero.status().error());
  auto refused = zero.try_push(Request{1, 1});
  errors[2] = static_cast<int>(refused.error());
  zero.~RoundRobinQueue();
  auto& one = build_scratch<RoundRobinQueue>(1, ok, std::uint64_t{1});
  (void)one.try_push(Request{1, 1});
  errors[3] = static_cast<int>(one.try_push(Request{2, 2}).error());
  one.close();
  errors[4] = static_cast<int>(one.try_push(Request{3, 200}).error());
  (void)one.try_pop();
  errors[5] = static_cast<int>(one.try_pop().error());
  one.~RoundRobinQueue();
}

// A queue whose rings the device heap cannot hold (3 tiers of 2^22 cells, over 250 MiB, against
// the heap's default 8 MiB) says no_space in status() and refuses pushes; what it took goes back,
// so a queue that fits is built afterwards in the same kernel. out: the two statuses, the push.
__global__ void heap_too_small(int* out) {
  const carve::TierThresholds t{128, 512};
  auto& big = build_scratch<RoundRobinQueue>(0, t, std::uint64_t{1} << 22);
  out[0] = big.status() ? 0 : static_cast<int>(big.status().error());
  out[1] = static_cast<int>(big.try_push(Request{1, 1}).error());
  big.~RoundRobinQueue();
  auto& small = build_scratch<RoundRobinQueue>(1, t, std::uint64_t{1024});
  out[2] = small.status() ? 0 : static_cast<int>(small.status().error());
  small.~RoundRobinQueue();
}

template <class T>
T* device_zeros(std::size_t n) {
  T* p = nullptr;
  check(cudaMalloc(&p, n * sizeof(T)), "cudaMalloc");
  check(cudaMemset(p, 0, n * sizeof(T)), "cudaMemset");
  return p;
}

int expect(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "FAILED: %s\n", what);
  }
  return ok ? 0 : 1;
}

} // namespace

int main() {
  carve::test::skip_without_device();
  int failures = 0;
  constexpr unsigned threads = 256;
  constexpr unsigned blocks = requests / threads;

  int* status = device_zeros<int>(1);
  build<<<1, 1>>>(status);
  check(cudaGetLastError(), "build launch");
  check(cudaDeviceSynchronize(), "build");
  failures += expect(to_host(status, 1)[0] == 0, "queue built on the device");

  unsigned* counters = device_zeros<unsigned>(3);
  unsigned* seen = device_zeros<unsigned>(requests);
  push_all<<<blocks, threads>>>(counters);
  check(cudaGetLastError(), "push_all launch");
  check(cudaDeviceSynchronize(), "push_all");
  auto* size_out = device_zeros<unsigned long long>(3);
  sizes<<<1, 1>>>(size_out);
  check(cudaGetLastError(), "sizes launch");
  const auto after_push = to_host(size_out, 3);
  failures += expect(after_push[0] == requests, "size() counts every pushed request");
  pop_all<<<blocks, threads>>>(seen, counters + 1, counters + 2);
  check(cudaGetLastError(), "pop_all launch");
  check(cudaDeviceSynchronize(), "pop_all");
  auto c = to_host(counters, 3);
  auto s = to_host(seen, requests);
  std::uint32_t once = 0;
  for (const unsigned x : s) {
    once += x == 1 ? 1 : 0;
  }
  failures += expect(c[0] == 0, "every push succeeded");
  failures += expect(c[1] == 0, "every request came out whole");
  failures += expect(c[2] == 0 && once == requests, "every request popped exactly once");

  check(cudaMemset(seen, 0, requests * sizeof(unsigned)), "reset");
  check(cudaMemset(counters, 0, 3 * sizeof(unsigned)), "reset");
  push_and_pop<<<2 * blocks, threads>>>(seen, counters);
  check(cudaGetLastError(), "push_and_pop launch");
  check(cudaDeviceSynchronize(), "push_and_pop");
  c = to_host(counters, 3);
  s = to_host(seen, requests);
  once = 0;
  for (const unsigned x : s) {
    once += x == 1 ? 1 : 0;
  }
  failures += expect(c[0] == 0 && once == requests, "concurrent pushes and pops: each request exactly once");
  sizes<<<1, 1>>>(size_out);
  check(cudaGetLastError(), "sizes launch");
  failures += expect(to_host(size_out, 3)[0] == 0, "the queue is empty afterwards");
  destroy<<<1, 1>>>();
  check(cudaGetLastError(), "destroy launch");
  check(cudaDeviceSynchronize(), "destroy");

  constexpr std::uint32_t n = 48;
  auto* rr = device_zeros<std::uint32_t>(n);
  auto* strict = device_zeros<std::uint32_t>(n);
  scripted_kernel<<<1, 1>>>(rr, strict, n);
  check(cudaGetLastError(), "scripted_kernel launch");
  check(cudaDeviceSynchronize(), "scripted");
  std::vector<std::uint32_t> host_rr(n), host_strict(n);
  RoundRobinQueue host_round_robin(carve::TierThresholds{128, 512}, scripted_capacity, carve::RoundRobin{});
  scripted(host_round_robin, host_rr.data(), n);
  PriorityQueue host_priority(carve::TierThresholds{128, 512}, scripted_capacity, carve::StrictPriority{});
  scripted(host_priority, host_strict.data(), n);
  failures += expect(to_host(rr, n) == host_rr, "round-robin order on the device equals the host's");
  failures += expect(to_host(strict, n) == host_strict, "strict priority order on the device equals the host's");

  int* errors = device_zeros<int>(6);
  bad_input<<<1, 1>>>(errors);
  check(cudaGetLastError(), "bad_input launch");
  check(cudaDeviceSynchronize(), "bad_input");
  const auto e = to_host(errors, 6);
  failures += expect(e[0] == static_cast<int>(carve::Errc::invalid_thresholds), "unsorted thresholds refused");
  failures += expect(e[1] == static_cast<int>(carve::Errc::invalid_argument), "zero capacity refused");
  failures += expect(e[2] == static_cast<int>(carve::Errc::invalid_argument), "a refused queue refuses pushes");
  failures += expect(e[3] == static_cast<int>(carve::Errc::full), "full tier");
  failures += expect(e[4] == static_cast<int>(carve::Errc::closed), "closed queue refuses pushes");
  failures += expect(e[5] == static_cast<int>(carve::Errc::closed), "closed and drained");

  int* heap = device_zeros<int>(3);
  heap_too_small<<<1, 1>>>(heap);
  check(cudaGetLastError(), "heap_too_small launch");
  check(cudaDeviceSynchronize(), "heap_too_small");
  const auto h = to_host(heap, 3);
  failures += expect(h[0] == static_cast<int>(carve::Errc::no_space), "a queue the device heap cannot hold: no_space");
  failures += expect(h[1] == static_cast<int>(carve::Errc::no_space), "and it refuses pushes with it");
  failures += expect(h[2] == 0, "what it took went back: a queue that fits is built after it");

  cudaFree(heap);
  cudaFree(status);
  cudaFree(counters);
  cudaFree(seen);
  cudaFree(size_out);
  cudaFree(rr);
  cudaFree(strict);
  cudaFree(errors);
  if (failures != 0) {
    return 1;
  }
  std::puts("device SizeTieredQueue: all checks passed");
  return 0;
}
