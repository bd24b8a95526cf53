// carve/queue/tier_thresholds.hpp — size thresholds, and which tier a size belongs to.
//
// Thresholds t1 < t2 < ... < tk cut sizes into k + 1 tiers. Each threshold is an inclusive upper
// bound, the largest size of its tier: a size s goes to tier_of(s) = the number of thresholds
// strictly below s. Tier 0 holds sizes 0..t1 (t1 included), tier i holds t_i + 1 .. t_(i+1), the
// last tier everything above tk. As in the scheme this follows, with 128 and 512 vectors tier 0
// holds requests of at most 128 vectors (exactly 128 included), tier 1 those of 129..512, tier 2
// everything from 513 up:
//
//   auto t = carve::TierThresholds::create({128, 512});   // cuda::std::expected<TierThresholds, Errc>
//   t->tier_of(0) == 0, t->tier_of(128) == 0, t->tier_of(129) == 1, t->tier_of(512) == 1, t->tier_of(513) == 2
//
// create() refuses (Errc::invalid_thresholds) an empty list, a list that is not strictly
// increasing (unsorted or repeated values) and more than max_tiers - 1 thresholds; a
// TierThresholds object is therefore always valid. Works on host and device.
#pragma once

#include <carve/core/config.hpp>
#include <carve/core/errc.hpp>

#include <cuda/std/cstddef>
#include <cuda/std/cstdint>
#include <cuda/std/expected>
#include <cuda/std/span>

#include <string>

namespace carve {

// Tiers a SizeTieredQueue can have (thresholds + 1). Sixteen is far more than size classes need
// and keeps a queue's per-tier state in fixed arrays, so it can live in device memory.
inline constexpr std::uint32_t max_tiers = 16;

class TierThresholds {
public:
  CARVE_HOST_DEVICE static constexpr cuda::std::expected<TierThresholds, Errc>
  create(cuda::std::span<const std::uint64_t> thresholds) noexcept {
    if (thresholds.empty() || thresholds.size() > max_tiers - 1) {
      return cuda::std::unexpected(Errc::invalid_thresholds);
    }
    TierThresholds t;
    for (cuda::std::size_t i = 0; i < thresholds.size(); ++i) {
      if (i != 0 && thresholds[i] <= thresholds[i - 1]) {
        return cuda::std::unexpected(Errc::invalid_thresholds);
      }
      t.bounds_[i] = thresholds[i];
    }
    t.count_ = static_cast<std::uint32_t>(thresholds.size());
    return t;
  }

  // create({128, 512}): the list's length is deduced.
  template <cuda::std::size_t K>
  CARVE_HOST_DEVICE static constexpr cuda::std::expected<TierThresholds, Errc>
  create(const std::uint64_t (&thresholds)[K]) noexcept {
    return create(cuda::std::span<const std::uint64_t>(thresholds, K));
  }

  // The number of thresholds below `size`: branch-free, a handful of compares.
  CARVE_HOST_DEVICE constexpr std::uint32_t tier_of(std::uint64_t size) const noexcept {
    std::uint32_t tier = 0;
    for (std::uint32_t i = 0; i < count_; ++i) {
      tier += size > bounds_[i] ? 1U : 0U;
    }
    return tier;
  }

  CARVE_HOST_DEVICE constexpr std::uint32_t tier_count() const noexcept { return count_ + 1; }
  CARVE_HOST_DEVICE constexpr cuda::std::span<const std::uint64_t> thresholds() const noexcept {
    return {bounds_, count_};
  }
  // Smallest and largest size of a tier (the last tier is open above: UINT64_MAX).
  CARVE_HOST_DEVICE constexpr std::uint64_t smallest(std::uint32_t tier) const noexcept {
    return tier == 0 ? 0 : bounds_[tier - 1] + 1;
  }
  CARVE_HOST_DEVICE constexpr std::uint64_t largest(std::uint32_t tier) const noexcept {
    return tier < count_ ? bounds_[tier] : ~std::uint64_t{0};
  }

private:
  constexpr TierThresholds() noexcept = default;

  std::uint64_t bounds_[max_tiers - 1]{};
  std::uint32_t count_ = 0;
};

// Host: what is wrong with a threshold list, in words, for exceptions and command-line tools;
// empty when create() would accept it.
inline std::string describe_threshold_error(cuda::std::span<const std::uint64_t> thresholds) {
  if (thresholds.empty()) {
    return "no thresholds given: at least one is needed for two tiers";
  }
  if (thresholds.size() > max_tiers - 1) {
    return std::to_string(thresholds.size()) + " thresholds given: at most " + std::to_string(max_tiers - 1) +
           " (max_tiers - 1) are supported";
  }
  for (cuda::std::size_t i = 1; i < thresholds.size(); ++i) {
    if (thresholds[i] <= thresholds[i - 1]) {
      return "thresholds must be strictly increasing: threshold " + std::to_string(i) + " (" +
             std::to_string(thresholds[i]) + ") " + (thresholds[i] == thresholds[i - 1] ? "repeats" : "is below") +
             " threshold " + std::to_string(i - 1) + " (" + std::to_string(thresholds[i - 1]) + ")";
    }
  }
  return {};
}

} // namespace carve
