/// @file carve/slot/batch/cu_choice.hpp
/// Which compute unit gets a workgroup when several could take it.
///
/// A scheduler with K compute units asks each unit's fit policy where m slots would go, then a
/// CU-choice rule picks among the units that can take the request. A rule is an ordering:
///
/// @code
/// struct MyRule {
///   CARVE_HOST_DEVICE constexpr bool better(const CuCandidate& a, const CuCandidate& b) const;
/// };
/// @endcode
///
/// `better` must be a strict weak ordering in which a unit that fits beats one that does not;
/// carve's rules break every tie by the lower unit index, so the choice is the same whatever order
/// the candidates are compared in (a sequential loop, a block-wide reduction).
#pragma once

#include <carve/core/config.hpp>

#include <cuda/std/concepts>
#include <cuda/std/cstdint>

namespace carve {

/// What one compute unit's fit policy says about a request: the input to a CU-choice rule.
struct CuCandidate {
  std::uint32_t cu;       ///< the unit's index
  bool fits;              ///< the policy found room
  std::uint32_t start;    ///< where the policy would put the request (when it fits)
  std::uint32_t free;     ///< free slots on the unit before the request
  std::uint32_t distance; ///< slots between the run and the nearer end of the unit (when it fits)
};

/// A CU-choice rule: `better(a, b)`, a strict weak ordering in which a unit that fits beats one
/// that does not.
template <class R>
concept CuChoiceRule = requires(const R& rule, const CuCandidate& a, const CuCandidate& b) {
  { rule.better(a, b) } -> cuda::std::same_as<bool>;
};

namespace detail {
/// How a unit compares with another on one key: before (-1), after (1) or level (0).
CARVE_HOST_DEVICE constexpr int order_by(bool before, bool after) noexcept { return before ? -1 : after ? 1 : 0; }

/// The order carve's rules share around their own keys: a unit that fits before one that does
/// not, then `keys` (the first that is not level decides), then the lower index.
template <class Keys>
CARVE_HOST_DEVICE constexpr bool fitting_first(const CuCandidate& a, const CuCandidate& b, Keys keys) noexcept {
  if (a.fits != b.fits) {
    return a.fits;
  }
  if (const int k = keys(a, b); k != 0) {
    return k < 0;
  }
  return a.cu < b.cu;
}

/// The emptier unit first.
struct Emptier {
  CARVE_HOST_DEVICE constexpr int operator()(const CuCandidate& a, const CuCandidate& b) const noexcept {
    return order_by(a.free > b.free, a.free < b.free);
  }
};
} // namespace detail

/// The lowest-numbered unit that fits.
struct FirstFittingCu {
  /// Shown in reports and tools.
  static constexpr const char* name = "first-cu";
  /// Whether `a` goes before `b`.
  CARVE_HOST_DEVICE constexpr bool better(const CuCandidate& a, const CuCandidate& b) const noexcept {
    return detail::fitting_first(a, b, [](const CuCandidate&, const CuCandidate&) { return 0; });
  }
};

/// The unit with the most free slots (spreads load), ties to the lower index.
struct LeastLoadedCu {
  /// Shown in reports and tools.
  static constexpr const char* name = "least-loaded";
  /// Whether `a` goes before `b`.
  CARVE_HOST_DEVICE constexpr bool better(const CuCandidate& a, const CuCandidate& b) const noexcept {
    return detail::fitting_first(a, b, detail::Emptier{});
  }
};

/// The unit where the policy's run lands nearest an end of the slot space (packs tightest); ties
/// to the emptier unit, then the lower index.
struct NearestBoundaryCu {
  /// Shown in reports and tools.
  static constexpr const char* name = "nearest-boundary";
  /// Whether `a` goes before `b`.
  CARVE_HOST_DEVICE constexpr bool better(const CuCandidate& a, const CuCandidate& b) const noexcept {
    return detail::fitting_first(a, b, [](const CuCandidate& x, const CuCandidate& y) {
      // Distances mean something only for units that fit (both do, or neither: fits is level).
      const int nearer = x.fits ? detail::order_by(x.distance<y.distance, x.distance> y.distance) : 0;
      return nearer != 0 ? nearer : detail::Emptier{}(x, y);
    });
  }
};

static_assert(CuChoiceRule<FirstFittingCu> && CuChoiceRule<LeastLoadedCu> && CuChoiceRule<NearestBoundaryCu>);

} // namespace carve
