/// @file carve/borrow/borrow_history.hpp
/// Who borrowed from whom, recently: a kept history of (time,
/// size, lender) per requester, which the weighted strategy reads to spread borrowing.
///
/// A window of the last `window` borrows; counts per (requester, lender) are kept up to date as
/// records enter and leave it, so reading them is O(1). Not synchronised: BorrowingAllocator
/// guards it with its own lock.
#pragma once

#include <carve/core/error.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace carve {

/// One borrow.
struct BorrowRecord {
  std::chrono::steady_clock::time_point time; ///< when it was made
  int requester = -1;                         ///< the card that asked
  int lender = -1;                            ///< the card that lent
  std::size_t bytes = 0;                      ///< how much
};

/// The last `window` borrows among `cards` cards, with counts per (requester, lender). Not
/// synchronised.
class BorrowHistory {
public:
  /// Empty. Throws carve::Exception (invalid_argument) for fewer than one card or a window of 0.
  BorrowHistory(int cards, std::size_t window) : cards_(cards), window_(window) {
    if (cards < 1 || window < 1) {
      throw Exception(Errc::invalid_argument,
                      "carve::BorrowHistory: needs at least one card and a window of at least one");
    }
    counts_.assign(static_cast<std::size_t>(cards) * static_cast<std::size_t>(cards), 0);
    totals_.assign(static_cast<std::size_t>(cards), 0);
    ring_.reserve(window);
  }

  /// Adds a borrow, dropping the oldest once the window is full. Throws carve::Exception
  /// (out_of_range) for a card outside 0..cards-1.
  void record(int requester, int lender, std::size_t bytes,
              std::chrono::steady_clock::time_point time = std::chrono::steady_clock::now()) {
    check(requester);
    check(lender);
    if (ring_.size() == window_) {
      const BorrowRecord& old = ring_[next_];
      --counts_[index(old.requester, old.lender)];
      --totals_[static_cast<std::size_t>(old.requester)];
      ring_[next_] = {time, requester, lender, bytes};
    } else {
      ring_.push_back({time, requester, lender, bytes});
    }
    next_ = (next_ + 1) % window_;
    ++counts_[index(requester, lender)];
    ++totals_[static_cast<std::size_t>(requester)];
  }

  /// Borrows by `requester` from `lender` in the window. Throws carve::Exception (out_of_range)
  /// for a card outside 0..cards-1, as total() does.
  std::uint32_t count(int requester, int lender) const {
    check(requester);
    check(lender);
    return counts_[index(requester, lender)];
  }
  /// All borrows by `requester` in the window.
  std::uint32_t total(int requester) const {
    check(requester);
    return totals_[static_cast<std::size_t>(requester)];
  }

  /// The records in the window, oldest first.
  std::vector<BorrowRecord> records() const {
    std::vector<BorrowRecord> out;
    out.reserve(ring_.size());
    const std::size_t start = ring_.size() == window_ ? next_ : 0;
    for (std::size_t i = 0; i < ring_.size(); ++i) {
      out.push_back(ring_[(start + i) % ring_.size()]);
    }
    return out;
  }
  /// Cards tracked.
  int cards() const noexcept { return cards_; }
  /// Borrows kept.
  std::size_t window() const noexcept { return window_; }

private:
  std::size_t index(int requester, int lender) const noexcept {
    return static_cast<std::size_t>(requester) * static_cast<std::size_t>(cards_) + static_cast<std::size_t>(lender);
  }
  void check(int card) const {
    if (card < 0 || card >= cards_) {
      throw Exception(Errc::out_of_range, "carve::BorrowHistory: no card " + std::to_string(card));
    }
  }

  int cards_;
  std::size_t window_;
  std::vector<BorrowRecord> ring_;
  std::size_t next_ = 0;
  std::vector<std::uint32_t> counts_;
  std::vector<std::uint32_t> totals_;
};

} // namespace carve
