/// @file carve/mirror/picker_placement.hpp
/// Pages near the device that will use them, as BandwidthWeightedPicker decides.
///
/// @code
/// carve::PickerPlacement placement(carve::BandwidthWeightedPicker(topology));   // LargestBandwidth
/// carve::PagedMirror mirror(backend, options, placement);
/// @endcode
///
/// The requesting device is the request's `near` device (the one the dispatcher gave the work to),
/// else `home`. The whole allocation goes to one device when one can hold it: the requester if it
/// has room, else the lender the picker's strategy chooses (borrow/). When no single device
/// can, the pages are spread: the requester's free pages first, then the picker's next choice, and
/// so on, so the pages furthest from the requester are the fewest. Device ordinals are the
/// topology's GPU ordinals; the topology must describe as many GPUs as the mirror has devices.
#pragma once

#include <carve/borrow/bandwidth_weighted_picker.hpp>
#include <carve/borrow/borrow_history.hpp>
#include <carve/mirror/placement.hpp>

#include <algorithm>
#include <cstddef>
#include <optional>
#include <span>
#include <utility>
#include <vector>

namespace carve {

/// A PagePlacement that asks a BandwidthWeightedPicker, keeping a BorrowHistory of its own.
template <PickStrategy Strategy = LargestBandwidth>
class PickerPlacement {
public:
  static constexpr const char* name = "picker"; ///< for reports

  /// `home`: the requester when a request names no `near` device. `history_window`: how many
  /// borrows the strategy's history term looks back over (0: none kept).
  explicit PickerPlacement(BandwidthWeightedPicker<Strategy> picker, std::uint32_t home = 0,
                           std::size_t history_window = 64)
      : picker_(std::move(picker)), home_(home) {
    if (history_window != 0) {
      history_.emplace(picker_.card_count(), history_window);
    }
  }

  /// The plan. Errors: out_of_range when the topology's GPU count differs from the devices' or the
  /// requester is not one of them; no_space when no reachable device has room for what is left.
  [[nodiscard]] cuda::std::expected<PlacementPlan, Errc> place(const PlacementRequest& r,
                                                               std::span<const DevicePageState> devices) {
    if (devices.size() != static_cast<std::size_t>(picker_.card_count())) {
      return cuda::std::unexpected(Errc::out_of_range);
    }
    const auto requester = static_cast<int>(r.near.value_or(home_));
    if (requester < 0 || requester >= picker_.card_count()) {
      return cuda::std::unexpected(Errc::out_of_range);
    }
    if (detail::usable_pages(devices) < r.pages) {
      return cuda::std::unexpected(Errc::no_space);
    }
    std::vector<CardState> cards(devices.size());
    for (std::size_t d = 0; d < devices.size(); ++d) {
      // Pages need not be contiguous on a device, so every free page counts as one block.
      const std::size_t bytes = devices[d].available ? std::size_t{devices[d].free_pages} * r.page_size : 0;
      cards[d] = {bytes, bytes};
    }
    PlacementPlan plan;
    std::vector<std::pair<int, std::size_t>> borrowed; // into the history once the plan is whole
    std::uint32_t left = r.pages;
    // First the whole request in one piece, then one device at a time in the picker's order of
    // preference (asking for a single page finds the best device that has any room).
    std::size_t ask = std::size_t{r.pages} * r.page_size;
    while (left != 0) {
      const auto pick = picker_.pick(requester, ask, cards, history_ ? &*history_ : nullptr);
      if (!pick) {
        if (ask == r.page_size) {
          return cuda::std::unexpected(pick.error()); // no reachable device has room
        }
        ask = r.page_size;
        continue;
      }
      const auto d = static_cast<std::size_t>(pick->card);
      const auto take = static_cast<std::uint32_t>(std::min<std::size_t>(left, cards[d].free_bytes / r.page_size));
      detail::append(plan, static_cast<std::uint32_t>(d), take);
      if (history_ && !pick->local) {
        borrowed.emplace_back(pick->card, std::size_t{take} * r.page_size);
      }
      cards[d] = {};
      left -= take;
      ask = r.page_size;
    }
    for (const auto& [card, bytes] : borrowed) {
      history_->record(requester, card, bytes);
    }
    return plan;
  }

  /// The picker.
  const BandwidthWeightedPicker<Strategy>& picker() const noexcept { return picker_; }
  /// The requester for requests without a `near` device.
  std::uint32_t home() const noexcept { return home_; }

private:
  BandwidthWeightedPicker<Strategy> picker_;
  std::uint32_t home_;
  std::optional<BorrowHistory> history_;
};

static_assert(PagePlacement<PickerPlacement<>>);

} // namespace carve
