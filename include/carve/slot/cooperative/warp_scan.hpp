/// @file carve/slot/cooperative/warp_scan.hpp
/// Warp- and block-cooperative searches for the lowest and highest
/// start of m free slots, for bitmaps of hundreds to tens of thousands of slots.
///
/// A warp reads 32 words at once (one per lane), turns each into a RunSegment and reduces them
/// with shuffles in a tree (5 steps per 2048 slots); a block does that in every warp and reduces
/// the warps' segments in its first warp. The algorithms are written once over a warp type:
///   - DeviceWarp (CUDA only): the calling lane's view; values are the lane's own, collectives
///     are shuffles. All 32 lanes of the warp must call together.
///   - HostWarp: all 32 lanes at once; values are arrays of the lanes' values.
/// and a block type (DeviceBlock / HostBlock). A warp type's only collectives are 32-bit shuffles
/// (shfl_down, shfl); everything built on them, such as moving a RunSegment between lanes, is
/// written once here, so the host runs exactly the reduction the device runs, value for value,
/// and the tests check it here.
#pragma once

#include <carve/core/bits.hpp>
#include <carve/core/config.hpp>
#include <carve/core/error.hpp>
#include <carve/slot/policy/fit_policy.hpp>
#include <carve/slot/search/run_search.hpp>
#include <carve/slot/search/run_segment.hpp>
#include <carve/slot/storage/word_source.hpp>

#include <cuda/std/array>
#include <cuda/std/cstdint>
#include <cuda/std/optional>

#include <string>

namespace carve {

/// Lanes in a warp.
inline constexpr std::uint32_t warp_lanes = 32;

/// All lanes of a warp, simulated on the host. Its only collective is the device's: a 32-bit
/// shuffle with the same out-of-range rule, so code written over a warp type moves exactly the
/// same values between lanes here as on a GPU.
struct HostWarp {
  /// A value per lane: an array of 32.
  template <class T>
  using lanes = cuda::std::array<T, warp_lanes>;

  /// f(lane, v[lane]...) for every lane.
  template <class F, class... T>
  static constexpr auto each(F&& f, const lanes<T>&... v) {
    lanes<decltype(f(std::uint32_t{}, v[0]...))> out{};
    for (std::uint32_t lane = 0; lane < warp_lanes; ++lane) {
      out[lane] = f(lane, v[lane]...);
    }
    return out;
  }
  /// __shfl_down_sync over the full warp: lane i receives lane i + delta's value, or keeps its
  /// own when i + delta is past the warp.
  static constexpr lanes<std::uint32_t> shfl_down(const lanes<std::uint32_t>& v, std::uint32_t delta) {
    return each([&](std::uint32_t lane) { return v[lane + delta < warp_lanes ? lane + delta : lane]; });
  }
  /// __shfl_sync: every lane receives lane `src`'s value.
  static constexpr std::uint32_t shfl(const lanes<std::uint32_t>& v, std::uint32_t src) { return v[src]; }
  /// Whether this thread writes the warp's result: always (the one host thread plays every lane).
  static constexpr bool leads() { return true; }
};

#if defined(__CUDACC__)
/// The calling lane's view of its warp (CUDA only); all 32 lanes call every member together.
struct DeviceWarp {
  /// A value per lane: the calling lane's own.
  template <class T>
  using lanes = T;

  /// f(lane, v...) for the calling lane.
  template <class F, class... T>
  __device__ auto each(F&& f, const T&... v) const {
    return f(lane(), v...);
  }
  /// `__shfl_down_sync` over the full warp.
  __device__ std::uint32_t shfl_down(std::uint32_t v, std::uint32_t delta) const {
    return __shfl_down_sync(all, v, delta);
  }
  /// `__shfl_sync` over the full warp: lane `src`'s value.
  __device__ std::uint32_t shfl(std::uint32_t v, std::uint32_t src) const {
    return __shfl_sync(all, v, static_cast<int>(src));
  }
  /// Whether this lane writes the warp's result (lane 0).
  __device__ bool leads() const { return lane() == 0; }
  /// The calling lane (blocks are one-dimensional).
  __device__ static std::uint32_t lane() { return threadIdx.x % warp_lanes; }

  /// The mask of all 32 lanes.
  static constexpr unsigned all = 0xffff'ffffu;
};
#endif

namespace detail {
// One field of every lane's segment.
template <class Warp>
CARVE_HOST_DEVICE auto segment_field(const Warp& warp, const typename Warp::template lanes<RunSegment>& s,
                                     std::uint32_t RunSegment::*field) {
  return warp.each([field](std::uint32_t, const RunSegment& x) { return x.*field; }, s);
}
} // namespace detail

/// Lane i receives lane i + delta's segment (its own when i + delta is past the warp). Every field
/// travels, `length` included: the segments a block reduces do not all cover the same number of
/// slots (lanes past the block's last warp hold empty ones), and a lane that kept its own length
/// would misplace every start above it. Written once over the warp type, so the host runs the
/// device's shuffles field for field.
template <class Warp>
CARVE_HOST_DEVICE auto shuffle_down(const Warp& warp, const typename Warp::template lanes<RunSegment>& s,
                                    std::uint32_t delta) {
  const auto moved = [&](std::uint32_t RunSegment::*field) {
    return warp.shfl_down(detail::segment_field(warp, s, field), delta);
  };
  return warp.each(
      [](std::uint32_t, std::uint32_t length, std::uint32_t low, std::uint32_t high, std::uint32_t lowest,
         std::uint32_t highest) {
        return RunSegment{length, low, high, lowest, highest};
      },
      moved(&RunSegment::length), moved(&RunSegment::low), moved(&RunSegment::high), moved(&RunSegment::lowest),
      moved(&RunSegment::highest));
}

/// Lane 0's segment, in every lane.
template <class Warp>
CARVE_HOST_DEVICE RunSegment from_first_lane(const Warp& warp, const typename Warp::template lanes<RunSegment>& s) {
  const auto first = [&](std::uint32_t RunSegment::*field) {
    return warp.shfl(detail::segment_field(warp, s, field), 0);
  };
  return {first(&RunSegment::length), first(&RunSegment::low), first(&RunSegment::high), first(&RunSegment::lowest),
          first(&RunSegment::highest)};
}

/// The segment of the lanes' segments, lane 0 lowest. After the step with distance d, lane i
/// holds lanes [i, i + 2d); lanes whose partner lies past the warp hold values no lower lane reads.
/// The lanes' segments may differ in length. Every lane gets the result.
template <class Warp>
CARVE_HOST_DEVICE RunSegment warp_reduce(const Warp& warp, typename Warp::template lanes<RunSegment> seg,
                                         std::uint32_t m) {
  for (std::uint32_t d = 1; d < warp_lanes; d *= 2) {
    const auto above = shuffle_down(warp, seg, d);
    seg = warp.each([m](std::uint32_t, const RunSegment& s, const RunSegment& a) { return combine(s, a, m); }, seg,
                    above);
  }
  return from_first_lane(warp, seg);
}

/// The 32 words from `first` (words past `count` read as taken), reduced by one warp.
template <class Warp, WordSource Words>
CARVE_HOST_DEVICE RunSegment warp_chunk(const Warp& warp, const Words& words, std::uint32_t count, std::uint32_t first,
                                        std::uint32_t m) {
  const auto seg = warp.each([&](std::uint32_t lane) {
    const std::uint32_t k = first + lane;
    return word_segment(k < count ? bits::word(words[k]) : bits::word{0}, m);
  });
  return warp_reduce(warp, seg, m);
}

/// The whole bitmap of `count` words, 32 words per step.
template <class Warp, WordSource Words>
CARVE_HOST_DEVICE RunSegment warp_summarize(const Warp& warp, const Words& words, std::uint32_t count,
                                            std::uint32_t m) {
  RunSegment total = empty_segment();
  for (std::uint32_t first = 0; first < count; first += warp_lanes) {
    total = combine(total, warp_chunk(warp, words, count, first, m), m);
  }
  return total;
}

/// A block of `warps()` warps, simulated on the host: 1 to 32, as a device block of at most 1024
/// threads has (the first warp reduces one segment per warp in its 32 lanes).
struct HostBlock {
  std::uint32_t warp_count; ///< warps in the simulated block

  /// Throws carve::Exception (invalid_argument) for 0 warps or more than 32.
  explicit HostBlock(std::uint32_t warps) : warp_count(warps) {
    if (warps == 0 || warps > warp_lanes) {
      throw Exception(Errc::invalid_argument,
                      "carve::HostBlock: " + std::to_string(warps) + " warps, where a block has 1 to 32");
    }
  }

  /// Warps in the block.
  constexpr std::uint32_t warps() const { return warp_count; }
  /// f(w, HostWarp) for every warp w in turn.
  template <class F>
  constexpr void for_each_warp(F&& f) const {
    for (std::uint32_t w = 0; w < warp_count; ++w) {
      f(w, HostWarp{});
    }
  }
  /// A block barrier: nothing to wait for on the host.
  constexpr void sync() const {}
};

#if defined(__CUDACC__)
/// The calling thread's view of its block; blockDim.x must be a multiple of 32 (at most 1024).
struct DeviceBlock {
  /// Warps in the block.
  __device__ std::uint32_t warps() const { return blockDim.x / warp_lanes; }
  /// f(w, DeviceWarp) for the calling thread's warp w.
  template <class F>
  __device__ void for_each_warp(F&& f) const {
    f(threadIdx.x / warp_lanes, DeviceWarp{});
  }
  /// `__syncthreads()`.
  __device__ void sync() const { __syncthreads(); }
};
#endif

/// The whole bitmap reduced by a block: each round, warp w takes the w-th run of 32 words and
/// the first warp reduces the warps' segments. `scratch` holds warps() + 1 segments (shared
/// memory on a device). Every thread gets the result.
template <class Block, WordSource Words>
CARVE_HOST_DEVICE RunSegment block_summarize(const Block& block, RunSegment* scratch, const Words& words,
                                             std::uint32_t count, std::uint32_t m) {
  const std::uint32_t warps = block.warps();
  RunSegment total = empty_segment();
  for (std::uint32_t base = 0; base < count; base += warps * warp_lanes) {
    block.for_each_warp([&](std::uint32_t w, const auto& warp) {
      const RunSegment s = warp_chunk(warp, words, count, base + w * warp_lanes, m);
      if (warp.leads()) {
        scratch[w] = s;
      }
    });
    block.sync();
    block.for_each_warp([&](std::uint32_t w, const auto& warp) {
      if (w != 0) {
        return;
      }
      // Lanes past the last warp hold empty segments (no slots), so here, unlike in warp_chunk,
      // the lanes' lengths differ.
      const auto seg = warp.each([&](std::uint32_t lane) { return lane < warps ? scratch[lane] : empty_segment(); });
      const RunSegment round = warp_reduce(warp, seg, m);
      if (warp.leads()) {
        scratch[warps] = combine(total, round, m);
      }
    });
    block.sync();
    total = scratch[warps];
    block.sync(); // everyone has read it before the next round writes
  }
  return total;
}

/// The lowest and highest start a segment covering a whole bitmap found.
CARVE_HOST_DEVICE constexpr runs::StartBounds bounds_of(const RunSegment& s) noexcept {
  return {s.lowest, s.highest, s.lowest != RunSegment::none};
}

/// A bounds policy's choice for m slots in a bitmap of `slots` slots, searched by one warp.
template <BoundsFitPolicy Fit, class Warp, WordSource Words>
CARVE_HOST_DEVICE cuda::std::optional<std::uint32_t> warp_find(const Fit& fit, const Warp& warp, const Words& words,
                                                               std::uint32_t slots, std::uint32_t m) {
  if (m == 0 || m > slots) {
    return cuda::std::nullopt;
  }
  return fit.pick(bounds_of(warp_summarize(warp, words, bits::word_count(slots), m)), slots, m);
}

/// The same, searched by a whole block (`scratch`: warps() + 1 segments of shared memory).
template <BoundsFitPolicy Fit, class Block, WordSource Words>
CARVE_HOST_DEVICE cuda::std::optional<std::uint32_t> block_find(const Fit& fit, const Block& block, RunSegment* scratch,
                                                                const Words& words, std::uint32_t slots,
                                                                std::uint32_t m) {
  if (m == 0 || m > slots) {
    return cuda::std::nullopt;
  }
  return fit.pick(bounds_of(block_summarize(block, scratch, words, bits::word_count(slots), m)), slots, m);
}

} // namespace carve
