/// @file carve/slot/storage/lazy_snapshot.hpp
/// The words of a live bitmap that one search has seen.
///
/// A fit policy searching a live bitmap reads words while other threads change them. LazySnapshot
/// loads a word the first time the search asks for it and answers later reads of it from that
/// copy, so the search sees one fixed (if not simultaneous) picture, and the caller can afterwards
///   - check the proposed run against what the policy saw (a run that was not free there is a
///     policy bug, not a race, as long as no word was evicted: see evicted()), and
///   - re-read the words the search used to confirm a "nothing fits" answer (double collect).
/// A caller may keep the snapshot for its next search and install a word it has just seen change
/// (saw(): the value a claim's atomic returned), or forget() it all; "the search" below means the
/// searches since the last forget(). Only words the search touches are loaded. The copies live in a direct-mapped cache
/// of at most `cached_words_max` = 16 words, so a bitmap of up to 1024 slots is held whole. On a larger one a word can
/// be evicted and is then read again — the search may see it twice, with different values — and the words it read can
/// no longer all be re-checked: unchanged() then answers false, and a caller must confirm "nothing fits" some other way
/// (ConcurrentSlotAllocator repeats the search between two fingerprints of every word, see word_fingerprint.hpp).
///
/// Why 16: the snapshot lives in a device thread's stack frame (local memory), so its size is
/// the frame every kernel that allocates pays, whatever N is. 16 words and 16 tags are 160 bytes
/// at most (128 + 32 with 16-bit tags, enough for bitmaps of up to 64 million slots; larger ones use
/// 32-bit tags, 192 bytes), which keeps an allocating kernel's frame under the 256-byte bound
/// that carve's builds check (cmake/CarveFrameCheck.cmake). A cache of 64 words held 4096 slots
/// whole but cost 784-byte frames; past 1024 slots "nothing fits" is now confirmed by fingerprint,
/// at the price of one more pass over the words, paid only on that answer.
#pragma once

#include <carve/core/bits.hpp>
#include <carve/core/config.hpp>
#include <carve/slot/storage/atomic_words.hpp>
#include <carve/slot/storage/slot_bitmap.hpp>
#include <carve/slot/storage/slot_range.hpp>

#include <cuda/std/cstddef>
#include <cuda/std/cstdint>
#include <cuda/std/type_traits>

namespace carve {

/// What a snapshot can say about a run.
enum class SeenRun {
  free,     ///< every slot of it was free in the words the search saw
  not_free, ///< a word the search saw has one of its slots taken
  unknown,  ///< free as far as the search saw, but a word it never kept shows a slot taken now
};

/// A WordSource that reads each word of live AtomicWords once and remembers it, for one search.
/// Belongs to one thread; at most 192 bytes (see above), so it lives on the stack for one allocation.
template <std::uint32_t N, cuda::thread_scope Scope>
class LazySnapshot {
public:
  /// Words in the bitmap.
  static constexpr cuda::std::size_t extent = bits::word_count(N);

  /// The most words a snapshot keeps, whatever N is (the bound on its stack frame).
  static constexpr cuda::std::size_t cached_words_max = 16;

  /// Nothing read yet.
  CARVE_HOST_DEVICE explicit LazySnapshot(AtomicWords<N, Scope> live) noexcept : live_(live), tag_{}, words_{} {}

  /// Whether the cache holds every word of the bitmap, so that no word is ever evicted.
  CARVE_HOST_DEVICE static constexpr bool holds_all() noexcept { return cache_words == extent; }

  /// Words in the bitmap.
  CARVE_HOST_DEVICE static constexpr cuda::std::size_t size() noexcept { return extent; }

  /// Word `k` as first seen by this snapshot (loaded now if it was not kept).
  CARVE_HOST_DEVICE bits::word operator[](cuda::std::size_t k) const noexcept {
    const cuda::std::size_t line = k % cache_words;
    if (tag_[line] != tag_of(k)) {
      evicted_ = evicted_ || tag_[line] != 0;
      words_[line] = live_[k];
      tag_[line] = tag_of(k);
    }
    return words_[line];
  }

  /// Every word, as a SlotBitmap (for policies that only search SlotBitmaps).
  CARVE_HOST_DEVICE SlotBitmap<N> bitmap() const noexcept { return SlotBitmap<N>::from_source(*this); }

  /// Whether `r` was free in the words seen; `r` must lie within the bitmap.
  CARVE_HOST_DEVICE SeenRun check(SlotRange r) const noexcept {
    SeenRun verdict = SeenRun::free;
    for_each_word_mask(r, [&](std::uint32_t k, bits::word mask) {
      const bool kept = tag_[k % cache_words] == tag_of(k);
      if (((*this)[k] & mask) != mask) {
        verdict = kept ? SeenRun::not_free : SeenRun::unknown;
        return false;
      }
      return true;
    });
    return verdict;
  }

  /// Word `k` as the caller has just seen it (the value a claim's atomic returned): later reads of
  /// `k` answer `value`, as if the search had loaded it now. A search that lost a claim goes on
  /// from what it knows instead of loading every word again.
  CARVE_HOST_DEVICE void saw(cuda::std::size_t k, bits::word value) noexcept {
    const cuda::std::size_t line = k % cache_words;
    evicted_ = evicted_ || (tag_[line] != 0 && tag_[line] != tag_of(k));
    words_[line] = value;
    tag_[line] = tag_of(k);
  }

  /// Forgets every word, for a search that must start from the live words.
  CARVE_HOST_DEVICE void forget() noexcept {
    for (cuda::std::size_t line = 0; line < cache_words; ++line) {
      tag_[line] = 0;
    }
    evicted_ = false;
  }

  /// Whether a word read (or installed by saw()) since the last forget() has been dropped from the
  /// cache (only possible past 1024 slots):
  /// a search that did so may have read a word twice and seen it change, so a run check() finds
  /// taken may have been free in the copy the search used. (check() reads words too: ask first.)
  CARVE_HOST_DEVICE bool evicted() const noexcept { return evicted_; }

  /// Whether every word read so far is still kept and still holds the value seen: then an answer
  /// drawn from them (such as "no run fits") holds for a state the bitmap was in. False once a word
  /// has been evicted (only possible past 1024 slots): the words read can no longer all be checked.
  CARVE_HOST_DEVICE bool unchanged() const noexcept {
    if (evicted_) {
      return false;
    }
    for (cuda::std::size_t line = 0; line < cache_words; ++line) {
      if (tag_[line] != 0 && live_[word_of(line)] != words_[line]) {
        return false;
      }
    }
    return true;
  }

private:
  static constexpr cuda::std::size_t cache_words = extent < cached_words_max ? extent : cached_words_max;
  /// Which of the words that share a line it holds (k / cache_words + 1; 0 = empty): 16 bits
  /// while that fits, so the tags cost 32 bytes rather than 64.
  using tag_type = cuda::std::conditional_t<(extent / cache_words + 1 <= 0xffffu), std::uint16_t, std::uint32_t>;

  CARVE_HOST_DEVICE static constexpr tag_type tag_of(cuda::std::size_t k) noexcept {
    return static_cast<tag_type>(k / cache_words + 1);
  }
  CARVE_HOST_DEVICE cuda::std::size_t word_of(cuda::std::size_t line) const noexcept {
    return (tag_[line] - cuda::std::size_t{1}) * cache_words + line;
  }

  AtomicWords<N, Scope> live_;
  mutable tag_type tag_[cache_words]; ///< which word each line holds
  // Zeroed although a word is read only once its tag says it was loaded: g++ -O2 cannot see
  // that and warns of a read before a write; the zeroing is at most 16 stores.
  mutable bits::word words_[cache_words];
  mutable bool evicted_ = false; ///< a word read by the search has been dropped from the cache
};

} // namespace carve
