// A brute-force model of ReleaseAlignedFit: every start, checked slot by slot, scored as the
// header describes. Written for obviousness, not speed.
#pragma once

#include "reference.hpp"

#include <cstdint>
#include <optional>
#include <vector>

namespace carve::test {

// What the policy knows about each slot: when it is expected back, if known.
using ReleaseTicks = std::vector<std::optional<std::uint32_t>>;

inline std::optional<std::uint32_t> ref_release_aligned(const Slots& s, const ReleaseTicks& ticks, std::uint32_t m,
                                                        std::uint32_t hint) {
  const auto n = static_cast<std::uint32_t>(s.size());
  constexpr std::uint64_t far = std::uint64_t{1} << 31;
  // (damage, slack) against the slot at index `nb`, or against an end of the space.
  const auto score = [&](std::int64_t nb, std::uint64_t& damage, std::uint64_t& slack) {
    if (nb < 0 || nb >= n || !ticks[static_cast<std::size_t>(nb)]) {
      slack += far;
      return;
    }
    const std::int64_t d = static_cast<std::int32_t>(hint - *ticks[static_cast<std::size_t>(nb)]);
    if (d > 0) {
      damage += static_cast<std::uint64_t>(d);
    } else {
      slack += static_cast<std::uint64_t>(-d);
    }
  };
  std::optional<std::uint32_t> best;
  std::uint64_t best_damage = 0;
  std::uint64_t best_slack = 0;
  for (const std::uint32_t start : ref_run_starts(s, m)) {
    const bool below_taken = start == 0 || !s[start - 1];
    const bool above_taken = start + m == n || !s[start + m];
    if (!below_taken && !above_taken) {
      continue; // inside a run: would split it
    }
    std::uint64_t damage = 0;
    std::uint64_t slack = 0;
    if (below_taken) {
      score(std::int64_t{start} - 1, damage, slack);
    }
    if (above_taken) {
      score(std::int64_t{start} + m, damage, slack);
    }
    if (!best || damage < best_damage || (damage == best_damage && slack < best_slack)) {
      best = start;
      best_damage = damage;
      best_slack = slack;
    }
  }
  return best;
}

} // namespace carve::test
