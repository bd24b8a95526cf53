/// @file carve/queue/queue_waiters.hpp
/// Where a SizeTieredQueue's blocking calls sleep (host only).
///
/// The queue's data path is lock-free and runs on devices too; only threads that choose to wait
/// (push into a full tier, pop from an empty queue) meet this mutex. Wakers take the lock only
/// when a waiter count says someone sleeps, so a queue that nobody blocks on never touches it.
/// The counts are the queue's (device-compatible atomics); this holds the host-only parts.
#pragma once

namespace carve::detail {
struct QueueWaiters;
} // namespace carve::detail

#if !defined(__CUDA_ARCH__)
#include <chrono>
#include <condition_variable>
#include <mutex>

namespace carve::detail {

struct QueueWaiters {
  std::mutex mutex;
  std::condition_variable readable; // a request was pushed, or the queue closed
  std::condition_variable writable; // a request was popped, or the queue closed

  // Both are called by a thread that made its state change visible and then saw waiters; the
  // empty critical section orders the wake after any waiter's last check.
  void wake_readers(bool all) {
    { const std::lock_guard lock(mutex); }
    all ? readable.notify_all() : readable.notify_one();
  }
  void wake_writers() {
    { const std::lock_guard lock(mutex); }
    writable.notify_all();
  }
};

} // namespace carve::detail
#endif
