/// @file carve/queue/tier_thresholds.hpp
/// Size thresholds, and which tier a size belongs to.
///
/// Thresholds t1 < t2 < ... < tk cut sizes into k + 1 tiers. Each threshold is an inclusive upper
/// bound, the largest size of its tier: a size s goes to tier_of(s) = the number of thresholds
/// strictly below s. Tier 0 holds sizes 0..t1 (t1 included), tier i holds t_i + 1 .. t_(i+1), the
/// last tier everything above tk. With thresholds of 128 and 512 vectors, tier 0
/// holds requests of at most 128 vectors (exactly 128 included), tier 1 those of 129..512, tier 2
/// everything from 513 up:
///
/// @code
/// const carve::TierThresholds t{128, 512};   // throws carve::Exception for a bad list
/// t.tier_of(0) == 0, t.tier_of(128) == 0, t.tier_of(129) == 1, t.tier_of(512) == 1, t.tier_of(513) == 2
/// @endcode
///
/// Works on host and device.
#pragma once

#include <carve/core/config.hpp>
#include <carve/core/error.hpp>

#include <cuda/std/concepts>
#include <cuda/std/cstddef>
#include <cuda/std/cstdint>
#include <cuda/std/expected>
#include <cuda/std/span>
#include <nv/target>

#include <initializer_list>

#include <string>

namespace carve {

/// Tiers a SizeTieredQueue can have (thresholds + 1). Sixteen is far more than size classes need
/// and keeps a queue's per-tier state in fixed arrays, so it can live in device memory.
inline constexpr std::uint32_t max_tiers = 16;

/// What sorts requests into tiers: a copyable callable giving a request's size (bytes, rows, any
/// unit the thresholds use).
template <class F, class T>
concept SizeFunction = cuda::std::copy_constructible<F> && requires(const F& size, const T& request) {
  { size(request) } -> cuda::std::convertible_to<std::uint64_t>;
};

/// Inclusive upper bounds that cut sizes into tiers (see the file's description). A value; its
/// calls are const.
class TierThresholds {
public:
  /// Throws carve::Exception (invalid_thresholds) for an empty list, a list that is not strictly
  /// increasing (unsorted or repeated values) or more than max_tiers - 1 thresholds, saying which.
  /// Device code cannot throw: there the same list gives thresholds whose status() is
  /// invalid_thresholds, and a queue built from them refuses every call with it.
  CARVE_HOST_DEVICE constexpr explicit TierThresholds(cuda::std::span<const std::uint64_t> thresholds) {
    bool valid = !thresholds.empty() && thresholds.size() <= max_tiers - 1;
    for (cuda::std::size_t i = 1; valid && i < thresholds.size(); ++i) {
      valid = thresholds[i] > thresholds[i - 1];
    }
    if (!valid) {
      NV_IF_TARGET(NV_IS_HOST, (throw Exception(Errc::invalid_thresholds, describe_threshold_error(thresholds));))
      return;
    }
    for (cuda::std::size_t i = 0; i < thresholds.size(); ++i) {
      bounds_[i] = thresholds[i];
    }
    count_ = static_cast<std::uint32_t>(thresholds.size());
  }
  /// `TierThresholds{128, 512}`; throws as the span constructor does.
  CARVE_HOST_DEVICE constexpr TierThresholds(std::initializer_list<std::uint64_t> thresholds)
      : TierThresholds(cuda::std::span<const std::uint64_t>(thresholds.begin(), thresholds.size())) {}

  /// invalid_thresholds for thresholds built from a bad list in device code; success otherwise.
  [[nodiscard]] CARVE_HOST_DEVICE constexpr cuda::std::expected<void, Errc> status() const noexcept {
    if (count_ == 0) {
      return cuda::std::unexpected(Errc::invalid_thresholds);
    }
    return {};
  }

  /// What is wrong with a threshold list, in words; empty when the constructor accepts it. Host.
  static std::string describe_threshold_error(cuda::std::span<const std::uint64_t> thresholds) {
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

  /// The tier of `size`: the number of thresholds below it. Branch-free, a handful of compares.
  CARVE_HOST_DEVICE constexpr std::uint32_t tier_of(std::uint64_t size) const noexcept {
    std::uint32_t tier = 0;
    for (std::uint32_t i = 0; i < count_; ++i) {
      tier += size > bounds_[i] ? 1U : 0U;
    }
    return tier;
  }

  /// Thresholds + 1.
  CARVE_HOST_DEVICE constexpr std::uint32_t tier_count() const noexcept { return count_ + 1; }
  /// The thresholds, increasing (empty when built from a bad list in device code).
  CARVE_HOST_DEVICE constexpr cuda::std::span<const std::uint64_t> thresholds() const noexcept {
    return {bounds_, count_};
  }
  /// The smallest size of `tier`.
  CARVE_HOST_DEVICE constexpr std::uint64_t smallest(std::uint32_t tier) const noexcept {
    return tier == 0 ? 0 : bounds_[tier - 1] + 1;
  }
  /// The largest size of `tier` (the last tier is open above: UINT64_MAX).
  CARVE_HOST_DEVICE constexpr std::uint64_t largest(std::uint32_t tier) const noexcept {
    return tier < count_ ? bounds_[tier] : ~std::uint64_t{0};
  }

private:
  std::uint64_t bounds_[max_tiers - 1]{};
  std::uint32_t count_ = 0; // 0: built from a bad list in device code
};

} // namespace carve
