/// @file carve/queue/backoff.hpp
/// The Backoff concept: how long a thread waits before it tries again.
///
/// A Backoff is default-constructed at the start of one attempt to push or pop, and its wait() is
/// called before each retry; it keeps whatever state it needs to grow the waits within that
/// attempt. Models: PollBackoff (microseconds, doubling), LostRaceBackoff (poll_backoff.hpp)
/// and RetryAtOnce. MpmcRing takes one as its wait after a lost race (mpmc_ring.hpp says why).
///
/// A Backoff with other lengths is a small type of its own:
///
/// @code
/// struct ShortBackoff : carve::PollBackoff {
///   constexpr ShortBackoff() noexcept : carve::PollBackoff(500, 4'000) {}
/// };
/// using Lanes = carve::RingLanes<cuda::thread_scope_system, ShortBackoff>;
/// @endcode
#pragma once

#include <carve/core/config.hpp>

#include <cuda/std/concepts>

namespace carve {

/// A wait before a retry: default-constructed once per attempt, then `b.wait()` before each
/// retry (see the file's description).
template <class B>
concept Backoff = cuda::std::default_initializable<B> && requires(B& b) {
  b.wait();
};

/// A Backoff that tries again at once: no wait at all.
struct RetryAtOnce {
  /// Returns at once.
  CARVE_HOST_DEVICE constexpr void wait() noexcept {}
};

static_assert(Backoff<RetryAtOnce>);

} // namespace carve
