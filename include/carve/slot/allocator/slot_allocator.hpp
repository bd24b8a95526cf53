/// @file carve/slot/allocator/slot_allocator.hpp
/// Checked allocation of contiguous slots under a fit policy.
///
/// @code
/// carve::SlotAllocator<128> slots;                 // boundary-nearest by default
/// auto r = slots.allocate(4);                      // expected<SlotRange, Errc>
/// if (r) { ...; slots.deallocate(*r); }
///
/// carve::SlotAllocator<128, carve::ReleaseAlignedFit> timed;        // a hinted policy
/// timed.allocate(4, carve::ExpectedRelease{now + expected_cycles});
/// @endcode
///
/// Every call either succeeds or returns an Errc and leaves the state exactly as it was. The
/// allocator is a value (no pointers, no heap), so it can live in shared memory, in a constexpr
/// context, or be copied as a snapshot. It is not synchronised: one thread owns it (see
/// ConcurrentSlotAllocator for shared use). Because it owns its policy object, it reports every
/// placement to a policy that remembers them (hinted_fit_policy.hpp). A carve::SlotSource.
#pragma once

#include <carve/core/compressed_pair.hpp>
#include <carve/core/config.hpp>
#include <carve/core/errc.hpp>
#include <carve/slot/allocator/slot_source.hpp>
#include <carve/slot/policy/boundary_nearest_fit.hpp>
#include <carve/slot/policy/fit_policy.hpp>
#include <carve/slot/policy/hinted_fit_policy.hpp>
#include <carve/slot/storage/slot_bitmap.hpp>
#include <carve/slot/storage/slot_range.hpp>

#include <cuda/std/cstdint>
#include <cuda/std/expected>

namespace carve {

/// N slots under policy `Fit`, as a value: checked calls, one owner, no synchronisation.
template <std::uint32_t N, class Fit = BoundaryNearestFit>
requires FitPolicyFor<sized_fit_t<Fit, N>, N>
class SlotAllocator {
public:
  /// The policy object the allocator owns (sized for N when `Fit` names a sized form).
  using policy_type = sized_fit_t<Fit, N>;

  /// All slots free, default policy object.
  constexpr SlotAllocator() noexcept = default;
  /// All slots free, with policy object `fit`.
  CARVE_HOST_DEVICE constexpr explicit SlotAllocator(policy_type fit) noexcept : state_(fit, SlotBitmap<N>{}) {}

  /// m contiguous slots placed by the policy.
  /// Errors: invalid_size for m == 0; no_space when no run of m free slots exists (m > N
  /// included: a request it could never hold is a fallback's to serve); invalid_placement when
  /// the policy breaks its contract (only possible with user policies).
  [[nodiscard]] CARVE_HOST_DEVICE constexpr cuda::std::expected<SlotRange, Errc> allocate(std::uint32_t m) noexcept {
    if (const auto ok = check_slot_request(m, N); !ok) {
      return cuda::std::unexpected(ok.error());
    }
    const auto taken = take(fit().find(slots(), m), m);
    if constexpr (TracksPlacements<policy_type>) {
      if (taken) {
        fit().placed(*taken);
      }
    }
    return taken;
  }

  /// The same with a hint for a hinted policy (see hinted_fit_policy.hpp), e.g. when the request
  /// is expected to be released. Same errors; only exists for hinted policies.
  template <class F = policy_type>
  requires cuda::std::same_as<F, policy_type> && HintedFitPolicyFor<F, N>
  [[nodiscard]] CARVE_HOST_DEVICE constexpr cuda::std::expected<SlotRange, Errc>
  allocate(std::uint32_t m, const typename F::hint_type& hint) noexcept {
    if (const auto ok = check_slot_request(m, N); !ok) {
      return cuda::std::unexpected(ok.error());
    }
    const auto taken = take(fit().find(slots(), m, hint), m);
    if (taken) {
      if constexpr (TracksHintedPlacements<policy_type>) {
        fit().placed(*taken, hint);
      } else if constexpr (TracksPlacements<policy_type>) {
        fit().placed(*taken);
      }
    }
    return taken;
  }

  /// Returns a range to the free pool. It may be any taken range: a whole allocation, or part of
  /// one (e.g. shrinking a workgroup's scratch).
  /// Errors: invalid_size for an empty range; out_of_range when it ends past N or wraps;
  /// not_allocated when any slot in it is already free (a double free).
  [[nodiscard]] CARVE_HOST_DEVICE constexpr cuda::std::expected<void, Errc> deallocate(SlotRange r) noexcept {
    if (r.count == 0) {
      return cuda::std::unexpected(Errc::invalid_size);
    }
    if (r.end() > N) {
      return cuda::std::unexpected(Errc::out_of_range);
    }
    if (slots().free_count(r) != 0) {
      return cuda::std::unexpected(Errc::not_allocated);
    }
    slots().release(r);
    return {};
  }

  /// Frees every slot (e.g. when a persistent kernel starts a new round).
  CARVE_HOST_DEVICE constexpr void reset() noexcept { slots().reset(); }

  /// The slots' state.
  CARVE_HOST_DEVICE constexpr const SlotBitmap<N>& bitmap() const noexcept { return state_.second(); }
  /// The policy object.
  CARVE_HOST_DEVICE constexpr const policy_type& policy() const noexcept { return state_.first(); }
  /// Slots in all: N.
  CARVE_HOST_DEVICE static constexpr std::uint32_t size() noexcept { return N; }
  /// Free slots.
  CARVE_HOST_DEVICE constexpr std::uint32_t free_count() const noexcept { return state_.second().free_count(); }
  /// The largest request that can succeed now.
  CARVE_HOST_DEVICE constexpr std::uint32_t largest_free_run() const noexcept {
    return state_.second().largest_free_run();
  }

private:
  /// Occupies the run the policy chose, after checking it.
  [[nodiscard]] CARVE_HOST_DEVICE constexpr cuda::std::expected<SlotRange, Errc>
  take(cuda::std::optional<std::uint32_t> start, std::uint32_t m) noexcept {
    if (!start) {
      return cuda::std::unexpected(Errc::no_space);
    }
    const SlotRange range{*start, m};
    // A policy written outside carve could return a run that is not free; taking it would hand
    // the same slot out twice, so the choice is checked before it is applied.
    if (range.end() > N || slots().free_count(range) != m) {
      return cuda::std::unexpected(Errc::invalid_placement);
    }
    slots().occupy(range);
    return range;
  }

  // The policy and the slots' state, the policy taking no bytes when it has no state.
  CARVE_HOST_DEVICE constexpr policy_type& fit() noexcept { return state_.first(); }
  CARVE_HOST_DEVICE constexpr SlotBitmap<N>& slots() noexcept { return state_.second(); }

  detail::CompressedPair<policy_type, SlotBitmap<N>> state_{};
};

static_assert(SlotSource<SlotAllocator<128>>);

} // namespace carve
