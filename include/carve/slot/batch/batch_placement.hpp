/// @file carve/slot/batch/batch_placement.hpp
/// Placing a batch of workgroups on K compute units at once.
///
/// Requests are taken in order, each seeing the bitmaps as the requests before it left them:
/// every unit's fit policy proposes a start, the CU-choice rule picks a unit, and that unit's
/// bitmap is updated. This header holds the per-request steps and a plain loop over them (the
/// reference, usable on the host or by one device thread); carve/slot/batch/batch_kernels.cuh runs the
/// same steps with one thread per unit.
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

/// A request's outcome: where it went, or invalid_size (m == 0 or m > N) / no_space (no unit fits).
using BatchPlacement = cuda::std::expected<CuPlacement, Errc>;

/// What unit `cu` would do with a request for m slots.
template <std::uint32_t N, class Fit>
requires FitPolicyFor<Fit, N> CARVE_HOST_DEVICE constexpr CuCandidate
evaluate_cu(const Fit& fit, const SlotBitmap<N>& bitmap, std::uint32_t cu, std::uint32_t m) noexcept {
  const cuda::std::optional<std::uint32_t> start = fit.find(bitmap, m);
  const std::uint32_t s = start ? *start : 0;
  const std::uint32_t from_top = N - s - m;
  return {cu, start.has_value(), s, bitmap.free_count(), s < from_top ? s : from_top};
}

/// The outcome for the winning candidate (already chosen by a CuChoiceRule).
CARVE_HOST_DEVICE constexpr BatchPlacement placement_of(const CuCandidate& best, std::uint32_t m) noexcept {
  if (!best.fits) {
    return cuda::std::unexpected(Errc::no_space);
  }
  return CuPlacement{best.cu, {best.start, m}};
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
      out[r] = cuda::std::unexpected(m == 0 || m > N ? Errc::invalid_size : Errc::no_space);
      continue;
    }
    CuCandidate best = evaluate_cu(fit, bitmaps[0], 0, m);
    for (std::uint32_t cu = 1; cu < bitmaps.size(); ++cu) {
      const CuCandidate c = evaluate_cu(fit, bitmaps[cu], cu, m);
      best = rule.better(c, best) ? c : best;
    }
    out[r] = placement_of(best, m);
    if (out[r]) {
      bitmaps[out[r]->cu].occupy(out[r]->range);
    }
  }
}

} // namespace carve
