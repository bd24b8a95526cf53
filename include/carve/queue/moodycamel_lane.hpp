// carve/queue/moodycamel_lane.hpp — moodycamel::ConcurrentQueue as a SizeTieredQueue lane
// (host only), to show that any MPMC queue can serve as a tier.
//
//   using Queue = carve::SizeTieredQueue<Request, Size, carve::MoodycamelLanes>;
//
// Available when moodycamel's header is found (Debian's libconcurrentqueue-dev installs
// <concurrentqueue/concurrentqueue.h>; upstream's CMake install uses
// <concurrentqueue/moodycamel/concurrentqueue.h>); CARVE_HAS_MOODYCAMEL_LANE is then defined.
//
// ConcurrentQueue is unbounded and keeps one sub-queue per producer; the adapter adds the
// exact bound a lane must have (a counter reserved before each enqueue) and the pushed/popped
// totals. Order: FIFO per producer, not across producers (moodycamel's own guarantee), and no
// peek, so policies that read head stamps (StrictPriority, PriorityTag) do not accept it.
// Requests must also be move-assignable: a failed enqueue hands the request back by assignment.
#pragma once

// <linux/fs.h> (pulled in by liburing, among others) defines a BLOCK_SIZE macro that would
// rewrite moodycamel's member of that name; it is set aside while moodycamel is read.
#pragma push_macro("BLOCK_SIZE")
#undef BLOCK_SIZE
#if __has_include(<concurrentqueue/moodycamel/concurrentqueue.h>)
#include <concurrentqueue/moodycamel/concurrentqueue.h>
#define CARVE_HAS_MOODYCAMEL_LANE 1
#elif __has_include(<concurrentqueue/concurrentqueue.h>)
#include <concurrentqueue/concurrentqueue.h>
#define CARVE_HAS_MOODYCAMEL_LANE 1
#endif
#pragma pop_macro("BLOCK_SIZE")

#if defined(CARVE_HAS_MOODYCAMEL_LANE)
#include <carve/queue/lane.hpp>

#include <cuda/atomic>
#include <cuda/std/cstddef>
#include <cuda/std/cstdint>
#include <cuda/std/optional>

#include <atomic>
#include <optional>
#include <type_traits>
#include <utility>

namespace carve {

template <class T>
class MoodycamelLane {
  static_assert(std::is_move_assignable_v<T>, "MoodycamelLane hands a refused request back by move assignment");

public:
  using value_type = T;

  explicit MoodycamelLane(cuda::std::size_t capacity) : queue_(capacity), capacity_(capacity) {}

  bool try_push(T& item, std::uint64_t stamp) {
    if (held_.fetch_add(1, std::memory_order_relaxed) >= capacity_) {
      held_.fetch_sub(1, std::memory_order_relaxed);
      return false;
    }
    // Counted before it can be popped, so popped() never passes pushed().
    pushed_.fetch_add(1, std::memory_order_release);
    Stamped<T> entry{std::move(item), stamp};
    if (!queue_.enqueue(std::move(entry))) { // only when memory runs out
      item = std::move(entry.value);
      pushed_.fetch_sub(1, std::memory_order_relaxed);
      held_.fetch_sub(1, std::memory_order_relaxed);
      return false;
    }
    return true;
  }

  cuda::std::optional<Stamped<T>> try_pop() {
    Receiver out;
    if (!queue_.try_dequeue(out)) {
      return cuda::std::nullopt;
    }
    popped_.fetch_add(1, std::memory_order_release);
    held_.fetch_sub(1, std::memory_order_relaxed);
    return cuda::std::optional<Stamped<T>>(std::move(*out.entry));
  }

  cuda::std::size_t capacity() const noexcept { return capacity_; }
  std::uint64_t pushed() const noexcept { return pushed_.load(std::memory_order_acquire); }
  std::uint64_t popped() const noexcept { return popped_.load(std::memory_order_acquire); }

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
  cuda::std::size_t capacity_;
  // Producers and consumers both move held_; only producers pushed_, only consumers popped_.
  alignas(interference_size) std::atomic<std::uint64_t> held_{0};
  alignas(interference_size) std::atomic<std::uint64_t> pushed_{0};
  alignas(interference_size) std::atomic<std::uint64_t> popped_{0};
};

struct MoodycamelLanes {
  template <class T>
  using lane = MoodycamelLane<T>;
  static constexpr cuda::thread_scope scope = cuda::thread_scope_system;
};

static_assert(LanePolicyFor<MoodycamelLanes, int> && !PeekableLane<MoodycamelLane<int>, int>);

} // namespace carve
#endif
