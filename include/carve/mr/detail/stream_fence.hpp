// carve/mr/detail/stream_fence.hpp — which frees a stream's work has passed, asked with one event
// for many frees: what an ExpandablePool keeps per reservation (memory is unmapped only once the
// work passed its frees) and a StreamOrderedPool for the one stream it has seen (its blocks go to
// another user only then). Frees made on another stream wait in carve/mr/detail/cross_stream_frees.hpp.
#pragma once

#include <carve/mr/stream_events.hpp>

#include <cstdint>
#include <new>
#include <optional>

namespace carve::detail {

// Frees are numbered in order (the pool's count of frees). A block freed on its own stream is
// free at once, since the stream may reuse it, while its last kernels may still run; before the
// memory is unmapped, an event recorded on the stream after the free must have completed. A fence
// is that event and the free count it covers. Not thread-safe: the pool holds its lock.
template <StreamEvents Streams>
class StreamFence {
public:
  using stream_type = typename Streams::stream_type;

  // Whether the work `stream` queued before free number `since` has run; `frees` is the count of
  // frees so far. `wait`: block until then, where the Streams can. Without `may_record`, only an
  // event recorded before is asked (nothing may be recorded on `stream` now: a capture).
  bool settled(Streams& streams, const stream_type& stream, std::uint64_t since, std::uint64_t frees, bool wait,
               bool may_record = true) noexcept {
    for (int round = 0; round < 2 && since > settled_; ++round) { // an older fence first, then a new one
      if (!event_) {
        if (!may_record) {
          return false;
        }
        try {
          auto e = streams.record(stream);
          if (!e) {
            return false;
          }
          event_ = *e;
        } catch (const std::bad_alloc&) {
          return false;
        }
        covers_ = frees;
      }
      if constexpr (StreamEventsThatWait<Streams>) {
        if (wait && !streams.completed(*event_)) { // a host sync with the device: counted
          ++waits_;
          streams.wait(*event_);
        }
      }
      if (!streams.completed(*event_)) {
        return false;
      }
      settled_ = covers_;
      streams.release(*event_);
      event_.reset();
    }
    return since <= settled_;
  }
  // How often settled() blocked the caller until the stream's work ran (a host sync with the device).
  std::uint64_t waits() const noexcept { return waits_; }
  // Gives the event back.
  void close(Streams& streams) noexcept {
    if (event_) {
      streams.release(*event_);
      event_.reset();
    }
  }

private:
  std::uint64_t settled_ = 0; // the stream's work before this many frees has run
  std::optional<typename Streams::event_type> event_;
  std::uint64_t covers_ = 0; // what settled_ moves on to when event_ completes
  std::uint64_t waits_ = 0;
};

} // namespace carve::detail
