/// @file carve/queue/round_robin.hpp
/// RoundRobin: serve the tiers in turn, skipping empty ones.
///
/// One request from tier 0, then tier 1, then tier 2,
/// then tier 0 again; an empty tier is passed over. A small request therefore waits for at most
/// one request of every other tier, however many large ones are queued.
#pragma once

#include <carve/core/config.hpp>
#include <carve/queue/drain_policy.hpp>
#include <carve/queue/force_inline.hpp>

#include <cuda/atomic>
#include <cuda/std/cstdint>
#include <cuda/std/expected>
#include <cuda/std/optional>

namespace carve {

/// The default DrainPolicy: one request per non-empty tier in turn. Safe to share between
/// consumers (its cursor is an atomic at View::scope).
class RoundRobin {
public:
  static constexpr const char* name = "round-robin"; ///< for reports

  /// Accepts any tier count.
  template <class Clock>
  [[nodiscard]] CARVE_HOST_DEVICE constexpr cuda::std::expected<void, Errc> prepare(std::uint32_t) noexcept {
    return {};
  }

  /// The tier after the last one served that this pop has not found empty; nullopt when all are.
  template <class View>
  CARVE_HOST_DEVICE CARVE_QUEUE_INLINE cuda::std::optional<std::uint32_t> pick(const View& view) noexcept {
    return detail::as_pick(detail::first_untried(view, cursor<View>().load(cuda::std::memory_order_relaxed)));
  }

  /// Moves the turn to the tier after `tier`.
  template <class View>
  CARVE_HOST_DEVICE CARVE_QUEUE_INLINE void served(const View& view, std::uint32_t tier, std::uint64_t) noexcept {
    cursor<View>().store(detail::tier_after(tier, view.tier_count()), cuda::std::memory_order_relaxed);
  }

private:
  template <class View>
  CARVE_HOST_DEVICE cuda::atomic_ref<std::uint32_t, View::scope> cursor() noexcept {
    return cuda::atomic_ref<std::uint32_t, View::scope>(next_);
  }

  alignas(4) std::uint32_t next_ = 0; // the tier served next, if it has anything
};

static_assert(DrainPolicy<RoundRobin>);

} // namespace carve
