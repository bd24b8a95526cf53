// src/torch/host_streams.hpp — the streams of libcarve_torch's host backend (CARVE_TORCH_BACKEND=host).
//
// There a stream is whatever handle the caller passes as its cudaStream_t: an opaque number. Work
// on it is queued and completed only by the test hooks (carve_torch_host_stream_enqueue and
// carve_torch_host_stream_complete in carve_torch.h), so a test decides when a block freed on one
// stream may be reused on another, exactly as a kernel still running would decide on a GPU. A
// stream nothing was queued on has no pending work: its events complete at once.
#pragma once

#include <carve/core/error.hpp>
#include <carve/mr/stream_events.hpp>

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <new>
#include <unordered_map>
#include <utility>

namespace carve::torch {

// A host-backend stream: the handle the caller passed.
struct HostStream {
  std::uintptr_t handle = 0;
  friend constexpr bool operator==(HostStream, HostStream) = default;
};

// The work queued and completed on every host stream: one table for the process, since the test
// hooks name streams, not pools.
class HostStreamTable {
public:
  static HostStreamTable& instance() {
    static HostStreamTable table;
    return table;
  }
  void enqueue(std::uintptr_t stream) {
    const std::lock_guard lock(mutex_);
    ++work_[stream].queued;
  }
  void complete(std::uintptr_t stream) {
    const std::lock_guard lock(mutex_);
    Work& w = work_[stream];
    w.done = w.queued;
  }
  std::uint64_t queued(std::uintptr_t stream) {
    const std::lock_guard lock(mutex_);
    const auto it = work_.find(stream);
    return it == work_.end() ? 0 : it->second.queued;
  }
  std::uint64_t pending(std::uintptr_t stream) {
    const std::lock_guard lock(mutex_);
    const auto it = work_.find(stream);
    return it == work_.end() ? 0 : it->second.queued - it->second.done;
  }
  bool done(std::uintptr_t stream, std::uint64_t position) {
    const std::lock_guard lock(mutex_);
    const auto it = work_.find(stream);
    return it == work_.end() || it->second.done >= position;
  }
  // What cudaStreamIsCapturing says of `stream` on a GPU: no capture, one under way, or one an
  // error invalidated that has not been ended yet.
  enum class Capture { none, active, invalidated };
  void set_capture(std::uintptr_t stream, Capture state) {
    const std::lock_guard lock(mutex_);
    work_[stream].capture = state;
  }
  Capture capture(std::uintptr_t stream) {
    const std::lock_guard lock(mutex_);
    const auto it = work_.find(stream);
    return it == work_.end() ? Capture::none : it->second.capture;
  }
  bool capturing(std::uintptr_t stream) { return capture(stream) == Capture::active; }
  void set_capturing(std::uintptr_t stream, bool capturing) {
    set_capture(stream, capturing ? Capture::active : Capture::none);
  }

  // A whole-device synchronisation (what cudaDeviceSynchronize would be), counted for tests.
  void synchronized() noexcept { synchronizations_.fetch_add(1, std::memory_order_relaxed); }
  std::uint64_t synchronizations() const noexcept { return synchronizations_.load(std::memory_order_relaxed); }

  // For tests: `hook` is called with the stream each time an event is recorded on one (outside
  // the table's lock), so a test can act while a stack records its events; empty: none.
  void on_record(std::function<void(std::uintptr_t)> hook) {
    const std::lock_guard lock(mutex_);
    on_record_ = std::move(hook);
  }
  void recording(std::uintptr_t stream) {
    std::function<void(std::uintptr_t)> hook;
    {
      const std::lock_guard lock(mutex_);
      hook = on_record_;
    }
    if (hook) {
      hook(stream);
    }
  }

private:
  struct Work {
    std::uint64_t queued = 0;
    std::uint64_t done = 0;
    Capture capture = Capture::none;
  };
  std::mutex mutex_;
  std::unordered_map<std::uintptr_t, Work> work_;
  std::function<void(std::uintptr_t)> on_record_;
  std::atomic<std::uint64_t> synchronizations_{0};
};

// StreamEvents over HostStreamTable: an event is the stream and the work queued on it when it was
// recorded. No wait(): only the test completes work, so a pool that would wait says no instead.
// synchronize() completes a stream's work, as the host's wait for it would.
class HostStreams {
public:
  using stream_type = HostStream;
  struct event_type {
    std::uintptr_t stream = 0;
    std::uint64_t position = 0;
  };
  Result<event_type> record(HostStream s) {
    HostStreamTable::instance().recording(s.handle);
    return event_type{s.handle, HostStreamTable::instance().queued(s.handle)};
  }
  bool completed(event_type e) const { return HostStreamTable::instance().done(e.stream, e.position); }
  void release(event_type) noexcept {}
  // What cudaStreamSynchronize leaves true: the work queued on `s` has run. StreamUsesPool's
  // fallback where no event can be kept for a held free (out of host memory).
  void synchronize(HostStream s) noexcept {
    try {
      HostStreamTable::instance().complete(s.handle);
    } catch (const std::bad_alloc&) { // no entry could be made for it: nothing was queued there
    }
  }
};

static_assert(StreamEventsThatSynchronize<HostStreams>);

} // namespace carve::torch
