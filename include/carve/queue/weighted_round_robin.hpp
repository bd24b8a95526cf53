/// @file carve/queue/weighted_round_robin.hpp
/// WeightedRoundRobin: tier t is served up to w[t] times
/// in a row before the next non-empty tier's turn.
///
/// @code
/// carve::WeightedRoundRobin wrr({4, 2, 1});   // per round: 4 small, 2 medium, 1 large
/// @endcode
///
/// Weights count requests, not bytes (DeficitRoundRobin shares bytes). One weight per tier, each
/// at least 1; prepare() refuses anything else with Errc::invalid_argument. An empty tier gives
/// its turn away, so the policy never idles while requests wait.
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

/// A DrainPolicy serving up to `w[t]` requests of tier t per turn. Safe to share between
/// consumers: turns hold on average (see served()).
class WeightedRoundRobin {
public:
  static constexpr const char* name = "weighted round-robin"; ///< for reports

  /// One weight per tier (at most max_tiers are kept); prepare() checks them.
  CARVE_HOST_DEVICE constexpr explicit WeightedRoundRobin(cuda::std::span<const std::uint32_t> weights) noexcept
      : weights_(weights) {}
  /// `WeightedRoundRobin({4, 2, 1})`.
  template <cuda::std::size_t K>
  CARVE_HOST_DEVICE constexpr explicit WeightedRoundRobin(const std::uint32_t (&weights)[K]) noexcept
      : WeightedRoundRobin(cuda::std::span<const std::uint32_t>(weights, K)) {}

  /// Errc::invalid_argument unless there is one weight per tier, each at least 1.
  template <class Clock>
  [[nodiscard]] CARVE_HOST_DEVICE constexpr cuda::std::expected<void, Errc> prepare(std::uint32_t tiers) noexcept {
    if (!weights_.fit(tiers, 1, ~std::uint32_t{0})) {
      return cuda::std::unexpected(Errc::invalid_argument);
    }
    return {};
  }

  /// The current tier while its turn lasts and it is not found empty, else the next tier this
  /// pop has not found empty; nullopt when all are.
  template <class View>
  CARVE_HOST_DEVICE CARVE_QUEUE_INLINE cuda::std::optional<std::uint32_t> pick(const View& view) noexcept {
    const std::uint64_t s = state<View>().load(cuda::std::memory_order_relaxed);
    const auto current = static_cast<std::uint32_t>(s >> 32);
    const auto used = static_cast<std::uint32_t>(s);
    if (current < view.tier_count() && !view.known_empty(current) && used < weights_[current]) {
      return detail::as_pick(current);
    }
    return detail::as_pick(detail::first_untried(view, current + 1));
  }

  /// Counts the request against its tier's turn; a tier that was not the current one starts a turn.
  /// A load and a store, not a compare-exchange: consumers that serve at the same moment may lose
  /// one count between them, which moves a turn by a request, where a read-modify-write would
  /// cost every pop a locked instruction.
  template <class View>
  CARVE_HOST_DEVICE CARVE_QUEUE_INLINE void served(const View&, std::uint32_t tier, std::uint64_t) noexcept {
    auto s = state<View>();
    const std::uint64_t seen = s.load(cuda::std::memory_order_relaxed);
    const bool same_turn =
        static_cast<std::uint32_t>(seen >> 32) == tier && static_cast<std::uint32_t>(seen) < weights_[tier];
    s.store(same_turn ? seen + 1 : (std::uint64_t{tier} << 32 | 1U), cuda::std::memory_order_relaxed);
  }

  /// The weights as given.
  CARVE_HOST_DEVICE constexpr cuda::std::span<const std::uint32_t> weights() const noexcept { return weights_.given(); }

private:
  template <class View>
  CARVE_HOST_DEVICE cuda::atomic_ref<std::uint64_t, View::scope> state() noexcept {
    return cuda::atomic_ref<std::uint64_t, View::scope>(turn_);
  }

  detail::TierValues<std::uint32_t> weights_;
  alignas(8) std::uint64_t turn_ = 0; // current tier << 32 | requests served in its turn
};

static_assert(DrainPolicy<WeightedRoundRobin>);

} // namespace carve
