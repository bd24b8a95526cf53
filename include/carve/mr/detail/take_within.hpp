// carve/mr/detail/take_within.hpp — the compare-and-swap every byte budget uses (LimitResource,
// ByteBudget): add to a count only while the sum stays within a limit, so the limit is never
// passed, not even for a moment, however many threads take at once.
#pragma once

#include <carve/core/config.hpp>

#include <cuda/std/atomic>
#include <cuda/std/cstddef>

namespace carve::detail {

// Adds `bytes` to `used` (a cuda::atomic_ref or cuda::std::atomic of size_t) if the sum stays at
// most `limit`; whether it did (false: nothing added).
template <class Atomic>
CARVE_HOST_DEVICE bool take_within(Atomic&& used, cuda::std::size_t bytes, cuda::std::size_t limit) noexcept {
  cuda::std::size_t before = used.load(cuda::std::memory_order_relaxed);
  do {
    if (before > limit || bytes > limit - before) {
      return false;
    }
  } while (!used.compare_exchange_weak(before, before + bytes, cuda::std::memory_order_relaxed));
  return true;
}

} // namespace carve::detail
