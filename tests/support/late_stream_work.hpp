// Random blocks on SimulatedStreams (or WaitingSimulatedStreams) whose work runs late, as a GPU's runs behind the host:
// each block's first kernel writes its pattern, and the kernel queued before its free checks that pattern and
// overwrites it, both run only when the test completes its stream's work. A block may be freed on another stream once
// its first kernel has run (as after an event). What a stream-ordered pool must never do under it: hand memory that
// another stream's queued work still uses to a new block, or disturb a block's bytes before its last kernel.
//
//   carve::test::LateStreamWork work(pool, 2);
//   work.random_steps(rng, 3000, {.small = 2 * page, .large = 9 * page}, [&](int step) { ... });
//   CHECK(work.intact());
#pragma once

#include "support/waiting_streams.hpp"

#include <carve/mr/stream_events.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <random>
#include <vector>

namespace carve::test {

// The sizes random_steps asks for: a quarter of the blocks from 3/8 of `large` up to `large`, the
// rest 1 byte up to `small`.
struct BlockSizes {
  std::size_t small = 0;
  std::size_t large = 0;
};

// Work queued on the streams of `Pool` (a pool over SimulatedStreams, used through its stream
// spellings) and the blocks it has handed out.
template <class Pool>
class LateStreamWork {
public:
  LateStreamWork(Pool& pool, std::uint32_t streams) : pool_(pool), queued_(streams, 0), work_(streams) {
    if constexpr (requires { pool.streams().ran; }) { // the pool's waits run kernels too
      pool_.streams().ran = [this](std::uint32_t s) { run(s); };
    }
  }
  LateStreamWork(const LateStreamWork&) = delete; // the streams call back into this one
  LateStreamWork& operator=(const LateStreamWork&) = delete;

  // `steps` random steps: allocate on a random stream (queuing the block's first kernel), free a
  // random live block (queuing the kernel before it on the stream it is freed on), run some of a
  // stream's work, or trim(); `each_step(step)` after each. Every new block is checked against live
  // blocks and other streams' queued work. Then all the work runs and the live blocks are freed.
  template <class EachStep>
  void random_steps(std::mt19937_64& rng, int steps, BlockSizes sizes, EachStep&& each_step) {
    const auto streams = static_cast<std::uint32_t>(queued_.size());
    for (int step = 0; step < steps && intact_; ++step) {
      const auto r = rng() % 100;
      if (r < 45 && live_.size() < 40) {
        const auto s = static_cast<std::uint32_t>(rng() % streams);
        const std::size_t bytes =
            rng() % 4 == 0 ? sizes.large * 3 / 8 + rng() % (sizes.large * 5 / 8) : 1 + rng() % sizes.small;
        if (const auto p = pool_.try_allocate(SimulatedStream{s}, bytes, 512)) {
          handed_out(s, static_cast<unsigned char*>(*p), bytes, static_cast<unsigned char>(1 + rng() % 200));
        }
      } else if (r < 85 && !live_.empty()) {
        const std::size_t i = rng() % live_.size();
        free_on(rng() % 4 == 0 ? static_cast<std::uint32_t>(rng() % streams) : std::uint32_t{~0u}, i);
      } else if (r < 97) {
        complete(static_cast<std::uint32_t>(rng() % streams), rng() % 4);
      } else {
        pool_.trim();
      }
      each_step(step);
    }
    complete_all();
    while (!live_.empty()) {
      free_on(~0u, live_.size() - 1);
    }
    complete_all();
  }

  // Runs up to `n` more pieces of stream `s`'s queued work.
  void complete(std::uint32_t s, std::uint64_t n) {
    pool_.streams().complete(SimulatedStream{s}, n);
    run(s);
  }
  void complete_all() {
    for (std::uint32_t s = 0; s < queued_.size(); ++s) {
      complete(s, ~std::uint64_t{0});
    }
  }
  // Calls `visit(p, bytes)` for every piece of work still queued: memory the pool must keep.
  template <class Visit>
  void for_each_queued(Visit&& visit) const {
    for (const auto& queue : work_) {
      for (const Work& w : queue) {
        visit(w.p, w.bytes);
      }
    }
  }
  // Whether every block's bytes held until its last kernel.
  bool intact() const noexcept { return intact_; }

private:
  struct Work {
    std::uint64_t position; // on its stream's queue
    unsigned char* p;
    std::size_t bytes;
    unsigned char pattern;
    bool last; // the kernel before a free: check the pattern, then overwrite it
  };
  struct Block {
    unsigned char* p;
    std::size_t bytes;
    std::uint32_t stream;
    unsigned char pattern;
    std::uint64_t first; // its first kernel's position
  };

  void handed_out(std::uint32_t s, unsigned char* p, std::size_t bytes, unsigned char pattern) {
    for (const Block& b : live_) {
      REQUIRE_FALSE((p < b.p + b.bytes && b.p < p + bytes));
    }
    for (std::uint32_t t = 0; t < work_.size(); ++t) {
      for (const Work& w : work_[t]) {
        REQUIRE_FALSE((t != s && w.last && p < w.p + w.bytes && w.p < p + bytes));
      }
    }
    queue(s, Work{0, p, bytes, pattern, false});
    live_.push_back(Block{p, bytes, s, pattern, queued_[s]});
  }
  // Frees live block `i` on stream `on` (~0u: its own), after its first kernel where `on` is another.
  void free_on(std::uint32_t on, std::size_t i) {
    const Block b = live_[i];
    live_[i] = live_.back();
    live_.pop_back();
    const std::uint32_t s = on == ~0u ? b.stream : on;
    const std::uint64_t done = queued_[b.stream] - pool_.streams().pending(SimulatedStream{b.stream});
    if (s != b.stream && done < b.first) {
      complete(b.stream, b.first - done);
    }
    queue(s, Work{0, b.p, b.bytes, b.pattern, true});
    pool_.deallocate(SimulatedStream{s}, b.p, b.bytes, 512);
  }
  void queue(std::uint32_t s, Work w) {
    pool_.streams().enqueue(SimulatedStream{s});
    w.position = ++queued_[s];
    work_[s].push_back(w);
  }
  // Runs the pieces of `s`'s work that the streams say have run.
  void run(std::uint32_t s) {
    const std::uint64_t done = queued_[s] - pool_.streams().pending(SimulatedStream{s});
    for (; !work_[s].empty() && work_[s].front().position <= done; work_[s].pop_front()) {
      const Work& w = work_[s].front();
      for (std::size_t k = 0; w.last && k < w.bytes; ++k) {
        intact_ = intact_ && w.p[k] == w.pattern;
      }
      std::memset(w.p, w.last ? 0xee : w.pattern, w.bytes);
    }
  }

  Pool& pool_;
  std::vector<std::uint64_t> queued_;
  std::vector<std::deque<Work>> work_;
  std::vector<Block> live_;
  bool intact_ = true;
};

} // namespace carve::test
