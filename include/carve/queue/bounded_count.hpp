/// @file carve/queue/bounded_count.hpp
/// An exact bound on the items a queue holds, counted so that
/// producers and consumers write different cache lines.
///
/// @code
/// carve::BoundedCount<cuda::thread_scope_system> held(1024);
/// if (held.try_acquire()) { /* store the item; held.cancel() if that fails */ }
/// ...                       /* an item taken out: */ held.release();
/// @endcode
///
/// One counter that pushes increment and pops decrement moves its line between the producer's
/// and the consumer's core on every item. Here producers count reservations (acquired) and
/// consumers count departures (released), each on its own line; a producer reads the consumers'
/// line only when the last value it saw (kept on the producers' line) says the bound is reached.
///
/// Exact: a reservation is granted only if at most bound - 1 others are held, however many
/// threads acquire, cancel and release at once. A reservation made while the count is at the
/// bound can be refused spuriously while a refused one has not been cancelled yet.
#pragma once

#include <carve/core/config.hpp>

#include <cuda/atomic>
#include <cuda/std/cstdint>

namespace carve {

/// At most `bound` items held, with reservations and departures on separate cache lines. All
/// calls may run concurrently; atomics at `Scope`.
template <cuda::thread_scope Scope>
class BoundedCount {
public:
  /// Nothing held yet; at most `bound` at once.
  CARVE_HOST_DEVICE explicit BoundedCount(std::uint64_t bound) noexcept : bound_(bound) {}

  /// Reserves room for one more item; false, with nothing reserved, when `bound` are held.
  CARVE_HOST_DEVICE bool try_acquire() noexcept {
    // Reservations granted so far are all counted in `mine`, so granting it keeps the held
    // count at most mine + 1 - released, and released only grows.
    const std::uint64_t mine = producers_.acquired.fetch_add(1, cuda::std::memory_order_relaxed);
    if (below_bound(mine, producers_.released_seen.load(cuda::std::memory_order_relaxed))) {
      return true;
    }
    const std::uint64_t released = consumers_.released.load(cuda::std::memory_order_relaxed);
    producers_.released_seen.store(released, cuda::std::memory_order_relaxed); // a stale value is only cautious
    if (below_bound(mine, released)) {
      return true;
    }
    cancel();
    return false;
  }
  /// Gives back a reservation whose item was never stored.
  CARVE_HOST_DEVICE void cancel() noexcept { producers_.acquired.fetch_sub(1, cuda::std::memory_order_relaxed); }
  /// An item left. Release, so that a thread reading released() and then acquired() never sees
  /// more departures than reservations.
  CARVE_HOST_DEVICE void release() noexcept { consumers_.released.fetch_add(1, cuda::std::memory_order_release); }

  /// The most items held at once.
  CARVE_HOST_DEVICE std::uint64_t bound() const noexcept { return bound_; }
  /// Reservations not cancelled (refused ones count until they are); held = acquired - released.
  CARVE_HOST_DEVICE std::uint64_t acquired() const noexcept {
    return producers_.acquired.load(cuda::std::memory_order_relaxed);
  }
  /// Items that left so far (release() calls).
  CARVE_HOST_DEVICE std::uint64_t released() const noexcept {
    return consumers_.released.load(cuda::std::memory_order_acquire);
  }

private:
  // Signed: another thread may have seen a released count newer than this reservation.
  CARVE_HOST_DEVICE bool below_bound(std::uint64_t mine, std::uint64_t released) const noexcept {
    return static_cast<std::int64_t>(mine - released) < static_cast<std::int64_t>(bound_);
  }

  std::uint64_t bound_;
  struct alignas(interference_size) {
    cuda::atomic<std::uint64_t, Scope> acquired{0};
    cuda::atomic<std::uint64_t, Scope> released_seen{0};
  } producers_;
  struct alignas(interference_size) {
    cuda::atomic<std::uint64_t, Scope> released{0};
  } consumers_;
};

namespace detail {
// What a queue without a shared bound keeps in place of its BoundedCount.
struct NoBound {
  CARVE_HOST_DEVICE explicit NoBound(std::uint64_t) noexcept {}
};
} // namespace detail

} // namespace carve
