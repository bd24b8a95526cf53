/// @file carve/queue/queue_clock.hpp
/// The time stamps a SizeTieredQueue puts on requests.
///
/// A push stamps its request and its pop reads the clock again: the difference feeds the
/// wait-time histogram and lets StrictPriority age requests. Only where something reads them,
/// though: every request when the drain policy compares stamps, otherwise one in
/// QueueOptions::wait_sample (size_tiered_queue.hpp), since a read costs about as much as a
/// ring's push and pop together (about 10 ns on x86-64; benchmarks/queue.md). The default clock
/// is the cheapest monotonic counter each side has:
///   - host, x86-64: the time-stamp counter (about 4x cheaper than steady_clock; invariant on
///     every CPU of the last decade), converted to nanoseconds with a rate measured once;
///   - host, elsewhere: std::chrono::steady_clock, in nanoseconds;
///   - device: the %globaltimer register, in nanoseconds.
///
/// Host and device ticks are not comparable: a queue is stamped and drained on one side.
///
/// A clock is any type with (StampClock):
/// @code
/// static std::uint64_t now() noexcept;             // monotonic ticks, callable where the queue runs
/// static std::uint64_t ticks_from_ns(std::uint64_t); // for bounds given in nanoseconds
/// static double ns_per_tick();                      // host: for reports
/// @endcode
/// Tests use a manual clock to script time.
#pragma once

#include <carve/core/config.hpp>

#include <cuda/std/concepts>
#include <cuda/std/cstdint>
#include <nv/target>

#if !defined(__CUDA_ARCH__)
#include <chrono>
#include <thread>
#endif

namespace carve {

/// A clock a SizeTieredQueue stamps requests with: static now(), ticks_from_ns() and
/// ns_per_tick() (see the file's description).
template <class C>
concept StampClock = requires(std::uint64_t ns) {
  { C::now() } -> cuda::std::same_as<std::uint64_t>;
  { C::ticks_from_ns(ns) } -> cuda::std::same_as<std::uint64_t>;
  { C::ns_per_tick() } -> cuda::std::same_as<double>;
};

/// The default StampClock: the time-stamp counter on x86-64 hosts, steady_clock on other hosts,
/// %globaltimer on devices. Stateless; callable from any thread.
struct QueueClock {
  /// Monotonic ticks (host and device ticks are not comparable).
  CARVE_HOST_DEVICE static std::uint64_t now() noexcept {
    NV_IF_ELSE_TARGET(NV_IS_DEVICE,
                      (std::uint64_t t; asm volatile("mov.u64 %0, %%globaltimer;"
                                                     : "=l"(t));
                       return t;),
                      (return host_now();))
  }

  /// Nanoseconds per tick. Host: measured on first use (about 5 ms, once per process). Device: 1.
  CARVE_HOST_DEVICE static double ns_per_tick() noexcept {
    NV_IF_ELSE_TARGET(NV_IS_DEVICE, (return 1.0;), (return host_ns_per_tick();))
  }

  /// `ns` nanoseconds in ticks (for bounds given in nanoseconds, such as an aging bound).
  CARVE_HOST_DEVICE static std::uint64_t ticks_from_ns(std::uint64_t ns) noexcept {
    // Past 2^64 ticks (a bound of centuries, or a tick shorter than a nanosecond) it saturates:
    // converting such a double to an integer would be undefined.
    NV_IF_ELSE_TARGET(NV_IS_DEVICE, (return ns;), ({
                        const double ticks = static_cast<double>(ns) / host_ns_per_tick();
                        return ticks >= 18446744073709551616.0 ? ~std::uint64_t{0} : static_cast<std::uint64_t>(ticks);
                      }))
  }

private:
#if !defined(__CUDA_ARCH__)
  static std::uint64_t steady_ns() noexcept {
    return static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
            .count());
  }

#if defined(__x86_64__)
  // The time-stamp counter through the builtin __rdtsc() wraps: <x86intrin.h> would bring every x86
  // intrinsic header (AVX-512 included), about a second of parsing in each .cu that uses a queue.
  static std::uint64_t rdtsc() noexcept { return __builtin_ia32_rdtsc(); }
#endif

  static std::uint64_t host_now() noexcept {
#if defined(__x86_64__)
    return rdtsc();
#else
    return steady_ns();
#endif
  }

  static double host_ns_per_tick() noexcept {
#if defined(__x86_64__)
    static const double rate = [] {
      // Both clocks read twice, 5 ms apart; the first pair is taken tightly together.
      const std::uint64_t ns0 = steady_ns();
      const std::uint64_t t0 = rdtsc();
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      const std::uint64_t ns1 = steady_ns();
      const std::uint64_t t1 = rdtsc();
      return t1 > t0 ? static_cast<double>(ns1 - ns0) / static_cast<double>(t1 - t0) : 1.0;
    }();
    return rate;
#else
    return 1.0;
#endif
  }
#endif
};

static_assert(StampClock<QueueClock>);

} // namespace carve
