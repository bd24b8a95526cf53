/// @file carve/slot/search/run_search.hpp
/// Finding runs of free slots in a bitmap held as 64-bit words.
///
/// These functions work on any WordSource (a SlotBitmap's own storage, a snapshot, a live
/// bitmap read atomically word by word), which is why they are free functions. Bits past the
/// last slot must be zero (taken), so no search ever reports a slot that does not exist.
///
/// Cost: one pass over the words from one end, O(log m) work per word, and the search stops at
/// the first word that settles the answer. A run longer than a word is tracked by a carry: the
/// number of free slots that touch the boundary of the words already visited.
#pragma once

#include <carve/core/bits.hpp>
#include <carve/core/config.hpp>
#include <carve/slot/storage/word_source.hpp>

#include <cuda/std/cstddef>
#include <cuda/std/cstdint>
#include <cuda/std/optional>
#include <cuda/std/span>

/// Searches for runs of free slots over any WordSource.
namespace carve::runs {

/// Bitmap words as a span (of static extent when the size is known at compile time).
template <cuda::std::size_t Extent>
using words_view = cuda::std::span<const bits::word, Extent>;

/// The lowest and highest start of m free slots: the two candidates boundary-nearest weighs.
/// `found` is false when no run of m fits (then the starts mean nothing). A flag rather than an
/// optional keeps this hottest path in registers: GCC tends to build an optional of a struct on
/// the stack.
struct StartBounds {
  std::uint32_t lowest;  ///< the lowest start
  std::uint32_t highest; ///< the highest start
  bool found;            ///< whether a run of m fits at all
};

namespace detail {
// Both candidates in a bitmap of one or two words (up to 128 slots, the usual shared-memory
// case): compute both words' in-word starts up front and pick the candidates with selects. Two
// early-exit scans would compute the same masks with branches that mispredict on most calls.
// m >= 1.
template <WordSource Words>
CARVE_HOST_DEVICE constexpr StartBounds small_start_bounds(const Words& words, std::uint32_t m) noexcept {
  constexpr cuda::std::size_t extent = static_word_count<Words>;
  static_assert(extent == 1 || extent == 2);
  const bits::word w0 = words[0];
  bits::word w1 = 0;
  if constexpr (extent == 2) {
    w1 = words[1];
  }
  const bool in_word = m <= bits::word_bits;
  const bits::word s0 = in_word ? bits::run_starts(w0, m) : 0;
  const bits::word s1 = in_word ? bits::run_starts(w1, m) : 0;
  // A run across the word boundary: free slots at the top of w0 plus those at the bottom of w1.
  const std::uint32_t h0 = bits::high_run(w0);
  const std::uint32_t l1 = bits::low_run(w1);
  const bool across = extent == 2 && h0 + l1 >= m;
  constexpr std::uint32_t top = bits::word_bits;
  const std::uint32_t lowest = s0 != 0 ? bits::lowest_set(s0) : across ? top - h0 : top + bits::lowest_set(s1);
  const std::uint32_t highest = s1 != 0 ? top + bits::highest_set(s1) : across ? top + l1 - m : bits::highest_set(s0);
  return {lowest, highest, s0 != 0 || s1 != 0 || across};
}

template <WordSource Words>
inline constexpr bool small_words = static_word_count<Words> == 1 || static_word_count<Words> == 2;
} // namespace detail

/// Lowest start s such that slots [s, s + m) are all free.
template <WordSource Words>
CARVE_HOST_DEVICE constexpr cuda::std::optional<std::uint32_t> lowest_start(const Words& words,
                                                                            std::uint32_t m) noexcept {
  if constexpr (detail::small_words<Words>) {
    // m == 0 folded into the select: an early return before it makes g++ branch on every call
    // (FirstFit at 128 slots: 1.8 -> 7.7 ns), while start_bounds needs the early return instead.
    const StartBounds b = m == 0 ? StartBounds{0, 0, false} : detail::small_start_bounds(words, m);
    return b.found ? cuda::std::optional<std::uint32_t>(b.lowest) : cuda::std::nullopt;
  } else {
    if (m == 0) {
      return cuda::std::nullopt;
    }
    std::uint64_t carry = 0; // free slots ending at the top of the words below
    for (std::uint32_t k = 0; k < words.size(); ++k) {
      const bits::word w = words[k];
      const std::uint32_t base = k * bits::word_bits;
      if (carry + bits::low_run(w) >= m) {
        return static_cast<std::uint32_t>(base - carry);
      }
      if (m <= bits::word_bits) {
        if (const bits::word starts = bits::run_starts(w, m)) {
          return base + bits::lowest_set(starts);
        }
      }
      carry = (w == bits::all_ones) ? carry + bits::word_bits : bits::high_run(w);
    }
    return cuda::std::nullopt;
  }
}

/// Highest start s such that slots [s, s + m) are all free.
template <WordSource Words>
CARVE_HOST_DEVICE constexpr cuda::std::optional<std::uint32_t> highest_start(const Words& words,
                                                                             std::uint32_t m) noexcept {
  if constexpr (detail::small_words<Words>) {
    // As in lowest_start: m == 0 stays in the select.
    const StartBounds b = m == 0 ? StartBounds{0, 0, false} : detail::small_start_bounds(words, m);
    return b.found ? cuda::std::optional<std::uint32_t>(b.highest) : cuda::std::nullopt;
  } else {
    if (m == 0) {
      return cuda::std::nullopt;
    }
    std::uint64_t carry = 0; // free slots starting at the bottom of the words above
    for (std::uint32_t k = static_cast<std::uint32_t>(words.size()); k-- > 0;) {
      const bits::word w = words[k];
      const std::uint64_t top = std::uint64_t{k + 1} * bits::word_bits;
      if (carry + bits::high_run(w) >= m) {
        return static_cast<std::uint32_t>(top + carry - m);
      }
      if (m <= bits::word_bits) {
        if (const bits::word starts = bits::run_starts(w, m)) {
          return k * bits::word_bits + bits::highest_set(starts);
        }
      }
      carry = (w == bits::all_ones) ? carry + bits::word_bits : bits::low_run(w);
    }
    return cuda::std::nullopt;
  }
}

/// lowest_start and highest_start together (one pass on one- and two-word bitmaps); `found` is
/// false for m == 0 and when no run of m fits.
template <WordSource Words>
CARVE_HOST_DEVICE constexpr StartBounds start_bounds(const Words& words, std::uint32_t m) noexcept {
  // Returning early for m == 0 lets the inlined scans below drop their own check (boundary-nearest
  // at 1024 slots: 13.6 -> 6.8 ns).
  if (m == 0) {
    return {0, 0, false};
  }
  if constexpr (detail::small_words<Words>) {
    return detail::small_start_bounds(words, m);
  } else {
    const cuda::std::optional<std::uint32_t> lowest = lowest_start(words, m);
    if (!lowest) {
      return {0, 0, false};
    }
    // On a live source the words may change between the two scans; the lowest run was seen free,
    // so it stands in for a highest one that vanished.
    return {*lowest, highest_start(words, m).value_or(*lowest), true};
  }
}

namespace detail {
// First slot at or after `from` whose bit equals `free`; `slots` when there is none. Bits past
// the end read as taken, hence the clamp.
template <WordSource Words>
CARVE_HOST_DEVICE constexpr std::uint32_t next_with(const Words& words, std::uint32_t slots, std::uint32_t from,
                                                    bool free) noexcept {
  if (from >= slots) {
    return slots;
  }
  const bits::word flip = free ? 0 : bits::all_ones;
  std::uint32_t k = from / bits::word_bits;
  bits::word w = (words[k] ^ flip) & ~bits::low_mask(from % bits::word_bits);
  while (w == 0) {
    if (++k == words.size()) {
      return slots;
    }
    w = words[k] ^ flip;
  }
  const std::uint32_t found = k * bits::word_bits + bits::lowest_set(w);
  return found < slots ? found : slots;
}
} // namespace detail

/// First free slot at or after `from`; `slots` (the bitmap's size) when there is none.
template <WordSource Words>
CARVE_HOST_DEVICE constexpr std::uint32_t next_free(const Words& words, std::uint32_t slots,
                                                    std::uint32_t from) noexcept {
  return detail::next_with(words, slots, from, true);
}

/// First taken slot at or after `from`; `slots` when the bitmap is free from there to the end.
template <WordSource Words>
CARVE_HOST_DEVICE constexpr std::uint32_t next_taken(const Words& words, std::uint32_t slots,
                                                     std::uint32_t from) noexcept {
  return detail::next_with(words, slots, from, false);
}

} // namespace carve::runs
