// carve/borrow/borrowing_allocator.hpp — memory for a card, borrowed from its best-connected
// peer when the card itself is full: one CachingPool per card plus a BandwidthWeightedPicker.
//
//   carve::BorrowingAllocator alloc(topology, cards);   // cards: one upstream per GPU ordinal
//   auto h = alloc.allocate(3 << 30, /*requesting card*/ 0);
//   if (h) { use(h->card, h->address); alloc.deallocate(*h); }
//   else   { std::puts(h.error().message.c_str()); }  // "no card can hold 3.0 GiB (...)"
//
// allocate() snapshots every card's state, picks, and allocates from the chosen card's pool;
// should that card turn out full after all (a real GPU is shared with other processes), it is
// struck off and the pick repeated. Borrows are recorded in a BorrowHistory for the weighted
// strategy. Thread-safe: picks are serialised by one lock (so two threads never both count on
// the same free block), deallocations go straight to the owning pool's lock.
#pragma once

#include <carve/borrow/bandwidth_weighted_picker.hpp>
#include <carve/borrow/borrow_history.hpp>
#include <carve/borrow/strategies.hpp>
#include <carve/core/errc.hpp>
#include <carve/mr/caching_pool.hpp>
#include <carve/mr/pool_stats.hpp>
#include <carve/mr/upstream.hpp>
#include <carve/topology/topology.hpp>

#include <cuda/std/expected>

#include <algorithm>
#include <cstddef>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace carve {

// What allocate hands out and deallocate takes back.
struct BorrowHandle {
  int card = -1;           // the card whose memory this is
  int requester = -1;      // the card that asked; card != requester means borrowed
  void* address = nullptr; // in the lending card's address space (host memory for SimulatedCard)
  std::size_t size = 0;    // bytes asked for
  bool borrowed() const noexcept { return card != requester; }
};

struct BorrowError {
  Errc code = Errc::no_space;
  std::string message;
};

// One decision, with the figures that drove it; passed to the on_decision callback.
struct BorrowDecision {
  int requester = -1;
  int lender = -1;
  std::size_t bytes = 0;
  double bandwidth_gbps = 0.0; // requester -> lender (infinite when local)
  int hops = 0;
  std::vector<CardState> cards;   // every card's state when the pick was made
  std::vector<double> bandwidths; // requester -> every card
};

template <UpstreamResource Upstream, PickStrategy Strategy = LargestBandwidth>
class BorrowingAllocator {
public:
  using pool_type = CachingPool<Upstream>;

  // `cards[i]` is the upstream of GPU ordinal i; there must be one per GPU of the topology.
  BorrowingAllocator(const Topology& topology, std::vector<Upstream> cards, Strategy strategy = {},
                     PoolOptions options = {}, std::size_t history_window = 1024)
      : picker_(topology, strategy), history_(std::max(topology.gpu_count(), 1), history_window), options_(options) {
    if (cards.size() != static_cast<std::size_t>(topology.gpu_count()) || cards.empty()) {
      throw std::invalid_argument("carve::BorrowingAllocator: " + std::to_string(cards.size()) +
                                  " upstreams for a topology with " + std::to_string(topology.gpu_count()) + " GPUs");
    }
    for (Upstream& card : cards) {
      pools_.push_back(std::make_unique<pool_type>(std::move(card), options));
    }
  }

  // Errors (nothing is allocated): invalid_size for 0 bytes or a size too large to round;
  // out_of_range for an unknown requesting card; no_space when no card can lend the request,
  // with the picker's explanation as the message (BandwidthWeightedPicker::explain_no_pick:
  // each card's largest free block, and why cards with room were ruled out).
  cuda::std::expected<BorrowHandle, BorrowError> allocate(std::size_t bytes, int requesting_card) {
    const std::size_t g = options_.granularity;
    if (bytes == 0 || bytes > std::numeric_limits<std::size_t>::max() - g) {
      return cuda::std::unexpected(
          BorrowError{Errc::invalid_size, "cannot allocate " + std::to_string(bytes) + " bytes"});
    }
    if (requesting_card < 0 || requesting_card >= card_count()) {
      return cuda::std::unexpected(BorrowError{Errc::out_of_range, "no card " + std::to_string(requesting_card) +
                                                                       " (the machine has " +
                                                                       std::to_string(card_count()) + ")"});
    }
    const std::size_t rounded = (bytes + g - 1) / g * g;
    const std::lock_guard lock(mutex_);
    std::vector<CardState> states = card_states();
    const std::vector<CardState> seen = states;
    for (int attempt = 0; attempt < card_count(); ++attempt) {
      const auto pick = picker_.pick(requesting_card, rounded, states, &history_);
      if (!pick) {
        break;
      }
      const auto block = pools_[static_cast<std::size_t>(pick->card)]->try_allocate(bytes);
      if (!block) {
        states[static_cast<std::size_t>(pick->card)] = CardState{}; // full after all: strike it off
        continue;
      }
      if (pick->card != requesting_card) {
        history_.record(requesting_card, pick->card, bytes);
      }
      if (on_decision_) {
        BorrowDecision d{requesting_card, pick->card, bytes, pick->bandwidth_gbps, pick->hops, seen, {}};
        for (int c = 0; c < card_count(); ++c) {
          d.bandwidths.push_back(picker_.bandwidth(requesting_card, c));
        }
        on_decision_(d);
      }
      return BorrowHandle{pick->card, requesting_card, *block, bytes};
    }
    return cuda::std::unexpected(
        BorrowError{Errc::no_space, picker_.explain_no_pick(requesting_card, rounded, card_states(), &history_)});
  }

  // Errors (nothing changes): out_of_range for a handle naming no card; not_allocated or
  // invalid_size from the card's pool when the handle is stale, forged or altered.
  cuda::std::expected<void, Errc> deallocate(const BorrowHandle& handle) {
    if (handle.card < 0 || handle.card >= card_count()) {
      return cuda::std::unexpected(Errc::out_of_range);
    }
    return pools_[static_cast<std::size_t>(handle.card)]->try_deallocate(handle.address, handle.size);
  }

  // Called after every successful allocation, under the allocator's lock (keep it short).
  void on_decision(std::function<void(const BorrowDecision&)> callback) {
    const std::lock_guard lock(mutex_);
    on_decision_ = std::move(callback);
  }

  // Every card's state now: what its pool has cached plus what the card has free.
  std::vector<CardState> card_states() const {
    std::vector<CardState> states;
    states.reserve(pools_.size());
    for (const auto& pool : pools_) {
      states.push_back(CardState{pool->free_bytes(), pool->largest_allocation()});
    }
    return states;
  }

  int card_count() const noexcept { return static_cast<int>(pools_.size()); }
  pool_type& pool(int card) { return *pools_.at(static_cast<std::size_t>(card)); }
  const pool_type& pool(int card) const { return *pools_.at(static_cast<std::size_t>(card)); }
  const BandwidthWeightedPicker<Strategy>& picker() const noexcept { return picker_; }
  // A copy of the borrowing history, taken under the lock.
  BorrowHistory history() const {
    const std::lock_guard lock(mutex_);
    return history_;
  }

private:
  BandwidthWeightedPicker<Strategy> picker_;
  BorrowHistory history_;
  PoolOptions options_;
  std::vector<std::unique_ptr<pool_type>> pools_;
  mutable std::mutex mutex_;
  std::function<void(const BorrowDecision&)> on_decision_;
};

} // namespace carve
