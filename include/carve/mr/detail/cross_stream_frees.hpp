// carve/mr/detail/cross_stream_frees.hpp — blocks freed on another stream than the one they were
// allocated for, each waiting for an event recorded on the freeing stream at the free. The stream
// pools (StreamCachingPool, ExpandablePool) keep one each and take a block back only once that
// event has completed: until then the freeing stream's kernels may still use it.
#pragma once

#include <carve/mr/stream_events.hpp>

#include <algorithm>
#include <cstddef>
#include <exception>
#include <new>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

namespace carve::detail {

// Not thread-safe: the pool holds its lock around every call.
template <StreamEvents Streams, class Block>
class CrossStreamFrees {
public:
  using stream_type = typename Streams::stream_type;

  // `block` freed on `stream`. Throws std::bad_alloc (nothing changes; no event is lost). A
  // recording that fails, or that `may_record` forbids (the pool is held: `stream` may be
  // capturing a graph, and an event recorded into a capture is never recorded on the stream), is
  // made at a later collect that may record.
  void add(Streams& streams, Block block, const stream_type& stream, bool may_record = true) {
    if (waiting_.size() == waiting_.capacity()) {
      waiting_.reserve(std::max<std::size_t>(8, 2 * waiting_.capacity()));
    }
    Waiting w{std::move(block), stream, std::nullopt};
    if (may_record) {
      if (auto e = streams.record(stream)) {
        w.event = *e;
      }
    }
    waiting_.push_back(std::move(w)); // room was made: cannot throw, so the event is not lost
  }

  // Offers each block whose freeing stream has passed its free to `freed(block)`, which answers
  // whether it is done with the block (false: it stays, to be offered again later); with `wait`,
  // first waits for each event where the Streams can. Events not yet recorded are recorded now
  // where `may_record` (see add). Returns how many it was done with. A block whose Streams throw
  // (std::bad_alloc where a recording that failed cannot be made now) stays, the others are still
  // offered, and the first exception is thrown at the end.
  template <class Freed>
  requires std::is_invocable_r_v<bool, Freed&, const Block&> std::size_t
  collect(Streams& streams, Freed&& freed, bool wait = false, bool may_record = true) {
    std::size_t taken = 0;
    std::exception_ptr failed;
    for (std::size_t i = 0; i < waiting_.size();) {
      Waiting& w = waiting_[i];
      bool passed = false;
      try {
        passed = has_passed(streams, w, wait, may_record);
      } catch (...) {
        if (!failed) {
          failed = std::current_exception();
        }
      }
      if (!passed || !freed(std::as_const(w.block))) {
        ++i;
        continue;
      }
      streams.release(*w.event);
      waiting_[i] = std::move(waiting_.back());
      waiting_.pop_back();
      ++taken;
    }
    if (failed) {
      std::rethrow_exception(failed);
    }
    return taken;
  }

  // Whether some waiting block satisfies `match`.
  template <class Match>
  bool any_of(Match&& match) const {
    return std::any_of(waiting_.begin(), waiting_.end(), [&](const Waiting& w) { return match(w.block); });
  }
  // Blocks waiting.
  std::size_t size() const noexcept { return waiting_.size(); }

  // Gives every event back, first waiting for it where the Streams can, and forgets the blocks.
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
    std::optional<typename Streams::event_type> event; // nullopt: not recorded yet (failed, or held)
  };

  // Whether `w`'s freeing stream has run past its free (recording its event now if it has none
  // and `may_record`).
  static bool has_passed(Streams& streams, Waiting& w, bool wait, bool may_record) {
    if (!w.event && may_record) {
      if (auto e = streams.record(w.stream)) {
        w.event = *e;
      }
    }
    if constexpr (StreamEventsThatWait<Streams>) {
      if (wait && w.event) {
        streams.wait(*w.event);
      }
    }
    return w.event && streams.completed(*w.event);
  }
  std::vector<Waiting> waiting_;
};

} // namespace carve::detail
