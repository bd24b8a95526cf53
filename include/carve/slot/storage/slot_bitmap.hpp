/// @file carve/slot/storage/slot_bitmap.hpp
/// One bit per slot, 1 = free, 0 = taken.
///
/// SlotBitmap<N> is the state of N equal slots (e.g. a compute unit's shared memory cut into
/// 128 slots of 512 bytes). It is a plain value: trivially copyable, constexpr, and usable in
/// host code and device code alike, so a snapshot is a copy and a comparison is ==.
///
/// Storage is ceil(N / 64) 64-bit words; slot s is bit s % 64 of word s / 64. Bits past slot
/// N - 1 are kept zero, which lets every search treat the end of the bitmap as a taken slot.
#pragma once

#include <carve/core/bits.hpp>
#include <carve/core/config.hpp>
#include <carve/slot/search/free_runs.hpp>
#include <carve/slot/search/run_search.hpp>
#include <carve/slot/storage/slot_range.hpp>
#include <carve/slot/storage/word_source.hpp>

#include <cuda/std/cstdint>
#include <cuda/std/optional>
#include <cuda/std/span>

namespace carve {

/// Slot numbers, counts and run lengths are 32-bit; keeping N below 2^31 leaves headroom for
/// the carries and sums the searches make.
inline constexpr std::uint32_t max_slots = std::uint32_t{1} << 31;

/// The free/taken state of N slots (1 <= N <= max_slots) as a value type; not synchronised.
template <std::uint32_t N>
class SlotBitmap {
  static_assert(N >= 1, "a SlotBitmap needs at least one slot");
  static_assert(N <= max_slots, "a SlotBitmap holds at most 2^31 slots");

public:
  /// The storage word (64 slots).
  using word_type = bits::word;
  /// Words of storage: ceil(N / 64).
  static constexpr std::uint32_t word_count = bits::word_count(N);

  /// All slots free.
  CARVE_HOST_DEVICE constexpr SlotBitmap() noexcept { reset(); }

  /// No slot free.
  CARVE_HOST_DEVICE static constexpr SlotBitmap all_taken() noexcept {
    SlotBitmap b;
    b.occupy({0, N});
    return b;
  }

  /// Adopts raw words (e.g. a snapshot of a bitmap someone else updates). Bits past slot N - 1
  /// are cleared, so the invariant holds whatever the words contain.
  CARVE_HOST_DEVICE static constexpr SlotBitmap from_words(cuda::std::span<const word_type, word_count> w) noexcept {
    return from_source(w);
  }
  /// The same, read word by word from any WordSource of word_count words (a live bitmap, a
  /// search's snapshot).
  template <WordSource Words>
  CARVE_HOST_DEVICE static constexpr SlotBitmap from_source(const Words& w) noexcept {
    SlotBitmap b;
    for (std::uint32_t k = 0; k < word_count; ++k) {
      b.words_[k] = w[k];
    }
    b.words_[word_count - 1] &= tail_mask;
    return b;
  }

  /// Slots in the bitmap: N.
  CARVE_HOST_DEVICE static constexpr std::uint32_t size() noexcept { return N; }

  /// Whether `slot` is free. False for a slot past the end: it does not exist, so it is not free.
  CARVE_HOST_DEVICE constexpr bool is_free(std::uint32_t slot) const noexcept {
    return slot < N && (words_[slot / bits::word_bits] >> (slot % bits::word_bits) & 1) != 0;
  }

  /// Free slots in the whole bitmap.
  CARVE_HOST_DEVICE constexpr std::uint32_t free_count() const noexcept {
    std::uint32_t n = 0;
    for (const word_type w : words_) {
      n += bits::popcount(w);
    }
    return n;
  }

  /// Free slots inside `r`; `r` must lie within the bitmap.
  CARVE_HOST_DEVICE constexpr std::uint32_t free_count(SlotRange r) const noexcept {
    std::uint32_t n = 0;
    for_each_word(r, [&](std::uint32_t k, word_type mask) { n += bits::popcount(words_[k] & mask); });
    return n;
  }

  /// Marks the slots of `r` taken. Precondition: r.end() <= N (checked in debug builds; an
  /// out-of-range call changes nothing). Use SlotAllocator for checked, error-returning calls.
  CARVE_HOST_DEVICE constexpr void occupy(SlotRange r) noexcept {
    for_each_word(r, [&](std::uint32_t k, word_type mask) { words_[k] &= ~mask; });
  }

  /// Marks the slots of `r` free. Same precondition as occupy().
  CARVE_HOST_DEVICE constexpr void release(SlotRange r) noexcept {
    for_each_word(r, [&](std::uint32_t k, word_type mask) { words_[k] |= mask; });
  }

  /// All slots free again.
  CARVE_HOST_DEVICE constexpr void reset() noexcept {
    for (word_type& w : words_) {
      w = bits::all_ones;
    }
    words_[word_count - 1] = tail_mask;
  }

  /// Bit i is set iff slots [i, i + m) are all free (the "avail mask"). Empty for m == 0
  /// and m > N. Built by log2(m) whole-bitmap shift-and steps: O(words * log m).
  CARVE_HOST_DEVICE constexpr SlotBitmap run_starts(std::uint32_t m) const noexcept {
    if (m == 0 || m > N) {
      return all_taken();
    }
    SlotBitmap starts = *this;
    std::uint32_t len = 1;
    while (len <= m / 2) { // 2 * len would wrap at len = 2^31
      starts.and_shifted_down(len);
      len *= 2;
    }
    if (len < m) {
      starts.and_shifted_down(m - len);
    }
    return starts;
  }

  /// Lowest start of m free slots (nullopt if none), stopping at the first word that settles it.
  CARVE_HOST_DEVICE constexpr cuda::std::optional<std::uint32_t> lowest_run_start(std::uint32_t m) const noexcept {
    return runs::lowest_start(words(), m);
  }
  /// Highest start of m free slots (nullopt if none), searching from the top word down.
  CARVE_HOST_DEVICE constexpr cuda::std::optional<std::uint32_t> highest_run_start(std::uint32_t m) const noexcept {
    return runs::highest_start(words(), m);
  }

  /// Both of the above in one pass (cheaper than two calls on small bitmaps); `found` is false
  /// when no run of m fits.
  CARVE_HOST_DEVICE constexpr runs::StartBounds run_start_bounds(std::uint32_t m) const noexcept {
    return runs::start_bounds(words(), m);
  }

  /// The maximal runs of free slots, lowest first. A view of this bitmap, so not available on a
  /// temporary (`for (auto r : make_bitmap().free_runs())` would read a destroyed object).
  CARVE_HOST_DEVICE constexpr FreeRuns<word_count> free_runs() const& noexcept { return {words(), N}; }
  void free_runs() const&& = delete;

  /// Length of the longest run of free slots: the largest request that can succeed now.
  CARVE_HOST_DEVICE constexpr std::uint32_t largest_free_run() const noexcept {
    std::uint32_t best = 0;
    for (const SlotRange run : free_runs()) {
      best = run.count > best ? run.count : best;
    }
    return best;
  }

  /// The storage words (a WordSource), valid while the bitmap lives.
  CARVE_HOST_DEVICE constexpr cuda::std::span<const word_type, word_count> words() const noexcept {
    return cuda::std::span<const word_type, word_count>(words_, word_count);
  }

  /// Equal when the same slots are free.
  friend CARVE_HOST_DEVICE constexpr bool operator==(const SlotBitmap& a, const SlotBitmap& b) noexcept {
    for (std::uint32_t k = 0; k < word_count; ++k) {
      if (a.words_[k] != b.words_[k]) {
        return false;
      }
    }
    return true;
  }

private:
  static constexpr word_type tail_mask = bits::low_mask(N - (word_count - 1) * bits::word_bits);

  /// for_each_word_mask over a range that must lie within the bitmap.
  template <class F>
  CARVE_HOST_DEVICE constexpr void for_each_word(SlotRange r, F&& f) const noexcept {
    CARVE_EXPECTS(r.end() <= N);
    if (r.end() <= N) {
      for_each_word_mask(r, f);
    }
  }

  /// words &= words shifted toward slot 0 by s (slot i sees slot i + s; zeros come in at the
  /// top). In place: word k reads only words k and above, which are not yet updated.
  CARVE_HOST_DEVICE constexpr void and_shifted_down(std::uint32_t s) noexcept {
    const std::uint32_t skip = s / bits::word_bits;
    const std::uint32_t bit = s % bits::word_bits;
    for (std::uint32_t k = 0; k < word_count; ++k) {
      const word_type lo = k + skip < word_count ? words_[k + skip] : 0;
      const word_type hi = k + skip + 1 < word_count ? words_[k + skip + 1] : 0;
      words_[k] &= bit == 0 ? lo : (lo >> bit) | (hi << (bits::word_bits - bit));
    }
  }

  word_type words_[word_count];
};

} // namespace carve
