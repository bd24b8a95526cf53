/// @file carve/mirror/host_copy_stream.hpp
/// A queue of copies run in order by one thread: a host stand-in for a device's copy stream.
///
/// copy() and zero() queue work and return at once; wait() blocks until everything queued before it
/// has run. Several streams run at the same time, as several devices' copy engines do, which is what
/// makes HostMirrorBackend's sync asynchronous per device. Thread-safe.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

namespace carve {

/// Copies and fills run in order on a thread of its own. Thread-safe; not copyable.
class HostCopyStream {
public:
  /// Starts the thread. Throws std::system_error when it cannot be started.
  HostCopyStream() : worker_([this] { run(); }) {}
  /// Runs what is queued, then stops the thread.
  ~HostCopyStream() {
    {
      const std::lock_guard lock(mutex_);
      stop_ = true;
    }
    work_.notify_one();
    worker_.join();
  }
  HostCopyStream(const HostCopyStream&) = delete;
  HostCopyStream& operator=(const HostCopyStream&) = delete;

  /// Queues a memcpy; both buffers must stay valid until wait() returns. false when the queue
  /// cannot grow (out of memory); nothing is queued then.
  bool copy(void* dst, const void* src, std::size_t bytes) noexcept { return push({dst, src, bytes}); }
  /// Queues zeroing `bytes` at `dst`; false as for copy().
  bool zero(void* dst, std::size_t bytes) noexcept { return push({dst, nullptr, bytes}); }

  /// Blocks until everything queued before the call has run.
  void wait() noexcept {
    std::unique_lock lock(mutex_);
    const std::uint64_t target = queued_;
    done_.wait(lock, [&] { return completed_ >= target; });
  }

private:
  struct Op {
    void* dst;
    const void* src; // nullptr: fill with zeros
    std::size_t bytes;
  };

  bool push(Op op) noexcept {
    {
      const std::lock_guard lock(mutex_);
      try {
        pending_.push_back(op);
      } catch (...) {
        return false;
      }
      ++queued_;
    }
    work_.notify_one();
    return true;
  }

  void run() {
    std::vector<Op> batch;
    std::unique_lock lock(mutex_);
    for (;;) {
      work_.wait(lock, [&] { return stop_ || !pending_.empty(); });
      if (pending_.empty()) {
        return; // stopping, and nothing is left to do
      }
      batch.swap(pending_);
      lock.unlock();
      for (const Op& op : batch) {
        if (op.src != nullptr) {
          std::memcpy(op.dst, op.src, op.bytes);
        } else {
          std::memset(op.dst, 0, op.bytes);
        }
      }
      const std::size_t done = batch.size();
      batch.clear();
      lock.lock();
      completed_ += done;
      done_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable work_;
  std::condition_variable done_;
  std::vector<Op> pending_;
  std::uint64_t queued_ = 0;
  std::uint64_t completed_ = 0;
  bool stop_ = false;
  std::thread worker_; // last: it starts running in the constructor
};

} // namespace carve
