// Device side of carve's concurrent and cooperative slot code, checked against the host:
// a block-scope ConcurrentSlotAllocator in shared memory under every thread of a block (with
// ownership stamps), warp-aggregated allocation, warp and block searches, and the batch kernels
// (placement under every CU-choice rule at every slot size 64..512, and batch release).
#include "support/device_test.hpp"

#include <carve/slot.hpp>

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

namespace {

using carve::test::check;
using carve::test::to_device;
using carve::test::to_host;

// Stamps every slot of `r` with `me` (each must have been unowned), checks and clears the stamps,
// then frees `r`. Returns the violations seen: a slot owned twice, or a free refused.
template <class Allocator>
__device__ unsigned hold_and_free(Allocator& slots, carve::SlotRange r, int* owner, int me) {
  unsigned bad = 0;
  for (std::uint32_t s = r.first; s < r.first + r.count; ++s) {
    bad += atomicExch(&owner[s], me) != 0 ? 1u : 0u;
  }
  for (std::uint32_t s = r.first; s < r.first + r.count; ++s) {
    bad += atomicExch(&owner[s], 0) != me ? 1u : 0u;
  }
  return bad + (slots.deallocate(r) ? 0u : 1u);
}

constexpr std::uint32_t storm_slots = 512;
using BlockSlots = carve::ConcurrentSlotAllocator<storm_slots, carve::BoundaryNearestFit, cuda::thread_scope_block>;

// Every thread of the block allocates, stamps its slots, checks and clears the stamps, frees.
// Half the warps go through warp_allocate. Counts slots found stamped by someone else, refused
// frees and refusals other than no_space (counts[0]), and the allocations granted (counts[1]);
// final_free: the fewest free slots any block ended with.
__global__ void storm(int rounds, unsigned* counts, std::uint32_t* final_free) {
  __shared__ BlockSlots slots;
  __shared__ int owner[storm_slots];
  for (unsigned s = threadIdx.x; s < storm_slots; s += blockDim.x) {
    owner[s] = 0;
  }
  if (threadIdx.x == 0) {
    slots.reset();
  }
  __syncthreads();
  const int me = static_cast<int>(threadIdx.x) + 1;
  unsigned bad = 0;
  unsigned granted = 0;
  for (int i = 0; i < rounds; ++i) {
    const std::uint32_t m = 1 + (threadIdx.x * 7 + static_cast<unsigned>(i)) % 4;
    const bool aggregated = (threadIdx.x / 32) % 2 == 0;
    const auto r = aggregated ? carve::warp_allocate(0xffff'ffffu, slots, m) : slots.allocate(m); // whole warps
    if (!r) {
      bad += r.error() != carve::Errc::no_space ? 1u : 0u;
      continue;
    }
    ++granted;
    bad += hold_and_free(slots, *r, owner, me);
  }
  atomicAdd(&counts[0], bad);
  atomicAdd(&counts[1], granted);
  __syncthreads();
  if (threadIdx.x == 0) {
    atomicMin(final_free, slots.free_count()); // the least of the blocks: every one must be whole
  }
}

// A device-scope allocator as a __device__ global (constant-initialised: no setup kernel), shared
// by every thread of the grid; owner stamps live in global memory.
constexpr std::uint32_t grid_slots = 4096;
__device__ carve::ConcurrentSlotAllocator<grid_slots, carve::FirstFit, cuda::thread_scope_device> grid_allocator;

__global__ void grid_storm(int rounds, int* owner, unsigned* counts) {
  const int me = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x) + 1;
  unsigned bad = 0;
  unsigned granted = 0;
  for (int i = 0; i < rounds; ++i) {
    const auto r = grid_allocator.allocate(1 + static_cast<std::uint32_t>(me + i) % 3);
    if (!r) {
      bad += r.error() != carve::Errc::no_space ? 1u : 0u;
      continue;
    }
    ++granted;
    bad += hold_and_free(grid_allocator, *r, owner, me);
  }
  atomicAdd(&counts[0], bad);
  atomicAdd(&counts[1], granted);
}

// After the storm every thread has freed what it took: all slots must be free.
__global__ void grid_free_count(std::uint32_t* out) { *out = grid_allocator.free_count(); }

// One warp per bitmap: warp_find with three policies; one block per bitmap: block_find.
template <std::uint32_t N>
__global__ void cooperative_find(const carve::SlotBitmap<N>* bitmaps, const std::uint32_t* ms, std::uint32_t* out) {
  __shared__ carve::RunSegment scratch[33];
  const auto& b = bitmaps[blockIdx.x];
  const std::uint32_t m = ms[blockIdx.x];
  const auto words = b.words();
  const auto pick = [](cuda::std::optional<std::uint32_t> s) { return s ? *s : 0xffff'ffffu; };
  if (threadIdx.x < 32) {
    const carve::DeviceWarp warp;
    const std::uint32_t ff = pick(carve::warp_find(carve::FirstFit{}, warp, words, N, m));
    const std::uint32_t lf = pick(carve::warp_find(carve::LastFit{}, warp, words, N, m));
    const std::uint32_t bn = pick(carve::warp_find(carve::BoundaryNearestFit{}, warp, words, N, m));
    if (threadIdx.x == 0) {
      out[4 * blockIdx.x + 0] = ff;
      out[4 * blockIdx.x + 1] = lf;
      out[4 * blockIdx.x + 2] = bn;
    }
  }
  const std::uint32_t block_bn =
      pick(carve::block_find(carve::BoundaryNearestFit{}, carve::DeviceBlock{}, scratch, words, N, m));
  if (threadIdx.x == 0) {
    out[4 * blockIdx.x + 3] = block_bn;
  }
}

int check_storm() {
  unsigned* violations = nullptr;
  std::uint32_t* final_free = nullptr;
  check(cudaMalloc(&violations, 2 * sizeof(unsigned)), "cudaMalloc"); // violations, allocations granted
  check(cudaMalloc(&final_free, sizeof(std::uint32_t)), "cudaMalloc");
  check(cudaMemset(final_free, 0xff, sizeof(std::uint32_t)), "cudaMemset");
  check(cudaMemset(violations, 0, 2 * sizeof(unsigned)), "cudaMemset");
  storm<<<4, 512>>>(200, violations, final_free);
  check(cudaGetLastError(), "storm launch");
  const auto counts = to_host(violations, 2);
  const unsigned bad = counts[0];
  const unsigned granted = counts[1];
  const auto free = to_host(final_free, 1)[0];
  cudaFree(violations);
  cudaFree(final_free);
  if (bad != 0 || free != storm_slots || granted == 0) {
    std::fprintf(stderr, "storm: %u violations, %u of %u slots free at the end, %u allocations granted\n", bad, free,
                 storm_slots, granted);
    return 1;
  }
  return 0;
}

int check_grid_storm() {
  int* owner = nullptr;
  unsigned* violations = nullptr;
  std::uint32_t* final_free = nullptr;
  check(cudaMalloc(&owner, grid_slots * sizeof(int)), "cudaMalloc");
  check(cudaMalloc(&violations, 2 * sizeof(unsigned)), "cudaMalloc"); // violations, allocations granted
  check(cudaMalloc(&final_free, sizeof(std::uint32_t)), "cudaMalloc");
  check(cudaMemset(owner, 0, grid_slots * sizeof(int)), "cudaMemset");
  check(cudaMemset(violations, 0, 2 * sizeof(unsigned)), "cudaMemset");
  grid_storm<<<64, 256>>>(50, owner, violations);
  check(cudaGetLastError(), "grid_storm launch");
  grid_free_count<<<1, 1>>>(final_free);
  check(cudaGetLastError(), "grid_free_count launch");
  const auto counts = to_host(violations, 2);
  const unsigned bad = counts[0];
  const unsigned granted = counts[1];
  const auto free = to_host(final_free, 1)[0];
  cudaFree(owner);
  cudaFree(violations);
  cudaFree(final_free);
  if (bad != 0 || free != grid_slots || granted == 0) {
    std::fprintf(stderr, "grid storm: %u violations, %u of %u slots free at the end, %u allocations granted\n", bad,
                 free, grid_slots, granted);
    return 1;
  }
  return 0;
}

template <std::uint32_t N>
int check_cooperative(std::mt19937_64& rng) {
  constexpr std::uint32_t count = 256;
  std::vector<carve::SlotBitmap<N>> bitmaps(count);
  std::vector<std::uint32_t> ms(count);
  for (std::uint32_t i = 0; i < count; ++i) {
    for (std::uint32_t k = 0; k < 40; ++k) {
      const auto s = static_cast<std::uint32_t>(rng() % N);
      bitmaps[i].occupy({s, 1 + static_cast<std::uint32_t>(rng() % (i % 5 == 0 ? 300u : 8u)) % (N - s)});
    }
    ms[i] = 1 + static_cast<std::uint32_t>(rng() % (i % 2 ? 16u : N));
  }
  auto* d_bitmaps = to_device(bitmaps);
  auto* d_ms = to_device(ms);
  std::uint32_t* d_out = nullptr;
  check(cudaMalloc(&d_out, 4 * count * sizeof(std::uint32_t)), "cudaMalloc");
  cooperative_find<N><<<count, 256>>>(d_bitmaps, d_ms, d_out);
  check(cudaGetLastError(), "cooperative_find launch");
  const auto got = to_host(d_out, 4 * count);
  int failures = 0;
  for (std::uint32_t i = 0; i < count; ++i) {
    const auto pick = [](cuda::std::optional<std::uint32_t> s) { return s ? *s : 0xffff'ffffu; };
    const std::uint32_t want[4] = {pick(carve::FirstFit{}.find(bitmaps[i], ms[i])),
                                   pick(carve::LastFit{}.find(bitmaps[i], ms[i])),
                                   pick(carve::BoundaryNearestFit{}.find(bitmaps[i], ms[i])),
                                   pick(carve::BoundaryNearestFit{}.find(bitmaps[i], ms[i]))};
    for (std::uint32_t k = 0; k < 4; ++k) {
      if (got[4 * i + k] != want[k] && failures++ < 5) {
        std::fprintf(stderr, "N=%u bitmap %u m=%u search %u: device %u, host %u\n", N, i, ms[i], k, got[4 * i + k],
                     want[k]);
      }
    }
  }
  cudaFree(d_bitmaps);
  cudaFree(d_ms);
  cudaFree(d_out);
  return failures;
}

// launch_place_batch under one CU-choice rule at one slot size, then launch_release_batch over
// some of the placements (with double and bad releases), each against the host's loop.
template <std::uint32_t N, class Rule>
int check_batch(std::mt19937_64& rng) {
  constexpr std::uint32_t units = 132;
  constexpr std::uint32_t requests = 600;
  std::vector<carve::SlotBitmap<N>> bitmaps(units);
  std::vector<std::uint32_t> sizes(requests);
  for (auto& m : sizes) {
    m = static_cast<std::uint32_t>(rng() % (N / 3)); // includes 0 (invalid) and sizes that stop fitting
  }
  auto* d_bitmaps = to_device(bitmaps);
  auto* d_sizes = to_device(sizes);
  carve::BatchPlacement* d_out = nullptr;
  check(cudaMalloc(&d_out, requests * sizeof(carve::BatchPlacement)), "cudaMalloc");
  check(carve::launch_place_batch<N, carve::BoundaryNearestFit, Rule>(d_bitmaps, units, d_sizes, requests, d_out),
        "place_batch launch");
  const auto got = to_host(d_out, requests);
  const auto got_bitmaps = to_host(d_bitmaps, units);

  std::vector<carve::BatchPlacement> want(requests);
  carve::place_batch<N, carve::BoundaryNearestFit, Rule>(cuda::std::span<carve::SlotBitmap<N>>(bitmaps.data(), units),
                                                         cuda::std::span<const std::uint32_t>(sizes.data(), requests),
                                                         want.data());
  int failures = 0;
  for (std::uint32_t r = 0; r < requests; ++r) {
    if (!(got[r] == want[r]) && failures++ < 5) {
      std::fprintf(stderr, "place_batch N=%u %s request %u: device and host disagree\n", N, Rule::name, r);
    }
  }
  for (std::uint32_t u = 0; u < units; ++u) {
    failures += got_bitmaps[u] == bitmaps[u] ? 0 : 1;
  }

  std::vector<carve::CuPlacement> releases;
  for (const auto& p : want) {
    if (p && rng() % 3 != 0) {
      releases.push_back(*p);
      if (rng() % 8 == 0) {
        releases.push_back(*p); // refused the second time
      }
    }
  }
  releases.push_back({units + 3, {0, 1}});
  releases.push_back({0, {N - 1, 2}});
  releases.push_back({1, {0, 0}});
  const auto count = static_cast<std::uint32_t>(releases.size());
  auto* d_releases = to_device(releases);
  carve::BatchRelease* d_released = nullptr;
  check(cudaMalloc(&d_released, count * sizeof(carve::BatchRelease)), "cudaMalloc");
  check(carve::launch_release_batch<N>(d_bitmaps, units, d_releases, count, d_released), "release_batch launch");
  const auto released = to_host(d_released, count);
  const auto after = to_host(d_bitmaps, units);
  std::vector<carve::BatchRelease> want_released(count);
  carve::release_batch<N>(cuda::std::span<carve::SlotBitmap<N>>(bitmaps.data(), units),
                          cuda::std::span<const carve::CuPlacement>(releases.data(), count), want_released.data());
  for (std::uint32_t r = 0; r < count; ++r) {
    if (!(released[r] == want_released[r]) && failures++ < 5) {
      std::fprintf(stderr, "release_batch N=%u release %u: device and host disagree\n", N, r);
    }
  }
  for (std::uint32_t u = 0; u < units; ++u) {
    failures += after[u] == bitmaps[u] ? 0 : 1;
  }

  if constexpr (N == 128) { // one size is enough for the masks (a grid-stride copy of run_starts)
    carve::SlotBitmap<N>* d_masks = nullptr;
    check(cudaMalloc(&d_masks, units * sizeof(carve::SlotBitmap<N>)), "cudaMalloc");
    check(carve::launch_run_start_masks<N>(d_bitmaps, units, 5, d_masks), "run_start_masks launch");
    const auto masks = to_host(d_masks, units);
    for (std::uint32_t u = 0; u < units; ++u) {
      failures += masks[u] == bitmaps[u].run_starts(5) ? 0 : 1;
    }
    cudaFree(d_masks);
  }
  cudaFree(d_bitmaps);
  cudaFree(d_sizes);
  cudaFree(d_out);
  cudaFree(d_releases);
  cudaFree(d_released);
  return failures;
}

// Every CU-choice rule at one slot size.
template <std::uint32_t N>
int check_batches(std::mt19937_64& rng) {
  return check_batch<N, carve::FirstFittingCu>(rng) + check_batch<N, carve::LeastLoadedCu>(rng) +
         check_batch<N, carve::NearestBoundaryCu>(rng);
}

} // namespace

int main() {
  carve::test::skip_without_device();
  std::mt19937_64 rng(99);
  const int failures = check_storm() + check_grid_storm() + check_cooperative<4096>(rng) +
                       check_cooperative<70000>(rng) + check_batches<64>(rng) + check_batches<128>(rng) +
                       check_batches<256>(rng) + check_batches<512>(rng);
  std::printf("%s: %d failures\n", failures == 0 ? "PASS" : "FAIL", failures);
  return failures == 0 ? 0 : 1;
}
