/// @file carve/borrow/strategies.hpp
/// Three ways of choosing a lender: the widest path, the most free
/// memory among well-connected cards, and a weighted score of free memory, bandwidth and history.
#pragma once

#include <carve/borrow/pick_strategy.hpp>

namespace carve {

/// The card with the widest path to the requester (equally wide: fewer hops, more free memory).
struct LargestBandwidth {
  /// Its name in the text form (parse_strategy).
  static constexpr const char* name = "largest-bandwidth";
  /// Every candidate may lend.
  constexpr bool eligible(const Candidate&) const noexcept { return true; }
  /// The path's bandwidth.
  constexpr PickScore score(const Candidate& c) const noexcept { return {c.bandwidth_gbps, 0.0}; }
};

/// Among cards whose path is at least `threshold_gbps` wide, the one with the most free
/// memory. When no card with room is that well connected: with `strict`, no card is chosen (the
/// request fails); otherwise the widest path wins, as with LargestBandwidth.
struct ThresholdMostFree {
  /// Its name in the text form (parse_strategy).
  static constexpr const char* name = "threshold-most-free";
  double threshold_gbps = 48.0; ///< between PCIe (16-32 GB/s) and NVLink (50+ GB/s): NVLink-connected cards only
  bool strict = false;          ///< only cards at or above the threshold may lend

  /// Any candidate, or with `strict` only those at or above the threshold.
  constexpr bool eligible(const Candidate& c) const noexcept { return !strict || c.bandwidth_gbps >= threshold_gbps; }
  /// Fast cards first, ranked by free memory; slower ones after, ranked by bandwidth.
  constexpr PickScore score(const Candidate& c) const noexcept {
    const bool fast = c.bandwidth_gbps >= threshold_gbps;
    return {fast ? 1.0 : 0.0, fast ? static_cast<double>(c.free_bytes) : c.bandwidth_gbps};
  }
};

/// A weighted score: grows with free memory and with bandwidth (each relative to the best
/// candidate, so the weights compare like with like), and shrinks with how much of this
/// requester's recent borrowing went to the card, which spreads repeated borrowing out.
struct WeightedScore {
  /// Its name in the text form (parse_strategy).
  static constexpr const char* name = "weighted-score";
  double free_weight = 1.0;      ///< weight of Candidate::free_share
  double bandwidth_weight = 1.0; ///< weight of Candidate::bandwidth_share
  double history_weight = 0.5;   ///< weight of Candidate::borrow_share (subtracted)

  /// Every candidate may lend.
  constexpr bool eligible(const Candidate&) const noexcept { return true; }
  /// free_weight * free_share + bandwidth_weight * bandwidth_share - history_weight * borrow_share.
  constexpr PickScore score(const Candidate& c) const noexcept {
    return {free_weight * c.free_share + bandwidth_weight * c.bandwidth_share - history_weight * c.borrow_share, 0.0};
  }
};

static_assert(PickStrategy<LargestBandwidth>);
static_assert(PickStrategy<ThresholdMostFree>);
static_assert(PickStrategy<WeightedScore>);

} // namespace carve
