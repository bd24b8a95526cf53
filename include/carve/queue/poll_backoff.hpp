/// @file carve/queue/poll_backoff.hpp
/// PollBackoff: how long a thread that polls a queue waits, after
/// finding it empty (or full), before it looks again.
///
/// @code
/// carve::PollBackoff idle;                 // first wait 8 us, doubling up to 64 us
/// for (;;) {
///   if (auto r = q.try_pop()) {
///     idle.reset();
///     handle(*r);
///   } else if (r.error() == carve::Errc::closed) {
///     break;
///   } else {
///     idle.wait();
///   }
/// }
/// @endcode
///
/// Why the first wait is microseconds, not a few pause instructions: a look at an empty queue
/// reads the cache line the producer is filling, and the producer's next write has to take that
/// line back. Where the two threads run on cores that pass lines slowly (two core complexes of an
/// AMD EPYC, two sockets: 200-300 ns a line), a consumer that looks again at once makes the line
/// cross between the cores for nearly every request, and the producer slows down to match. In
/// bench_queue_cost's pipeline there, round-robin tiers took 91-136 ns per request with retries
/// after 1, 2, 4 ... 64 pauses and 51-61 ns with this back-off; a single MpmcRing 36-65 and 7-12
/// (docs/queue-cost.md). A few microseconds let the producer fill whole lines, which the
/// consumer then takes a block at a time. Where lines move fast, throughput is the same or better.
///
/// The price is latency: a request that arrives while the consumer waits is seen up to one wait
/// later, so at most max_ns() after it arrived (in that benchmark while lines moved slowly, small
/// requests' p99 time in a strict-priority queue went from 1.5 us to 12 us). Where that matters
/// more than throughput, pass a shorter first wait; PollBackoff(0, 0) looks again at once.
///
/// Host: yields the core (std::this_thread::yield) until steady_clock passes the wait. Where more
/// threads are runnable than there are cores, as in examples/embedding_lookup on two cores, they
/// get the core for the wait; where none is, yield returns at once and the wait is what it was
/// when it spun on cpu_pause() (bench_queue_cost: the same or lower). Device: __nanosleep (sm_70
/// and later) until %globaltimer passes it.
#pragma once

#include <carve/core/config.hpp>
#include <carve/queue/backoff.hpp>
#include <carve/queue/queue_clock.hpp>

#include <cuda/std/cstdint>
#include <nv/target>

#if !defined(__CUDA_ARCH__)
#include <chrono>
#include <thread>
#endif

namespace carve {

/// A Backoff whose waits start at first_ns() and double up to max_ns(); reset() after a
/// successful look. One object per polling thread (not thread-safe).
class PollBackoff {
public:
  static constexpr std::uint32_t default_first_ns = 8'000; ///< 8 us: the first wait by default
  static constexpr std::uint32_t default_max_ns = 64'000;  ///< 64 us: the longest wait by default

  /// 8 us, doubling up to 64 us.
  CARVE_HOST_DEVICE constexpr PollBackoff() noexcept : PollBackoff(default_first_ns, default_max_ns) {}
  /// Waits start at `first_ns` and double up to `max_ns` (raised to `first_ns` when below it).
  CARVE_HOST_DEVICE constexpr PollBackoff(std::uint32_t first_ns, std::uint32_t max_ns) noexcept
      : first_(first_ns), max_(max_ns < first_ns ? first_ns : max_ns), next_(first_ns) {}

  /// Waits next_ns(), then doubles the next wait, up to max_ns().
  CARVE_HOST_DEVICE void wait() noexcept {
    NV_IF_ELSE_TARGET(NV_IS_HOST, (spin_for(next_);), (sleep_for(next_);))
    next_ = next_ >= max_ / 2 ? max_ : 2 * next_;
  }
  /// After a successful look: the next wait is the first one again.
  CARVE_HOST_DEVICE constexpr void reset() noexcept { next_ = first_; }

  /// How long the next wait() waits, in nanoseconds.
  CARVE_HOST_DEVICE constexpr std::uint32_t next_ns() const noexcept { return next_; }
  /// The first wait after construction or reset(), in nanoseconds.
  CARVE_HOST_DEVICE constexpr std::uint32_t first_ns() const noexcept { return first_; }
  /// The longest wait, in nanoseconds.
  CARVE_HOST_DEVICE constexpr std::uint32_t max_ns() const noexcept { return max_; }

private:
#if !defined(__CUDA_ARCH__)
  static void spin_for(std::uint32_t ns) noexcept {
    if (ns == 0) {
      return;
    }
    const auto until = std::chrono::steady_clock::now() + std::chrono::nanoseconds(ns);
    do {
      std::this_thread::yield();
    } while (std::chrono::steady_clock::now() < until);
  }
#else
  __device__ static void sleep_for(std::uint32_t ns) noexcept {
    const std::uint64_t until = QueueClock::now() + ns; // %globaltimer: ns
    while (QueueClock::now() < until) {
#if __CUDA_ARCH__ >= 700
      __nanosleep(ns); // sleeps anywhere from 0 to about 2 * ns: the loop checks the time
#endif
    }
  }
#endif

  std::uint32_t first_;
  std::uint32_t max_;
  std::uint32_t next_;
};

/// What MpmcRing (so RingLanes) waits by default after losing a race for a position: the winner
/// runs on with the lines its core holds (mpmc_ring.hpp). Host threads wait as PollBackoff does
/// by default. Device threads start at 64 ns and double up to 2 us: the 32 threads of a warp
/// race at once and all but one lose, so microsecond waits would add up to milliseconds for the
/// last; these device lengths are not yet measured on a GPU.
class LostRaceBackoff : public PollBackoff {
public:
  /// Host: 8 us doubling to 64 us; device: 64 ns doubling to 2 us.
  CARVE_HOST_DEVICE LostRaceBackoff() noexcept : PollBackoff(first_wait_ns(), max_wait_ns()) {}

private:
  CARVE_HOST_DEVICE static std::uint32_t first_wait_ns() noexcept {
    NV_IF_ELSE_TARGET(NV_IS_HOST, (return default_first_ns;), (return 64;))
  }
  CARVE_HOST_DEVICE static std::uint32_t max_wait_ns() noexcept {
    NV_IF_ELSE_TARGET(NV_IS_HOST, (return default_max_ns;), (return 2'000;))
  }
};

static_assert(Backoff<PollBackoff> && Backoff<LostRaceBackoff>);

} // namespace carve
