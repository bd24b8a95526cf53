// carve/slot/lazy_snapshot.hpp — the words of a live bitmap that one search has seen.
//
// A fit policy searching a live bitmap reads words while other threads change them. LazySnapshot
// loads each word the first time the search asks for it and returns that same value afterwards,
// so the search sees one fixed (if not simultaneous) picture, and the caller can afterwards
//   - check the proposed run against exactly what the policy saw (a run that was not free there
//     is a policy bug, not a race), and
//   - re-read the words the search used to confirm a "nothing fits" answer (double collect).
// Only words the search touches are loaded, so first/last/boundary-nearest fit on a large
// bitmap read a few words, not all of them.
#pragma once

#include <carve/core/bits.hpp>
#include <carve/core/config.hpp>
#include <carve/slot/atomic_words.hpp>
#include <carve/slot/slot_bitmap.hpp>
#include <carve/slot/slot_range.hpp>

#include <cuda/std/cstddef>
#include <cuda/std/cstdint>

namespace carve {

template <std::uint32_t N, cuda::thread_scope Scope>
class LazySnapshot {
public:
  static constexpr cuda::std::size_t extent = bits::word_count(N);

  CARVE_HOST_DEVICE explicit LazySnapshot(AtomicWords<N, Scope> live) noexcept : live_(live), seen_{} {}

  CARVE_HOST_DEVICE static constexpr cuda::std::size_t size() noexcept { return extent; }

  CARVE_HOST_DEVICE bits::word operator[](cuda::std::size_t k) const noexcept {
    const bits::word flag = bits::word{1} << (k % bits::word_bits);
    if ((seen_[k / bits::word_bits] & flag) == 0) {
      words_[k] = live_[k];
      seen_[k / bits::word_bits] |= flag;
    }
    return words_[k];
  }

  // Every word, as a SlotBitmap (for policies that only search SlotBitmaps).
  CARVE_HOST_DEVICE SlotBitmap<N> bitmap() const noexcept {
    bits::word all[extent];
    for (cuda::std::size_t k = 0; k < extent; ++k) {
      all[k] = (*this)[k];
    }
    return SlotBitmap<N>::from_words(all);
  }

  // Whether every slot of `r` (within the bitmap) was free in the words as seen.
  CARVE_HOST_DEVICE bool all_free(SlotRange r) const noexcept {
    return for_each_word_mask(r, [&](std::uint32_t k, bits::word mask) { return ((*this)[k] & mask) == mask; });
  }

  // Whether every word seen still holds the value seen: then an answer drawn from them (such as
  // "no run fits") holds for a state the bitmap was in.
  CARVE_HOST_DEVICE bool unchanged() const noexcept {
    for (cuda::std::size_t k = 0; k < extent; ++k) {
      const bool seen = (seen_[k / bits::word_bits] >> (k % bits::word_bits) & 1) != 0;
      if (seen && live_[k] != words_[k]) {
        return false;
      }
    }
    return true;
  }

private:
  static constexpr cuda::std::size_t flag_words = bits::word_count(extent);

  AtomicWords<N, Scope> live_;
  mutable bits::word seen_[flag_words];
  mutable bits::word words_[extent];
};

} // namespace carve
