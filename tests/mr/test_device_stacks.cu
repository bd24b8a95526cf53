// The combinators in kernels: a block-shared stack of a slot arena, a fallback to a global
// arena, a limit and counters, every thread allocating and freeing at once. Built by nvcc for
// every architecture in CI; run where a GPU is present (exit code 77 without one).
#include "support/device_test.hpp"

#include <carve/mr.hpp>
#include <carve/slot.hpp>

#include <cstdio>

namespace {

using Local =
    carve::SlotArena<carve::ConcurrentSlotAllocator<128, carve::BoundaryNearestFit, cuda::thread_scope_block>>;
using Global = carve::SlotArena<carve::ConcurrentSlotAllocatorRef<2048, carve::FirstFit>>;
using Counted = carve::StatsResource<carve::LimitResource<Global>>;
using Stack = carve::FallbackResource<Local, carve::Segregator<512, Counted, Global>>;

constexpr unsigned threads = 256;

// Every thread allocates 1..1000 bytes, writes them, checks them and frees them, `rounds` times.
__global__ void hammer(Global global, unsigned rounds, unsigned* failures, unsigned long long* served) {
  __shared__ alignas(64) std::byte local_memory[128 * 64];
  __shared__ Stack stack;
  if (threadIdx.x == 0) {
    stack.primary().reset(local_memory, sizeof local_memory, 64);
    stack.fallback().small() = Counted(carve::LimitResource<Global>(global, 64 << 10));
    stack.fallback().large() = global;
  }
  __syncthreads();
  const unsigned id = blockIdx.x * blockDim.x + threadIdx.x;
  // A thread that fails stops allocating but still reaches the barrier below with the others.
  for (unsigned round = 0; round < rounds; ++round) {
    const std::size_t bytes = 1 + (id * 131 + round * 977) % 1000;
    auto p = stack.try_allocate(bytes, 8);
    // Full: others are about to free. Bounded, so that a stack that can never serve fails the
    // test instead of hanging it.
    for (int tries = 0; !p && p.error() == carve::Errc::no_space && tries < 1'000'000; ++tries) {
      p = stack.try_allocate(bytes, 8);
    }
    if (!p) {
      atomicAdd(failures, 1u);
      break;
    }
    auto* b = static_cast<unsigned char*>(*p);
    for (std::size_t i = 0; i < bytes; ++i) {
      b[i] = static_cast<unsigned char>(id);
    }
    for (std::size_t i = 0; i < bytes; ++i) {
      if (b[i] != static_cast<unsigned char>(id)) {
        atomicAdd(failures, 1u); // someone else was handed the same bytes
        break;
      }
    }
    stack.deallocate(*p, bytes, 8);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const carve::ResourceStats s = stack.fallback().small().stats();
    if (s.bytes_in_use != 0 || s.allocations != s.deallocations || s.peak_bytes > (64 << 10)) {
      atomicAdd(failures, 1u);
    }
    atomicAdd(served, s.allocations);
  }
}

__global__ void reset(Global global) { global.slots().reset(); }

// Device code cannot throw: an arena given bad input reports it through status() and refuses
// every call with it, instead of holding nothing silently. out: per case, the status and the
// error try_allocate gave (0 for success).
__global__ void bad_arenas(int* out) {
  __shared__ alignas(64) std::byte local_memory[128 * 64];
  __shared__ Local arena;
  if (threadIdx.x != 0) {
    return;
  }
  const auto record = [&](int k) {
    const auto st = arena.status();
    out[2 * k] = st ? 0 : static_cast<int>(st.error());
    const auto p = arena.try_allocate(64, 8);
    out[2 * k + 1] = p ? 0 : static_cast<int>(p.error());
    if (p) {
      arena.deallocate(*p, 64, 8);
    }
  };
  arena.reset(local_memory, sizeof local_memory - 1, 64); // one byte short of 128 slots
  record(0);
  arena.reset(nullptr, sizeof local_memory, 64);
  record(1);
  arena.reset(local_memory, sizeof local_memory, 0);
  record(2);
  arena.reset(local_memory, sizeof local_memory, 64); // good input clears it
  record(3);
}
__global__ void free_bytes(Global global, unsigned long long* out) { *out = global.free_bytes(); }

} // namespace

int main() {
  using namespace carve::test;
  skip_without_device();
  std::byte* memory = nullptr;
  carve::bits::word* words = nullptr;
  check(cudaMalloc(&memory, 2048 * 64), "cudaMalloc arena");
  check(cudaMalloc(&words, carve::bits::word_count(2048) * sizeof(carve::bits::word)), "cudaMalloc words");
  const Global global(memory, 2048 * 64, 64,
                      carve::ConcurrentSlotAllocatorRef<2048, carve::FirstFit>(carve::BorrowedSlotWords<2048>(words)));
  reset<<<1, 1>>>(global);
  unsigned* d_failures = to_device(std::vector<unsigned>{0});
  unsigned long long* d_served = to_device(std::vector<unsigned long long>{0, 0});
  // 32 blocks of 16 rounds; under compute-sanitizer 8 blocks of 2 (see under_compute_sanitizer).
  const bool sanitized = under_compute_sanitizer();
  hammer<<<sanitized ? 8 : 32, threads>>>(global, sanitized ? 2 : 16, d_failures, d_served);
  free_bytes<<<1, 1>>>(global, d_served + 1);
  int* d_bad = to_device(std::vector<int>(8, -1));
  bad_arenas<<<1, 32>>>(d_bad);
  check(cudaGetLastError(), "launch"); // a launch refused for its configuration shows only here
  check(cudaDeviceSynchronize(), "kernels");
  const auto bad = to_host(d_bad, 8);
  const int refused = static_cast<int>(carve::Errc::invalid_argument);
  for (std::size_t k = 0; k < 3; ++k) {
    expect(bad[2 * k] == refused && bad[2 * k + 1] == refused, "an arena given bad input in a kernel says so");
  }
  expect(bad[6] == 0 && bad[7] == 0, "an arena reset with good input serves again");
  const auto f = to_host(d_failures, 1);
  const auto s = to_host(d_served, 2);
  expect(f[0] == 0, "no thread saw its bytes change, every counter balanced");
  expect(s[1] == 2048 * 64, "every byte of the global arena came back");
  expect(s[0] > 0, "the hammer ran: allocations went through the counted level");
  std::printf("%llu allocations went through the counted, limited level\n", s[0]);
  std::printf(failures == 0 ? "all passed\n" : "%d failed\n", failures);
  return failures == 0 ? 0 : 1;
}
