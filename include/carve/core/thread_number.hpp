/// @file carve/core/thread_number.hpp
/// A small number per running thread, for picking a shard.
///
/// @code
/// const std::uint32_t shard = carve::thread_number() % shards;
/// @endcode
///
/// Host: each thread takes the lowest number no running thread holds, and gives it back when
/// it exits, so up to n threads running at once get the numbers 0..n-1 however many threads
/// came and went before them (a thread pool rebuilt per job, a test creating thousands). Taking
/// and giving back lock a mutex, once per thread; reading the number is a thread_local load.
/// Device: one number per warp of the grid (a warp's threads run in lock-step, so they would
/// share a shard's cache line anyway).
#pragma once

#include <carve/core/config.hpp>

#include <cuda/std/cstdint>
#include <nv/target>

#if !defined(__CUDA_ARCH__)
#include <mutex>
#include <vector>
#endif

namespace carve {

namespace detail {
#if !defined(__CUDA_ARCH__)
class ThreadNumbers {
public:
  std::uint32_t take() {
    const std::lock_guard lock(mutex_);
    std::uint32_t n = 0;
    while (n < held_.size() && held_[n]) {
      ++n;
    }
    if (n == held_.size()) {
      held_.push_back(true);
    } else {
      held_[n] = true;
    }
    return n;
  }
  void give_back(std::uint32_t n) {
    const std::lock_guard lock(mutex_);
    held_[n] = false;
  }

  // Never destroyed: threads still running at exit give their numbers back after statics die.
  static ThreadNumbers& registry() {
    static ThreadNumbers* const numbers = new ThreadNumbers;
    return *numbers;
  }

private:
  std::mutex mutex_;
  std::vector<bool> held_;
};

class ThreadNumber {
public:
  ThreadNumber() : value_(ThreadNumbers::registry().take()) {}
  ~ThreadNumber() { ThreadNumbers::registry().give_back(value_); }
  ThreadNumber(const ThreadNumber&) = delete;
  ThreadNumber& operator=(const ThreadNumber&) = delete;
  std::uint32_t value() const noexcept { return value_; }

private:
  std::uint32_t value_;
};

inline std::uint32_t host_thread_number() noexcept {
  thread_local const ThreadNumber mine;
  return mine.value();
}
#endif
} // namespace detail

/// This thread's number: on the host the lowest number no other running thread holds, on a
/// device the warp's index in the grid. Thread-safe; a thread_local load after the first call.
CARVE_HOST_DEVICE inline std::uint32_t thread_number() noexcept {
  NV_IF_ELSE_TARGET(NV_IS_DEVICE,
                    (const std::uint32_t block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
                     const std::uint32_t warps = (blockDim.x * blockDim.y * blockDim.z + 31) / 32;
                     const std::uint32_t thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
                     return block * warps + thread / 32;),
                    (return detail::host_thread_number();))
}

} // namespace carve
