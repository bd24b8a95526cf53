// carve/vmm/detail/stream_frees.hpp — what an ExpandablePool keeps about stream work on freed
// memory: per reservation, a fence saying which frees its stream's work has passed (memory is
// unmapped only then); and the frees made on another stream, waiting for that stream's work.
#pragma once

#include <carve/mr/stream_events.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <new>
#include <optional>
#include <utility>
#include <vector>

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
  // frees so far. `wait`: block until then, where the Streams can.
  bool settled(Streams& streams, const stream_type& stream, std::uint64_t since, std::uint64_t frees,
               bool wait) noexcept {
    for (int round = 0; round < 2 && since > settled_; ++round) { // an older fence first, then a new one
      if (!event_) {
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
        if (wait) {
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
};

// Blocks freed on a stream other than their reservation's: each waits for an event recorded on
// the freeing stream at the free. Not thread-safe: the pool holds its lock.
template <StreamEvents Streams, class Block>
class CrossStreamFrees {
public:
  using stream_type = typename Streams::stream_type;

  // `block` freed on `stream`. Throws std::bad_alloc (nothing changes; no event is lost).
  void add(Streams& streams, Block block, const stream_type& stream) {
    if (waiting_.size() == waiting_.capacity()) {
      waiting_.reserve(std::max<std::size_t>(8, 2 * waiting_.capacity()));
    }
    Waiting w{block, stream, std::nullopt};
    if (auto e = streams.record(stream)) {
      w.event = *e;
    } // else recorded again at the next collect
    waiting_.push_back(std::move(w));
  }
  // Calls `freed(block)` for each block whose stream's work has passed its free, and forgets it.
  // Throws std::bad_alloc when an event that failed to record cannot be recorded now for want of
  // memory (for its error's message); the blocks not yet collected stay.
  template <class Freed>
  void collect(Streams& streams, Freed&& freed) {
    for (std::size_t i = 0; i < waiting_.size();) {
      Waiting& w = waiting_[i];
      if (!w.event) {
        if (auto e = streams.record(w.stream)) {
          w.event = *e;
        }
      }
      if (!w.event || !streams.completed(*w.event)) {
        ++i;
        continue;
      }
      streams.release(*w.event);
      const Block block = w.block;
      waiting_[i] = std::move(waiting_.back());
      waiting_.pop_back();
      freed(block);
    }
  }
  // Blocks waiting.
  std::size_t size() const noexcept { return waiting_.size(); }
  // Gives every event back, first waiting for it where the Streams can.
  void close(Streams& streams) noexcept {
    for (Waiting& w : waiting_) {
      if (w.event) {
        if constexpr (StreamEventsThatWait<Streams>) {
          streams.wait(*w.event);
        }
        streams.release(*w.event);
      }
    }
    waiting_.clear();
  }

private:
  struct Waiting {
    Block block;
    stream_type stream;
    std::optional<typename Streams::event_type> event; // nullopt: recording failed, tried again later
  };
  std::vector<Waiting> waiting_;
};

} // namespace carve::detail
