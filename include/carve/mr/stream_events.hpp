/// @file carve/mr/stream_events.hpp
/// Streams and the events recorded on them, as a stream-ordered pool needs them: the
/// `StreamEvents` concept, and `SimulatedStreams`, its host twin with ordered completion.
///
/// A stream runs its work in order. An event recorded on a stream completes when everything
/// queued on that stream before it has run. That is all a stream-ordered pool relies on: a block
/// freed on stream S may be handed to S again at once (whatever uses it next is queued behind
/// what used it before), and to another stream only once an event recorded on S at or after the
/// free has completed. `CudaStreams` (carve/mr/cuda_stream_events.hpp) is the real thing;
/// `SimulatedStreams` runs the same pool code on the host, where a test decides when work
/// completes.
#pragma once

#include <carve/core/error.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

namespace carve {

/// What a stream-ordered pool needs of streams: `record(stream)` returns an event that completes
/// once the work queued on `stream` so far has run, `completed(event)` asks without waiting, and
/// `release(event)` gives the event back. Streams compare equal when they are the same stream.
/// A type may also offer `wait(event)`, which blocks until the event completes (see
/// StreamEventsThatWait): a pool that must unmap memory a stream may still touch uses it rather
/// than fail.
template <class S>
concept StreamEvents = requires(S& s, typename S::stream_type stream, typename S::event_type event) {
  { s.record(stream) } -> std::same_as<Result<typename S::event_type>>;
  { s.completed(event) } -> std::convertible_to<bool>;
  { s.release(event) }
  noexcept;
  { stream == stream } -> std::convertible_to<bool>;
};

/// StreamEvents that can also block until an event completes.
template <class S>
concept StreamEventsThatWait = StreamEvents<S> && requires(S& s, typename S::event_type event) {
  { s.wait(event) }
  noexcept;
};

/// StreamEvents that can also block until the work queued on a stream so far has run:
/// `synchronize(stream)`. What a pool falls back on where no event can be recorded on a stream (one
/// of another device) or kept (out of host memory) but the stream's work must still be waited for.
template <class S>
concept StreamEventsThatSynchronize = StreamEvents<S> && requires(S& s, typename S::stream_type stream) {
  { s.synchronize(stream) }
  noexcept;
};

/// A simulated stream: a number. Two streams are the same when their numbers are.
struct SimulatedStream {
  std::uint32_t id = 0; ///< which stream
  /// Same stream.
  friend constexpr bool operator==(SimulatedStream, SimulatedStream) = default;
};

/// Streams whose work a test queues and completes by hand, in order per stream: the host twin of
/// CUDA streams and events. Thread-safe; copies share nothing, so hand the pool a reference
/// wrapper or keep one instance (the pool holds it by value; see StreamOrderedPool::streams()).
class SimulatedStreams {
public:
  /// A stream.
  using stream_type = SimulatedStream;
  /// An event: the stream and how much of its work must have run.
  struct event_type {
    std::uint32_t stream = 0;   ///< where it was recorded
    std::uint64_t position = 0; ///< the work queued on that stream when it was recorded
  };

  /// `streams` streams, numbered from 0, with nothing queued.
  explicit SimulatedStreams(std::uint32_t streams) : queued_(streams, 0), done_(streams, 0) {}
  /// Takes over the other's streams (not thread-safe: nothing else may use `other`).
  SimulatedStreams(SimulatedStreams&& other) noexcept
      : queued_(std::move(other.queued_)), done_(std::move(other.done_)) {}

  /// Queues one piece of work on `s` (a kernel that uses a block, say).
  void enqueue(SimulatedStream s) {
    const std::lock_guard lock(mutex_);
    ++queued_[index(s.id)];
  }
  /// Runs the oldest `n` pieces of `s`'s queued work (all of it when fewer are queued).
  void complete(SimulatedStream s, std::uint64_t n = ~std::uint64_t{0}) {
    const std::lock_guard lock(mutex_);
    const std::uint64_t left = queued_[index(s.id)] - done_[s.id];
    done_[s.id] += n < left ? n : left;
  }
  /// Work queued on `s` that has not run.
  std::uint64_t pending(SimulatedStream s) const {
    const std::lock_guard lock(mutex_);
    return queued_[index(s.id)] - done_[s.id];
  }

  /// An event after everything queued on `s` so far. Errors: out_of_range for an unknown stream.
  [[nodiscard]] Result<event_type> record(SimulatedStream s) {
    const std::lock_guard lock(mutex_);
    if (s.id >= queued_.size()) {
      return fail(Errc::out_of_range, "no simulated stream " + std::to_string(s.id));
    }
    return event_type{s.id, queued_[s.id]};
  }
  /// Whether the work before the event has run.
  bool completed(event_type e) const {
    const std::lock_guard lock(mutex_);
    return done_[index(e.stream)] >= e.position;
  }
  /// Nothing to give back. (No wait(): here only the test completes work, so a pool that would
  /// wait says no instead.)
  void release(event_type) noexcept {}

private:
  // `id` checked: carve::Exception (out_of_range) for a stream this object does not have.
  std::size_t index(std::uint32_t id) const {
    if (id >= queued_.size()) {
      throw Exception(Errc::out_of_range, "no simulated stream " + std::to_string(id));
    }
    return id;
  }

  mutable std::mutex mutex_;
  std::vector<std::uint64_t> queued_;
  std::vector<std::uint64_t> done_;
};

static_assert(StreamEvents<SimulatedStreams>);

/// The one stream of SynchronousStreams.
struct SynchronousStream {
  /// There is only one.
  friend constexpr bool operator==(SynchronousStream, SynchronousStream) noexcept { return true; }
};

/// Streams whose work has always run by the time a block is freed: host code, or a program that
/// synchronises before it frees. One stream, and every event is complete when it is recorded. The
/// default of pools that take a Streams parameter, so that they need none where nothing is queued.
class SynchronousStreams {
public:
  /// The stream.
  using stream_type = SynchronousStream;
  /// An event (complete from the start).
  struct event_type {};
  /// An event after all work so far: none is pending.
  [[nodiscard]] Result<event_type> record(SynchronousStream) noexcept { return event_type{}; }
  /// Always: the work ran before the call that recorded it returned.
  bool completed(event_type) const noexcept { return true; }
  /// Nothing to give back.
  void release(event_type) noexcept {}
  /// Nothing to wait for.
  void wait(event_type) const noexcept {}
  /// Nothing to wait for.
  void synchronize(SynchronousStream) const noexcept {}
};

static_assert(StreamEventsThatWait<SynchronousStreams> && StreamEventsThatSynchronize<SynchronousStreams>);

} // namespace carve
