/// @file carve/core/bits.hpp
/// Operations on one 64-bit word of a slot bitmap.
///
/// Slot s lives in word s / 64 at bit s % 64, so a lower bit is a lower slot. A set bit is a free
/// slot. These helpers are the only place that knows about shifts and masks.
#pragma once

#include <carve/core/config.hpp>

#include <cuda/std/bit>
#include <cuda/std/cstdint>

/// Operations on one 64-bit word of a slot bitmap (a set bit is a free slot).
namespace carve::bits {

/// One word of a slot bitmap; bit b is slot b of the word.
using word = cuda::std::uint64_t;
/// Slots per word.
inline constexpr cuda::std::uint32_t word_bits = 64;
/// A word whose 64 slots are all free.
inline constexpr word all_ones = ~word{0};

/// Words needed to hold `slots` slots (below 2^38: the count must fit 32 bits).
CARVE_HOST_DEVICE constexpr cuda::std::uint32_t word_count(cuda::std::uint64_t slots) noexcept {
  return static_cast<cuda::std::uint32_t>((slots + word_bits - 1) / word_bits);
}

/// The lowest `n` bits set, for 0 <= n <= 64.
CARVE_HOST_DEVICE constexpr word low_mask(cuda::std::uint32_t n) noexcept {
  return n >= word_bits ? all_ones : (word{1} << n) - 1;
}

/// Bits [lo, lo + n) set, for lo < 64 and lo + n <= 64.
CARVE_HOST_DEVICE constexpr word range_mask(cuda::std::uint32_t lo, cuda::std::uint32_t n) noexcept {
  return low_mask(n) << lo;
}

/// Bit i of the result is set iff bits i .. i+m-1 of `w` are all set, for 1 <= m <= 64.
///
/// Fixed shift-and steps build runs of 2, 4, ..., 32 bits; the longest of them that fits in m is
/// kept, and one more step by the remainder covers the rest (the two windows overlap). The
/// steps do not depend on m, only the choice does, which compilers turn into conditional moves
/// on a CPU and predication on a GPU: a loop of log2(m) steps would mispredict on most calls and
/// diverge across a warp. Zeros shifted in from the top exclude runs that would leave the word.
CARVE_HOST_DEVICE constexpr word run_starts(word w, cuda::std::uint32_t m) noexcept {
  const word r2 = w & (w >> 1); // bit i set: bits [i, i + 2) all set
  const word r4 = r2 & (r2 >> 2);
  const word r8 = r4 & (r4 >> 4);
  const word r16 = r8 & (r8 >> 8);
  const word r32 = r16 & (r16 >> 16);
  // Written out rather than as a loop: GCC keeps these as conditional moves only in this form
  // (measured 20% faster at N = 128 in benchmarks/slot_find.cpp).
  word runs = w;
  cuda::std::uint32_t len = 1;
  if (m >= 2) {
    runs = r2;
    len = 2;
  }
  if (m >= 4) {
    runs = r4;
    len = 4;
  }
  if (m >= 8) {
    runs = r8;
    len = 8;
  }
  if (m >= 16) {
    runs = r16;
    len = 16;
  }
  if (m >= 32) {
    runs = r32;
    len = 32;
  }
  return runs & (runs >> (m - len));
}

/// The lowest set bit (the first free slot) of a nonzero word.
CARVE_HOST_DEVICE constexpr cuda::std::uint32_t lowest_set(word w) noexcept {
  return static_cast<cuda::std::uint32_t>(cuda::std::countr_zero(w));
}
/// The highest set bit (the last free slot) of a nonzero word.
CARVE_HOST_DEVICE constexpr cuda::std::uint32_t highest_set(word w) noexcept {
  return word_bits - 1 - static_cast<cuda::std::uint32_t>(cuda::std::countl_zero(w));
}
/// Free slots at the low end of a word (its trailing ones).
CARVE_HOST_DEVICE constexpr cuda::std::uint32_t low_run(word w) noexcept {
  return static_cast<cuda::std::uint32_t>(cuda::std::countr_one(w));
}
/// Free slots at the high end of a word (its leading ones).
CARVE_HOST_DEVICE constexpr cuda::std::uint32_t high_run(word w) noexcept {
  return static_cast<cuda::std::uint32_t>(cuda::std::countl_one(w));
}
/// Free slots in a word.
CARVE_HOST_DEVICE constexpr cuda::std::uint32_t popcount(word w) noexcept {
  return static_cast<cuda::std::uint32_t>(cuda::std::popcount(w));
}

} // namespace carve::bits
