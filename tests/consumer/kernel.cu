// A .cu file of a project that consumes carve: a kernel whose blocks each share one lock-free slot
// allocator in shared memory. Built with nothing but carve::carve linked: the target asks for the
// C++20 that carve's headers need. It includes the slot folder's umbrella, what the kernel uses
// (below_cxx20.cu includes <carve/carve.hpp>, which in a .cu adds mr, queue and core).
#include <carve/slot.hpp>
#include <carve/version.hpp>

#include <cstdio>

constexpr unsigned threads = 64;

// Every thread takes 2 of the block's 128 slots at once and reports where; the host checks that
// no two threads of a block were given the same slot.
__global__ void claim(unsigned* firsts) {
  __shared__ carve::ConcurrentSlotAllocator<128, carve::BoundaryNearestFit, cuda::thread_scope_block> slots;
  if (threadIdx.x == 0) slots.reset(); // shared memory is not constructed
  __syncthreads();
  const auto r = slots.allocate(2);
  firsts[blockIdx.x * threads + threadIdx.x] = r ? r->first : ~0u;
}

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::puts("consumer_cuda: built with carve; no CUDA device here, so the kernel did not run");
    return 0;
  }
  constexpr unsigned blocks = 4;
  unsigned* firsts = nullptr;
  if (cudaMallocManaged(&firsts, blocks * threads * sizeof(unsigned)) != cudaSuccess) return 1;
  claim<<<blocks, threads>>>(firsts);
  if (cudaDeviceSynchronize() != cudaSuccess) return 1;
  for (unsigned b = 0; b < blocks; ++b) {
    bool taken[128] = {};
    for (unsigned t = 0; t < threads; ++t) {
      const unsigned first = firsts[b * threads + t];
      if (first > 126 || taken[first] || taken[first + 1]) {
        std::printf("consumer_cuda: block %u thread %u got slot %u\n", b, t, first);
        return 1;
      }
      taken[first] = taken[first + 1] = true;
    }
  }
  cudaFree(firsts);
  std::printf("consumer_cuda: carve %d.%d.%d in a kernel, %u blocks x %u threads\n", carve::version_major,
              carve::version_minor, carve::version_patch, blocks, threads);
  return 0;
}
