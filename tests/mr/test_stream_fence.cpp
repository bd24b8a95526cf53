// StreamFence (which frees a stream's work has passed, on a few events) and RecentFrees (which
// free an idle range must wait for): a wait ends at the oldest event after the free asked about,
// events recorded every few frees are given back once passed, the newest is replaced when too many
// are outstanding, and the free log forgets what the stream has passed.
#include "support/waiting_streams.hpp"

#include <carve/mr/detail/stream_fence.hpp>
#include <carve/mr/stream_events.hpp>
#include <carve/vmm/detail/recent_frees.hpp>

#include <doctest/doctest.h>

#include <cstdint>

// In a namespace of its own: the area's test files may compile as one translation unit.
namespace test_stream_fence {

using carve::SimulatedStream;

namespace {

// One stream whose wait runs its work up to the event only, counting the events the fence holds.
struct Streams : carve::test::WaitingSimulatedStreams {
  Streams() : WaitingSimulatedStreams(1) {}
  carve::Result<event_type> record(stream_type s) {
    ++held;
    return WaitingSimulatedStreams::record(s);
  }
  void release(event_type) noexcept { --held; }
  void enqueue() { WaitingSimulatedStreams::enqueue(SimulatedStream{0}); }

  int held = 0;
};
static_assert(carve::StreamEventsThatWait<Streams>);

constexpr SimulatedStream s0{0};

} // namespace

TEST_CASE("a wait ends at the oldest event after the free asked about, not at the newest work") {
  Streams streams;
  carve::detail::StreamFence<Streams> fence;
  for (std::uint64_t free = 1; free <= 40; ++free) { // a kernel, then its free, 40 times
    streams.enqueue();
    fence.mark(streams, s0, free, 16);
  }
  CHECK(streams.held == 3); // events after frees 1, 17 and 33
  CHECK_FALSE(fence.settled(streams, s0, 5, 40, false));
  CHECK(fence.waits() == 0);
  CHECK(fence.settled(streams, s0, 5, 40, true)); // waits for the event after free 17
  CHECK(fence.waits() == 1);
  CHECK(streams.pending(s0) == 23);
  CHECK(fence.settled_through() == 17);
  CHECK(streams.held == 1);                        // the two passed are given back
  CHECK(fence.settled(streams, s0, 12, 40, true)); // passed already: no wait
  CHECK(fence.waits() == 1);
  CHECK(fence.settled(streams, s0, 38, 40, true)); // after the newest event: one recorded now
  CHECK(fence.waits() == 2);
  CHECK(streams.pending(s0) == 0);
  CHECK(streams.held == 0);
}

TEST_CASE("events the stream has passed are given back at the next mark; the newest is replaced when many wait") {
  Streams streams;
  carve::detail::StreamFence<Streams> fence;
  fence.mark(streams, s0, 1, 4); // nothing queued: complete at once
  CHECK(streams.held == 1);
  fence.mark(streams, s0, 3, 4); // within 4 frees of the newest: nothing recorded
  CHECK(streams.held == 1);
  fence.mark(streams, s0, 5, 4); // the old one is given back, a new one recorded
  CHECK(streams.held == 1);
  CHECK(fence.settled_through() == 1);
  for (std::uint64_t free = 6; free < 1000; ++free) { // the stream never runs: events pile up, to a bound
    streams.enqueue();
    fence.mark(streams, s0, free, 4);
  }
  CHECK(streams.held <= 64);
  CHECK(fence.settled(streams, s0, 999, 999, true)); // the newest covers every free
  CHECK(streams.pending(s0) == 0);
  CHECK(streams.held == 0);
  streams.enqueue();
  fence.mark(streams, s0, 1000, 4);
  fence.close(streams);
  CHECK(streams.held == 0);
}

TEST_CASE("without room to record (a capture), only events recorded before are asked") {
  Streams streams;
  carve::detail::StreamFence<Streams> fence;
  streams.enqueue();
  CHECK_FALSE(fence.settled(streams, s0, 1, 1, false, false));
  CHECK(streams.held == 0);
  CHECK_FALSE(fence.settled(streams, s0, 1, 1, true, false)); // nothing to wait on
  CHECK(fence.waits() == 0);
  CHECK(fence.settled(streams, s0, 1, 1, true)); // recorded now, and waited for
  CHECK(fence.waits() == 1);
}

TEST_CASE("the free log: the last free that touched a range, until the stream passes it") {
  carve::detail::RecentFrees log;
  CHECK_FALSE(log.started());
  log.note(0x800, 0x100, 5); // the first noted: ranges the log never saw wait for free 4
  CHECK(log.last_touching(0x1000, 0x100) == 4);
  log.forget_through(5);
  CHECK(log.last_touching(0x1000, 0x100) == 0);
  CHECK(log.size() == 0);
  log.note(0x1000, 0x100, 6);
  log.note(0x2000, 0x100, 7);
  log.note(0x1080, 0x100, 8); // overlaps the first
  CHECK(log.last_touching(0x1000, 0x80) == 6);
  CHECK(log.last_touching(0x1000, 0x81) == 8);
  CHECK(log.last_touching(0x2000, 0x1000) == 7);
  CHECK(log.last_touching(0x3000, 0x1000) == 0); // never freed since: nothing to wait for
  log.forget_through(7);
  CHECK(log.size() == 1);
  CHECK(log.last_touching(0x1000, 0x80) == 0);
  CHECK(log.last_touching(0x1100, 0x80) == 8);
  log.forget_through(8);
  CHECK(log.size() == 0);
  CHECK(log.last_touching(0x1000, 0x1000) == 0);
}

} // namespace test_stream_fence
