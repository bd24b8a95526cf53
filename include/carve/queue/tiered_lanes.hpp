/// @file carve/queue/tiered_lanes.hpp
/// The raw lane storage of a SizeTieredQueue: one lane per tier, and one small lane per tier for
/// the requests a consumer put back at the head of its tier (try_push_front).
///
/// The queue builds its lanes in place, one tier at a time, and in device code must be able to
/// refuse a lane that got no storage without throwing; so the lanes live in unions that the queue
/// constructs and destroys by hand. This header keeps that bookkeeping, the tiers' bounds and the
/// order in which a pop looks at a tier's two lanes apart from the queue's logic. Only
/// capacity() and size() check a tier index: the queue passes only tiers it built.
#pragma once

#include <carve/core/config.hpp>
#include <carve/core/errc.hpp>
#include <carve/queue/force_inline.hpp>
#include <carve/queue/lane.hpp>
#include <carve/queue/queue_stats.hpp>
#include <carve/queue/tier_thresholds.hpp>

#include <cuda/atomic>
#include <cuda/std/cstddef>
#include <cuda/std/cstdint>
#include <cuda/std/expected>
#include <cuda/std/optional>
#include <cuda/std/span>
#include <cuda/std/utility>
#include <nv/target>

#include <new>

namespace carve::detail {

// Room for the request a pop takes: the lane moves it here from its cell, and the queue moves it
// once more, into what it returns (take()).
template <class T>
union HeldRequest {
  CARVE_HOST_DEVICE HeldRequest() noexcept {}
  CARVE_HOST_DEVICE ~HeldRequest() {}
  // Moves the request out and ends its life here.
  [[nodiscard]] CARVE_HOST_DEVICE cuda::std::expected<T, Errc> take() noexcept {
    cuda::std::expected<T, Errc> r(cuda::std::in_place, cuda::std::move(value));
    value.~T();
    return r;
  }
  T value;
};

// Per tier, a lane of type L for requests pushed and one for requests put back, with counters at
// `Scope`; with `Shared`, one bound for all tiers. Every call but set_capacities(), construct()
// and destroy() may run concurrently.
template <class T, class L, cuda::thread_scope Scope, bool Shared>
class TieredLanes {
public:
  using value_type = T;
  using lane_type = L;
  static constexpr cuda::thread_scope scope = Scope;

  // Where take() found a request: the queue gives back a shared-capacity unit only for `lane`.
  enum class Took : std::uint32_t { nothing, put_back, lane };

  CARVE_HOST_DEVICE TieredLanes() noexcept {}
  TieredLanes(const TieredLanes&) = delete;
  TieredLanes& operator=(const TieredLanes&) = delete;
  // The queue calls destroy(): it must first stop using the lanes.
  CARVE_HOST_DEVICE ~TieredLanes() {}

  // The bounds of `tiers` tiers: `single` for each (with Shared, for all together) when
  // `capacities` is empty, else one each. Why they do not fit (an Errc::invalid_argument), or
  // nullptr.
  CARVE_HOST_DEVICE const char* set_capacities(std::uint32_t tiers, cuda::std::span<const cuda::std::size_t> capacities,
                                               cuda::std::size_t single) noexcept {
    if (!capacities.empty() && (Shared || capacities.size() != tiers)) {
      return Shared ? "this drain policy takes one capacity for the whole queue" : "one capacity per tier is needed";
    }
    for (std::uint32_t t = 0; t < tiers; ++t) {
      capacity_[t] = capacities.empty() ? single : capacities[t];
      if (capacity_[t] == 0) {
        return "a queue needs a capacity of at least 1";
      }
    }
    tiers_ = tiers;
    return nullptr;
  }

  // Builds the lanes of every tier set_capacities() bounded, each put-back lane for at most
  // `front_limit` requests; false when some lane got less room than asked (no storage). Every
  // lane is built either way, for destroy() to destroy.
  CARVE_HOST_DEVICE bool construct(cuda::std::size_t front_limit) {
    bool whole = true;
    for (std::uint32_t t = 0; t < tiers_; ++t) {
      const cuda::std::size_t capacity = capacity_[Shared ? 0 : t];
      whole &= construct_tier(t, capacity, capacity < front_limit ? capacity : front_limit);
      ++built_;
    }
    return whole;
  }
  // Destroys the lanes built, and the requests still in them.
  CARVE_HOST_DEVICE void destroy() noexcept {
    for (std::uint32_t t = 0; t < built_; ++t) {
      lanes_[t].lane.~L();
      fronts_[t].lane.~L();
    }
    built_ = 0;
  }

  // Tiers whose lanes are built (all once the queue is usable).
  CARVE_HOST_DEVICE std::uint32_t built() const noexcept { return built_; }
  // The bound of `tier` (the whole queue's, with Shared); 0 for a tier not built.
  CARVE_HOST_DEVICE cuda::std::size_t capacity(std::uint32_t tier) const noexcept {
    return tier < built_ ? capacity_[Shared ? 0 : tier] : 0;
  }

  CARVE_HOST_DEVICE L& lane(std::uint32_t tier) noexcept { return lanes_[tier].lane; }
  CARVE_HOST_DEVICE const L& lane(std::uint32_t tier) const noexcept { return lanes_[tier].lane; }
  CARVE_HOST_DEVICE L& front(std::uint32_t tier) noexcept { return fronts_[tier].lane; }
  CARVE_HOST_DEVICE const L& front(std::uint32_t tier) const noexcept { return fronts_[tier].lane; }

  // Puts `request` back at the head of `tier`; moves from it only on success (false: the
  // put-back lane is full).
  CARVE_HOST_DEVICE bool push_front(std::uint32_t tier, T& request, std::uint64_t stamp) noexcept {
    if (!front(tier).try_push(request, stamp)) {
      return false;
    }
    fronted_.fetch_add(1, cuda::std::memory_order_release);
    return true;
  }

  // The head of `tier` into `held`, and its stamp into `stamp`: a request put back if there is
  // one, else the lane's. Requests put back are rare, so a pop reads one counter to skip them.
  CARVE_HOST_DEVICE CARVE_QUEUE_INLINE Took take(std::uint32_t tier, HeldRequest<T>& held,
                                                 std::uint64_t& stamp) noexcept {
    if (fronted_.load(cuda::std::memory_order_acquire) != 0) {
      if (pop_lane(front(tier), held, stamp)) {
        fronted_.fetch_sub(1, cuda::std::memory_order_relaxed);
        return Took::put_back;
      }
    }
    return pop_lane(lane(tier), held, stamp) ? Took::lane : Took::nothing;
  }

  // The stamp of the request take() would pop from `tier` next (one put back first), or nullopt
  // when neither lane shows a head; for lanes that can peek (PeekableLane).
  CARVE_HOST_DEVICE CARVE_QUEUE_INLINE cuda::std::optional<std::uint64_t>
  head_stamp(std::uint32_t tier) const noexcept {
    if (fronted_.load(cuda::std::memory_order_acquire) != 0) {
      if (const auto s = front(tier).front_stamp()) {
        return s;
      }
    }
    return lane(tier).front_stamp();
  }
  // head_stamp() into `stamp`, or false, through the lanes' peek_stamp (no optional on the way).
  CARVE_HOST_DEVICE CARVE_QUEUE_INLINE bool head_stamp_into(std::uint32_t tier, std::uint64_t& stamp) const noexcept {
    return (fronted_.load(cuda::std::memory_order_acquire) != 0 && front(tier).peek_stamp(stamp)) ||
           lane(tier).peek_stamp(stamp);
  }

  // Requests `tier` handed out, and those it took in (pushed and put back).
  CARVE_HOST_DEVICE std::uint64_t popped(std::uint32_t tier) const noexcept {
    return lane(tier).popped() + front(tier).popped();
  }
  CARVE_HOST_DEVICE std::uint64_t pushed(std::uint32_t tier) const noexcept {
    return lane(tier).pushed() + front(tier).pushed();
  }
  // The counts of `tier` in its report: requests in, out, put back, waiting, and its bound.
  CARVE_HOST_DEVICE void count_into(std::uint32_t tier, TierStats& ts) const noexcept {
    ts.dequeued = popped(tier);
    ts.requeued = front(tier).pushed();
    ts.enqueued = lane(tier).pushed() + ts.requeued;
    ts.depth = ts.enqueued - ts.dequeued;
    ts.capacity = capacity(tier);
  }
  // Requests in `tier`, including those put back and pushes in flight; exact when no call is in
  // flight; 0 for a tier not built.
  CARVE_HOST_DEVICE cuda::std::size_t size(std::uint32_t tier) const noexcept {
    if (tier >= built_) {
      return 0;
    }
    const std::uint64_t out = popped(tier); // first: `pushed` read later is never smaller
    return static_cast<cuda::std::size_t>(pushed(tier) - out);
  }

private:
  // Builds `tier`'s lane for `capacity` requests and its put-back lane for `front_capacity`;
  // false when either got less room than asked. A lane constructor that throws (host) leaves
  // the tier unbuilt: construct() counts it only once this returns.
  CARVE_HOST_DEVICE bool construct_tier(std::uint32_t tier, cuda::std::size_t capacity,
                                        cuda::std::size_t front_capacity) {
    ::new (static_cast<void*>(&lanes_[tier].lane)) L(capacity);
    NV_IF_ELSE_TARGET(NV_IS_HOST,
                      (
                          try { ::new (static_cast<void*>(&fronts_[tier].lane)) L(front_capacity); } catch (...) {
                            lanes_[tier].lane.~L();
                            throw;
                          }),
                      (::new (static_cast<void*>(&fronts_[tier].lane)) L(front_capacity);))
    return lanes_[tier].lane.capacity() == capacity && fronts_[tier].lane.capacity() == front_capacity;
  }

  union Slot {
    CARVE_HOST_DEVICE Slot() noexcept {}
    CARVE_HOST_DEVICE ~Slot() {}
    L lane;
  };

  // Pops from `l` into `held`, and its stamp into `stamp`; through the lane's sink where it has
  // one, which builds no temporary on the way out.
  CARVE_HOST_DEVICE CARVE_QUEUE_INLINE static bool pop_lane(L& l, HeldRequest<T>& held, std::uint64_t& stamp) noexcept {
    if constexpr (SinkLane<L, T>) {
      return l.try_pop_into([&held, &stamp](T&& item, std::uint64_t s) {
        ::new (static_cast<void*>(&held.value)) T(cuda::std::move(item));
        stamp = s;
      });
    } else {
      auto got = l.try_pop();
      if (!got) {
        return false;
      }
      ::new (static_cast<void*>(&held.value)) T(cuda::std::move(got->value));
      stamp = got->stamp;
      return true;
    }
  }

  // Read on every pop, written only while the queue is built: on lines of their own.
  std::uint32_t built_ = 0;
  std::uint32_t tiers_ = 0;
  cuda::std::size_t capacity_[max_tiers]{};
  alignas(interference_size) Slot lanes_[max_tiers];
  // Requests put back at the head of their tier, over all tiers: on a line of its own, since
  // every pop reads it and only put-backs write it.
  alignas(interference_size) cuda::atomic<std::uint32_t, Scope> fronted_{0};
  Slot fronts_[max_tiers];
};

} // namespace carve::detail
