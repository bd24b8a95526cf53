/// @file carve/core/asymmetric_fence.hpp
/// A fence split into a free half for the hot path and an
/// expensive half for the rare one (host threads only).
///
/// @code
/// hot thread:   store X; asymmetric_fence_light(); load Y
/// rare thread:  store Y; asymmetric_fence_heavy(); load X
/// @endcode
///
/// Together the two act like a sequentially consistent fence on each side (the Dekker pattern
/// holds: at least one thread sees the other's store), but the light half is only a compiler
/// barrier. The heavy half makes every running thread of the process pass a full memory barrier
/// (Linux membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED; a few microseconds with threads running
/// on other cores). The same split as folly's asymmetric_thread_fence_light/heavy.
///
/// Only where asymmetric_fences_available() is true: Linux with membarrier (4.14+, not blocked by
/// seccomp). Elsewhere, and on devices, callers keep their read-modify-writes. GPU threads never
/// see the heavy half, so a fast path built on this must be taken by host threads only.
#pragma once

#include <carve/core/config.hpp>

#include <cuda/atomic>

#if !defined(__CUDA_ARCH__) && defined(__linux__) && __has_include(<linux/membarrier.h>)
#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>
#define CARVE_HAS_MEMBARRIER 1
#endif

namespace carve::detail {

#if !defined(__CUDA_ARCH__)
// Registers the process for expedited membarriers on first use; false when the kernel refuses.
inline bool asymmetric_fences_available() noexcept {
#if defined(CARVE_HAS_MEMBARRIER)
  static const bool available = [] {
    const long commands = syscall(__NR_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
    return commands > 0 && (commands & MEMBARRIER_CMD_PRIVATE_EXPEDITED) != 0 &&
           syscall(__NR_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0;
  }();
  return available;
#else
  return false;
#endif
}

inline void asymmetric_fence_light() noexcept { cuda::std::atomic_signal_fence(cuda::std::memory_order_seq_cst); }

// Only after asymmetric_fences_available() returned true.
inline void asymmetric_fence_heavy() noexcept {
  cuda::std::atomic_thread_fence(cuda::std::memory_order_seq_cst);
#if defined(CARVE_HAS_MEMBARRIER)
  if (syscall(__NR_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) != 0) {
    // Refused because this process is not registered (whatever lost the registration):
    // register and retry; failing that, the global barrier (milliseconds, but never wrong).
    if (syscall(__NR_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) != 0 ||
        syscall(__NR_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) != 0) {
      syscall(__NR_membarrier, MEMBARRIER_CMD_GLOBAL, 0, 0);
    }
  }
#endif
  cuda::std::atomic_thread_fence(cuda::std::memory_order_seq_cst);
}
#endif

} // namespace carve::detail
