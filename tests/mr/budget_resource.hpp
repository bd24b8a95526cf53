// A memory resource for testing stacks: real host memory under a byte budget, with a record of
// every live block, so a test can predict exactly when it says no_space and check afterwards
// that every block came back exactly once.
#pragma once

#include <carve/mr.hpp>
#include <carve/mr/detail/block_lookup.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <new>

namespace carve::test {

class BudgetResource {
public:
  explicit BudgetResource(std::size_t budget) : budget_(budget) {}
  BudgetResource(const BudgetResource&) = delete;
  BudgetResource& operator=(const BudgetResource&) = delete;
  ~BudgetResource() {
    for (const auto& [addr, b] : live_) {
      ::operator delete (reinterpret_cast<void*>(addr), std::align_val_t{b.alignment});
    }
  }

  // Errors: invalid_size (check_request); no_space when used + bytes would pass the budget.
  cuda::std::expected<void*, Errc> try_allocate(std::size_t bytes, std::size_t alignment) noexcept {
    if (const auto ok = check_request(bytes, alignment); !ok) {
      return cuda::std::unexpected(ok.error());
    }
    const std::lock_guard lock(mutex_);
    if (bytes > budget_ - used_) {
      return cuda::std::unexpected(Errc::no_space);
    }
    void* p = ::operator new (bytes, std::align_val_t{alignment}, std::nothrow);
    if (p == nullptr) {
      return cuda::std::unexpected(Errc::no_space);
    }
    live_.emplace(reinterpret_cast<std::uintptr_t>(p), Block{bytes, alignment});
    used_ += bytes;
    ++allocations_;
    return p;
  }
  void deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept {
    if (const auto r = try_deallocate(p, bytes, alignment); !r) {
      report_misuse("BudgetResource::deallocate", p, bytes, r.error());
    }
  }
  cuda::std::expected<void, Errc> try_deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept {
    const std::lock_guard lock(mutex_);
    const auto it = live_.find(reinterpret_cast<std::uintptr_t>(p));
    if (it == live_.end()) {
      return cuda::std::unexpected(Errc::not_allocated);
    }
    if (it->second.bytes != bytes || it->second.alignment != alignment) {
      return cuda::std::unexpected(Errc::invalid_size);
    }
    ::operator delete (reinterpret_cast<void*>(it->first), std::align_val_t{alignment}); // the block, as recorded
    used_ -= bytes;
    live_.erase(it);
    return {};
  }
  bool owns(const void* p) const noexcept {
    const std::lock_guard lock(mutex_);
    return detail::block_containing(live_, p, [](const Block& b) { return b.bytes; }) != live_.end();
  }
  std::size_t free_bytes() const {
    const std::lock_guard lock(mutex_);
    return budget_ - used_;
  }
  std::size_t capacity() const noexcept { return budget_; }

  std::size_t used_bytes() const {
    const std::lock_guard lock(mutex_);
    return used_;
  }
  std::size_t live_blocks() const {
    const std::lock_guard lock(mutex_);
    return live_.size();
  }
  std::size_t allocations() const {
    const std::lock_guard lock(mutex_);
    return allocations_;
  }
  friend bool operator==(const BudgetResource& a, const BudgetResource& b) noexcept { return &a == &b; }

private:
  struct Block {
    std::size_t bytes;
    std::size_t alignment;
  };
  std::size_t budget_;
  std::size_t used_ = 0;
  std::size_t allocations_ = 0;
  std::map<std::uintptr_t, Block> live_;
  mutable std::mutex mutex_;
};

static_assert(UpstreamResource<BudgetResource> && OwnsMemory<BudgetResource> && ChecksDeallocation<BudgetResource>);

} // namespace carve::test
