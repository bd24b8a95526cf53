/// @file carve/queue/deficit_round_robin.hpp
/// DeficitRoundRobin: tiers share the drain by size
/// (bytes, or whatever unit the queue's size function returns), not by request count.
///
/// @code
/// carve::DeficitRoundRobin drr({64 << 10, 64 << 10, 64 << 10});   // equal bytes per round
/// @endcode
///
/// Each visit adds the tier's quantum to its deficit; the tier is served while its deficit is
/// positive, and every request served is charged its size afterwards (so a deficit can go
/// negative and the overdraft is carried into the next round). A tier found empty drops its
/// credit, as in Shreedhar and Varghese's DRR. Over time every busy tier gets bytes in
/// proportion to its quantum, whatever the mix of sizes; a quantum at least as large as the
/// largest request keeps each visit to one round. One quantum per tier, each at least 1 and at
/// most max_quantum (Errc::invalid_argument otherwise).
///
/// Turn-taking with a latency target for small requests (DeficitRoundRobin::small_first):
///
/// @code
/// const double work[] = {36, 88, 35};   // per tier: arrival share x mean size (vectors)
/// auto drr = carve::DeficitRoundRobin::small_first(work, 100);   // quanta 411, 251, 100
/// @endcode
///
/// gives every tier a quantum in proportion to the work it brings, the smallest of tiers 1..
/// `floor` units, and tier 0 `headroom` (default 4) times its proportion: a quantum its requests
/// do not use up while they arrive at their usual rate, so each of its turns serves it until it
/// is empty. Each tier still takes its turn (under a flood of small requests the others keep
/// their shares, which strict priority does not give them), and a small request waits at most
/// for one turn of each other tier, about its quantum each: small quanta keep that short, at the
/// price of more turns (a request larger than its tier's quantum is paid for over several).
#pragma once

#include <carve/core/config.hpp>
#include <carve/queue/drain_policy.hpp>
#include <carve/queue/force_inline.hpp>
#include <carve/queue/tier_thresholds.hpp>

#include <cuda/atomic>
#include <cuda/std/cstddef>
#include <cuda/std/cstdint>
#include <cuda/std/expected>
#include <cuda/std/optional>
#include <cuda/std/span>

namespace carve {

/// A DrainPolicy sharing the drain by size: each tier's quantum per visit (see the file's
/// description). Safe to share between consumers: shares hold on average.
class DeficitRoundRobin {
public:
  static constexpr const char* name = "deficit round-robin"; ///< for reports

  /// One quantum per tier (at most max_tiers are kept); prepare() checks them.
  CARVE_HOST_DEVICE constexpr explicit DeficitRoundRobin(cuda::std::span<const std::uint64_t> quanta) noexcept
      : quanta_(quanta) {}
  /// `DeficitRoundRobin({q0, q1, q2})`.
  template <cuda::std::size_t K>
  CARVE_HOST_DEVICE constexpr explicit DeficitRoundRobin(const std::uint64_t (&quanta)[K]) noexcept
      : DeficitRoundRobin(cuda::std::span<const std::uint64_t>(quanta, K)) {}

  /// Quanta in proportion to `work` (per tier, positive), the smallest of tiers 1.. `floor`,
  /// and tier 0's `headroom` times its proportion (rounded; capped at max_quantum). Bad input
  /// (fewer than two tiers, work that is not positive, a floor or headroom of 0) gives quanta
  /// that prepare() refuses.
  CARVE_HOST_DEVICE static constexpr DeficitRoundRobin
  small_first(cuda::std::span<const double> work, std::uint64_t floor, std::uint64_t headroom = 4) noexcept {
    DeficitRoundRobin drr(cuda::std::span<const std::uint64_t>{});
    drr.quanta_.count = static_cast<std::uint32_t>(work.size());
    double least = 0;
    for (std::uint32_t t = 1; t < drr.quanta_.count && t < max_tiers; ++t) {
      least = (t == 1 || work[t] < least) ? work[t] : least;
    }
    for (std::uint32_t t = 0; t < drr.quanta_.count && t < max_tiers; ++t) {
      if (work[t] > 0 && least > 0) { // else 0: refused by prepare()
        const double q = static_cast<double>(floor) * static_cast<double>(t == 0 ? headroom : 1) * work[t] / least;
        drr.quanta_.values[t] =
            q < static_cast<double>(max_quantum) ? static_cast<std::uint64_t>(q + 0.5) : max_quantum;
      }
    }
    return drr;
  }
  /// small_first() over an array: `small_first(work, 100)`.
  template <cuda::std::size_t K>
  CARVE_HOST_DEVICE static constexpr DeficitRoundRobin small_first(const double (&work)[K], std::uint64_t floor,
                                                                   std::uint64_t headroom = 4) noexcept {
    return small_first(cuda::std::span<const double>(work, K), floor, headroom);
  }

  /// Errc::invalid_argument unless there is one quantum per tier, each in [1, max_quantum];
  /// starts tier 0's first visit.
  template <class Clock>
  [[nodiscard]] CARVE_HOST_DEVICE constexpr cuda::std::expected<void, Errc> prepare(std::uint32_t tiers) noexcept {
    if (!quanta_.fit(tiers, 1, max_quantum)) {
      return cuda::std::unexpected(Errc::invalid_argument);
    }
    for (std::uint32_t t = 0; t < tiers; ++t) {
      deficit_[t] = 0;
    }
    cursor_ = 0;
    deficit_[0] = static_cast<std::int64_t>(quanta_[0]); // the first visit has begun
    return {};
  }

  /// The current tier while it has credit and is not found empty, else the next tier this pop
  /// has not found empty, credited its quantum; nullopt when all are empty.
  template <class View>
  CARVE_HOST_DEVICE CARVE_QUEUE_INLINE cuda::std::optional<std::uint32_t> pick(const View& view) noexcept {
    // Each step either finds a tier with credit or moves the cursor one tier on (adding that
    // tier's quantum). Overdrafts larger than a quantum take extra rounds; the bound keeps a
    // pathological configuration from spinning, falling back to plain round-robin.
    const std::uint32_t n = view.tier_count();
    for (std::uint32_t step = 0; step < 64 * n; ++step) {
      std::uint32_t current = cursor<View>().load(cuda::std::memory_order_relaxed);
      if (!view.known_empty(current) && deficit<View>(current).load(cuda::std::memory_order_relaxed) > 0) {
        return detail::as_pick(current);
      }
      if (view.known_empty(current)) {
        deficit<View>(current).store(0, cuda::std::memory_order_relaxed);
      }
      const std::uint32_t next = detail::first_untried(view, current + 1);
      if (next == detail::no_tier) {
        return cuda::std::nullopt;
      }
      cursor<View>().store(next, cuda::std::memory_order_relaxed);
      credit<View>(next, static_cast<std::int64_t>(quanta_[next]));
    }
    return detail::next_untried(view, cursor<View>().load(cuda::std::memory_order_relaxed));
  }

  /// Charges `tier` the request's size (at most max_quantum).
  template <class View>
  CARVE_HOST_DEVICE CARVE_QUEUE_INLINE void served(const View&, std::uint32_t tier, std::uint64_t size) noexcept {
    const std::uint64_t charge = size < max_quantum ? size : max_quantum;
    credit<View>(tier, -static_cast<std::int64_t>(charge));
  }

  /// The quanta as given (or as small_first() computed them).
  CARVE_HOST_DEVICE constexpr cuda::std::span<const std::uint64_t> quanta() const noexcept { return quanta_.given(); }

  /// The largest quantum (2^48), and the most a request is charged: more would risk overflowing
  /// the signed deficits.
  static constexpr std::uint64_t max_quantum = std::uint64_t{1} << 48;

private:
  template <class View>
  CARVE_HOST_DEVICE cuda::atomic_ref<std::uint32_t, View::scope> cursor() noexcept {
    return cuda::atomic_ref<std::uint32_t, View::scope>(cursor_);
  }
  template <class View>
  CARVE_HOST_DEVICE cuda::atomic_ref<std::int64_t, View::scope> deficit(std::uint32_t tier) noexcept {
    return cuda::atomic_ref<std::int64_t, View::scope>(deficit_[tier]);
  }
  // Adds to a deficit with a load and a store, not a read-modify-write: consumers that change
  // the same deficit at the same moment may lose one change, which shifts a share by a request
  // (the concept asks shares to hold on average), where a locked instruction would cost every
  // pop. Clamped, so that lost updates cannot carry a deficit towards overflow.
  template <class View>
  CARVE_HOST_DEVICE void credit(std::uint32_t tier, std::int64_t amount) noexcept {
    constexpr auto limit = static_cast<std::int64_t>(max_quantum);
    std::int64_t d = deficit<View>(tier).load(cuda::std::memory_order_relaxed) + amount;
    d = d > limit ? limit : (d < -limit ? -limit : d);
    deficit<View>(tier).store(d, cuda::std::memory_order_relaxed);
  }

  detail::TierValues<std::uint64_t> quanta_;
  alignas(8) std::int64_t deficit_[max_tiers]{};
  alignas(4) std::uint32_t cursor_ = 0;
};

static_assert(DrainPolicy<DeficitRoundRobin>);

} // namespace carve
