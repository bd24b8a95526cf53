// Scratch for every thread of a kernel from a stack of two slot arenas: the block's own shared
// memory first (a lock-free block-scope allocator), and a device-wide arena in global memory
// when the block's is full. Each thread sums its item's values in its scratch; the host checks.
#include <carve/carve.hpp>

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

using Local = carve::SlotArena<carve::ConcurrentSlotAllocator<64, carve::BoundaryNearestFit, cuda::thread_scope_block>>;
using Global = carve::SlotArena<carve::ConcurrentSlotAllocatorRef<4096>>; // a handle: every block shares it
using Scratch = carve::FallbackResource<Local, Global>;
constexpr unsigned long long no_scratch = ~0ull; // an item's result when it got no scratch

__global__ void sums(const unsigned* counts, unsigned long long* out, Global global) {
  __shared__ alignas(128) std::byte local_memory[64 * 128];
  __shared__ Scratch scratch;
  if (threadIdx.x == 0) { // shared memory is not constructed: one thread sets the stack up
    scratch.primary().reset(local_memory, sizeof local_memory, 128);
    scratch.fallback() = global;
  }
  __syncthreads();
  const unsigned item = blockIdx.x * blockDim.x + threadIdx.x;
  const std::size_t bytes = counts[item] * sizeof(unsigned);
  auto p = scratch.try_allocate(bytes, alignof(unsigned));
  // Both arenas full: other threads are about to free theirs. Bounded, so that a stack that can
  // never serve (an arena given bad input) ends the kernel with an answer instead of a hang.
  for (int tries = 0; !p && p.error() == carve::Errc::no_space && tries < 1'000'000; ++tries) {
    p = scratch.try_allocate(bytes, alignof(unsigned));
  }
  if (!p) {
    out[item] = no_scratch;
    return;
  }
  auto* values = static_cast<unsigned*>(*p);
  out[item] = 0;
  for (unsigned i = 0; i < counts[item]; ++i) {
    values[i] = item + i;
    out[item] += values[i];
  }
  scratch.deallocate(*p, bytes, alignof(unsigned));
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::printf("compose_block_scratch: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::puts("compose_block_scratch: no CUDA device here; nothing to run");
    return 77;
  }
  constexpr unsigned items = 64 * 256;
  unsigned* counts = nullptr;
  unsigned long long* out = nullptr;
  std::byte* memory = nullptr;
  carve::bits::word* words = nullptr;
  check(cudaMallocManaged(&counts, items * sizeof(unsigned)), "cudaMallocManaged");
  check(cudaMallocManaged(&out, items * sizeof(unsigned long long)), "cudaMallocManaged");
  check(cudaMallocManaged(&memory, 4096 * 128), "cudaMallocManaged");
  check(cudaMallocManaged(&words, carve::bits::word_count(4096) * sizeof(carve::bits::word)), "cudaMallocManaged");
  for (unsigned i = 0; i < items; ++i) {
    counts[i] = 1 + i * 37 % 200; // 4 to 800 bytes of scratch each
  }
  Global global(memory, 4096 * 128, 128,
                carve::ConcurrentSlotAllocatorRef<4096>(carve::BorrowedSlotWords<4096>(words)));
  global.reset(); // all 4096 slots free
  sums<<<64, 256>>>(counts, out, global);
  check(cudaGetLastError(), "launching sums"); // e.g. no kernel image for this GPU
  check(cudaDeviceSynchronize(), "sums");
  for (unsigned long long i = 0; i < items; ++i) {
    const unsigned long long n = counts[i];
    if (out[i] == no_scratch) {
      std::printf("compose_block_scratch: item %llu got no scratch\n", i);
      return 1;
    }
    if (out[i] != n * i + n * (n - 1) / 2) {
      std::printf("compose_block_scratch: item %llu summed to %llu\n", i, out[i]);
      return 1;
    }
  }
  std::printf("%u items summed in scratch from block shared memory, then the global arena\n", items);
  return 0;
}
