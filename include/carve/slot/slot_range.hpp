// carve/slot/slot_range.hpp — a run of contiguous slots: what an allocation hands out.
#pragma once

#include <carve/core/bits.hpp>
#include <carve/core/config.hpp>

#include <cuda/std/cstdint>
#include <cuda/std/type_traits>

namespace carve {

struct SlotRange {
  std::uint32_t first;
  std::uint32_t count;

  // One past the last slot, widened so that a range reaching past 2^32 does not wrap.
  CARVE_HOST_DEVICE constexpr std::uint64_t end() const noexcept { return std::uint64_t{first} + count; }

  friend CARVE_HOST_DEVICE constexpr bool operator==(const SlotRange& a, const SlotRange& b) noexcept {
    return a.first == b.first && a.count == b.count;
  }
};

// Calls f(word index, mask of the range's bits in that word) for each 64-bit word the range
// touches, lowest first. When f returns bool, false stops the walk and the call returns false.
template <class F>
CARVE_HOST_DEVICE constexpr bool for_each_word_mask(SlotRange r, F&& f) noexcept {
  std::uint32_t slot = r.first;
  std::uint32_t left = r.count;
  while (left != 0) {
    const std::uint32_t bit = slot % bits::word_bits;
    const std::uint32_t n = left < bits::word_bits - bit ? left : bits::word_bits - bit;
    const std::uint32_t k = slot / bits::word_bits;
    const bits::word mask = bits::range_mask(bit, n);
    if constexpr (cuda::std::is_same_v<decltype(f(k, mask)), bool>) {
      if (!f(k, mask)) {
        return false;
      }
    } else {
      f(k, mask);
    }
    slot += n;
    left -= n;
  }
  return true;
}

} // namespace carve
