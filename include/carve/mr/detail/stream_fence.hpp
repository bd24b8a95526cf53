// carve/mr/detail/stream_fence.hpp — which frees a stream's work has passed, asked with a few
// events for many frees: what an ExpandablePool keeps per reservation (memory is unmapped only once
// the work passed its frees) and a StreamOrderedPool for the one stream it has seen (its blocks go
// to another user only then). Frees made on another stream wait in carve/mr/detail/cross_stream_frees.hpp.
#pragma once

#include <carve/mr/stream_events.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <new>

namespace carve::detail {

// Frees are numbered in order (the pool's count of frees). A block freed on its own stream is
// free at once, since the stream may reuse it, while its last kernels may still run; before the
// memory is unmapped, an event recorded on the stream after the free must have completed. A fence
// keeps a few such events, each with the free count it covers, oldest first: an owner that marks
// its frees now and then (mark) can later wait for the oldest event after the free it cares about
// rather than for everything queued since, so the device still has work when the wait ends (a
// wait on an event recorded now drains the stream, and the device idles while the host catches
// up). Not thread-safe: the pool holds its lock.
template <StreamEvents Streams>
class StreamFence {
public:
  using stream_type = typename Streams::stream_type;

  // Whether the work `stream` queued before free number `since` has run; `frees` is the count of
  // frees so far. `wait`: block until then, where the Streams can, on the oldest event that covers
  // `since` (recorded now where none does). Without `may_record`, only events recorded before are
  // asked (nothing may be recorded on `stream` now: a capture).
  bool settled(Streams& streams, const stream_type& stream, std::uint64_t since, std::uint64_t frees, bool wait,
               bool may_record = true) noexcept {
    retire(streams, since);
    if (since <= settled_) {
      return true;
    }
    std::size_t i = 0;
    while (i < count_ && marks_[i].covers < since) {
      ++i;
    }
    // None covers it: one recorded now, unless this is only a question and the stream has yet to
    // pass an older one (asked again later, it will have).
    if (i == count_ && (!may_record || (!wait && count_ != 0) || !record(streams, stream, frees))) {
      return false;
    }
    i = std::min(i, count_ - 1); // record() may have replaced the newest
    if constexpr (StreamEventsThatWait<Streams>) {
      if (wait && !streams.completed(marks_[i].event)) { // a host sync with the device: counted
        ++waits_;
        streams.wait(marks_[i].event);
      }
    }
    if (!streams.completed(marks_[i].event)) {
      return false;
    }
    settled_ = marks_[i].covers;
    drop(streams, i + 1); // the stream ran in order: the older events have completed too
    return true;
  }

  // At free number `frees` on `stream`: records an event after it where none is outstanding or the
  // newest covers `every` frees fewer, so that a wait for this free need not wait for what the
  // stream queues later. Never waits; events that have completed are given back first.
  void mark(Streams& streams, const stream_type& stream, std::uint64_t frees, std::uint64_t every) noexcept {
    if (count_ != 0 && frees - marks_[count_ - 1].covers < every) {
      return;
    }
    retire(streams, frees);
    (void)record(streams, stream, frees);
  }

  // The frees the stream's work is known to have passed: free numbers up to this one.
  std::uint64_t settled_through() const noexcept { return settled_; }
  // How often settled() blocked the caller until the stream's work ran (a host sync with the device).
  std::uint64_t waits() const noexcept { return waits_; }

  // Gives the events back.
  void close(Streams& streams) noexcept { drop(streams, count_); }

private:
  static constexpr std::size_t most = 64; // events outstanding at once: the newest is replaced beyond

  struct Mark {
    typename Streams::event_type event;
    std::uint64_t covers; // what settled_ moves on to when the event completes
  };

  // Gives back the oldest events that have completed, until one covers `since` or one has not.
  void retire(Streams& streams, std::uint64_t since) noexcept {
    std::size_t done = 0;
    while (done < count_ && settled_ < since && streams.completed(marks_[done].event)) {
      settled_ = marks_[done++].covers;
    }
    drop(streams, done);
  }
  // Gives back the oldest `n` events.
  void drop(Streams& streams, std::size_t n) noexcept {
    for (std::size_t k = 0; k < n; ++k) {
      streams.release(marks_[k].event);
    }
    for (std::size_t k = n; k < count_; ++k) {
      marks_[k - n] = marks_[k];
    }
    count_ -= n;
  }
  // An event after everything `stream` has queued, covering `frees`, as the newest (in place of the
  // newest when `most` are outstanding). False when it could not be recorded.
  bool record(Streams& streams, const stream_type& stream, std::uint64_t frees) noexcept {
    try {
      auto e = streams.record(stream);
      if (!e) {
        return false;
      }
      if (count_ == most) {
        streams.release(marks_[--count_].event);
      }
      marks_[count_++] = Mark{*e, frees};
      return true;
    } catch (const std::bad_alloc&) {
      return false;
    }
  }

  std::uint64_t settled_ = 0; // the stream's work before this many frees has run
  std::array<Mark, most> marks_{};
  std::size_t count_ = 0;
  std::uint64_t waits_ = 0;
};

} // namespace carve::detail
