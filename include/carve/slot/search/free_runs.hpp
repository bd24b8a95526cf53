/// @file carve/slot/search/free_runs.hpp
/// The maximal runs of free slots, lowest first, as a forward range.
///
/// @code
/// for (carve::SlotRange run : bitmap.free_runs()) { ... }
/// @endcode
///
/// Each step costs a count-trailing-zeros per word it crosses, so walking all runs is
/// O(words + runs). The range is a view: it must not outlive the words it reads.
#pragma once

#include <carve/core/bits.hpp>
#include <carve/core/config.hpp>
#include <carve/core/errc.hpp>
#include <carve/core/error.hpp>
#include <carve/slot/search/run_search.hpp>
#include <carve/slot/storage/slot_range.hpp>

#include <nv/target>

#include <cuda/std/cstddef>
#include <cuda/std/cstdint>
#include <cuda/std/expected>
#include <cuda/std/iterator>

namespace carve {

/// The maximal free runs of `slots` slots held in `Extent` words (a view over the words).
template <cuda::std::size_t Extent = cuda::std::dynamic_extent>
class FreeRuns {
public:
  /// A forward iterator whose values are the runs (SlotRange), lowest first.
  class iterator {
  public:
    using value_type = SlotRange; ///< a run
    using reference = SlotRange;  ///< runs are computed, not stored: a C++20 forward iterator over values
    using difference_type = cuda::std::ptrdiff_t;             ///< as iterators require
    using iterator_concept = cuda::std::forward_iterator_tag; ///< a forward iterator in C++20 terms
    using iterator_category = cuda::std::input_iterator_tag;  ///< an input iterator in C++17 terms

    /// A singular iterator.
    constexpr iterator() noexcept = default;

    /// The current run.
    CARVE_HOST_DEVICE constexpr SlotRange operator*() const noexcept { return run_; }
    /// On to the next run.
    CARVE_HOST_DEVICE constexpr iterator& operator++() noexcept {
      seek(static_cast<std::uint32_t>(run_.end()));
      return *this;
    }
    /// On to the next run; returns the iterator as it was.
    CARVE_HOST_DEVICE constexpr iterator operator++(int) noexcept {
      iterator before = *this;
      ++*this;
      return before;
    }
    /// Equal at the same run.
    friend CARVE_HOST_DEVICE constexpr bool operator==(const iterator& a, const iterator& b) noexcept {
      return a.run_ == b.run_;
    }

  private:
    friend class FreeRuns;
    CARVE_HOST_DEVICE constexpr iterator(runs::words_view<Extent> words, std::uint32_t slots,
                                         std::uint32_t from) noexcept
        : words_(words.data()), slots_(slots) {
      seek(from);
    }
    CARVE_HOST_DEVICE constexpr void seek(std::uint32_t from) noexcept {
      const runs::words_view<Extent> words(words_, bits::word_count(slots_));
      const std::uint32_t first = runs::next_free(words, slots_, from);
      const std::uint32_t last = runs::next_taken(words, slots_, first);
      run_ = {first, last - first}; // the end iterator is {slots, 0}
    }

    /// A pointer rather than a span: a span of static extent has no default constructor, and a
    /// forward iterator needs one.
    const bits::word* words_ = nullptr;
    std::uint32_t slots_ = 0;
    SlotRange run_{0, 0};
  };

  /// The runs of the first `slots` slots of `words` (SlotBitmap's layout; bits past them zero).
  /// More slots than the words hold throws carve::Exception (invalid_argument) on the host; in
  /// device code the range is empty and status() reports it.
  CARVE_HOST_DEVICE constexpr FreeRuns(runs::words_view<Extent> words, std::uint32_t slots)
      : words_(words), slots_(slots) {
    if (std::uint64_t{slots} > std::uint64_t{words.size()} * bits::word_bits) {
      NV_IF_TARGET(NV_IS_HOST,
                   (throw Exception(Errc::invalid_argument, "carve::FreeRuns: more slots than its words hold");));
      slots_ = 0;
      status_ = Errc::invalid_argument;
    }
  }

  /// invalid_argument for a range built in device code over more slots than its words hold (on
  /// the host the constructor throws); success otherwise.
  [[nodiscard]] CARVE_HOST_DEVICE constexpr cuda::std::expected<void, Errc> status() const noexcept {
    if (status_ != Errc{}) {
      return cuda::std::unexpected(status_);
    }
    return {};
  }

  /// The lowest run.
  CARVE_HOST_DEVICE constexpr iterator begin() const noexcept { return iterator(words_, slots_, 0); }
  /// Past the highest run.
  CARVE_HOST_DEVICE constexpr iterator end() const noexcept { return iterator(words_, slots_, slots_); }

private:
  runs::words_view<Extent> words_;
  std::uint32_t slots_;
  Errc status_{}; ///< Errc{} (no error) unless built from bad input in device code
};

} // namespace carve
