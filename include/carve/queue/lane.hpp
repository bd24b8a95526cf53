/// @file carve/queue/lane.hpp
/// The concept a SizeTieredQueue's per-tier queues (lanes) model.
///
/// A lane is a bounded multi-producer multi-consumer queue of Stamped<T>; the queue holds one per
/// tier. A lane policy names the lane type for each request type and the thread scope the queue's
/// own counters use:
///
/// @code
/// struct MyLanes {
///   template <class T> using lane = MyLane<T>;
///   static constexpr cuda::thread_scope scope = cuda::thread_scope_system;
/// };
/// @endcode
///
/// Lane<L, T> requires:
/// @code
/// L(cuda::std::size_t capacity)              // room for exactly `capacity` items
/// bool try_push(T& item, std::uint64_t stamp) // false when full; moves from `item` only on true
/// cuda::std::optional<Stamped<T>> try_pop()   // nullopt when empty
/// std::size_t capacity() const                // 0 when the lane could not get its storage
/// std::uint64_t pushed() const, popped() const // totals so far; size = pushed - popped
/// @endcode
/// and, semantically: a push that returns true is popped exactly once; try_push fails when the
/// lane holds capacity() items (or pushes in flight would make it so), and may keep failing
/// after that until a stated amount of room is free again (MpmcRing: 1/16 of its capacity), but
/// never while the lane is empty; any number of threads may call any operation at once. FIFO
/// order is the lane's own property: MpmcRing is FIFO across all producers (linearizable),
/// MoodycamelLane only per producer.
///
/// PeekableLane adds `cuda::std::optional<std::uint64_t> front_stamp() const`: the stamp of the
/// oldest item (a hint under concurrency), which drain policies that age requests need.
/// SinkLane adds `bool try_pop_into(sink)`: pops by calling sink(T&& item, std::uint64_t stamp)
/// on the item in place (false when empty); the queue uses it where a lane has it, since it
/// builds no temporary on the way out.
#pragma once

#include <carve/core/config.hpp>
#include <carve/queue/force_inline.hpp>

#include <cuda/atomic>
#include <cuda/std/concepts>
#include <cuda/std/cstddef>
#include <cuda/std/cstdint>
#include <cuda/std/optional>

namespace carve {

/// A request and the clock reading taken when it was pushed.
template <class T>
struct Stamped {
  T value;             ///< the request
  std::uint64_t stamp; ///< given to the push (a SizeTieredQueue gives 0 where it reads no clock)
};

/// A bounded MPMC queue of Stamped<T> that a SizeTieredQueue can use per tier (see the file's
/// description for the calls and their semantics).
template <class L, class T>
concept Lane = cuda::std::constructible_from<L, cuda::std::size_t> &&
    requires(L& lane, const L& view, T& item, std::uint64_t stamp) {
  { lane.try_push(item, stamp) } -> cuda::std::same_as<bool>;
  { lane.try_pop() } -> cuda::std::same_as<cuda::std::optional<Stamped<T>>>;
  { view.capacity() } -> cuda::std::same_as<cuda::std::size_t>;
  { view.pushed() } -> cuda::std::same_as<std::uint64_t>;
  { view.popped() } -> cuda::std::same_as<std::uint64_t>;
};

/// A Lane that tells the stamp of its oldest item (`front_stamp()`), as drain policies that compare
/// arrival times need.
template <class L, class T>
concept PeekableLane = Lane<L, T> && requires(const L& view) {
  { view.front_stamp() } -> cuda::std::same_as<cuda::std::optional<std::uint64_t>>;
};

namespace detail {
template <class T>
struct SinkArchetype {
  CARVE_HOST_DEVICE void operator()(T&&, std::uint64_t) const noexcept {}
};
} // namespace detail

/// A Lane that pops into a callable (`try_pop_into(sink)`), with no temporary on the way out.
template <class L, class T>
concept SinkLane = Lane<L, T> && requires(L& lane, detail::SinkArchetype<T> sink) {
  { lane.try_pop_into(sink) } -> cuda::std::same_as<bool>;
};

/// A lane policy: `P::lane<T>` is a Lane and `P::scope` the thread scope of the queue's own
/// counters.
template <class P, class T>
concept LanePolicyFor = requires {
  typename P::template lane<T>;
  { P::scope } -> cuda::std::convertible_to<cuda::thread_scope>;
}
&&Lane<typename P::template lane<T>, T>;

} // namespace carve
