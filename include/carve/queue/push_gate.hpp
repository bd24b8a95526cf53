/// @file carve/queue/push_gate.hpp
/// The closed flag, the pushes in flight and the sleeping
/// threads of a SizeTieredQueue, kept off the lines other threads write.
///
/// A consumer that finds every lane empty after close() must know whether a push that saw the
/// queue open is still on its way; a thread about to sleep must not miss the push or pop that
/// would wake it. Both are Dekker patterns (each side writes, then reads what the other wrote),
/// which need a full fence between the write and the read. On a line that another core wrote
/// last, that is the most expensive thing a queue does (a few hundred ns on a virtualised host
/// while its two virtual CPUs run far apart, against ~10 ns for a line the core already owns).
/// So the state is split into shards, each on lines of its own, and only the rare paths (close,
/// sleeping, the final check of a closed queue) visit every shard.
///
/// Each shard holds:
///  - `bits`: the pushes in flight of the threads that share the shard, the threads sleeping in
///    a blocking pop (readers) and push (writers), and the closed bit. A sleeper adds itself to
///    every shard; a push (pop) makes its change visible and then reads its shard's bits.
///  - `owned`: the pushes in flight of the one host thread whose thread_number() is the shard's
///    index, written by that thread alone.
///
/// Host threads with a shard of their own (thread numbers below `shards`) take the fast path:
/// plain stores and asymmetric_fence_light(), with the heavy half of the fence on the rare paths
/// (a sleeper after announcing itself; close() before it seals the queue). Every other thread
/// (more threads than shards, GPU threads, or no membarrier) does read-modify-writes on `bits`:
/// there, per shard, the two read-modify-writes are ordered, and either the waker sees the
/// announcement or the sleeper's second look sees the change.
///
/// A queue shared by host threads and a kernel at once must be closed from the host: a kernel
/// cannot issue the heavy fence that the host fast path relies on.
#pragma once

#include <carve/core/asymmetric_fence.hpp>
#include <carve/core/config.hpp>
#include <carve/core/thread_number.hpp>
#include <carve/queue/lane.hpp>

#include <cuda/atomic>
#include <cuda/std/cstdint>
#include <nv/target>

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

  // The calling thread's shard, and whether it is the shard's only writer of `owned`.
  struct Seat {
    std::uint32_t shard;
    bool owner;
  };
  CARVE_HOST_DEVICE CARVE_QUEUE_INLINE static Seat my_seat() noexcept {
    const std::uint32_t n = carve::thread_number();
    return {n % shards, n < owned_shards()};
  }
  // How many shards can have an owner where this runs: none on a device, or on a host without
  // asymmetric fences.
  CARVE_HOST_DEVICE static std::uint32_t owned_shards() noexcept {
    NV_IF_ELSE_TARGET(NV_IS_HOST, (return asymmetric_fences_available() ? shards : 0;), (return 0;))
  }

  // A push about to touch the lanes: counts it in flight. `open` is false once the queue is
  // closed; leave() must follow either way.
  struct Entry {
    Seat seat;
    bool open;
  };
  CARVE_HOST_DEVICE CARVE_QUEUE_INLINE Entry enter() noexcept {
    const Seat seat = my_seat();
    Shard& s = shard_[seat.shard];
    if (seat.owner) {
      s.owned.store(s.owned.load(cuda::std::memory_order_relaxed) + 1, cuda::std::memory_order_relaxed);
      fence_light();
      return {seat, closed_.load(cuda::std::memory_order_acquire) == 0};
    }
    const word w = s.bits.fetch_add(1, cuda::std::memory_order_acq_rel);
    return {seat, (w & closed_bit) == 0};
  }
  // After the push made its request visible (or gave up): the shard word, whose reader bits
  // say whether a consumer sleeps and whose closed bit whether all of them must wake.
  CARVE_HOST_DEVICE CARVE_QUEUE_INLINE word leave(const Entry& e) noexcept {
    Shard& s = shard_[e.seat.shard];
    if (e.seat.owner) {
      // Release: a consumer that sees the count drop also sees the request in its lane.
      s.owned.store(s.owned.load(cuda::std::memory_order_relaxed) - 1, cuda::std::memory_order_release);
      fence_light();
      return s.bits.load(cuda::std::memory_order_relaxed);
    }
    return s.bits.fetch_sub(1, cuda::std::memory_order_acq_rel);
  }
  // After a pop made its freed cell visible: the shard word, whose writer bits say whether a
  // producer sleeps.
  CARVE_HOST_DEVICE CARVE_QUEUE_INLINE word touch(const Seat& seat) noexcept {
    if (seat.owner) {
      fence_light();
      return shard_[seat.shard].bits.load(cuda::std::memory_order_relaxed);
    }
    return shard_[seat.shard].bits.fetch_add(0, cuda::std::memory_order_acq_rel);
  }

  // True once in `every` calls from the threads of `seat`'s shard: which pushes a queue that
  // samples its waits stamps. The counter sits on the line enter() just wrote; a plain load and
  // store, since a count lost between threads sharing the shard only moves the sample.
  CARVE_HOST_DEVICE CARVE_QUEUE_INLINE bool sample(const Seat& seat, std::uint32_t every) noexcept {
    auto& counter = shard_[seat.shard].sampled;
    const std::uint32_t n = counter.load(cuda::std::memory_order_relaxed) + 1;
    const bool take = n >= every;
    counter.store(take ? 0 : n, cuda::std::memory_order_relaxed);
    return take;
  }

  // The closed bit in every word (for the read-modify-write path), then the flag the fast path
  // reads; then the heavy fence, after which every fast push either counted itself where
  // drained() looks or saw the flag. Only then may consumers trust drained().
  CARVE_HOST_DEVICE void close() noexcept {
    for (auto& s : shard_) {
      s.bits.fetch_or(closed_bit, cuda::std::memory_order_acq_rel);
    }
    closed_.store(1, cuda::std::memory_order_release);
    fence_heavy();
    sealed_.store(1, cuda::std::memory_order_release);
  }
  CARVE_HOST_DEVICE bool closed() const noexcept { return closed_.load(cuda::std::memory_order_acquire) != 0; }

  // Closed, and no push in flight anywhere: every accepted request is visible in the lanes.
  CARVE_HOST_DEVICE bool drained() const noexcept {
    if (sealed_.load(cuda::std::memory_order_acquire) == 0) {
      return false;
    }
    for (const auto& s : shard_) {
      if ((s.bits.load(cuda::std::memory_order_acquire) & in_flight_mask) != 0 ||
          s.owned.load(cuda::std::memory_order_acquire) != 0) {
        return false;
      }
    }
    return true;
  }

  // A thread going to sleep (unit: reader or writer), before its second look, and coming back.
  CARVE_HOST_DEVICE void announce(word unit) noexcept {
    for (auto& s : shard_) {
      s.bits.fetch_add(unit, cuda::std::memory_order_acq_rel);
    }
    fence_heavy();
  }
  CARVE_HOST_DEVICE void withdraw(word unit) noexcept {
    for (auto& s : shard_) {
      s.bits.fetch_sub(unit, cuda::std::memory_order_relaxed);
    }
  }

private:
  CARVE_HOST_DEVICE static void fence_light() noexcept { NV_IF_TARGET(NV_IS_HOST, (asymmetric_fence_light();)) }
  CARVE_HOST_DEVICE static void fence_heavy() noexcept {
    NV_IF_TARGET(NV_IS_HOST, (if (asymmetric_fences_available()) { asymmetric_fence_heavy(); }))
  }

  struct alignas(interference_size) Shard {
    cuda::atomic<word, Scope> bits{0};
    cuda::atomic<std::uint32_t, Scope> owned{0};
    cuda::atomic<std::uint32_t, Scope> sampled{0}; // pushes since the last one sample() took
  };
  Shard shard_[shards];
  // Read-mostly: their own line.
  alignas(interference_size) cuda::atomic<std::uint32_t, Scope> closed_{0};
  cuda::atomic<std::uint32_t, Scope> sealed_{0};
};

} // namespace carve::detail
