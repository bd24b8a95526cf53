// carve/slot/search/free_runs.hpp — the maximal runs of free slots, lowest first, as a forward range.
//
//   for (carve::SlotRange run : bitmap.free_runs()) { ... }
//
// Each step costs a count-trailing-zeros per word it crosses, so walking all runs is
// O(words + runs). The range is a view: it must not outlive the words it reads.
#pragma once

#include <carve/core/config.hpp>
#include <carve/slot/search/run_search.hpp>
#include <carve/slot/storage/slot_range.hpp>

#include <cuda/std/cstddef>
#include <cuda/std/cstdint>
#include <cuda/std/iterator>

namespace carve {

template <cuda::std::size_t Extent = cuda::std::dynamic_extent>
class FreeRuns {
public:
  class iterator {
  public:
    using value_type = SlotRange;
    using reference = SlotRange; // runs are computed, not stored: a C++20 forward iterator over values
    using difference_type = cuda::std::ptrdiff_t;
    using iterator_concept = cuda::std::forward_iterator_tag;
    using iterator_category = cuda::std::input_iterator_tag;

    constexpr iterator() noexcept = default;

    CARVE_HOST_DEVICE constexpr SlotRange operator*() const noexcept { return run_; }
    CARVE_HOST_DEVICE constexpr iterator& operator++() noexcept {
      seek(static_cast<std::uint32_t>(run_.end()));
      return *this;
    }
    CARVE_HOST_DEVICE constexpr iterator operator++(int) noexcept {
      iterator before = *this;
      ++*this;
      return before;
    }
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

    // A pointer rather than a span: a span of static extent has no default constructor, and a
    // forward iterator needs one.
    const bits::word* words_ = nullptr;
    std::uint32_t slots_ = 0;
    SlotRange run_{0, 0};
  };

  CARVE_HOST_DEVICE constexpr FreeRuns(runs::words_view<Extent> words, std::uint32_t slots) noexcept
      : words_(words), slots_(slots) {}

  CARVE_HOST_DEVICE constexpr iterator begin() const noexcept { return iterator(words_, slots_, 0); }
  CARVE_HOST_DEVICE constexpr iterator end() const noexcept { return iterator(words_, slots_, slots_); }

private:
  runs::words_view<Extent> words_;
  std::uint32_t slots_;
};

} // namespace carve
