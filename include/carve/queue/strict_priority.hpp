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
/// never served. With aging, a request that has waited longer than the bound is served first (of
/// several tiers holding such requests, the one whose oldest has waited longest), so a request
/// waits at most about the bound plus the time to serve the requests that became overdue before
/// it. Ages are known without stamping any push (a time-stamp counter read costs as much as a
/// ring's push and pop together; benchmarks/queue.md): a pop that serves one tier while another
/// has a visible head passes that tier over, and then notes the time and how many requests the
/// tier's lane has taken so far, at most once in an eighth of the bound per tier (a checkpoint;
/// at most `checkpoints` live per tier). Every request counted by a checkpoint arrived before its
/// time, so once that time is more than the bound ago those requests are overdue, and they are
/// served first until they have left. A request is therefore never served out of priority before
/// it is older than the bound, and is served once its age passes the bound plus at most an eighth
/// of it (the checkpoint after its arrival may come that much later). In an overload, when every
/// tier holds overdue requests, the tier a pop would serve competes too: the oldest checkpoint
/// goes first, whatever its tier. Waits far past the bound are told apart more coarsely, since a
/// tier keeps at most `checkpoints` of them.
///
/// The clock is read only by pops that pass a tier over, once in clock_every such pops: that pop
/// looks for overdue requests and takes the checkpoints due, and the pops up to the next such
/// look serve the tier it found overdue, if any. One thread pushing and popping never reads the
/// clock, and the bound is kept to within the time of clock_every pops (microseconds, against
/// bounds of milliseconds).
/// With several consumers the checkpoints are plain loads and stores: two consumers that change
/// a tier's checkpoints at the same moment may lose one change, which moves a checkpoint by the
/// pops in flight at that moment or drops it (its requests then count as arrived at the next
/// one). Needs a PeekableLane (the default MpmcRing is one) to see which tiers hold requests.
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

/// A DrainPolicy serving the lowest non-empty tier, optionally with an age bound (see the file's
/// description). Safe to share between consumers.
class StrictPriority {
public:
  static constexpr const char* name = "strict priority"; ///< for reports
  static constexpr bool needs_head_stamps = true;        ///< looks for a visible head in each tier
  /// With aging: pops that pass a tier over between two clock reads (see the file's description).
  static constexpr std::uint32_t clock_every = 8;
  /// With aging: the most checkpoints a tier keeps (taken an eighth of the bound apart, so about
  /// nine are live while a tier is passed over; a full ring takes no more until one is dropped).
  /// An eighth rather than a quarter: the requests of one checkpoint become overdue together,
  /// and coarser checkpoints made those bursts hold up small requests (benchmarks/queue.md).
  static constexpr std::uint32_t checkpoints = 12;

  /// Pure priority, no aging: a steady stream of small requests starves the other tiers.
  constexpr StrictPriority() noexcept = default;

  /// Serves first, whatever its tier, a request that has waited more than `bound_ns`
  /// nanoseconds (known to within an eighth of the bound). Pushes are not stamped; pops that
  /// pass a tier over read the clock once in clock_every.
  CARVE_HOST_DEVICE static constexpr StrictPriority with_aging(std::uint64_t bound_ns) noexcept {
    StrictPriority p;
    p.aging_ = true;
    p.bound_ns_ = bound_ns;
    return p;
  }

  /// Converts the bound to the clock's ticks and drops every checkpoint; accepts any tier count.
  template <class Clock>
  CARVE_HOST_DEVICE cuda::std::expected<void, Errc> prepare(std::uint32_t) noexcept {
    bound_ticks_ = aging_ ? Clock::ticks_from_ns(bound_ns_) : 0;
    spacing_ticks_ = bound_ticks_ / 8;
    for (std::uint32_t t = 0; t < max_tiers; ++t) {
      tiers_[t] = TierCheckpoints{};
    }
    pops_since_scan_ = 0;
    overdue_tier_ = 0;
    return {};
  }

  /// The order never depends on requests' stamps: pushes need none.
  CARVE_HOST_DEVICE constexpr bool reads_stamps() const noexcept { return false; }

  /// The lowest tier this pop has not found empty, unless aging finds overdue requests elsewhere.
  template <class View>
  CARVE_HOST_DEVICE CARVE_QUEUE_INLINE cuda::std::optional<std::uint32_t> pick(const View& view) noexcept {
    const std::uint32_t first = detail::first_untried(view, 0);
    if (!aging_ || first == detail::no_tier) {
      return detail::as_pick(first);
    }
    return detail::as_pick(pick_aging(view, first));
  }

  /// With aging, drops `tier`'s checkpoints whose requests have all left.
  template <class View>
  CARVE_HOST_DEVICE CARVE_QUEUE_INLINE void served(const View& view, std::uint32_t tier, std::uint64_t) noexcept {
    if (!aging_ || tier >= max_tiers) {
      return;
    }
    // Loads first: most pops find no checkpoint and write nothing.
    std::uint32_t head = oldest<View>(tier).load(cuda::std::memory_order_relaxed);
    const std::uint32_t tail = next<View>(tier).load(cuda::std::memory_order_acquire);
    if (head == tail) {
      return;
    }
    const std::uint64_t left = view.popped(tier);
    const std::uint32_t was = head;
    while (head != tail && left >= pushed_by<View>(tier, head).load(cuda::std::memory_order_relaxed)) {
      ++head;
    }
    if (head != was) {
      oldest<View>(tier).store(head, cuda::std::memory_order_relaxed);
      // Its overdue requests may be gone: the next pop that passes a tier over scans again.
      if (overdue_tier<View>().load(cuda::std::memory_order_relaxed) == tier + 1) {
        overdue_tier<View>().store(0, cuda::std::memory_order_relaxed);
        pops_since_scan<View>().store(0, cuda::std::memory_order_relaxed);
      }
    }
  }

  /// Whether it was built with with_aging().
  CARVE_HOST_DEVICE constexpr bool aging() const noexcept { return aging_; }
  /// The age bound in nanoseconds (0 without aging).
  CARVE_HOST_DEVICE constexpr std::uint64_t aging_bound_ns() const noexcept { return bound_ns_; }

private:
  // A tier's checkpoints, a ring indexed by running numbers: `oldest` is the first live one,
  // `next` the one the next checkpoint takes. Each holds when it was taken and how many requests
  // the tier's lane had taken by then.
  struct TierCheckpoints {
    std::uint64_t time[checkpoints]{};
    std::uint64_t pushed[checkpoints]{};
    std::uint32_t oldest = 0;
    std::uint32_t next = 0;
  };

  // The first tier with a visible head is served, unless a tier it would pass over has overdue
  // requests. Which tier that is, and which tiers need a checkpoint, a pop that passes a tier
  // over finds out once in clock_every (scan()); the pops in between serve the tier it found.
  template <class View>
  CARVE_HOST_DEVICE CARVE_QUEUE_INLINE std::uint32_t pick_aging(const View& view, std::uint32_t first) noexcept {
    const std::uint32_t n = view.tier_count() < max_tiers ? view.tier_count() : max_tiers;
    std::uint32_t serve = detail::no_tier;
    std::uint32_t passed = 0; // tiers passed over
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
      // A live checkpoint means requests are there (it is dropped when they leave): no need to look.
      if (oldest<View>(t).load(cuda::std::memory_order_relaxed) !=
              next<View>(t).load(cuda::std::memory_order_relaxed) ||
          detail::head_stamp_into(view, t, stamp)) {
        passed |= 1U << t;
      }
    }
    if (serve == detail::no_tier) {
      return first; // no head visible yet (a push in flight): let the pop look
    }
    const std::uint32_t pops = pops_since_scan<View>().load(cuda::std::memory_order_relaxed);
    if (passed == 0) {
      // Nothing passed over, no clock needed; the next pop that passes a tier over scans
      // afresh instead of trusting a scan from before this quiet spell.
      if (pops != 0) {
        pops_since_scan<View>().store(0, cuda::std::memory_order_relaxed);
      }
      return serve;
    }
    if (pops != 0 && pops < clock_every) {
      pops_since_scan<View>().store(pops + 1, cuda::std::memory_order_relaxed);
      const std::uint32_t overdue = overdue_tier<View>().load(cuda::std::memory_order_relaxed); // tier + 1, or 0
      return overdue != 0 && ((passed >> (overdue - 1)) & 1U) != 0 ? overdue - 1 : serve;
    }
    pops_since_scan<View>().store(1, cuda::std::memory_order_relaxed);
    return scan(view, serve, passed, n);
  }

  // Reads the clock: of `serve` and the tiers passed over, the one whose oldest checkpoint is
  // earliest, if that is more than the bound ago, is served (and remembered for the pops until
  // the next scan), else `serve`; every tier passed over gets a checkpoint if it needs one.
  template <class View>
  CARVE_HOST_DEVICE std::uint32_t scan(const View& view, std::uint32_t serve, std::uint32_t passed,
                                       std::uint32_t n) noexcept {
    const std::uint64_t now = view.now();
    std::uint32_t chosen = serve;
    bool overdue_seen = false;
    std::uint64_t earliest = 0;
    // `serve` too: when every tier holds overdue requests (an overload), the oldest go first,
    // small ones included.
    for (std::uint32_t t = serve; t < n; ++t) {
      if (t != serve && ((passed >> t) & 1U) == 0) {
        continue;
      }
      const std::uint32_t head = oldest<View>(t).load(cuda::std::memory_order_relaxed);
      if (head == next<View>(t).load(cuda::std::memory_order_acquire)) {
        continue;
      }
      const std::uint64_t taken = time_of<View>(t, head).load(cuda::std::memory_order_relaxed);
      if (now > taken && now - taken > bound_ticks_ && (!overdue_seen || taken < earliest)) {
        chosen = t;
        earliest = taken;
        overdue_seen = true;
      }
    }
    const std::uint32_t overdue = chosen == serve ? 0 : chosen + 1;
    if (overdue_tier<View>().load(cuda::std::memory_order_relaxed) != overdue) {
      overdue_tier<View>().store(overdue, cuda::std::memory_order_relaxed);
    }
    if (chosen != serve) {
      passed = (passed | (1U << serve)) & ~(1U << chosen); // `serve` is passed over in its turn
    }
    for (std::uint32_t t = 0; passed != 0 && t < n; ++t) {
      if (((passed >> t) & 1U) != 0) {
        checkpoint(view, t, now);
        passed &= ~(1U << t);
      }
    }
    return chosen;
  }

  // A checkpoint of `tier` at `now`, unless its newest is less than an eighth of the bound old,
  // no request arrived since, or its ring is full (the requests since then count as arrived at
  // the next checkpoint taken).
  template <class View>
  CARVE_HOST_DEVICE void checkpoint(const View& view, std::uint32_t tier, std::uint64_t now) noexcept {
    const std::uint32_t head = oldest<View>(tier).load(cuda::std::memory_order_relaxed);
    const std::uint32_t tail = next<View>(tier).load(cuda::std::memory_order_relaxed);
    if (tail - head >= checkpoints) {
      return;
    }
    const std::uint64_t arrived = view.pushed(tier);
    if (head != tail) {
      const std::uint64_t last = time_of<View>(tier, tail - 1).load(cuda::std::memory_order_relaxed);
      if (now < last || now - last < spacing_ticks_ || // another consumer's clock may be ahead
          arrived == pushed_by<View>(tier, tail - 1).load(cuda::std::memory_order_relaxed)) {
        return;
      }
    } else if (arrived == view.popped(tier)) {
      return; // its head was taken meanwhile
    }
    // What the lane has taken so far arrived before now. Written first, published by `next`.
    time_of<View>(tier, tail).store(now, cuda::std::memory_order_relaxed);
    pushed_by<View>(tier, tail).store(arrived, cuda::std::memory_order_relaxed);
    next<View>(tier).store(tail + 1, cuda::std::memory_order_release);
  }

  template <class View>
  CARVE_HOST_DEVICE cuda::atomic_ref<std::uint32_t, View::scope> oldest(std::uint32_t tier) noexcept {
    return cuda::atomic_ref<std::uint32_t, View::scope>(tiers_[tier].oldest);
  }
  template <class View>
  CARVE_HOST_DEVICE cuda::atomic_ref<std::uint32_t, View::scope> next(std::uint32_t tier) noexcept {
    return cuda::atomic_ref<std::uint32_t, View::scope>(tiers_[tier].next);
  }
  template <class View>
  CARVE_HOST_DEVICE cuda::atomic_ref<std::uint64_t, View::scope> time_of(std::uint32_t tier, std::uint32_t i) noexcept {
    return cuda::atomic_ref<std::uint64_t, View::scope>(tiers_[tier].time[i % checkpoints]);
  }
  template <class View>
  CARVE_HOST_DEVICE cuda::atomic_ref<std::uint64_t, View::scope> pushed_by(std::uint32_t tier,
                                                                           std::uint32_t i) noexcept {
    return cuda::atomic_ref<std::uint64_t, View::scope>(tiers_[tier].pushed[i % checkpoints]);
  }
  template <class View>
  CARVE_HOST_DEVICE cuda::atomic_ref<std::uint32_t, View::scope> pops_since_scan() noexcept {
    return cuda::atomic_ref<std::uint32_t, View::scope>(pops_since_scan_);
  }
  template <class View>
  CARVE_HOST_DEVICE cuda::atomic_ref<std::uint32_t, View::scope> overdue_tier() noexcept {
    return cuda::atomic_ref<std::uint32_t, View::scope>(overdue_tier_);
  }

  bool aging_ = false;
  std::uint64_t bound_ns_ = 0;
  std::uint64_t bound_ticks_ = 0;
  std::uint64_t spacing_ticks_ = 0;              // between a tier's checkpoints: an eighth of the bound
  alignas(4) std::uint32_t pops_since_scan_ = 0; // 0: scan at the next pop that passes a tier over
  alignas(4) std::uint32_t overdue_tier_ = 0;    // the tier the last scan found overdue, plus one; or 0
  TierCheckpoints tiers_[max_tiers]{};
};

static_assert(DrainPolicy<StrictPriority>);

} // namespace carve
