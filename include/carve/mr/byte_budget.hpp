/// @file carve/mr/byte_budget.hpp
/// A fixed number of bytes shared by every copy of a resource.
///
/// Resources that stand for a bounded amount of memory (a simulated card, a GPU's share of a
/// spill tier) count their allocations against a ByteBudget. Copies of a ByteBudget are handles
/// to the same count, as copies of such a resource are handles to the same memory. Thread-safe.
#pragma once

#include <carve/mr/detail/take_within.hpp>

#include <cuda/std/atomic>

#include <atomic>
#include <cstddef>
#include <memory>

namespace carve {

/// A shared, thread-safe count of bytes taken from a fixed capacity; copies are handles to it.
class ByteBudget {
public:
  /// A new budget of `capacity` bytes, none taken; copies share it.
  explicit ByteBudget(std::size_t capacity) : state_(std::make_shared<State>(capacity)) {}

  /// Takes `bytes` from the budget; false (and nothing taken) when they are not all there.
  bool take(std::size_t bytes) noexcept {
    if (!detail::take_within(state_->used, bytes, state_->capacity)) {
      return false;
    }
    state_->allocations.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  /// Returns what one take() took.
  void give_back(std::size_t bytes) noexcept {
    state_->used.fetch_sub(bytes, cuda::std::memory_order_relaxed);
    state_->allocations.fetch_sub(1, std::memory_order_relaxed);
  }

  /// The budget's size.
  std::size_t capacity() const noexcept { return state_->capacity; }
  /// Bytes taken now.
  std::size_t used_bytes() const noexcept { return state_->used.load(cuda::std::memory_order_relaxed); }
  /// Bytes left.
  std::size_t free_bytes() const noexcept { return capacity() - used_bytes(); }
  /// take() calls not yet given back.
  std::size_t allocation_count() const noexcept { return state_->allocations.load(std::memory_order_relaxed); }

  /// Equal when both are copies of the same budget.
  friend bool operator==(const ByteBudget& a, const ByteBudget& b) noexcept { return a.state_ == b.state_; }

private:
  struct State {
    explicit State(std::size_t cap) : capacity(cap) {}
    const std::size_t capacity;
    cuda::std::atomic<std::size_t> used{0};
    std::atomic<std::size_t> allocations{0};
  };
  std::shared_ptr<State> state_;
};

} // namespace carve
