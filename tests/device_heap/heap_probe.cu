// Every way carve's device-capable types take memory from the device heap inside a kernel,
// compiled to PTX so that check_heap_writes.py can prove, without a GPU, that none writes
// below the blocks it gets: rings and queues built on a thread's stack and in global memory,
// at block and device scope, under each drain policy that runs in kernels (the four of
// tests/layout/device_types.hpp).
#include <carve/queue.hpp>

#include <cuda/atomic>

#include <cstdint>
#include <new>

namespace {

struct Request {
  std::uint32_t id;
  std::uint32_t vectors;
};

struct Vectors {
  __host__ __device__ std::uint64_t operator()(const Request& r) const noexcept { return r.vectors; }
};

template <cuda::thread_scope Scope, class Drain>
using Queue = carve::SizeTieredQueue<Request, Vectors, carve::RingLanes<Scope>, Drain>;
using DeviceRing = carve::MpmcRing<Request, cuda::thread_scope_device>;
using GlobalQueue = Queue<cuda::thread_scope_device, carve::RoundRobin>;

__device__ alignas(DeviceRing) unsigned char ring_storage[sizeof(DeviceRing)];
__device__ alignas(GlobalQueue) unsigned char queue_storage[sizeof(GlobalQueue)];

} // namespace

__global__ void ring_on_stack(std::uint32_t capacity, std::uint32_t* out) {
  carve::MpmcRing<Request, cuda::thread_scope_block> ring(capacity);
  Request r{1, 2};
  out[0] = ring.try_push(r, 0) ? 1U : 0U;
}

__global__ void ring_in_global_memory(std::uint32_t capacity) { new (ring_storage) DeviceRing(capacity); }

__global__ void ring_destroyed() { reinterpret_cast<DeviceRing*>(ring_storage)->~DeviceRing(); }

__global__ void queue_in_global_memory(std::uint32_t per_tier, int* status) {
  auto* q = new (queue_storage) GlobalQueue(carve::TierThresholds{128, 512}, per_tier);
  *status = q->status() ? 0 : static_cast<int>(q->status().error());
}

__global__ void queue_destroyed() { reinterpret_cast<GlobalQueue*>(queue_storage)->~GlobalQueue(); }

template <class Drain>
__device__ int queue_on_stack(std::uint32_t per_tier, Drain drain) {
  Queue<cuda::thread_scope_block, Drain> q(carve::TierThresholds{128, 512}, per_tier, drain);
  (void)q.try_push(Request{1, 200});
  return q.try_pop() ? 0 : 1;
}

__global__ void queues_on_stack(std::uint32_t per_tier, int* out) {
  out[0] = queue_on_stack(per_tier, carve::RoundRobin{});
  out[1] = queue_on_stack(per_tier, carve::StrictPriority{});
  const std::uint32_t weights[] = {4, 2, 1};
  out[2] = queue_on_stack(per_tier, carve::WeightedRoundRobin(weights));
  const std::uint64_t quanta[] = {4096, 1024, 256};
  out[3] = queue_on_stack(per_tier, carve::DeficitRoundRobin(quanta));
}
