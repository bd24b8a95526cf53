/// @file carve/slot/policy/end_fit.hpp
/// The fit nearest one chosen end of the slot space: first fit (the lowest start, the classic
/// address-ordered first fit) and last fit (the highest start: allocations grow down from the
/// top) are one policy with the end as its parameter.
///
/// @code
/// carve::SlotAllocator<128, carve::FirstFit> low;   // = EndFit<SlotEnd::first>
/// carve::SlotAllocator<128, carve::LastFit> high;   // = EndFit<SlotEnd::last>
/// @endcode
#pragma once

#include <carve/core/config.hpp>
#include <carve/slot/policy/fit_policy.hpp>
#include <carve/slot/search/run_search.hpp>
#include <carve/slot/storage/slot_bitmap.hpp>
#include <carve/slot/storage/word_source.hpp>

namespace carve {

/// The end of the slot space an EndFit packs against.
enum class SlotEnd {
  first, ///< slot 0: the lowest start that fits
  last,  ///< slot N - 1: the highest start that fits
};

/// The start of m free slots nearest `End`.
template <SlotEnd End>
struct EndFit {
  /// Shown in reports and tools.
  static constexpr const char* name = End == SlotEnd::first ? "first-fit" : "last-fit";

  /// The start in `words`, or nullopt when nothing fits or m == 0.
  template <WordSource Words>
  CARVE_HOST_DEVICE constexpr cuda::std::optional<std::uint32_t> find_in(const Words& words, std::uint32_t /*slots*/,
                                                                         std::uint32_t m) const noexcept {
    if constexpr (End == SlotEnd::first) {
      return runs::lowest_start(words, m);
    } else {
      return runs::highest_start(words, m);
    }
  }

  /// The choice given both extreme candidates (for the cooperative searches in warp_scan.hpp).
  CARVE_HOST_DEVICE static constexpr cuda::std::optional<std::uint32_t> pick(runs::StartBounds b, std::uint32_t,
                                                                             std::uint32_t) noexcept {
    if (!b.found) {
      return cuda::std::nullopt;
    }
    return End == SlotEnd::first ? b.lowest : b.highest;
  }

  /// The start in `bitmap`, or nullopt when nothing fits or m == 0.
  template <std::uint32_t N>
  CARVE_HOST_DEVICE constexpr cuda::std::optional<std::uint32_t> find(const SlotBitmap<N>& bitmap,
                                                                      std::uint32_t m) const noexcept {
    return find_in(bitmap.words(), N, m);
  }
};

/// First fit: the lowest start of m free slots.
using FirstFit = EndFit<SlotEnd::first>;
/// Last fit: the highest start of m free slots.
using LastFit = EndFit<SlotEnd::last>;

static_assert(WordSearchingFitPolicy<FirstFit> && BoundsFitPolicy<FirstFit>);
static_assert(WordSearchingFitPolicy<LastFit> && BoundsFitPolicy<LastFit>);

} // namespace carve
