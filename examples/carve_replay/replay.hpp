// Replaying a request stream through one allocator: the start state, then every request in order,
// measuring what the allocator reserved from the device, the device calls it made and its own host
// cost per request; and the smallest card on which the whole stream runs.
#pragma once

#include <carve/trace/allocation_trace.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace carve::replay {

// Dense stream numbers for the trace's recorded stream handles, in order of first appearance.
struct StreamNumbers {
  std::vector<std::uint32_t> of_block;
  std::uint32_t count = 1;
};

inline StreamNumbers number_streams(const trace::AllocationTrace& t) {
  StreamNumbers out;
  std::unordered_map<std::uint64_t, std::uint32_t> seen;
  out.of_block.reserve(t.blocks.size());
  for (const trace::TraceBlock& b : t.blocks) {
    const auto [it, inserted] = seen.emplace(b.stream, static_cast<std::uint32_t>(seen.size()));
    out.of_block.push_back(it->second);
  }
  out.count = std::max<std::uint32_t>(1, static_cast<std::uint32_t>(seen.size()));
  return out;
}

// An allocator under test, built for one replay on a card of a given capacity.
class Subject {
public:
  virtual ~Subject() = default;
  // A block of `bytes` for work on `stream` (dense stream numbers from 0); nullptr when refused.
  virtual void* allocate(std::size_t bytes, std::uint32_t stream) noexcept = 0;
  virtual void free(void* p, std::size_t bytes, std::uint32_t stream) noexcept = 0;
  virtual std::uint64_t reserved() const = 0;      // bytes held from the device now
  virtual std::uint64_t peak_reserved() const = 0; // the most it has held
  virtual std::uint64_t device_calls() const = 0;  // calls that changed what the device gave it
  virtual std::uint64_t device_ns() const = 0;     // time spent in them
  // Places the start blocks as the recording allocator had them (the trace's start segments), for
  // a model of that allocator; `at` receives their addresses. False where it cannot (then the
  // start blocks are allocated like requests).
  virtual bool seed(const trace::AllocationTrace&, const StreamNumbers&, std::vector<void*>&) { return false; }
};

// A named allocator: how to build it for a card of `capacity` bytes with `streams` streams.
struct Contender {
  std::string name;
  std::string description;
  std::function<std::unique_ptr<Subject>(std::uint64_t capacity, std::uint32_t streams)> make;
};

// One more run of a trace's requests after the first (replay's `again`): the blocks the trace
// both allocates and frees, allocated and freed again in the same order, while the blocks it left
// live stay. A longer run of the same steps, for what an allocator does after many of them.
struct AgainRun {
  std::uint64_t peak_reserved = 0; // the most it reserved during this run
  std::uint64_t peak_live = 0;     // the most bytes live during this run
  std::uint64_t device_calls = 0;  // made during this run
  bool completed = false;
};

// What one replay saw.
struct Run {
  bool completed = false;
  std::optional<std::uint64_t> failed_request; // index into trace.requests; start_blocks... for the start state
  std::uint64_t peak_reserved = 0;
  std::uint64_t device_calls = 0; // made while replaying the requests (building the start state not counted)
  std::uint64_t start_device_calls = 0;
  double ns_per_op = 0;                      // host time per allocate+free, device calls taken out
  bool from_recorded_start = false;          // the start blocks were placed as the recording had them
  std::vector<std::uint64_t> reserved_after; // per request, when asked for
  std::vector<AgainRun> again;               // the runs after the first, when asked for
};

// The requests of `t` again, `times` times, after replay() ran them once through `s` (`at`: where
// each block is now, null when not live; `live`: the bytes live now): see AgainRun.
inline std::vector<AgainRun> replay_again(const trace::AllocationTrace& t, const StreamNumbers& streams, Subject& s,
                                          std::vector<void*>& at, std::uint64_t live, int times) {
  std::vector<char> freed(t.blocks.size(), 0);
  for (const trace::TraceRequest& q : t.requests) {
    freed[q.block] = q.allocate ? freed[q.block] : 1;
  }
  std::vector<AgainRun> runs;
  for (int k = 0; k < times; ++k) {
    AgainRun run{s.reserved(), live, s.device_calls(), true};
    for (const trace::TraceRequest& q : t.requests) {
      const trace::TraceBlock& b = t.blocks[q.block];
      if (q.block < t.start_blocks || freed[q.block] == 0) {
        continue; // a start block freed is not allocated again; a block never freed stays live
      }
      if (q.allocate) {
        at[q.block] = s.allocate(b.bytes, streams.of_block[q.block]);
        if (at[q.block] == nullptr) {
          run.completed = false;
          break;
        }
        live += b.bytes;
      } else {
        s.free(at[q.block], b.bytes, streams.of_block[q.block]);
        at[q.block] = nullptr;
        live -= b.bytes;
      }
      run.peak_reserved = std::max(run.peak_reserved, s.reserved());
      run.peak_live = std::max(run.peak_live, live);
    }
    run.device_calls = s.device_calls() - run.device_calls;
    runs.push_back(run);
    if (!run.completed) {
      break;
    }
  }
  return runs;
}

// Replays `t` through `s`: the start blocks first (placed as the recording had them, with
// `from_recorded_start`, where `s` can), then the requests. Stops at the first refusal. With
// `curve`, records the reserved bytes after every request (slower: off for timing). With `again`,
// runs the requests that many more times after the first, untimed (replay_again).
inline Run replay(const trace::AllocationTrace& t, const StreamNumbers& streams, Subject& s, bool curve = false,
                  bool from_recorded_start = false, int again = 0) {
  Run run;
  std::vector<void*> at(t.blocks.size(), nullptr);
  const auto start = std::chrono::steady_clock::now();
  const bool seeded = from_recorded_start && s.seed(t, streams, at);
  run.from_recorded_start = seeded;
  for (std::uint32_t i = 0; i < t.start_blocks && !seeded; ++i) {
    at[i] = s.allocate(t.blocks[i].bytes, streams.of_block[i]);
    if (at[i] == nullptr) {
      run.failed_request = t.requests.size() + i; // a start block: past the requests' numbers
      break;
    }
  }
  run.start_device_calls = s.device_calls();
  if (curve) {
    run.reserved_after.reserve(t.requests.size());
  }
  for (std::uint64_t r = 0; r < t.requests.size() && !run.failed_request; ++r) {
    const trace::TraceRequest& q = t.requests[r];
    const trace::TraceBlock& b = t.blocks[q.block];
    if (q.allocate) {
      at[q.block] = s.allocate(b.bytes, streams.of_block[q.block]);
      if (at[q.block] == nullptr) {
        run.failed_request = r;
        break;
      }
    } else {
      s.free(at[q.block], b.bytes, streams.of_block[q.block]);
      at[q.block] = nullptr;
    }
    if (curve) {
      run.reserved_after.push_back(s.reserved());
    }
  }
  const auto elapsed = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
  run.completed = !run.failed_request;
  run.peak_reserved = s.peak_reserved();
  run.device_calls = s.device_calls() - run.start_device_calls;
  const double allocations = static_cast<double>(std::max<std::uint64_t>(1, t.blocks.size()));
  run.ns_per_op = std::max(0.0, elapsed - static_cast<double>(s.device_ns())) / allocations;
  if (again > 0 && run.completed) {
    std::uint64_t live = 0;
    for (std::uint32_t i = 0; i < at.size(); ++i) {
      live += at[i] != nullptr ? t.blocks[i].bytes : 0;
    }
    run.again = replay_again(t, streams, s, at, live, again);
  }
  // Blocks still live go back, so the allocator is torn down from a clean state.
  for (std::uint32_t i = 0; i < at.size(); ++i) {
    if (at[i] != nullptr) {
      s.free(at[i], t.blocks[i].bytes, streams.of_block[i]);
    }
  }
  return run;
}

// Whether the whole stream runs on a card of `capacity` bytes, and `again` more times after it.
inline bool fits(const trace::AllocationTrace& t, const StreamNumbers& streams, const Contender& c,
                 std::uint64_t capacity, int again = 0) {
  const auto subject = c.make(capacity, streams.count);
  const Run run = replay(t, streams, *subject, false, false, again);
  return run.completed && run.again.size() == static_cast<std::size_t>(again) &&
         (again == 0 || run.again.back().completed);
}

// The smallest card, to `step` bytes, on which the stream runs (and `again` more times after it):
// bisection between `floor` (below which nothing can run: the peak of live bytes) and `hint` (the
// allocator's peak on a roomy card), or `roomy` where the hint does not run. Whether a stream runs
// need not be monotone in the capacity (an allocator's choices change with what it is refused), so
// the answer is a capacity that runs with one `step` less that does not.
inline std::uint64_t smallest_card(const trace::AllocationTrace& t, const StreamNumbers& streams, const Contender& c,
                                   std::uint64_t floor, std::uint64_t hint, std::uint64_t roomy, std::uint64_t step,
                                   int again = 0) {
  std::uint64_t bad = floor > step ? (floor - 1) / step * step : 0; // a multiple of step below the floor
  std::uint64_t good = (std::max(hint, floor) + step - 1) / step * step;
  if (!fits(t, streams, c, good, again)) {
    good = (roomy + step - 1) / step * step;
  }
  while (good - bad > step) {
    const std::uint64_t mid = bad + (good - bad) / step / 2 * step;
    if (fits(t, streams, c, mid, again)) {
      good = mid;
    } else {
      bad = mid;
    }
  }
  return good;
}

} // namespace carve::replay
