// carve's pool plugs into CCCL's memory-resource machinery. CCCL 3.0 keeps it behind an opt-in
// macro, which must come before the first CCCL include.
#define LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE
#include <carve/mr.hpp>

#include <doctest/doctest.h>

#include <cuda/memory_resource>

using carve::CachingPool;
using carve::SimulatedCard;
using Pool = CachingPool<SimulatedCard>;

static_assert(carve::cuda_mr_available);
// carve's statement of synchronous_resource, with CCCL's real property types.
static_assert(carve::SynchronousResourceWith<Pool, cuda::mr::host_accessible>);
static_assert(!carve::SynchronousResourceWith<Pool, cuda::mr::device_accessible>);
static_assert(carve::SynchronousResourceWith<SimulatedCard, cuda::mr::host_accessible>);
static_assert(carve::SynchronousResourceWith<carve::StreamCachingPool<SimulatedCard>, cuda::mr::host_accessible>);
#if !defined(CARVE_HAS_CUDA_SYNCHRONOUS_RESOURCE)
static_assert(CCCL_MAJOR_VERSION == 3 && CCCL_MINOR_VERSION == 0); // the last CCCL without it
static_assert(cuda::mr::resource<SimulatedCard>);
static_assert(cuda::mr::resource<Pool>);
static_assert(cuda::mr::resource_with<Pool, cuda::mr::host_accessible>);
static_assert(!cuda::mr::resource_with<Pool, cuda::mr::device_accessible>);
using HostRef = cuda::mr::resource_ref<cuda::mr::host_accessible>;
// The stream-ordered pool over CUDA streams is CCCL's stream-ordered resource.
static_assert(cuda::mr::async_resource<carve::StreamOrderedPool<carve::CudaDeviceResource, carve::CudaStreams>>);
static_assert(cuda::mr::async_resource<carve::StreamCachingPool<carve::CudaDeviceResource, carve::CudaStreams>>);
#else
static_assert(cuda::mr::resource<carve::StreamOrderedPool<carve::CudaDeviceResource, carve::CudaStreams>>);
static_assert(cuda::mr::resource<carve::StreamCachingPool<carve::CudaDeviceResource, carve::CudaStreams>>);
static_assert(cuda::mr::synchronous_resource<Pool>);
static_assert(cuda::mr::synchronous_resource_with<Pool, cuda::mr::host_accessible>);
static_assert(!cuda::mr::synchronous_resource_with<Pool, cuda::mr::device_accessible>);
using HostRef = cuda::mr::synchronous_resource_ref<cuda::mr::host_accessible>;
#endif

namespace {
// Code written against CCCL that knows nothing about carve.
int* make_ints(HostRef mr, int n) {
  auto* p = static_cast<int*>(mr.allocate(sizeof(int) * static_cast<std::size_t>(n), alignof(int)));
  for (int i = 0; i < n; ++i) {
    p[i] = i;
  }
  return p;
}
} // namespace

TEST_CASE("a CachingPool through a CCCL resource_ref") {
  Pool pool(SimulatedCard(1 << 20), carve::PoolOptions{.granularity = 256, .segment_size = 64 << 10});
  int* p = make_ints(HostRef(pool), 1000);
  CHECK(p[999] == 999);
  CHECK(pool.stats().bytes_in_use == 4096);
  HostRef(pool).deallocate(p, sizeof(int) * 1000, alignof(int));
  CHECK(pool.stats().bytes_in_use == 0);
  CHECK(pool.stats().bytes_cached == 64 << 10);
  CHECK(pool == pool);
}

TEST_CASE("stacks keep the properties their parts share, and CCCL's resource_ref takes them") {
  using Counted = carve::StatsResource<Pool>;
  using Stack = carve::Segregator<4096, Pool, Counted>;
  static_assert(carve::SynchronousResourceWith<Counted, cuda::mr::host_accessible>);
  static_assert(carve::SynchronousResourceWith<Stack, cuda::mr::host_accessible>);
  static_assert(!carve::SynchronousResourceWith<Stack, cuda::mr::device_accessible>);
  static_assert(carve::SynchronousResourceWith<carve::ResourceRef<Pool>, cuda::mr::host_accessible>);
  static_assert(
      carve::SynchronousResourceWith<carve::LimitResource<carve::ResourceRef<Pool>>, cuda::mr::host_accessible>);
  Stack stack(SimulatedCard(1 << 20), SimulatedCard(4 << 20));
  int* small = make_ints(HostRef(stack), 100);  // 400 bytes: the first pool
  int* large = make_ints(HostRef(stack), 5000); // 20000 bytes: the counted one
  CHECK(small[99] == 99);
  CHECK(large[4999] == 4999);
  CHECK(stack.small().stats().live_blocks == 1);
  CHECK(stack.large().stats().allocations == 1);
  HostRef(stack).deallocate(small, 400, alignof(int));
  HostRef(stack).deallocate(large, 20000, alignof(int));
  CHECK(stack.large().stats().bytes_in_use == 0);
}
