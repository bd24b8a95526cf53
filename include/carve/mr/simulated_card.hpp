// carve/mr/simulated_card.hpp — a GPU card's memory played by host memory with a fixed capacity.
//
//   carve::SimulatedCard card(64 << 20);   // a "card" with 64 MiB
//   void* p = card.try_allocate(1 << 20, 256);
//
// For tests, demos and planning on machines without GPUs: allocations are real host memory
// (so sanitizers see misuse), counted against the capacity. Copies are handles to the same
// card (like two references to one device), and compare equal. Thread-safe.
#pragma once

#include <carve/mr/cuda_mr.hpp>
#include <carve/mr/upstream.hpp>

#include <atomic>
#include <cstddef>
#include <memory>
#include <new>

namespace carve {

class SimulatedCard : public CcclSpellings<SimulatedCard> {
public:
  explicit SimulatedCard(std::size_t capacity_bytes) : state_(std::make_shared<State>(capacity_bytes)) {}

  // nullptr when `bytes` is 0, the alignment is not a power of two, the card is full, or the
  // host itself is out of memory.
  void* try_allocate(std::size_t bytes, std::size_t alignment) noexcept {
    if (bytes == 0 || alignment == 0 || (alignment & (alignment - 1)) != 0) {
      return nullptr;
    }
    std::size_t used = state_->used.load(std::memory_order_relaxed);
    do {
      if (bytes > state_->capacity - used) {
        return nullptr;
      }
    } while (!state_->used.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
    void* p = ::operator new (bytes, std::align_val_t{alignment}, std::nothrow);
    if (p == nullptr) {
      state_->used.fetch_sub(bytes, std::memory_order_relaxed);
      return nullptr;
    }
    state_->allocations.fetch_add(1, std::memory_order_relaxed);
    return p;
  }

  void deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept {
    ::operator delete (p, std::align_val_t{alignment});
    state_->used.fetch_sub(bytes, std::memory_order_relaxed);
    state_->allocations.fetch_sub(1, std::memory_order_relaxed);
  }

  std::size_t capacity() const noexcept { return state_->capacity; }
  std::size_t used_bytes() const noexcept { return state_->used.load(std::memory_order_relaxed); }
  std::size_t free_bytes() const noexcept { return capacity() - used_bytes(); }
  std::size_t allocation_count() const noexcept { return state_->allocations.load(std::memory_order_relaxed); }

  friend bool operator==(const SimulatedCard& a, const SimulatedCard& b) noexcept { return a.state_ == b.state_; }

#if defined(CARVE_HAS_CUDA_MR)
  friend constexpr void get_property(const SimulatedCard&, cuda::mr::host_accessible) noexcept {}
#endif

private:
  struct State {
    explicit State(std::size_t cap) : capacity(cap) {}
    const std::size_t capacity;
    std::atomic<std::size_t> used{0};
    std::atomic<std::size_t> allocations{0};
  };
  std::shared_ptr<State> state_;
};

static_assert(UpstreamResource<SimulatedCard>);

} // namespace carve
