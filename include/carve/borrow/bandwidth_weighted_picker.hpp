/// @file carve/borrow/bandwidth_weighted_picker.hpp
/// Which card lends memory to a card that is full.
///
/// @code
/// carve::BandwidthWeightedPicker picker(topology);              // LargestBandwidth
/// auto pick = picker.pick(/*requester*/ 0, bytes, card_states); // expected<Pick, Errc>
/// @endcode
///
/// The requester itself when its largest free block holds the request. Otherwise every other
/// card that can hold it and has a path to the requester (within the topology's max_hops)
/// becomes a Candidate, and the strategy (carve/borrow/strategies.hpp, or any PickStrategy)
/// chooses; equal scores go to the wider path, then fewer hops, then more free memory, then the
/// lower ordinal. A card without room is never chosen.
///
/// Cards are GPU ordinals 0..topology.gpu_count()-1. Path bandwidths between them are copied out
/// of the topology when the picker is built, so a pick reads one row of a small table and does
/// not allocate; 16 cards take well under a microsecond (benchmarks/picker.cpp).
///
/// Two forms, the same decision:
/// - `pick(...)` returns `expected<Pick, Errc>`; noexcept, never allocates: for hot paths.
/// - `pick_explained(...)` returns `carve::Result<Pick>`, whose error carries a sentence for people:
///   "no card can hold 3.0 GiB (largest free block per card: GPU0 1.2 GiB, GPU1 0 B, ...)",
///   or, when cards had room but were ruled out, which ones and why (no path within
///   max_hops, or the strategy declined them, e.g. `ThresholdMostFree{.strict = true}`).
///
/// Errors: out_of_range for an unknown requester, or a card list or history of the wrong length
/// (bandwidth(), hops() and mappable() throw carve::Exception, out_of_range, for an unknown card); no_space
/// when no card can lend (explain_no_pick() gives pick_explained()'s sentence for a pick() that
/// failed, no_card_message() the first part alone).
#pragma once

#include <carve/borrow/borrow_history.hpp>
#include <carve/borrow/pick_strategy.hpp>
#include <carve/borrow/strategies.hpp>
#include <carve/core/error.hpp>
#include <carve/core/format_bytes.hpp>
#include <carve/topology/topology.hpp>

#include <cuda/std/expected>

#include <concepts>
#include <cstddef>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

namespace carve {

/// What a card can give right now.
struct CardState {
  std::size_t free_bytes = 0;         ///< in total (cached plus what the card itself has free)
  std::size_t largest_free_block = 0; ///< in one piece
};

/// The card chosen to serve a request.
struct Pick {
  int card = -1;               ///< GPU ordinal
  bool local = false;          ///< the requester itself
  double bandwidth_gbps = 0.0; ///< of the path from the requester (infinite when local)
  int hops = 0;                ///< links on that path (0 when local)
};

namespace detail {
// "(largest free block per card: GPU0 1.2 GiB, GPU1 0 B, ...)".
inline std::string free_blocks_list(std::span<const CardState> cards) {
  std::string m = "(largest free block per card:";
  for (std::size_t c = 0; c < cards.size(); ++c) {
    m += (c == 0 ? " GPU" : ", GPU") + std::to_string(c) + " " + format_bytes(cards[c].largest_free_block);
  }
  return m + ")";
}
} // namespace detail

/// "no card can hold 3.0 GiB (largest free block per card: GPU0 1.2 GiB, GPU1 0 B, ...)".
inline std::string no_card_message(std::size_t bytes, std::span<const CardState> cards) {
  return "no card can hold " + format_bytes(bytes) + " " + detail::free_blocks_list(cards);
}

/// Chooses the card that serves a request: the requester when it has room, else a lender chosen
/// by `Strategy`. Immutable after construction, so threads may share one.
template <PickStrategy Strategy = LargestBandwidth>
class BandwidthWeightedPicker {
public:
  /// The strategy that ranks lenders.
  using strategy_type = Strategy;

  /// For the GPUs of `topology`. A borrowed block is used where it lies, by the requester's
  /// loads and stores, so each pair is scored by the path such an access takes: the topology's
  /// paths with no GPU relaying (GpuRelay::never), whose bandwidths and hop counts are copied in.
  explicit BandwidthWeightedPicker(const Topology& topology, Strategy strategy = {})
      : BandwidthWeightedPicker(topology, strategy, [](int, int) { return true; }) {}

  /// The same, for machines where some pairs of cards cannot map each other's memory at all
  /// (`mappable(requester, lender)` false, e.g. cudaDeviceCanAccessPeer said no): those lenders
  /// are never picked, and explain_no_pick() says why. Both throw carve::Exception
  /// (invalid_argument) for a topology without GPUs: nothing could ever be picked.
  template <class Mappable>
  requires std::predicate<Mappable&, int, int> BandwidthWeightedPicker(const Topology& topology, Strategy strategy,
                                                                       Mappable mappable)
      : cards_(topology.gpu_count()), strategy_(strategy) {
    if (cards_ < 1) {
      throw Exception(Errc::invalid_argument, "carve::BandwidthWeightedPicker: the topology has no GPUs");
    }
    const auto n = static_cast<std::size_t>(cards_);
    const Topology access = topology.with_options({topology.options().max_hops, GpuRelay::never});
    bandwidth_.resize(n * n);
    hops_.resize(n * n);
    mappable_.resize(n * n);
    for (int a = 0; a < cards_; ++a) {
      for (int b = 0; b < cards_; ++b) {
        const std::size_t i = static_cast<std::size_t>(a) * n + static_cast<std::size_t>(b);
        mappable_[i] = a == b || mappable(a, b);
        bandwidth_[i] = mappable_[i] ? access.path_bandwidth(access.gpu(a), access.gpu(b)) : 0.0;
        hops_[i] = mappable_[i] ? access.hops(access.gpu(a), access.gpu(b)) : -1;
      }
    }
  }

  /// `cards[c]` is card c's state; `history` (optional) feeds Candidate::borrow_share.
  [[nodiscard]] cuda::std::expected<Pick, Errc> pick(int requester, std::size_t bytes, std::span<const CardState> cards,
                                                     const BorrowHistory* history = nullptr) const noexcept {
    if (!valid(requester, cards, history)) {
      return cuda::std::unexpected(Errc::out_of_range);
    }
    if (cards[static_cast<std::size_t>(requester)].largest_free_block >= bytes) {
      return Pick{requester, true, bandwidth_[index(requester, requester)], 0};
    }
    const Shares shares = best_figures(requester, bytes, cards, history);
    int best = -1;
    Candidate best_candidate;
    PickScore best_score;
    for (int c = 0; c < cards_; ++c) {
      if (!lendable(requester, c, bytes, cards)) {
        continue;
      }
      const Candidate cand = candidate(requester, c, cards, history, shares);
      if (!strategy_.eligible(cand)) {
        continue;
      }
      const PickScore score = strategy_.score(cand);
      if (best < 0 || preferred(score, cand, best_score, best_candidate)) {
        best = c;
        best_candidate = cand;
        best_score = score;
      }
    }
    if (best < 0) {
      return cuda::std::unexpected(Errc::no_space);
    }
    return Pick{best, false, best_candidate.bandwidth_gbps, best_candidate.hops};
  }

  /// The same decision as pick(), with an error that explains itself (see the top of this
  /// header). Allocates only to build the message of an error.
  [[nodiscard]] Result<Pick> pick_explained(int requester, std::size_t bytes, std::span<const CardState> cards,
                                            const BorrowHistory* history = nullptr) const {
    if (const auto p = pick(requester, bytes, cards, history)) {
      return *p;
    } else if (p.error() == Errc::out_of_range) {
      if (cards.size() != static_cast<std::size_t>(cards_)) {
        return fail(Errc::out_of_range, "states for " + std::to_string(cards.size()) + " cards, the topology has " +
                                            std::to_string(cards_) + " GPUs");
      }
      if (history != nullptr && history->cards() != cards_) {
        return fail(Errc::out_of_range, "a borrowing history of " + std::to_string(history->cards()) +
                                            " cards, the topology has " + std::to_string(cards_) + " GPUs");
      }
      return fail(Errc::out_of_range, "no card " + std::to_string(requester) + " (the topology has GPUs 0.." +
                                          std::to_string(cards_ - 1) + ")");
    }
    return fail(Errc::no_space, explain_no_pick(requester, bytes, cards, history));
  }

  /// Why pick() found no card for (requester, bytes): no_card_message() when no other card has
  /// a free block that large; otherwise which cards had room and why each was ruled out.
  std::string explain_no_pick(int requester, std::size_t bytes, std::span<const CardState> cards,
                              const BorrowHistory* history = nullptr) const {
    if (!valid(requester, cards, history)) {
      return "no card " + std::to_string(requester) + " with states for " + std::to_string(cards.size()) + " cards" +
             (history != nullptr ? " and a history of " + std::to_string(history->cards()) : "") +
             " (the topology has " + std::to_string(cards_) + " GPUs)";
    }
    std::string why;
    const Shares shares = best_figures(requester, bytes, cards, history);
    for (int c = 0; c < cards_; ++c) {
      if (c == requester || cards[static_cast<std::size_t>(c)].largest_free_block < bytes) {
        continue;
      }
      why += why.empty() ? ": " : "; ";
      if (!mappable_[index(requester, c)]) {
        why += "GPU" + std::to_string(c) + " has room but GPU" + std::to_string(requester) +
               " cannot map its memory (no peer access between them)";
        continue;
      }
      if (!lendable(requester, c, bytes, cards)) {
        why += "GPU" + std::to_string(c) + " has room but no path to GPU" + std::to_string(requester) +
               " within the topology's max_hops";
        continue;
      }
      const Candidate cand = candidate(requester, c, cards, history, shares);
      char gbps[32];
      std::snprintf(gbps, sizeof gbps, "%.0f GB/s", cand.bandwidth_gbps);
      why +=
          "GPU" + std::to_string(c) + " has room but the " + strategy_label() + " strategy declines it (" + gbps + ")";
    }
    if (why.empty()) {
      return no_card_message(bytes, cards);
    }
    return "no card can lend " + format_bytes(bytes) + " to GPU" + std::to_string(requester) + why + " " +
           detail::free_blocks_list(cards);
  }

  /// GPUs the picker knows.
  int card_count() const noexcept { return cards_; }
  /// GB/s of `from`'s accesses to memory on `to` (the topology's path without GPU relays; 0
  /// when `from` cannot map `to`'s memory). Throws carve::Exception (out_of_range) for a card
  /// outside 0..card_count()-1, as do mappable() and hops().
  double bandwidth(int from, int to) const { return bandwidth_[checked_index(from, to)]; }
  /// Whether `from` can map memory on `to` at all.
  bool mappable(int from, int to) const { return mappable_[checked_index(from, to)]; }
  /// Links on the path between two cards (from the topology); -1 when `from` cannot map `to`'s
  /// memory.
  int hops(int from, int to) const { return hops_[checked_index(from, to)]; }
  /// The strategy.
  const Strategy& strategy() const noexcept { return strategy_; }

private:
  /// The best figures among the cards that could lend, and the requester's borrows in the
  /// history, for the relative shares.
  struct Shares {
    std::size_t most_free = 0;
    double widest = 0.0;
    double borrows = 0.0;
  };

  const char* strategy_label() const noexcept {
    if constexpr (requires { strategy_.name(); }) {
      return strategy_.name(); // AnyStrategy: the strategy it holds
    } else {
      return strategy_name<Strategy>();
    }
  }
  /// Whether the request's indices are all good: a known requester, one state per card, and a
  /// history (if any) of as many cards, so that nothing after this check indexes out of range.
  bool valid(int requester, std::span<const CardState> cards, const BorrowHistory* history) const noexcept {
    return requester >= 0 && requester < cards_ && cards.size() == static_cast<std::size_t>(cards_) &&
           (history == nullptr || history->cards() == cards_);
  }
  Shares best_figures(int requester, std::size_t bytes, std::span<const CardState> cards,
                      const BorrowHistory* history) const noexcept {
    Shares s;
    s.borrows = history != nullptr ? static_cast<double>(history->total(requester)) : 0.0;
    for (int c = 0; c < cards_; ++c) {
      if (lendable(requester, c, bytes, cards)) {
        const CardState& card = cards[static_cast<std::size_t>(c)];
        s.most_free = card.free_bytes > s.most_free ? card.free_bytes : s.most_free;
        const double gbps = bandwidth_[index(requester, c)];
        s.widest = gbps > s.widest ? gbps : s.widest;
      }
    }
    return s;
  }
  Candidate candidate(int requester, int c, std::span<const CardState> cards, const BorrowHistory* history,
                      const Shares& shares) const noexcept {
    const CardState& s = cards[static_cast<std::size_t>(c)];
    Candidate cand;
    cand.card = c;
    cand.bandwidth_gbps = bandwidth_[index(requester, c)];
    cand.hops = hops_[index(requester, c)];
    cand.free_bytes = s.free_bytes;
    cand.largest_free_block = s.largest_free_block;
    cand.free_share =
        shares.most_free == 0 ? 1.0 : static_cast<double>(s.free_bytes) / static_cast<double>(shares.most_free);
    cand.bandwidth_share = cand.bandwidth_gbps / shares.widest;
    cand.borrow_share =
        shares.borrows == 0.0 ? 0.0 : static_cast<double>(history->count(requester, c)) / shares.borrows;
    return cand;
  }

  /// The table index of a pair of cards the caller has checked.
  std::size_t index(int from, int to) const noexcept {
    return static_cast<std::size_t>(from) * static_cast<std::size_t>(cards_) + static_cast<std::size_t>(to);
  }
  std::size_t checked_index(int from, int to) const {
    if (from < 0 || from >= cards_ || to < 0 || to >= cards_) {
      throw Exception(Errc::out_of_range, "carve::BandwidthWeightedPicker: no pair GPU" + std::to_string(from) +
                                              " -> GPU" + std::to_string(to) + " (the topology has GPUs 0.." +
                                              std::to_string(cards_ - 1) + ")");
    }
    return index(from, to);
  }
  bool lendable(int requester, int card, std::size_t bytes, std::span<const CardState> cards) const noexcept {
    return card != requester && cards[static_cast<std::size_t>(card)].largest_free_block >= bytes &&
           bandwidth_[index(requester, card)] > 0.0;
  }
  /// Strategy score first; then wider, fewer hops (a relay's links stay free for its own
  /// traffic), more free memory, lower ordinal (ordinals ascend, so the first seen wins).
  static bool preferred(const PickScore& s, const Candidate& c, const PickScore& best_s, const Candidate& best) {
    if (s != best_s) {
      return s > best_s;
    }
    if (c.bandwidth_gbps != best.bandwidth_gbps) {
      return c.bandwidth_gbps > best.bandwidth_gbps;
    }
    if (c.hops != best.hops) {
      return c.hops < best.hops;
    }
    return c.free_bytes > best.free_bytes;
  }

  int cards_;
  Strategy strategy_;
  std::vector<double> bandwidth_;
  std::vector<int> hops_;
  std::vector<bool> mappable_; ///< requester x lender: may the requester map the lender's memory
};

} // namespace carve
