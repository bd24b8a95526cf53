/// @file carve/slot/batch/batch_kernels.cuh
/// Kernels for schedulers that place many workgroups at once.
/// CUDA only (nvcc); `<carve/slot.hpp>` and `<carve/carve.hpp>` include it under a CUDA compiler.
///
/// - launch_place_batch: K slot bitmaps (one per SM/CU) in device memory and R requests; each
///   request gets a placement (unit and start) under a fit policy and a CU-choice rule, in
///   request order, exactly as carve::place_batch computes it on the host. One block; one
///   thread per unit, so a request costs one fit search per thread plus a block reduction.
/// - launch_release_batch: the reverse, R finished placements given back on their units, with
///   deallocate's checks, exactly as carve::release_batch does on the host. Releases on different
///   units are independent, so one thread serves every unit congruent to its index (modulo the
///   grid's threads), in batch order: no atomics, and a unit's releases keep their order.
/// - launch_run_start_masks: the run-start mask ("avail mask") of K bitmaps for one size m, for
///   callers that decide placement themselves.
#pragma once

#include <carve/slot/batch/batch_placement.hpp>
#include <carve/slot/batch/cu_choice.hpp>
#include <carve/slot/policy/boundary_nearest_fit.hpp>
#include <carve/slot/policy/fit_policy.hpp>
#include <carve/slot/storage/slot_bitmap.hpp>

#include <cuda_runtime_api.h>

#include <cuda/std/cstdint>

namespace carve {
/// The kernels behind the launch_ functions, for callers that choose their own launch.
namespace kernels {

/// Lane `src`'s candidate (a warp shuffle; all 32 lanes call together).
__device__ inline CuCandidate shuffle(const CuCandidate& c, int src) {
  constexpr unsigned all = 0xffff'ffffu;
  return {__shfl_sync(all, c.cu, src), __shfl_sync(all, c.fits, src) != 0, __shfl_sync(all, c.start, src),
          __shfl_sync(all, c.free, src), __shfl_sync(all, c.distance, src)};
}

/// The best candidate of the block under `rule`, in every thread. `scratch`: one per warp.
template <CuChoiceRule Rule>
__device__ CuCandidate block_best(const Rule& rule, CuCandidate mine, CuCandidate* scratch) {
  for (int d = 16; d > 0; d /= 2) {
    const CuCandidate other = shuffle(mine, static_cast<int>(threadIdx.x % 32) ^ d);
    mine = rule.better(other, mine) ? other : mine;
  }
  if (threadIdx.x % 32 == 0) {
    scratch[threadIdx.x / 32] = mine;
  }
  __syncthreads();
  CuCandidate best = scratch[0];
  for (unsigned w = 1; w < blockDim.x / 32; ++w) {
    best = rule.better(scratch[w], best) ? scratch[w] : best;
  }
  __syncthreads(); // scratch is reused by the next call
  return best;
}

/// launch_place_batch's kernel: one block of whole warps (at most 1024 threads). Launched any
/// other way (several blocks would each place every request), every placement is invalid_argument.
template <std::uint32_t N, class Fit, CuChoiceRule Rule>
__global__ void place_batch(SlotBitmap<N>* bitmaps, std::uint32_t units, const std::uint32_t* sizes,
                            std::uint32_t requests, BatchPlacement* out, Fit fit, Rule rule) {
  __shared__ CuCandidate scratch[32];
  if (gridDim.x != 1 || gridDim.y != 1 || gridDim.z != 1 || blockDim.y != 1 || blockDim.z != 1 ||
      blockDim.x % 32 != 0) { // the same in every thread: all leave together
    for (std::uint32_t r = threadIdx.x; blockIdx.x == 0 && r < requests; r += blockDim.x) {
      out[r] = cuda::std::unexpected(Errc::invalid_argument);
    }
    return;
  }
  for (std::uint32_t r = 0; r < requests; ++r) {
    const std::uint32_t m = sizes[r];
    if (m == 0 || m > N || units == 0) {
      if (threadIdx.x == 0) {
        out[r] = cuda::std::unexpected(m == 0 ? Errc::invalid_size : Errc::no_space);
      }
      continue;
    }
    // Thread t weighs units t, t + blockDim.x, ...; threads without a unit offer a non-fit.
    CuCandidate mine{threadIdx.x, false, 0, 0, 0};
    for (std::uint32_t cu = threadIdx.x; cu < units; cu += blockDim.x) {
      const CuCandidate c = evaluate_cu(fit, bitmaps[cu], cu, m);
      mine = cu == threadIdx.x || rule.better(c, mine) ? c : mine;
    }
    const CuCandidate best = block_best(rule, mine, scratch);
    if (threadIdx.x == 0) {
      out[r] = best.fits ? checked_placement(best, m, bitmaps[best.cu]) : placement_of(best, m);
      if (out[r]) {
        bitmaps[best.cu].occupy({best.start, m});
      }
    }
    __syncthreads(); // the next request sees the update
  }
}

/// launch_release_batch's kernel: any grid; each thread is one part of release_batch_part.
template <std::uint32_t N>
__global__ void release_batch(SlotBitmap<N>* bitmaps, std::uint32_t units, const CuPlacement* placements,
                              std::uint32_t count, BatchRelease* out) {
  release_batch_part<N>(cuda::std::span<SlotBitmap<N>>(bitmaps, units),
                        cuda::std::span<const CuPlacement>(placements, count), out,
                        blockIdx.x * blockDim.x + threadIdx.x, gridDim.x * blockDim.x);
}

/// launch_run_start_masks's kernel: any grid, a grid-stride loop over the bitmaps.
template <std::uint32_t N>
__global__ void run_start_masks(const SlotBitmap<N>* bitmaps, std::uint32_t count, std::uint32_t m,
                                SlotBitmap<N>* out) {
  for (std::uint32_t k = blockIdx.x * blockDim.x + threadIdx.x; k < count; k += gridDim.x * blockDim.x) {
    out[k] = bitmaps[k].run_starts(m);
  }
}

} // namespace kernels

/// Places `requests` requests (sizes[r] slots each) on `units` bitmaps, updating them; out[r]
/// receives each request's placement or error. All pointers are device memory. Returns the
/// launch error, if any; the work completes in stream order.
template <std::uint32_t N, class Fit = BoundaryNearestFit, CuChoiceRule Rule = FirstFittingCu>
requires FitPolicyFor<Fit, N> cudaError_t launch_place_batch(SlotBitmap<N>* bitmaps, std::uint32_t units,
                                                             const std::uint32_t* sizes, std::uint32_t requests,
                                                             BatchPlacement* out, cudaStream_t stream = nullptr,
                                                             Fit fit = {}, Rule rule = {}) {
  if (requests == 0) {
    return cudaSuccess;
  }
  // One thread per unit, whole warps, at most one block's worth (threads then take several units).
  const std::uint32_t wanted = (units + 31) / 32 * 32;
  const std::uint32_t threads = wanted == 0 ? 32 : wanted > 1024 ? 1024 : wanted;
  kernels::place_batch<N><<<1, threads, 0, stream>>>(bitmaps, units, sizes, requests, out, fit, rule);
  return cudaGetLastError();
}

/// Gives back `count` placements (placements[r].range on unit placements[r].cu of the `units`
/// bitmaps); out[r] receives each outcome (see BatchRelease). All pointers are device memory.
/// Returns the launch error, if any; the work completes in stream order.
template <std::uint32_t N>
cudaError_t launch_release_batch(SlotBitmap<N>* bitmaps, std::uint32_t units, const CuPlacement* placements,
                                 std::uint32_t count, BatchRelease* out, cudaStream_t stream = nullptr) {
  if (count == 0) {
    return cudaSuccess;
  }
  // One thread per unit up to 64 blocks of 256 (then threads take several units); at least one
  // thread, which reports every release as out_of_range when there are no units.
  const std::uint32_t threads = 256;
  const std::uint32_t wanted = (units + threads - 1) / threads;
  const std::uint32_t blocks = wanted == 0 ? 1 : wanted > 64 ? 64 : wanted;
  kernels::release_batch<N><<<blocks, threads, 0, stream>>>(bitmaps, units, placements, count, out);
  return cudaGetLastError();
}

/// out[k] = bitmaps[k].run_starts(m) for k < count (device memory).
template <std::uint32_t N>
cudaError_t launch_run_start_masks(const SlotBitmap<N>* bitmaps, std::uint32_t count, std::uint32_t m,
                                   SlotBitmap<N>* out, cudaStream_t stream = nullptr) {
  if (count == 0) {
    return cudaSuccess;
  }
  const std::uint32_t threads = 256;
  const std::uint32_t blocks = (count + threads - 1) / threads < 1024 ? (count + threads - 1) / threads : 1024;
  kernels::run_start_masks<N><<<blocks, threads, 0, stream>>>(bitmaps, count, m, out);
  return cudaGetLastError();
}

} // namespace carve
