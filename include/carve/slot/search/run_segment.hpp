/// @file carve/slot/search/run_segment.hpp
/// A stretch of slots summarised for one request size m.
///
/// To find the lowest and highest start of m free slots, a stretch of the bitmap only needs to
/// report its free run at each end and the extreme starts that lie wholly inside it. Two
/// neighbouring stretches combine into one (a run may cross their border), and the combination
/// is associative, so the words of a bitmap can be reduced in any tree shape — a sequential scan,
/// a warp's shuffle tree, a block's reduction over its warps — and all give the same answer.
#pragma once

#include <carve/core/bits.hpp>
#include <carve/core/config.hpp>

#include <cuda/std/cstdint>

namespace carve {

/// What a stretch of slots tells about runs of m free slots; combine() joins neighbours.
struct RunSegment {
  /// No such start.
  static constexpr std::uint32_t none = 0xffff'ffff;

  std::uint32_t length;  ///< slots covered
  std::uint32_t low;     ///< free slots at the bottom (== length when all are free)
  std::uint32_t high;    ///< free slots at the top
  std::uint32_t lowest;  ///< lowest start of m free slots inside, from the segment's first slot; or none
  std::uint32_t highest; ///< highest such start; or none

  /// Equal when every field is.
  friend CARVE_HOST_DEVICE constexpr bool operator==(const RunSegment& a, const RunSegment& b) noexcept {
    return a.length == b.length && a.low == b.low && a.high == b.high && a.lowest == b.lowest && a.highest == b.highest;
  }
};

/// No slots at all: combining with it changes nothing.
CARVE_HOST_DEVICE constexpr RunSegment empty_segment() noexcept {
  return {0, 0, 0, RunSegment::none, RunSegment::none};
}

/// One 64-bit word of the bitmap (padding bits past the last slot are taken, so a segment may
/// safely count them in its length).
CARVE_HOST_DEVICE constexpr RunSegment word_segment(bits::word w, std::uint32_t m) noexcept {
  const bits::word starts = m >= 1 && m <= bits::word_bits ? bits::run_starts(w, m) : 0;
  return {bits::word_bits, bits::low_run(w), bits::high_run(w),
          starts != 0 ? bits::lowest_set(starts) : RunSegment::none,
          starts != 0 ? bits::highest_set(starts) : RunSegment::none};
}

/// `below` immediately followed by `above`.
CARVE_HOST_DEVICE constexpr RunSegment combine(const RunSegment& below, const RunSegment& above,
                                               std::uint32_t m) noexcept {
  const bool across = m >= 1 && std::uint64_t{below.high} + above.low >= m; // a run over the border
  RunSegment s{};
  s.length = below.length + above.length;
  s.low = below.low == below.length ? below.length + above.low : below.low;
  s.high = above.high == above.length ? above.length + below.high : above.high;
  s.lowest = below.lowest != RunSegment::none   ? below.lowest
             : across                           ? below.length - below.high
             : above.lowest != RunSegment::none ? below.length + above.lowest
                                                : RunSegment::none;
  s.highest = above.highest != RunSegment::none   ? below.length + above.highest
              : across                            ? below.length + above.low - m
              : below.highest != RunSegment::none ? below.highest
                                                  : RunSegment::none;
  return s;
}

/// The segment of words [0, count), combined in order: the sequential form of the reductions
/// in warp_scan.hpp.
CARVE_HOST_DEVICE constexpr RunSegment fold_segments(const bits::word* words, std::uint32_t count,
                                                     std::uint32_t m) noexcept {
  RunSegment s = empty_segment();
  for (std::uint32_t k = 0; k < count; ++k) {
    s = combine(s, word_segment(words[k], m), m);
  }
  return s;
}

} // namespace carve
