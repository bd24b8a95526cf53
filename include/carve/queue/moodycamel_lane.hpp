/// @file carve/queue/moodycamel_lane.hpp
/// moodycamel::ConcurrentQueue as a SizeTieredQueue lane
/// (host only), to show that any MPMC queue can serve as a tier.
///
/// @code
/// using Queue = carve::SizeTieredQueue<Request, Size, carve::MoodycamelLanes>;
/// @endcode
///
/// Available when moodycamel's header is found (Debian's libconcurrentqueue-dev installs
/// <concurrentqueue/concurrentqueue.h>; upstream's CMake install uses
/// <concurrentqueue/moodycamel/concurrentqueue.h>); CARVE_HAS_MOODYCAMEL_LANE is then defined.
///
/// ConcurrentQueue is unbounded and keeps one sub-queue per producer; the adapter adds the
/// exact bound a lane must have and the pushed/popped totals (a BoundedCount, reserved before
/// each enqueue). Order: FIFO per producer, not across producers (moodycamel's own guarantee), and no
/// peek, so policies that read head stamps (StrictPriority, PriorityTag) do not accept it.
/// Requests must also be move-assignable: a failed enqueue hands the request back by assignment.
#pragma once

// <linux/fs.h> (pulled in by liburing, among others) defines a BLOCK_SIZE macro that would
// rewrite moodycamel's member of that name; it is set aside while moodycamel is read.
#pragma push_macro("BLOCK_SIZE")
#undef BLOCK_SIZE
#if __has_include(<concurrentqueue/moodycamel/concurrentqueue.h>)
#include <concurrentqueue/moodycamel/concurrentqueue.h>
/// Defined (as 1) when moodycamel's header was found and MoodycamelLane is available.
#define CARVE_HAS_MOODYCAMEL_LANE 1
#elif __has_include(<concurrentqueue/concurrentqueue.h>)
#include <concurrentqueue/concurrentqueue.h>
#define CARVE_HAS_MOODYCAMEL_LANE 1
#endif
#pragma pop_macro("BLOCK_SIZE")

#if defined(CARVE_HAS_MOODYCAMEL_LANE)
#include <carve/queue/bounded_count.hpp>
#include <carve/queue/lane.hpp>

#include <cuda/atomic>
#include <cuda/std/cstddef>
#include <cuda/std/cstdint>
#include <cuda/std/optional>

#include <optional>
#include <type_traits>
#include <utility>

namespace carve {

/// moodycamel::ConcurrentQueue of Stamped<T> with an exact bound: a Lane (not peekable), FIFO
/// per producer. Host only; every call may run concurrently.
template <class T>
class MoodycamelLane {
  static_assert(std::is_move_assignable_v<T>, "MoodycamelLane hands a refused request back by move assignment");

public:
  using value_type = T; ///< the request type

  /// Room for exactly `capacity` items; moodycamel's queue preallocates that many.
  explicit MoodycamelLane(cuda::std::size_t capacity) : queue_(capacity), held_(capacity) {}

  /// Moves `item` in with `stamp`; false, with `item` untouched (or handed back), when full or
  /// when moodycamel could not get memory.
  bool try_push(T& item, std::uint64_t stamp) {
    if (!held_.try_acquire()) {
      return false;
    }
    Stamped<T> entry{std::move(item), stamp};
    if (!queue_.enqueue(std::move(entry))) { // only when memory runs out
      item = std::move(entry.value);
      held_.cancel();
      return false;
    }
    return true;
  }

  /// An item (FIFO per producer), or nullopt when empty.
  cuda::std::optional<Stamped<T>> try_pop() {
    Receiver out;
    if (!queue_.try_dequeue(out)) {
      return cuda::std::nullopt;
    }
    held_.release();
    return cuda::std::optional<Stamped<T>>(std::move(*out.entry));
  }

  /// The bound given to the constructor.
  cuda::std::size_t capacity() const noexcept { return static_cast<cuda::std::size_t>(held_.bound()); }
  /// Pushes so far, counted when reserved (before the enqueue), so popped() never passes pushed().
  std::uint64_t pushed() const noexcept { return held_.acquired(); }
  /// Pops so far.
  std::uint64_t popped() const noexcept { return held_.released(); }

private:
  // try_dequeue assigns into an existing object; this one constructs on assignment, so T needs
  // no default constructor.
  struct Receiver {
    std::optional<Stamped<T>> entry;
    Receiver& operator=(Stamped<T>&& e) {
      entry.emplace(std::move(e));
      return *this;
    }
  };

  moodycamel::ConcurrentQueue<Stamped<T>> queue_;
  BoundedCount<cuda::thread_scope_system> held_; // the bound moodycamel's queue does not keep
};

/// The lane policy for MoodycamelLane (host threads: system scope).
struct MoodycamelLanes {
  /// MoodycamelLane of the request type.
  template <class T>
  using lane = MoodycamelLane<T>;
  /// The queue's own counters at system scope.
  static constexpr cuda::thread_scope scope = cuda::thread_scope_system;
};

static_assert(LanePolicyFor<MoodycamelLanes, int> && !PeekableLane<MoodycamelLane<int>, int>);

} // namespace carve
#endif
