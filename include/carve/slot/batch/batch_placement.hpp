/// @file carve/slot/batch/batch_placement.hpp
/// Placing a batch of workgroups on K compute units at once, and releasing a batch.
///
/// Requests are taken in order, each seeing the bitmaps as the requests before it left them:
/// every unit's fit policy proposes a start, the CU-choice rule picks a unit, and that unit's
/// bitmap is updated. This header holds the per-request steps and a plain loop over them (the
/// reference, usable on the host or by one device thread); carve/slot/batch/batch_kernels.cuh runs the
/// same steps with one thread per unit.
///
/// Releases (release_batch) are independent across units, so the kernel splits them by unit:
/// release_batch_part(…, part, parts) handles, in batch order, the releases whose unit is `part`
/// modulo `parts`. Every part together does exactly what release_batch does; the kernel runs one
/// part per thread (launch_release_batch), and the host tests run the same parts in any order.
#pragma once

#include <carve/core/config.hpp>
#include <carve/core/errc.hpp>
#include <carve/slot/batch/cu_choice.hpp>
#include <carve/slot/policy/fit_policy.hpp>
#include <carve/slot/storage/slot_bitmap.hpp>
#include <carve/slot/storage/slot_range.hpp>

#include <cuda/std/cstdint>
#include <cuda/std/expected>
#include <cuda/std/span>

namespace carve {

/// Where a request went: a unit and the slots taken on it.
struct CuPlacement {
  std::uint32_t cu; ///< the unit's index
  SlotRange range;  ///< the slots taken on that unit

  /// Equal when unit and range are.
  friend CARVE_HOST_DEVICE constexpr bool operator==(const CuPlacement& a, const CuPlacement& b) noexcept {
    return a.cu == b.cu && a.range == b.range;
  }
};

/// A request's outcome: where it went, or invalid_size (m == 0) / no_space (no unit fits, m > N
/// included) / invalid_placement (the policy picked a run that is not free on the chosen unit).
using BatchPlacement = cuda::std::expected<CuPlacement, Errc>;

/// What unit `cu` would do with a request for m slots.
template <std::uint32_t N, class Fit>
requires FitPolicyFor<Fit, N> CARVE_HOST_DEVICE constexpr CuCandidate
evaluate_cu(const Fit& fit, const SlotBitmap<N>& bitmap, std::uint32_t cu, std::uint32_t m) noexcept {
  const cuda::std::optional<std::uint32_t> start = fit.find(bitmap, m);
  const std::uint32_t s = start ? *start : 0;
  const std::uint32_t from_top = s <= N - m ? N - s - m : 0; // a start past N - m is refused at placement
  return {cu, start.has_value(), s, bitmap.free_count(), s < from_top ? s : from_top};
}

/// The outcome for the winning candidate (already chosen by a CuChoiceRule).
[[nodiscard]] CARVE_HOST_DEVICE constexpr BatchPlacement placement_of(const CuCandidate& best,
                                                                      std::uint32_t m) noexcept {
  if (!best.fits) {
    return cuda::std::unexpected(Errc::no_space);
  }
  return CuPlacement{best.cu, {best.start, m}};
}

/// placement_of(best, m), checked against the chosen unit's bitmap before it is taken: a policy
/// written outside carve could pick a run that is not free or runs past N, and taking it would hand
/// a slot out twice (invalid_placement, as SlotAllocator says).
template <std::uint32_t N>
[[nodiscard]] CARVE_HOST_DEVICE constexpr BatchPlacement checked_placement(const CuCandidate& best, std::uint32_t m,
                                                                           const SlotBitmap<N>& unit) noexcept {
  const BatchPlacement p = placement_of(best, m);
  if (p && (best.start > N - m || unit.free_count(p->range) != m)) {
    return cuda::std::unexpected(Errc::invalid_placement);
  }
  return p;
}

/// Places every request in order and records each outcome; `out` holds sizes.size() entries.
template <std::uint32_t N, class Fit, CuChoiceRule Rule>
requires FitPolicyFor<Fit, N> CARVE_HOST_DEVICE constexpr void place_batch(cuda::std::span<SlotBitmap<N>> bitmaps,
                                                                           cuda::std::span<const std::uint32_t> sizes,
                                                                           BatchPlacement* out, const Fit& fit = {},
                                                                           const Rule& rule = {}) noexcept {
  for (std::size_t r = 0; r < sizes.size(); ++r) {
    const std::uint32_t m = sizes[r];
    if (m == 0 || m > N || bitmaps.empty()) {
      out[r] = cuda::std::unexpected(m == 0 ? Errc::invalid_size : Errc::no_space);
      continue;
    }
    CuCandidate best = evaluate_cu(fit, bitmaps[0], 0, m);
    for (std::uint32_t cu = 1; cu < bitmaps.size(); ++cu) {
      const CuCandidate c = evaluate_cu(fit, bitmaps[cu], cu, m);
      best = rule.better(c, best) ? c : best;
    }
    out[r] = best.fits ? checked_placement(best, m, bitmaps[best.cu]) : placement_of(best, m);
    if (out[r]) {
      bitmaps[out[r]->cu].occupy(out[r]->range);
    }
  }
}

/// A release's outcome: done, or the error SlotAllocator::deallocate would give (invalid_size for
/// an empty range, out_of_range for one past N or for a unit past the batch's, not_allocated when
/// a slot of it is already free).
using BatchRelease = cuda::std::expected<void, Errc>;

/// Gives `p.range` back on unit `p.cu` of `bitmaps`, checked as SlotAllocator::deallocate checks
/// it; on error nothing changes.
template <std::uint32_t N>
[[nodiscard]] CARVE_HOST_DEVICE constexpr BatchRelease release_one(cuda::std::span<SlotBitmap<N>> bitmaps,
                                                                   const CuPlacement& p) noexcept {
  if (p.range.count == 0) {
    return cuda::std::unexpected(Errc::invalid_size);
  }
  if (p.cu >= bitmaps.size() || p.range.end() > N) {
    return cuda::std::unexpected(Errc::out_of_range);
  }
  SlotBitmap<N>& bitmap = bitmaps[p.cu];
  if (bitmap.free_count(p.range) != 0) {
    return cuda::std::unexpected(Errc::not_allocated);
  }
  bitmap.release(p.range);
  return {};
}

/// The releases of `placements` whose unit is `part` modulo `parts`, in order; out[r] receives
/// each one's outcome (entries of other parts are not written). Parts touch disjoint units, so
/// they may run at once: launch_release_batch runs one per thread.
template <std::uint32_t N>
CARVE_HOST_DEVICE constexpr void release_batch_part(cuda::std::span<SlotBitmap<N>> bitmaps,
                                                    cuda::std::span<const CuPlacement> placements, BatchRelease* out,
                                                    std::uint32_t part, std::uint32_t parts) noexcept {
  for (std::size_t r = 0; r < placements.size(); ++r) {
    if (placements[r].cu % parts == part) {
      out[r] = release_one(bitmaps, placements[r]);
    }
  }
}

/// Releases every placement in order and records each outcome; `out` holds placements.size()
/// entries. A placement may be part of one that place_batch made (e.g. a finished workgroup's
/// scratch), and a release that repeats an earlier one of the batch is refused (not_allocated).
template <std::uint32_t N>
CARVE_HOST_DEVICE constexpr void release_batch(cuda::std::span<SlotBitmap<N>> bitmaps,
                                               cuda::std::span<const CuPlacement> placements,
                                               BatchRelease* out) noexcept {
  release_batch_part(bitmaps, placements, out, 0, 1);
}

} // namespace carve
