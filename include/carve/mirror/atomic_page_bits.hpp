/// @file carve/mirror/atomic_page_bits.hpp
/// One bit per page, set and collected by many threads at once.
///
/// PagedMirror keeps two: which pages are dirty (written since their last sync) and which are
/// allocated (the fault handler's test of whether an address is the mirror's to handle). Writers
/// set bits with fetch_or; sync() collects a word's dirty pages and clears them in one exchange, so
/// a bit set concurrently is either collected now or stays for the next sync, never lost. Bits use
/// carve's word layout (page p is bit p % 64 of word p / 64). The words are a LazyArray: a 1 TiB
/// mirror of 4 KiB pages has 32 MiB of them, committed only where bits are set.
///
/// Every operation is a lock-free atomic on one 64-bit word, so all of them may be called from a
/// signal handler (C++ allows lock-free atomic operations there).
#pragma once

#include <carve/core/bits.hpp>
#include <carve/mirror/reserved_memory.hpp>
#include <carve/slot/storage/slot_range.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace carve {

/// A fixed number of page bits, all clear at first; every call is thread-safe and signal-safe.
class AtomicPageBits {
  using ref = std::atomic_ref<bits::word>;
  static_assert(ref::is_always_lock_free, "page bits are updated from a signal handler");

public:
  /// `pages` bits, all clear; their words are reserved, not committed. Throws carve::Exception
  /// (no_space) when the kernel refuses the reservation.
  explicit AtomicPageBits(std::uint32_t pages) : pages_(pages), words_(bits::word_count(pages)) {}

  /// Pages covered.
  std::uint32_t size() const noexcept { return pages_; }
  /// 64-bit words holding the bits.
  std::size_t word_count() const noexcept { return words_.size(); }

  /// Whether `page` (< size()) is set.
  bool test(std::uint32_t page) const noexcept {
    return (load(page / bits::word_bits) >> (page % bits::word_bits) & 1) != 0;
  }
  /// Sets pages [r.first, r.end()), which must lie within size() (release order).
  void set(SlotRange r) noexcept {
    for (const WordMask w : word_masks(r)) {
      at(w.word).fetch_or(w.mask, std::memory_order_release);
    }
  }
  /// Clears pages [r.first, r.end()), which must lie within size().
  void clear(SlotRange r) noexcept {
    for (const WordMask w : word_masks(r)) {
      at(w.word).fetch_and(~w.mask, std::memory_order_acq_rel);
    }
  }
  /// Clears the bits of `mask` in word k and returns which of them were set, in one atomic step.
  bits::word take(std::size_t k, bits::word mask = bits::all_ones) noexcept {
    return at(k).fetch_and(~mask, std::memory_order_acq_rel) & mask;
  }
  /// Word k (acquire order).
  bits::word load(std::size_t k) const noexcept { return at(k).load(std::memory_order_acquire); }
  /// Pages set within r (each word read once; not a snapshot of the whole range).
  std::uint32_t count(SlotRange r) const noexcept {
    std::uint32_t n = 0;
    for (const WordMask w : word_masks(r)) {
      n += bits::popcount(load(w.word) & w.mask);
    }
    return n;
  }

private:
  ref at(std::size_t k) const noexcept { return ref(words_[k]); }

  std::uint32_t pages_;
  mutable LazyArray<bits::word> words_; // atomics are read-modify-writes even in const reads
};

} // namespace carve
