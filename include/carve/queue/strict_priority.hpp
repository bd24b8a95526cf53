/// @file carve/queue/strict_priority.hpp
/// StrictPriority: the lowest non-empty tier first, with an
/// optional age bound past which a request is served whatever its tier.
///
/// @code
/// carve::StrictPriority{}                                 // pure priority: can starve large requests
/// carve::StrictPriority::with_aging(2'000'000)            // nothing waits (much) past 2 ms
/// @endcode
///
/// Without aging, a steady stream of small requests keeps tier 0 busy and the other tiers are
/// never served. With aging, every pop first looks at the head of each tier (the oldest request
/// there): if any has waited longer than the bound, the one that has waited longest is served.
/// So a request waits at most about the bound plus the time to serve the requests that became
/// overdue before it. Needs a PeekableLane (the default MpmcRing is one).
#pragma once

#include <carve/core/config.hpp>
#include <carve/queue/drain_policy.hpp>
#include <carve/queue/force_inline.hpp>

#include <cuda/std/cstdint>
#include <cuda/std/expected>
#include <cuda/std/optional>

namespace carve {

/// A DrainPolicy serving the lowest non-empty tier, optionally with an age bound (see the file's
/// description). Its calls write nothing: safe to share between consumers.
class StrictPriority {
public:
  static constexpr const char* name = "strict priority"; ///< for reports
  static constexpr bool needs_head_stamps = true;        ///< reads each tier's oldest stamp

  /// Pure priority, no aging: a steady stream of small requests starves the other tiers.
  constexpr StrictPriority() noexcept = default;

  /// Serves, whatever its tier, the request that has waited longest once it has waited more than
  /// `bound_ns` nanoseconds. Every push is then stamped (a clock read each).
  CARVE_HOST_DEVICE static constexpr StrictPriority with_aging(std::uint64_t bound_ns) noexcept {
    StrictPriority p;
    p.aging_ = true;
    p.bound_ns_ = bound_ns;
    return p;
  }

  /// Converts the bound to the clock's ticks; accepts any tier count.
  template <class Clock>
  [[nodiscard]] CARVE_HOST_DEVICE cuda::std::expected<void, Errc> prepare(std::uint32_t) noexcept {
    bound_ticks_ = aging_ ? Clock::ticks_from_ns(bound_ns_) : 0;
    return {};
  }

  /// Only with aging does the order depend on stamps.
  CARVE_HOST_DEVICE constexpr bool reads_stamps() const noexcept { return aging_; }

  /// The lowest tier this pop has not found empty, unless aging finds an overdue head elsewhere.
  template <class View>
  CARVE_HOST_DEVICE CARVE_QUEUE_INLINE cuda::std::optional<std::uint32_t> pick(const View& view) const noexcept {
    const std::uint32_t first = detail::first_untried(view, 0);
    if (!aging_ || first == detail::no_tier) {
      return detail::as_pick(first);
    }
    // The request that has waited longest, if it has waited past the bound, else the first
    // tier. When the oldest head is the first tier's, both answers agree: no clock read.
    std::uint32_t oldest_tier = first;
    bool seen = false;
    std::uint64_t oldest = 0;
    for (std::uint32_t t = first; t < view.tier_count(); ++t) {
      if (view.known_empty(t)) {
        continue;
      }
      std::uint64_t stamp = 0;
      if (detail::head_stamp_into(view, t, stamp) && (!seen || stamp < oldest)) {
        oldest_tier = t;
        oldest = stamp;
        seen = true;
      }
    }
    if (oldest_tier == first) {
      return detail::as_pick(first);
    }
    const std::uint64_t now = view.now();
    return detail::as_pick(now > oldest && now - oldest > bound_ticks_ ? oldest_tier : first);
  }

  /// Nothing to record.
  template <class View>
  CARVE_HOST_DEVICE void served(const View&, std::uint32_t, std::uint64_t) const noexcept {}

  /// Whether it was built with with_aging().
  CARVE_HOST_DEVICE constexpr bool aging() const noexcept { return aging_; }
  /// The age bound in nanoseconds (0 without aging).
  CARVE_HOST_DEVICE constexpr std::uint64_t aging_bound_ns() const noexcept { return bound_ns_; }

private:
  bool aging_ = false;
  std::uint64_t bound_ns_ = 0;
  std::uint64_t bound_ticks_ = 0;
};

static_assert(DrainPolicy<StrictPriority>);

} // namespace carve
