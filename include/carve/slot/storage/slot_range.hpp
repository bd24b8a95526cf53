/// @file carve/slot/storage/slot_range.hpp
/// A run of contiguous slots: what an allocation hands out.
#pragma once

#include <carve/core/bits.hpp>
#include <carve/core/config.hpp>

#include <cuda/std/cstdint>
#include <cuda/std/type_traits>

namespace carve {

/// Slots [first, first + count).
struct SlotRange {
  std::uint32_t first; ///< the lowest slot
  std::uint32_t count; ///< how many slots

  /// One past the last slot, widened so that a range reaching past 2^32 does not wrap.
  CARVE_HOST_DEVICE constexpr std::uint64_t end() const noexcept { return std::uint64_t{first} + count; }

  /// Equal when first and count are.
  friend CARVE_HOST_DEVICE constexpr bool operator==(const SlotRange& a, const SlotRange& b) noexcept {
    return a.first == b.first && a.count == b.count;
  }
};

/// One step of a walk over the words a range touches: the word holding `slot`, the mask of the
/// range's bits in it (at most `left` of them), and how many slots that covers.
struct WordMask {
  std::uint32_t word;  ///< index of the word
  bits::word mask;     ///< the range's bits in it
  std::uint32_t slots; ///< how many bits that is
};
/// The first step of the walk over the `left` slots starting at `slot`.
CARVE_HOST_DEVICE constexpr WordMask word_mask_at(std::uint32_t slot, std::uint32_t left) noexcept {
  const std::uint32_t bit = slot % bits::word_bits;
  const std::uint32_t n = left < bits::word_bits - bit ? left : bits::word_bits - bit;
  return {slot / bits::word_bits, bits::range_mask(bit, n), n};
}

/// Calls f(word index, mask of the range's bits in that word) for each 64-bit word the range
/// touches, lowest first. When f returns bool, false stops the walk and the call returns false.
template <class F>
CARVE_HOST_DEVICE constexpr bool for_each_word_mask(SlotRange r, F&& f) noexcept {
  std::uint32_t slot = r.first;
  std::uint32_t left = r.count;
  while (left != 0) {
    const WordMask w = word_mask_at(slot, left);
    if constexpr (cuda::std::is_same_v<decltype(f(w.word, w.mask)), bool>) {
      if (!f(w.word, w.mask)) {
        return false;
      }
    } else {
      f(w.word, w.mask);
    }
    slot += w.slots;
    left -= w.slots;
  }
  return true;
}

/// The same walk as a range, for host code whose loop body cannot be a device lambda (nvcc treats
/// a lambda passed to a __host__ __device__ function as both):
///   for (const carve::WordMask w : carve::word_masks(r)) { ... w.word, w.mask ... }
class WordMasks {
public:
  /// A forward iterator over the WordMask steps.
  class iterator {
  public:
    /// The end.
    constexpr iterator() noexcept = default;
    /// At the `left` slots starting at `slot`.
    CARVE_HOST_DEVICE constexpr iterator(std::uint32_t slot, std::uint32_t left) noexcept : slot_(slot), left_(left) {}
    /// The current step.
    CARVE_HOST_DEVICE constexpr WordMask operator*() const noexcept { return word_mask_at(slot_, left_); }
    /// On to the next word.
    CARVE_HOST_DEVICE constexpr iterator& operator++() noexcept {
      const std::uint32_t n = word_mask_at(slot_, left_).slots;
      slot_ += n;
      left_ -= n;
      return *this;
    }
    /// Equal when as many slots are left.
    friend CARVE_HOST_DEVICE constexpr bool operator==(const iterator& a, const iterator& b) noexcept {
      return a.left_ == b.left_;
    }

  private:
    std::uint32_t slot_ = 0;
    std::uint32_t left_ = 0;
  };

  /// The walk over `r`.
  CARVE_HOST_DEVICE constexpr explicit WordMasks(SlotRange r) noexcept : r_(r) {}
  /// The first word's step.
  CARVE_HOST_DEVICE constexpr iterator begin() const noexcept { return {r_.first, r_.count}; }
  /// Past the last word (iterators compare by slots left).
  CARVE_HOST_DEVICE constexpr iterator end() const noexcept { return {0, 0}; }

private:
  SlotRange r_;
};
/// The words `r` touches, as a range of WordMask.
CARVE_HOST_DEVICE constexpr WordMasks word_masks(SlotRange r) noexcept { return WordMasks(r); }

} // namespace carve
