/// @file carve/slot/storage/lazy_snapshot.hpp
/// The words of a live bitmap that one search has seen.
///
/// A fit policy searching a live bitmap reads words while other threads change them. LazySnapshot
/// loads a word the first time the search asks for it and answers later reads of it from that
/// copy, so the search sees one fixed (if not simultaneous) picture, and the caller can afterwards
///   - check the proposed run against what the policy saw (a run that was not free there is a
///     policy bug, not a race), and
///   - re-read the words the search used to confirm a "nothing fits" answer (double collect).
/// Only words the search touches are loaded. The copies live in a direct-mapped cache of at most
/// 64 words (512 bytes), so a bitmap of up to 4096 slots is held whole. On a larger one a word can
/// be evicted and is then read again — the search may see it twice, with different values — and
/// the words it read can no longer all be re-checked: unchanged() then answers false, and a caller
/// must confirm "nothing fits" some other way (ConcurrentSlotAllocator repeats the search between
/// two fingerprints of every word, see word_fingerprint.hpp).
#pragma once

#include <carve/core/bits.hpp>
#include <carve/core/config.hpp>
#include <carve/slot/storage/atomic_words.hpp>
#include <carve/slot/storage/slot_bitmap.hpp>
#include <carve/slot/storage/slot_range.hpp>

#include <cuda/std/cstddef>
#include <cuda/std/cstdint>

namespace carve {

/// What a snapshot can say about a run.
enum class SeenRun {
  free,     ///< every slot of it was free in the words the search saw
  not_free, ///< a word the search saw has one of its slots taken
  unknown,  ///< free as far as the search saw, but a word it never kept shows a slot taken now
};

/// A WordSource that reads each word of live AtomicWords once and remembers it, for one search.
/// Belongs to one thread; a few hundred bytes, so it lives on the stack for one allocation.
template <std::uint32_t N, cuda::thread_scope Scope>
class LazySnapshot {
public:
  /// Words in the bitmap.
  static constexpr cuda::std::size_t extent = bits::word_count(N);

  /// Nothing read yet.
  CARVE_HOST_DEVICE explicit LazySnapshot(AtomicWords<N, Scope> live) noexcept : live_(live), tag_{} {}

  /// Whether the cache holds every word of the bitmap, so that no word is ever evicted.
  CARVE_HOST_DEVICE static constexpr bool holds_all() noexcept { return cache_words == extent; }

  /// Words in the bitmap.
  CARVE_HOST_DEVICE static constexpr cuda::std::size_t size() noexcept { return extent; }

  /// Word `k` as first seen by this snapshot (loaded now if it was not kept).
  CARVE_HOST_DEVICE bits::word operator[](cuda::std::size_t k) const noexcept {
    const cuda::std::size_t line = k % cache_words;
    if (tag_[line] != k + 1) {
      evicted_ = evicted_ || tag_[line] != 0;
      words_[line] = live_[k];
      tag_[line] = static_cast<std::uint32_t>(k + 1);
    }
    return words_[line];
  }

  /// Every word, as a SlotBitmap (for policies that only search SlotBitmaps).
  CARVE_HOST_DEVICE SlotBitmap<N> bitmap() const noexcept {
    bits::word all[extent];
    for (cuda::std::size_t k = 0; k < extent; ++k) {
      all[k] = (*this)[k];
    }
    return SlotBitmap<N>::from_words(all);
  }

  /// Whether `r` was free in the words seen; `r` must lie within the bitmap.
  CARVE_HOST_DEVICE SeenRun check(SlotRange r) const noexcept {
    SeenRun verdict = SeenRun::free;
    for_each_word_mask(r, [&](std::uint32_t k, bits::word mask) {
      const bool kept = tag_[k % cache_words] == k + 1;
      if (((*this)[k] & mask) != mask) {
        verdict = kept ? SeenRun::not_free : SeenRun::unknown;
        return false;
      }
      return true;
    });
    return verdict;
  }

  /// Whether every word read so far is still kept and still holds the value seen: then an answer
  /// drawn from them (such as "no run fits") holds for a state the bitmap was in. False once a word
  /// has been evicted (only possible past 4096 slots): the words read can no longer all be checked.
  CARVE_HOST_DEVICE bool unchanged() const noexcept {
    if (evicted_) {
      return false;
    }
    for (cuda::std::size_t line = 0; line < cache_words; ++line) {
      if (tag_[line] != 0 && live_[tag_[line] - 1] != words_[line]) {
        return false;
      }
    }
    return true;
  }

private:
  static constexpr cuda::std::size_t cache_words = extent < 64 ? extent : 64;

  AtomicWords<N, Scope> live_;
  mutable std::uint32_t tag_[cache_words]; ///< word index + 1 held in each line; 0 = empty
  mutable bits::word words_[cache_words];
  mutable bool evicted_ = false; ///< a word read by the search has been dropped from the cache
};

} // namespace carve
