// carve/vmm/detail/recent_frees.hpp — the ranges a reservation's stream has freed since its work
// last caught up, with their free numbers: which free an idle chunk must wait for before it is
// unmapped. Waiting for that free rather than for everything queued since (StreamFence) leaves the
// device the work queued after it, so it does not idle while the host unmaps and maps.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

namespace carve::detail {

// Frees in order of their numbers, oldest forgotten first. Not thread-safe: the pool holds its lock.
class RecentFrees {
public:
  // [start, start + bytes) was freed as free number `free` (numbers rise). Where the log cannot
  // grow, every range counts as freed then, until the stream passes it; so do the frees before the
  // first noted, which the log never saw.
  void note(std::uintptr_t start, std::size_t bytes, std::uint64_t free) noexcept {
    if (!started_) {
      started_ = true;
      lost_ = free - 1;
    }
    try {
      log_.push_back(Freed{start, start + bytes, free});
    } catch (const std::bad_alloc&) {
      lost_ = free;
    }
  }

  // Forgets the frees the stream's work has passed (numbers up to `settled`).
  void forget_through(std::uint64_t settled) noexcept {
    while (head_ < log_.size() && log_[head_].free <= settled) {
      ++head_;
    }
    if (head_ == log_.size() || head_ > log_.size() / 2) { // amortised: each entry moves once at most
      log_.erase(log_.begin(), log_.begin() + static_cast<std::ptrdiff_t>(head_));
      head_ = 0;
    }
    lost_ = lost_ <= settled ? 0 : lost_;
  }

  // The number of the last free not yet forgotten whose range meets [start, start + bytes); 0
  // where there is none (the stream's work has passed every use of that memory). Only once started.
  std::uint64_t last_touching(std::uintptr_t start, std::size_t bytes) const noexcept {
    for (std::size_t i = log_.size(); i > head_; --i) {
      const Freed& f = log_[i - 1];
      if (f.start < start + bytes && start < f.end) {
        return f.free > lost_ ? f.free : lost_;
      }
    }
    return lost_;
  }

  // Whether a free was noted: before, last_touching knows nothing.
  bool started() const noexcept { return started_; }
  // Frees remembered (for tests).
  std::size_t size() const noexcept { return log_.size() - head_; }

private:
  struct Freed {
    std::uintptr_t start;
    std::uintptr_t end;
    std::uint64_t free;
  };
  std::vector<Freed> log_;
  std::size_t head_ = 0;   // log_[0, head_) is forgotten
  std::uint64_t lost_ = 0; // a free the log could not hold: every range waits for it
  bool started_ = false;
};

} // namespace carve::detail
