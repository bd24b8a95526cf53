// carve/queue/push_gate.hpp — PushGate: the closed flag, the pushes in flight and the sleeping
// threads of a SizeTieredQueue, kept off the lines other threads write.
//
// A consumer that finds every lane empty after close() must know whether a push that saw the
// queue open is still on its way; a thread about to sleep must not miss the push or pop that
// would wake it. Both need a read-modify-write on every push and pop, and a read-modify-write
// on a cache line that another core wrote last is the most expensive thing a queue does (a
// few hundred ns on a virtualised two-core host, against ~10 ns for a line the core already
// owns). So the word is split into shards, each on lines of its own: a thread counts its pushes in
// its own shard, and only the rare paths (close, sleeping, the final check of a closed queue)
// visit every shard.
//
// Each shard word holds the pushes in flight through it, the threads sleeping in a blocking
// pop (readers) and push (writers), and the closed bit. A sleeper adds itself to every shard
// and then looks at the lanes again; a push (pop) makes its change visible and then does its
// read-modify-write on its own shard. Per shard the two read-modify-writes are ordered: either
// the waker sees the announcement and wakes the sleeper, or the sleeper's synchronizes with
// the waker's and its second look sees the change. No fence on the fast path.
#pragma once

#include <carve/core/config.hpp>
#include <carve/core/thread_number.hpp>

#include <cuda/atomic>
#include <cuda/std/cstdint>

namespace carve::detail {

template <cuda::thread_scope Scope>
class PushGate {
public:
  using word = std::uint64_t;
  static constexpr word closed_bit = word{1} << 63;
  static constexpr word in_flight_mask = 0xffff'ffffULL;
  static constexpr word reader = word{1} << 32; // a thread sleeping in a blocking pop
  static constexpr word readers_mask = 0xffffULL << 32;
  static constexpr word writer = word{1} << 48; // a thread sleeping in a blocking push
  static constexpr word writers_mask = 0x7fffULL << 48;
  // Shared memory is one cache for the whole block: sharding it would only cost room.
  static constexpr std::uint32_t shards = Scope == cuda::thread_scope_block ? 1 : 16;

  // A push about to touch the lanes: counts it in flight on the calling thread's shard.
  // `open` is false once the queue is closed; leave() must follow either way.
  struct Entry {
    std::uint32_t shard;
    bool open;
  };
  // The calling thread's shard; also the index of its share of other per-thread state.
  CARVE_HOST_DEVICE static std::uint32_t my_shard() noexcept { return carve::thread_number() % shards; }

  CARVE_HOST_DEVICE Entry enter() noexcept {
    const std::uint32_t s = my_shard();
    const word w = shard_[s].value.fetch_add(1, cuda::std::memory_order_acq_rel);
    return {s, (w & closed_bit) == 0};
  }
  // After the push made its request visible (or gave up): the shard word as it left it, whose
  // reader bits say whether a consumer sleeps.
  CARVE_HOST_DEVICE word leave(const Entry& e) noexcept {
    return shard_[e.shard].value.fetch_sub(1, cuda::std::memory_order_acq_rel);
  }
  // After a pop made its freed cell visible: the calling thread's shard word, whose writer bits
  // say whether a producer sleeps.
  CARVE_HOST_DEVICE word touch(std::uint32_t shard) noexcept {
    return shard_[shard].value.fetch_add(0, cuda::std::memory_order_acq_rel);
  }

  // Every shard first, then the flag that readers check cheaply: a thread that sees the flag
  // also sees the bit in every shard.
  CARVE_HOST_DEVICE void close() noexcept {
    for (auto& s : shard_) {
      s.value.fetch_or(closed_bit, cuda::std::memory_order_acq_rel);
    }
    closed_.store(1, cuda::std::memory_order_release);
  }
  CARVE_HOST_DEVICE bool closed() const noexcept { return closed_.load(cuda::std::memory_order_acquire) != 0; }

  // Closed, and no push in flight anywhere: every accepted request is visible in the lanes.
  CARVE_HOST_DEVICE bool drained() const noexcept {
    if (!closed()) {
      return false;
    }
    for (const auto& s : shard_) {
      if ((s.value.load(cuda::std::memory_order_acquire) & in_flight_mask) != 0) {
        return false;
      }
    }
    return true;
  }

  // A thread going to sleep (unit: reader or writer) and coming back.
  CARVE_HOST_DEVICE void announce(word unit) noexcept {
    for (auto& s : shard_) {
      s.value.fetch_add(unit, cuda::std::memory_order_acq_rel);
    }
  }
  CARVE_HOST_DEVICE void withdraw(word unit) noexcept {
    for (auto& s : shard_) {
      s.value.fetch_sub(unit, cuda::std::memory_order_relaxed);
    }
  }

private:
  struct alignas(interference_size) Shard {
    cuda::atomic<word, Scope> value{0};
  };
  Shard shard_[shards];
  alignas(interference_size) cuda::atomic<std::uint32_t, Scope> closed_{0}; // read-mostly: its own line
};

} // namespace carve::detail
