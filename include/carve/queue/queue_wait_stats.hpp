/// @file carve/queue/queue_wait_stats.hpp
/// How a SizeTieredQueue measures the time requests wait: which pushes read the clock, which
/// pops record a wait, and the histograms they record into (what stats() reports; the
/// histograms and the report's types are in queue_stats.hpp).
///
/// Reading the clock costs about as much as the ring's push, so a queue reads it only where
/// something reads the stamp: on every push when the drain policy compares stamps (aging,
/// arrival order) or every wait is recorded (QueueOptions::wait_sample == 1); otherwise on one
/// push in wait_sample, whose stamp is marked by its low bit so that the pop knows to record the
/// wait, and 0 for the rest.
///
/// Consumers record into histograms of their own PushGate shard, so that two consumers do not
/// fight over the bucket both just hit: a shard's owner thread alone, with no read-modify-write;
/// the threads that share shards in the slots after the owners'.
#pragma once

#include <carve/core/config.hpp>
#include <carve/core/heap_array.hpp>
#include <carve/queue/force_inline.hpp>
#include <carve/queue/push_gate.hpp>
#include <carve/queue/queue_stats.hpp>

#include <cuda/atomic>
#include <cuda/std/cstddef>
#include <cuda/std/cstdint>

namespace carve::detail {

// A queue's wait histograms, histogram_slots() x tiers, and its sampling rule (see the file's
// description). Set up once by allocate(); record() and stamp() from any number of threads.
template <cuda::thread_scope Scope>
class QueueWaitStats {
public:
  using Gate = PushGate<Scope>;
  using Seat = typename Gate::Seat;

  CARVE_HOST_DEVICE QueueWaitStats() noexcept {}
  QueueWaitStats(const QueueWaitStats&) = delete;
  QueueWaitStats& operator=(const QueueWaitStats&) = delete;
  CARVE_HOST_DEVICE ~QueueWaitStats() { release(); }

  // Histograms for `tiers` tiers and `owner_slots` shard owners (none in a queue built in device
  // code, whose threads never own a shard, or on a host without asymmetric fences), recording one
  // wait in `wait_sample` (0: none); `stamp_every`: every push reads the clock (see the file's
  // description). False when the histograms got no memory (device code: the heap is full).
  CARVE_HOST_DEVICE bool allocate(std::uint32_t tiers, std::uint32_t owner_slots, std::uint32_t wait_sample,
                                  bool stamp_every) {
    release(); // a second allocate replaces the first histograms
    tiers_ = tiers;
    owner_slots_ = owner_slots;
    wait_sample_ = wait_sample;
    stamp_every_ = stamp_every;
    waits_ = new_heap_array<WaitHistogram<Scope>>(histogram_count()); // nullptr: no memory
    return waits_ != nullptr;
  }
  CARVE_HOST_DEVICE void release() noexcept {
    delete_heap_array(waits_, histogram_count());
    waits_ = nullptr;
  }

  // The stamp a push puts on its request (see the file's description).
  template <class Clock>
  CARVE_HOST_DEVICE CARVE_QUEUE_INLINE std::uint64_t stamp(Gate& gate, const Seat& seat) noexcept {
    if (stamp_every_) {
      return Clock::now();
    }
    if (wait_sample_ != 0 && gate.sample(seat, wait_sample_)) {
      return Clock::now() | 1U;
    }
    return 0;
  }

  // Records the wait of a request popped from `tier` with `stamp`, if it was sampled; where every
  // request is stamped, one pop in wait_sample records (counted in the seat's tier-0 histogram).
  // `now()` gives the clock's ticks, read only when the wait is recorded.
  template <class Now>
  CARVE_HOST_DEVICE void record(const Seat& seat, std::uint32_t tier, std::uint64_t stamp, const Now& now) noexcept {
    if (stamp_every_) {
      if (wait_sample_ == 0 || (wait_sample_ != 1 && !mine(seat, 0).sample(wait_sample_))) {
        return;
      }
    } else if (stamp == 0) {
      return;
    }
    const std::uint64_t at = now();
    const std::uint64_t ticks = at > stamp ? at - stamp : 0;
    if (seat.owner) {
      mine(seat, tier).record_alone(ticks);
    } else {
      mine(seat, tier).record(ticks);
    }
  }

  // Sums every slot's histogram of `tier` into `s`.
  CARVE_HOST_DEVICE void add_to(std::uint32_t tier, WaitHistogramSnapshot& s) const noexcept {
    if (waits_ == nullptr) {
      return;
    }
    for (std::uint32_t slot = 0; slot < histogram_slots(); ++slot) {
      at(slot, tier).add_to(s);
    }
  }

private:
  CARVE_HOST_DEVICE std::uint32_t histogram_slots() const noexcept { return owner_slots_ + Gate::shards; }
  CARVE_HOST_DEVICE cuda::std::size_t histogram_count() const noexcept {
    return cuda::std::size_t{histogram_slots()} * tiers_;
  }
  // Mutable from const calls too: the report reads the same histograms pops record into.
  CARVE_HOST_DEVICE WaitHistogram<Scope>& at(std::uint32_t slot, std::uint32_t tier) const noexcept {
    return waits_[cuda::std::size_t{slot} * tiers_ + tier];
  }
  CARVE_HOST_DEVICE WaitHistogram<Scope>& mine(const Seat& seat, std::uint32_t tier) const noexcept {
    return at(seat.owner ? seat.shard : owner_slots_ + seat.shard, tier);
  }

  WaitHistogram<Scope>* waits_ = nullptr;
  std::uint32_t tiers_ = 0;
  std::uint32_t owner_slots_ = 0;
  std::uint32_t wait_sample_ = 0;
  bool stamp_every_ = true;
};

} // namespace carve::detail
