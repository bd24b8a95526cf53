/// @file carve/slot/policy/best_fit.hpp
/// The start of the smallest maximal free run that holds m.
///
/// Keeps large runs intact for large requests. Ties go to the lowest run, and a run of exactly m
/// ends the search early. Cost is one walk over the free runs: O(words + runs).
#pragma once

#include <carve/core/config.hpp>
#include <carve/slot/policy/fit_policy.hpp>
#include <carve/slot/search/run_search.hpp>
#include <carve/slot/storage/slot_bitmap.hpp>
#include <carve/slot/storage/word_source.hpp>

namespace carve {

/// Best fit: the smallest free run that holds m, lowest first among equals.
struct BestFit {
  /// Shown in reports and tools.
  static constexpr const char* name = "best-fit";

  /// The start in the first `slots` slots of `words`, or nullopt when nothing fits or m == 0.
  template <WordSource Words>
  CARVE_HOST_DEVICE constexpr cuda::std::optional<std::uint32_t> find_in(const Words& words, std::uint32_t slots,
                                                                         std::uint32_t m) const noexcept {
    if (m == 0) {
      return cuda::std::nullopt;
    }
    cuda::std::optional<std::uint32_t> best;
    std::uint32_t best_count = 0;
    for (std::uint32_t first = runs::next_free(words, slots, 0); first < slots;) {
      const std::uint32_t end = runs::next_taken(words, slots, first);
      const std::uint32_t count = end - first;
      if (count >= m && (!best || count < best_count)) {
        best = first;
        best_count = count;
        if (count == m) {
          break;
        }
      }
      first = runs::next_free(words, slots, end);
    }
    return best;
  }

  /// The start in `bitmap`, or nullopt when nothing fits or m == 0.
  template <std::uint32_t N>
  CARVE_HOST_DEVICE constexpr cuda::std::optional<std::uint32_t> find(const SlotBitmap<N>& bitmap,
                                                                      std::uint32_t m) const noexcept {
    return find_in(bitmap.words(), N, m);
  }
};
static_assert(WordSearchingFitPolicy<BestFit>);

} // namespace carve
