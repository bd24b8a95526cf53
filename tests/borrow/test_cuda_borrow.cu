// On a machine with GPUs: the topology the CUDA runtime reports, a CachingPool over cudaMalloc,
// and a BorrowingAllocator across every device. Exit code 77 (skipped) without a GPU.
#include "support/device_test.hpp"

#include <carve/borrow.hpp>
#include <carve/mr/caching_pool.hpp> // host-only: not in <carve/mr.hpp> in a .cu
#include <carve/mr/cuda_device_resource.hpp>
#include <carve/topology.hpp>
#include <carve/topology/cuda_discovery.hpp>

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

using carve::test::expect;
using carve::test::failures;

__global__ void fill(unsigned char* p, std::size_t n, unsigned char v) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    p[i] = v;
  }
}

bool filled(const void* device_ptr, std::size_t n, unsigned char v) {
  std::vector<unsigned char> host(n);
  if (cudaMemcpy(host.data(), device_ptr, n, cudaMemcpyDeviceToHost) != cudaSuccess) {
    return false;
  }
  for (const unsigned char c : host) {
    if (c != v) {
      return false;
    }
  }
  return true;
}

} // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device: skipped\n");
    return 77;
  }
  const carve::Topology topo = carve::discover_topology();
  expect(topo.gpu_count() == devices, "one GPU node per CUDA device");
  for (int a = 0; a < devices; ++a) {
    for (int b = 0; b < devices; ++b) {
      if (a != b) {
        expect(topo.path_bandwidth(topo.gpu(a), topo.gpu(b)) > 0.0, "every pair of GPUs has a path");
        std::printf("GPU%d -> GPU%d: %.0f GB/s over %d link(s)\n", a, b, topo.path_bandwidth(topo.gpu(a), topo.gpu(b)),
                    topo.hops(topo.gpu(a), topo.gpu(b)));
      }
    }
  }

  carve::CachingPool pool(carve::CudaDeviceResource(0));
  const std::size_t n = 3 << 20;
  const auto p = pool.try_allocate(n, 256);
  expect(p.has_value(), "cudaMalloc through the pool");
  if (p) {
    fill<<<64, 256>>>(static_cast<unsigned char*>(*p), n, 0x5a);
    expect(cudaDeviceSynchronize() == cudaSuccess, "kernel writes pool memory");
    expect(filled(*p, n, 0x5a), "the memory holds what the kernel wrote");
    expect(pool.try_deallocate(*p, n, 256).has_value(), "deallocate");
    const auto again = pool.try_allocate(n, 256);
    expect(again && *again == *p, "the freed block is reused");
    expect(pool.try_deallocate(*again, n, 256).has_value(), "deallocate again");
  }
  expect(pool.stats().upstream_allocations == 1, "one cudaMalloc for both");
  expect(pool.trim() > 0, "trim calls cudaFree");
  expect(pool.try_allocate(std::size_t{1} << 50, 256).error() == carve::Errc::no_space, "an impossible request");

  using Pool = carve::CachingPool<carve::CudaDeviceResource>;
  carve::BorrowingAllocator<Pool, carve::LargestBandwidth, carve::CudaPeerAccess> alloc(
      topo, [](int d) { return Pool(carve::CudaDeviceResource(d)); }, {}, 1024, carve::CudaPeerAccess());
  for (int r = 0; r < devices; ++r) {
    for (int l = 0; l < devices; ++l) {
      int driver = 0;
      cudaDeviceCanAccessPeer(&driver, r, l);
      expect(r == l || alloc.peer_access().can_access(r, l) == (driver != 0), "the driver's peer matrix");
      expect(r == l || (alloc.picker().bandwidth(r, l) > 0.0) <= (driver != 0), "unmappable lenders are never scored");
    }
  }
  const auto h = alloc.borrow_explained(devices - 1, 1 << 20, carve::default_alignment);
  expect(h.has_value() && h->card == devices - 1, "a card with room allocates locally");
  if (h) {
    expect(alloc.give_back(*h).has_value(), "give back through the allocator");
  }
  carve::CachingPool last(alloc.card(devices - 1)); // a pool over the card's memory, borrowed when full
  const auto q = last.try_allocate(n, 256);
  expect(q.has_value(), "a pool over borrower.card(i)");
  if (q) {
    fill<<<64, 256>>>(static_cast<unsigned char*>(*q), n, 0x33);
    expect(cudaDeviceSynchronize() == cudaSuccess && filled(*q, n, 0x33), "a kernel writes it");
    last.deallocate(*q, n, 256);
  }
  std::printf(failures == 0 ? "all passed\n" : "%d failed\n", failures);
  return failures == 0 ? 0 : 1;
}
