/// @file carve/slot/policy/release_aligned_fit.hpp
/// Place a workgroup beside neighbours that release after it.
///
/// Contiguous slots fragment when a run is released while the runs on both sides of it stay taken:
/// a hole opens that no larger request can use. Where that happens is decided at placement time.
/// A workgroup put next to a neighbour that is released *before* it leaves a hole behind that
/// neighbour for as long as the workgroup outlives it; put next to one released *after* it, its
/// own release merges into the free run beside it and nothing is stranded.
///
/// The hint is the tick at which the request is expected to be released (now + expected run time,
/// in any clock the caller keeps: cycles, microseconds). The policy remembers the expected release
/// of every slot it placed and scores each candidate start, i.e. either end of each free run that
/// holds m (a start inside a run would split it into two holes):
/// - damage: the ticks by which the request outlives a taken neighbour, summed over its sides;
/// - slack: the ticks by which its taken neighbours outlive it, summed over its sides.
///
/// The smallest damage wins, then the smallest slack (the tightest match in time keeps neighbours
/// that live long for requests that live long), then the lowest start. The ends of the slot space,
/// and slots placed without a hint, count as neighbours that are never released.
///
/// Ticks are compared modulo 2^32, so a counter may wrap; expected releases of live workgroups must
/// lie within 2^31 ticks of each other. Without a hint (plain find) the policy is
/// BoundaryNearestFit. Cost: one walk over the free runs, O(words + runs), like BestFit; memory:
/// N ticks and N bits beside the bitmap.
///
/// Use it as SlotAllocator<N, ReleaseAlignedFit>: the allocator sizes the per-slot memory
/// (ReleaseAlignedPlacements<N>) and reports every placement to it. Allocators shared by many
/// threads cannot report placements, so they refuse this policy at compile time.
///
/// In the workgroup scheduling simulator (examples/slot_sim) this recovers 27-41% of
/// the makespan that contiguity costs on mixed-size workloads with exact hints, against 7-23% for
/// boundary-nearest; noisy hints shrink the gain, and where rare huge requests need the middle
/// kept whole boundary-nearest does better.
#pragma once

#include <carve/core/bits.hpp>
#include <carve/core/config.hpp>
#include <carve/slot/policy/boundary_nearest_fit.hpp>
#include <carve/slot/policy/hinted_fit_policy.hpp>
#include <carve/slot/storage/slot_bitmap.hpp>
#include <carve/slot/storage/slot_range.hpp>

#include <cuda/std/cstdint>
#include <cuda/std/optional>
#include <cuda/std/type_traits>

namespace carve {

/// When a request is expected to be released, in the caller's ticks.
struct ExpectedRelease {
  std::uint32_t tick; ///< compared modulo 2^32
};

template <std::uint32_t N>
class ReleaseAlignedPlacements;

/// The policy: what users name. Its state for N slots is ReleaseAlignedPlacements<N>.
struct ReleaseAlignedFit {
  /// Shown in reports and tools.
  static constexpr const char* name = "release-aligned";
  /// The hint: when the request is expected back.
  using hint_type = ExpectedRelease;
  /// The policy with its per-slot memory for N slots.
  template <std::uint32_t N>
  using for_slots = ReleaseAlignedPlacements<N>;
};

/// The policy for N slots, with the expected release of every slot it placed.
template <std::uint32_t N>
class ReleaseAlignedPlacements {
public:
  /// Shown in reports and tools.
  static constexpr const char* name = ReleaseAlignedFit::name;
  /// The hint: when the request is expected back.
  using hint_type = ExpectedRelease;

  /// Nothing placed yet.
  constexpr ReleaseAlignedPlacements() noexcept = default;
  /// Nothing placed yet (what SlotAllocator<N, ReleaseAlignedFit> builds from its policy value).
  CARVE_HOST_DEVICE constexpr ReleaseAlignedPlacements(ReleaseAlignedFit) noexcept {}

  /// Without a hint: BoundaryNearestFit's choice.
  CARVE_HOST_DEVICE constexpr cuda::std::optional<std::uint32_t> find(const SlotBitmap<N>& bitmap,
                                                                      std::uint32_t m) const noexcept {
    return BoundaryNearestFit{}.find(bitmap, m);
  }

  /// The run end with the least damage, then the least slack, then the lowest start; nullopt
  /// when nothing fits, m == 0 or m > N.
  CARVE_HOST_DEVICE constexpr cuda::std::optional<std::uint32_t> find(const SlotBitmap<N>& bitmap, std::uint32_t m,
                                                                      ExpectedRelease hint) const noexcept {
    if (m == 0 || m > N) {
      return cuda::std::nullopt;
    }
    cuda::std::optional<std::uint32_t> best;
    Score best_score{};
    const auto consider = [&](std::uint32_t start, Score score) {
      if (!best || score < best_score) {
        best = start;
        best_score = score;
      }
    };
    for (const SlotRange run : bitmap.free_runs()) {
      if (run.count < m) {
        continue;
      }
      const auto end = static_cast<std::uint32_t>(run.end());
      // At the low end: the run's lower neighbour, plus its upper one on an exact fit.
      Score low = side(run.first, hint);
      if (run.count == m) {
        low += side_above(end, hint);
      }
      consider(run.first, low);
      if (run.count > m) {
        consider(end - m, side_above(end, hint));
      }
    }
    return best;
  }

  /// Records when the slots of `range` are expected back.
  CARVE_HOST_DEVICE constexpr void placed(SlotRange range, ExpectedRelease hint) noexcept {
    for (std::uint32_t s = range.first; s < range.end(); ++s) {
      release_[s] = hint.tick;
      set_known(s, true);
    }
  }

  /// A placement without a hint: its slots count as never released.
  CARVE_HOST_DEVICE constexpr void placed(SlotRange range) noexcept {
    for (std::uint32_t s = range.first; s < range.end(); ++s) {
      set_known(s, false);
    }
  }

private:
  /// Lexicographic (damage, slack); sums of at most two sides fit easily in 64 bits.
  struct Score {
    std::uint64_t damage = 0;
    std::uint64_t slack = 0;

    CARVE_HOST_DEVICE constexpr Score& operator+=(Score o) noexcept {
      damage += o.damage;
      slack += o.slack;
      return *this;
    }
    friend CARVE_HOST_DEVICE constexpr bool operator<(Score a, Score b) noexcept {
      return a.damage != b.damage ? a.damage < b.damage : a.slack < b.slack;
    }
  };

  /// A neighbour that is never released: no damage, and the loosest possible match.
  static constexpr Score never_released{0, std::uint64_t{1} << 31};

  /// The neighbour just below `start` (slot start - 1, or the low end of the slot space).
  CARVE_HOST_DEVICE constexpr Score side(std::uint32_t start, ExpectedRelease hint) const noexcept {
    return start == 0 ? never_released : versus(start - 1, hint);
  }
  /// The neighbour at `end` (the first slot past a run, or the high end).
  CARVE_HOST_DEVICE constexpr Score side_above(std::uint32_t end, ExpectedRelease hint) const noexcept {
    return end == N ? never_released : versus(end, hint);
  }

  CARVE_HOST_DEVICE constexpr Score versus(std::uint32_t neighbour, ExpectedRelease hint) const noexcept {
    if (!known(neighbour)) {
      return never_released;
    }
    // Signed distance modulo 2^32: positive when the request outlives the neighbour.
    const auto outlives = static_cast<std::int32_t>(hint.tick - release_[neighbour]);
    if (outlives > 0) {
      return {static_cast<std::uint64_t>(outlives), 0};
    }
    return {0, static_cast<std::uint64_t>(-static_cast<std::int64_t>(outlives))};
  }

  CARVE_HOST_DEVICE constexpr bool known(std::uint32_t s) const noexcept {
    return (known_[s / bits::word_bits] >> (s % bits::word_bits) & 1) != 0;
  }
  CARVE_HOST_DEVICE constexpr void set_known(std::uint32_t s, bool value) noexcept {
    const bits::word bit = bits::word{1} << (s % bits::word_bits);
    known_[s / bits::word_bits] = value ? known_[s / bits::word_bits] | bit : known_[s / bits::word_bits] & ~bit;
  }

  std::uint32_t release_[N]{};
  bits::word known_[bits::word_count(N)]{};
};

static_assert(cuda::std::is_same_v<sized_fit_t<ReleaseAlignedFit, 128>, ReleaseAlignedPlacements<128>>);
static_assert(HintedFitPolicyFor<ReleaseAlignedPlacements<128>, 128>);
static_assert(TracksPlacements<ReleaseAlignedPlacements<128>> && TracksHintedPlacements<ReleaseAlignedPlacements<128>>);

} // namespace carve
