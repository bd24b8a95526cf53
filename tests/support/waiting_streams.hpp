// WaitingSimulatedStreams: SimulatedStreams a pool can wait on, so that a test sees how much of a
// stream's work the pool's wait needed.
#pragma once

#include <carve/mr/stream_events.hpp>

#include <cstdint>
#include <functional>
#include <vector>

namespace carve::test {

// SimulatedStreams that can also wait, as CudaStreams can: a wait runs the stream's work up to the
// event only (as cudaEventSynchronize returns once the device has passed it), and `ran(stream)`
// then lets a test run those kernels (LateStreamWork does). After a pool's wait, the work queued
// after the event is still to run.
class WaitingSimulatedStreams : public SimulatedStreams {
public:
  explicit WaitingSimulatedStreams(std::uint32_t streams) : SimulatedStreams(streams), queued_(streams, 0) {}

  void enqueue(SimulatedStream s) {
    SimulatedStreams::enqueue(s);
    ++queued_.at(s.id);
  }
  void wait(event_type e) noexcept {
    const SimulatedStream s{e.stream};
    const std::uint64_t done = queued_[e.stream] - pending(s);
    complete(s, e.position > done ? e.position - done : 0);
    if (ran) {
      ran(e.stream);
    }
  }

  std::function<void(std::uint32_t)> ran;

private:
  std::vector<std::uint64_t> queued_;
};
static_assert(StreamEventsThatWait<WaitingSimulatedStreams>);

} // namespace carve::test
