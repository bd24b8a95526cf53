// src/torch/capture_gate.hpp — the gate every allocation, free and empty_cache of a DeviceStack
// passes, and that begin_capture closes (device_stack.hpp says why).
//
// Why not std::shared_mutex: the gate is passed twice per allocate+free, from whatever threads
// PyTorch allocates on, and closed only when a CUDA graph capture begins. glibc's reader-writer
// lock costs two calls into libc and a compare-and-swap loop per pass: about 23 ns per
// allocate+free, of the 55 to 70 ns libcarve_torch added to a pool with it (docs/torch.md, Cost).
// Here a pass is two atomic adds on one counter, inline. The price is paid by the rare closer,
// which waits for the passes under way by yielding, and by a thread that arrives while the gate
// closes, which waits on the closer's mutex.
//
// It models the standard's SharedMutex requirements as far as std::shared_lock and
// std::lock_guard use them (lock_shared, unlock_shared, lock, unlock). Not recursive: a thread
// that holds it, shared or alone, must not take it again.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <thread>

namespace carve::torch {

class CaptureGate {
public:
  CaptureGate() = default;
  CaptureGate(const CaptureGate&) = delete;
  CaptureGate& operator=(const CaptureGate&) = delete;

  // Passes, waiting while the gate is closed.
  void lock_shared() noexcept {
    for (;;) {
      // Announce the pass, then look: the closer marks the gate closing, then looks at the passes
      // under way. With both sequentially consistent, at least one of the two sees the other.
      passing_.fetch_add(1, std::memory_order_seq_cst);
      if (!closing_.load(std::memory_order_seq_cst)) {
        return;
      }
      passing_.fetch_sub(1, std::memory_order_release);
      const std::lock_guard wait(closer_); // held by the closer until it opens the gate again
    }
  }
  void unlock_shared() noexcept { passing_.fetch_sub(1, std::memory_order_release); }

  // Closes the gate once every pass under way has ended; no pass begins until unlock().
  void lock() {
    closer_.lock();
    closing_.store(true, std::memory_order_seq_cst);
    while (passing_.load(std::memory_order_seq_cst) != 0) {
      std::this_thread::yield();
    }
  }
  void unlock() {
    closing_.store(false, std::memory_order_seq_cst);
    closer_.unlock();
  }

private:
  std::atomic<std::uint64_t> passing_{0}; // passes under way, and those about to look at closing_
  std::atomic<bool> closing_{false};      // set only while closer_ is held
  std::mutex closer_;                     // one closer at a time; where passes wait for it
};

} // namespace carve::torch
