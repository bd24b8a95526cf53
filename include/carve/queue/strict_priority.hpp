/// @file carve/queue/strict_priority.hpp
/// StrictPriority: the lowest non-empty tier first, with an
/// optional age bound past which a tier is served whatever its rank.
///
/// @code
/// carve::StrictPriority{}                                 // pure priority: can starve large requests
/// carve::StrictPriority::with_aging(2'000'000)            // nothing waits (much) past 2 ms
/// @endcode
///
/// Without aging, a steady stream of small requests keeps tier 0 busy and the other tiers are
/// never served. With aging, the bound applies to how long a non-empty tier has been passed over,
/// so that no push reads the clock (a time-stamp counter read costs as much as a ring's push and
/// pop together; benchmarks/queue.md):
///   - a pop that serves one tier while another has a visible head starts that tier's clock, if
///     it is not running, and notes how many requests the tier's lane had taken by then: those
///     were all queued before the clock started;
///   - once a tier's clock has run for half the bound, the tier is overdue and is served before
///     any tier that is not (of several, the one whose clock started first), until the requests
///     noted when its clock started have all left; then its clock stops, and the next pop that
///     passes it over starts it again.
/// So a request waits at most about the bound: at most half of it before a clock that covers it
/// starts (the running clock's overdue requests are served first) and half after, plus the time
/// to serve the overdue requests ahead of it. A pop that passes nothing over reads no clock (one
/// thread pushing and popping never does), and a pop that does reads it once in clock_every such
/// pops, sharing the reading in between: the bound is kept to within the time of that many pops
/// (microseconds, against bounds of milliseconds). With several consumers the clocks are plain
/// loads and stores: two consumers that start or stop a tier's clock at the same moment may lose
/// one of the two changes, which shifts the tier's clock by the pops in flight at that moment.
/// Needs a PeekableLane (the default MpmcRing is one) to see which tiers hold requests.
#pragma once

#include <carve/core/config.hpp>
#include <carve/queue/drain_policy.hpp>
#include <carve/queue/force_inline.hpp>
#include <carve/queue/tier_thresholds.hpp>

#include <cuda/atomic>
#include <cuda/std/cstdint>
#include <cuda/std/expected>
#include <cuda/std/optional>

namespace carve {

/// A DrainPolicy serving the lowest non-empty tier, optionally with an age bound on how long a
/// tier may be passed over (see the file's description). Safe to share between consumers.
class StrictPriority {
public:
  static constexpr const char* name = "strict priority"; ///< for reports
  static constexpr bool needs_head_stamps = true;        ///< looks for a visible head in each tier
  /// With aging: pops that pass a tier over between two clock reads (see the file's description).
  static constexpr std::uint32_t clock_every = 8;

  /// Pure priority, no aging: a steady stream of small requests starves the other tiers.
  constexpr StrictPriority() noexcept = default;

  /// Serves a tier first once it has been passed over for half of `bound_ns` nanoseconds, until
  /// the requests it held then have left: no request waits much more than `bound_ns`. Pushes are
  /// not stamped; pops that pass a tier over read the clock once in clock_every.
  CARVE_HOST_DEVICE static constexpr StrictPriority with_aging(std::uint64_t bound_ns) noexcept {
    StrictPriority p;
    p.aging_ = true;
    p.bound_ns_ = bound_ns;
    return p;
  }

  /// Converts the bound to the clock's ticks and stops every tier's clock; accepts any tier count.
  template <class Clock>
  CARVE_HOST_DEVICE cuda::std::expected<void, Errc> prepare(std::uint32_t) noexcept {
    overdue_ticks_ = aging_ ? Clock::ticks_from_ns(bound_ns_ / 2) : 0;
    for (std::uint32_t t = 0; t < max_tiers; ++t) {
      started_[t] = 0;
      noted_[t] = 0;
    }
    reading_ = 0;
    pops_since_reading_ = 0;
    return {};
  }

  /// The order never depends on requests' stamps: pushes need none.
  CARVE_HOST_DEVICE constexpr bool reads_stamps() const noexcept { return false; }

  /// The lowest tier this pop has not found empty, unless aging finds an overdue tier.
  template <class View>
  CARVE_HOST_DEVICE CARVE_QUEUE_INLINE cuda::std::optional<std::uint32_t> pick(const View& view) noexcept {
    const std::uint32_t first = detail::first_untried(view, 0);
    if (!aging_ || first == detail::no_tier) {
      return detail::as_pick(first);
    }
    return detail::as_pick(pick_aging(view, first));
  }

  /// With aging, stops `tier`'s clock once the requests it held when the clock started have left.
  template <class View>
  CARVE_HOST_DEVICE CARVE_QUEUE_INLINE void served(const View& view, std::uint32_t tier, std::uint64_t) noexcept {
    if (!aging_ || tier >= max_tiers) {
      return;
    }
    // A load first: most pops find the clock stopped and write nothing.
    if (started<View>(tier).load(cuda::std::memory_order_acquire) != 0 &&
        view.popped(tier) >= noted<View>(tier).load(cuda::std::memory_order_relaxed)) {
      started<View>(tier).store(0, cuda::std::memory_order_relaxed);
    }
  }

  /// Whether it was built with with_aging().
  CARVE_HOST_DEVICE constexpr bool aging() const noexcept { return aging_; }
  /// The age bound in nanoseconds (0 without aging).
  CARVE_HOST_DEVICE constexpr std::uint64_t aging_bound_ns() const noexcept { return bound_ns_; }

private:
  // The first tier with a visible head is served, unless a tier it would pass over is overdue
  // (of several, the one whose clock started first); every tier passed over has its clock
  // started if it was not running. One walk over the tiers, reading the clock only once a tier
  // is found passed over.
  template <class View>
  CARVE_HOST_DEVICE CARVE_QUEUE_INLINE std::uint32_t pick_aging(const View& view, std::uint32_t first) noexcept {
    const std::uint32_t n = view.tier_count() < max_tiers ? view.tier_count() : max_tiers;
    std::uint32_t serve = detail::no_tier;
    std::uint32_t chosen = detail::no_tier;
    std::uint32_t to_start = 0; // tiers passed over whose clocks are stopped
    std::uint64_t now = 0, earliest = 0;
    bool have_now = false;
    for (std::uint32_t t = first; t < n; ++t) {
      if (view.known_empty(t)) {
        continue;
      }
      std::uint64_t stamp = 0;
      if (serve == detail::no_tier) {
        if (detail::head_stamp_into(view, t, stamp)) {
          serve = t;
        }
        continue;
      }
      const std::uint64_t since = started<View>(t).load(cuda::std::memory_order_relaxed); // start + 1, or 0
      if (since == 0) {
        to_start |= detail::head_stamp_into(view, t, stamp) ? 1U << t : 0U;
        continue;
      }
      // A running clock means requests are there (it stops when they leave): no need to look.
      if (!have_now) {
        now = clock_reading(view);
        have_now = true;
      }
      if (now + 1 > since && now + 1 - since > overdue_ticks_ && (chosen == detail::no_tier || since < earliest)) {
        chosen = t;
        earliest = since;
      }
    }
    if (serve == detail::no_tier) {
      return first; // no head visible yet (a push in flight): let the pop look
    }
    if (!have_now) {
      if (to_start == 0) {
        // Nothing passed over, no clock needed; the next pop that passes a tier over reads it
        // afresh instead of trusting a reading from before this quiet spell.
        if (pops_since_reading<View>().load(cuda::std::memory_order_relaxed) != 0) {
          pops_since_reading<View>().store(0, cuda::std::memory_order_relaxed);
        }
        return serve;
      }
      now = clock_reading(view);
    }
    if (chosen == detail::no_tier) {
      chosen = serve;
    } else if (started<View>(serve).load(cuda::std::memory_order_relaxed) == 0) {
      to_start |= 1U << serve; // passed over in its turn
    }
    for (std::uint32_t t = serve; to_start != 0 && t < n; ++t) {
      if (((to_start >> t) & 1U) != 0) {
        start_clock(view, t, now);
        to_start &= ~(1U << t);
      }
    }
    return chosen;
  }

  // Starts `tier`'s clock at `now`. What its lane has taken so far arrived before now: noted
  // first, published by the start.
  template <class View>
  CARVE_HOST_DEVICE void start_clock(const View& view, std::uint32_t tier, std::uint64_t now) noexcept {
    noted<View>(tier).store(view.pushed(tier), cuda::std::memory_order_relaxed);
    started<View>(tier).store(now + 1, cuda::std::memory_order_release);
  }

  // The clock, read once in clock_every pops that pass a tier over (by any consumer: the count
  // and the reading are shared, with plain loads and stores).
  template <class View>
  CARVE_HOST_DEVICE std::uint64_t clock_reading(const View& view) noexcept {
    const std::uint32_t pops = pops_since_reading<View>().load(cuda::std::memory_order_relaxed);
    if (pops == 0 || pops >= clock_every) {
      const std::uint64_t now = view.now();
      reading<View>().store(now, cuda::std::memory_order_relaxed);
      pops_since_reading<View>().store(1, cuda::std::memory_order_relaxed);
      return now;
    }
    pops_since_reading<View>().store(pops + 1, cuda::std::memory_order_relaxed);
    return reading<View>().load(cuda::std::memory_order_relaxed);
  }

  template <class View>
  CARVE_HOST_DEVICE cuda::atomic_ref<std::uint64_t, View::scope> started(std::uint32_t tier) noexcept {
    return cuda::atomic_ref<std::uint64_t, View::scope>(started_[tier]);
  }
  template <class View>
  CARVE_HOST_DEVICE cuda::atomic_ref<std::uint64_t, View::scope> noted(std::uint32_t tier) noexcept {
    return cuda::atomic_ref<std::uint64_t, View::scope>(noted_[tier]);
  }
  template <class View>
  CARVE_HOST_DEVICE cuda::atomic_ref<std::uint64_t, View::scope> reading() noexcept {
    return cuda::atomic_ref<std::uint64_t, View::scope>(reading_);
  }
  template <class View>
  CARVE_HOST_DEVICE cuda::atomic_ref<std::uint32_t, View::scope> pops_since_reading() noexcept {
    return cuda::atomic_ref<std::uint32_t, View::scope>(pops_since_reading_);
  }

  bool aging_ = false;
  std::uint64_t bound_ns_ = 0;
  std::uint64_t overdue_ticks_ = 0; // half the bound, in the clock's ticks
  // Per tier: when its clock started, plus one (0: not running), and the lane's pushes then.
  alignas(8) std::uint64_t started_[max_tiers]{};
  alignas(8) std::uint64_t noted_[max_tiers]{};
  alignas(8) std::uint64_t reading_ = 0;            // the clock as last read
  alignas(4) std::uint32_t pops_since_reading_ = 0; // 0: read the clock at the next pop that passes a tier over
};

static_assert(DrainPolicy<StrictPriority>);

} // namespace carve
