// SimulatedStreams that count the events recorded on them: on a GPU each is a driver call, and
// while a pool is held (a CUDA graph capture) none may be recorded.
#pragma once

#include <carve/mr/stream_events.hpp>

namespace carve::test {

struct CountingStreams {
  using stream_type = SimulatedStream;
  using event_type = SimulatedStreams::event_type;
  SimulatedStreams* streams;
  int* recorded;
  Result<event_type> record(SimulatedStream s) {
    ++*recorded;
    return streams->record(s);
  }
  bool completed(event_type e) const { return streams->completed(e); }
  void release(event_type e) noexcept { streams->release(e); }
};
static_assert(StreamEvents<CountingStreams>);

} // namespace carve::test
