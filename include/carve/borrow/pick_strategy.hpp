/// @file carve/borrow/pick_strategy.hpp
/// How a lending card is chosen: the policy concept.
///
/// When the requesting card has no room, BandwidthWeightedPicker builds a Candidate for every
/// other card that could hold the request and is reachable, and asks the strategy two things:
///
/// @code
/// struct MyStrategy {
///   bool eligible(const carve::Candidate& c) const;     // may this card lend at all?
///   carve::PickScore score(const carve::Candidate& c) const; // higher wins
/// };
/// @endcode
///
/// Scores compare lexicographically (primary, then secondary), exactly. Equal scores are broken
/// the same way for every strategy: wider path, then fewer hops, then more free memory, then the
/// lower card ordinal; so a decision never depends on iteration order. Scores meant to tie must be
/// computed to tie (two quotients equal on paper may differ in their last bit, and the larger
/// wins). Semantic requirements: both functions are pure (same candidate, same answer)
/// and cheap, since a pick is meant to take well under a microsecond.
#pragma once

#include <compare>
#include <concepts>
#include <cstddef>

namespace carve {

/// A card that could lend: what a strategy sees of it.
struct Candidate {
  int card = -1;                      ///< GPU ordinal
  double bandwidth_gbps = 0.0;        ///< best path from the requester to this card
  int hops = 0;                       ///< links on that path
  std::size_t free_bytes = 0;         ///< what the card could still hand out in total
  std::size_t largest_free_block = 0; ///< the largest single allocation it could make now
  // The same figures relative to the other candidates, for scores that mix units:
  double free_share = 0.0;      ///< free_bytes / the largest free_bytes among candidates, in (0, 1]
  double bandwidth_share = 0.0; ///< bandwidth / the widest candidate's, in (0, 1]
  double borrow_share = 0.0;    ///< this requester's recent borrows from this card / all its borrows
};

/// A strategy's score for a candidate; higher wins, compared lexicographically.
struct PickScore {
  double primary = 0.0;   ///< compared first
  double secondary = 0.0; ///< breaks ties of primary
  /// Equal when both parts are.
  // Written out rather than defaulted: nvcc's host pass rejects the implicit operator==.
  friend constexpr bool operator==(const PickScore& a, const PickScore& b) noexcept {
    return a.primary == b.primary && a.secondary == b.secondary;
  }
  /// Primary, then secondary.
  friend constexpr std::partial_ordering operator<=>(const PickScore& a, const PickScore& b) noexcept {
    if (const auto c = a.primary <=> b.primary; c != 0) {
      return c;
    }
    return a.secondary <=> b.secondary;
  }
};

/// A lender-choosing policy: copyable, with `eligible(candidate)` and `score(candidate)` as above.
template <class S>
concept PickStrategy = std::copyable<S> && requires(const S& s, const Candidate& c) {
  { s.eligible(c) } -> std::same_as<bool>;
  { s.score(c) } -> std::same_as<PickScore>;
};

/// The strategy's display name, or "custom".
template <class S>
constexpr const char* strategy_name() noexcept {
  if constexpr (requires { S::name; }) {
    return S::name;
  } else {
    return "custom";
  }
}

} // namespace carve
