// src/torch/stream_uses.hpp — Tensor.record_stream under libcarve_torch: the streams besides its
// own that a block is used on, and the frees that wait for those streams' work.
//
// A block belongs to the stream it was allocated for, and PyTorch frees it there; work on that
// stream is ordered behind the free, so the pools may reuse it on that stream at once. A tensor
// also used on another stream (NCCL's, a copy's side stream) is named to the allocator with
// record_stream(ptr, stream): at its free, the block must wait until the work queued on each such
// stream so far has run, or a kernel still reading it there would see the next tensor's bytes.
// PyTorch names the block by address alone, so the uses are the process's (StreamUses), and the
// stack that frees the block holds the free (UsedFrees): an event recorded on each stream, the
// free made on the block's own stream once every event has completed.
#pragma once

#include "backends.hpp"

#include <carve/mr/stream_events.hpp>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <mutex>
#include <new>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

namespace carve::torch {

// Which blocks are used on streams other than their own. Thread-safe.
class StreamUses {
public:
  static StreamUses& instance() {
    static StreamUses* uses = new StreamUses; // never destroyed: frees may come at exit
    return *uses;
  }
  // `p` is used by work on `stream` too. Throws std::bad_alloc (nothing recorded).
  void record(void* p, cudaStream_t stream) {
    const std::lock_guard lock(mutex_);
    std::vector<cudaStream_t>& streams = uses_[p];
    if (std::find(streams.begin(), streams.end(), stream) == streams.end()) {
      streams.push_back(stream);
    }
    any_.store(true, std::memory_order_release);
  }
  // The streams `p` is used on besides `own`, forgotten: its free takes them.
  std::vector<cudaStream_t> take(void* p, cudaStream_t own) noexcept {
    std::vector<cudaStream_t> out;
    const std::lock_guard lock(mutex_);
    const auto it = uses_.find(p);
    if (it == uses_.end()) {
      return out;
    }
    out = std::move(it->second);
    uses_.erase(it);
    any_.store(!uses_.empty(), std::memory_order_release);
    std::erase(out, own);
    return out;
  }
  // Whether `p` is used on a stream other than `own` (its uses kept).
  bool used_elsewhere(void* p, cudaStream_t own) {
    if (!any()) {
      return false;
    }
    const std::lock_guard lock(mutex_);
    const auto it = uses_.find(p);
    return it != uses_.end() &&
           std::any_of(it->second.begin(), it->second.end(), [own](cudaStream_t s) { return s != own; });
  }
  // `p`'s uses dropped: it stays with a graph's private pool, whose replays order its uses.
  void forget(void* p) noexcept { (void)take(p, nullptr); }
  // Whether any block has a use recorded (read without the lock, so a free asks only then).
  bool any() const noexcept { return any_.load(std::memory_order_acquire); }

private:
  StreamUses() = default;
  std::mutex mutex_;
  std::unordered_map<void*, std::vector<cudaStream_t>> uses_;
  std::atomic<bool> any_{false};
};

// One stack's frees that wait for other streams' work. Thread-safe.
template <class Backend>
class UsedFrees {
public:
  // A free of `p` (`bytes`, allocated for `own`), which its pool would accept (the caller asked
  // it): whether it must wait, because `p` is used on other streams; then an event is recorded on
  // each, and the free is held. Out of host memory, those streams are synchronised instead, and
  // the free may be made at once.
  bool hold(cudaStream_t own, void* p, std::size_t bytes) noexcept {
    if (!StreamUses::instance().any()) {
      return false;
    }
    std::vector<cudaStream_t> streams = StreamUses::instance().take(p, own);
    if (streams.empty()) {
      return false;
    }
    try {
      Held h{p, bytes, own, {}};
      h.events.reserve(streams.size());
      const std::lock_guard lock(mutex_);
      if (held_.size() == held_.capacity()) {
        held_.reserve(std::max<std::size_t>(8, 2 * held_.capacity()));
      }
      for (const cudaStream_t s : streams) { // room was made for all: no event is lost
        h.events.push_back(Event{s, record(s)});
      }
      held_.push_back(std::move(h));
      count_.fetch_add(1, std::memory_order_release);
      return true;
    } catch (const std::bad_alloc&) {
      for (const cudaStream_t s : streams) {
        Backend::synchronize(s);
      }
      return false;
    }
  }
  // Whether any free is held (read without the lock).
  bool any() const noexcept { return count_.load(std::memory_order_acquire) != 0; }
  // Whether a free of `p` is held (a second free of it is a double free).
  bool holds(const void* p) {
    if (count_.load(std::memory_order_acquire) == 0) {
      return false;
    }
    const std::lock_guard lock(mutex_);
    for (const Held& h : held_) {
      if (h.p == p) {
        return true;
      }
    }
    return false;
  }
  // The held frees whose every stream has run past them (waited for first when `wait`, where the
  // Streams can): give(own, p, bytes) for each, which answers whether the free was made (false:
  // it stays held, to be made later).
  template <class Give>
  void collect(Give&& give, bool wait = false) noexcept {
    if (count_.load(std::memory_order_acquire) == 0) {
      return;
    }
    const std::lock_guard lock(mutex_);
    for (std::size_t i = 0; i < held_.size();) {
      if (!passed(held_[i], wait) || !give(held_[i].own, held_[i].p, held_[i].bytes)) {
        ++i;
        continue;
      }
      for (Event& e : held_[i].events) {
        if (e.event) {
          streams_.release(*e.event);
        }
      }
      held_[i] = std::move(held_.back());
      held_.pop_back();
      count_.fetch_sub(1, std::memory_order_release);
    }
  }
  ~UsedFrees() {
    for (Held& h : held_) {
      for (Event& e : h.events) {
        if (e.event) {
          streams_.release(*e.event);
        }
      }
    }
  }

private:
  using Streams = typename Backend::Streams;
  struct Event {
    cudaStream_t stream;
    std::optional<typename Streams::event_type> event; // nullopt: recording failed, tried again
  };
  struct Held {
    void* p;
    std::size_t bytes;
    cudaStream_t own;
    std::vector<Event> events;
  };

  std::optional<typename Streams::event_type> record(cudaStream_t s) noexcept {
    try {
      if (auto e = streams_.record(Backend::stream(s))) {
        return *e;
      }
    } catch (const std::exception&) {
    }
    return std::nullopt;
  }
  // Whether every stream `h` waits on has run its work up to the free. An event that could not be
  // recorded at the free is recorded now (it then covers more work, never less); one that cannot
  // be recorded at all (a stream of another device) is waited for by synchronising its stream.
  bool passed(Held& h, bool wait) noexcept {
    for (Event& e : h.events) {
      if (!e.event) {
        e.event = record(e.stream);
        if (!e.event) {
          Backend::synchronize(e.stream);
          continue;
        }
      }
      if constexpr (StreamEventsThatWait<Streams>) {
        if (wait) {
          streams_.wait(*e.event);
        }
      }
      try {
        if (!streams_.completed(*e.event)) {
          return false;
        }
      } catch (const std::exception&) {
        return false;
      }
    }
    return true;
  }

  std::mutex mutex_;
  Streams streams_;
  std::vector<Held> held_;
  std::atomic<std::size_t> count_{0}; // held_.size(), read without the lock
};

} // namespace carve::torch
