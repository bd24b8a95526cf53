// carve/mr/detail/shared_upstream.hpp — one upstream under several pools (StreamCachingPool's
// streams' pools): SharedUpstream owns it and a lock, and counts what the pools hold at once;
// each pool holds a SharedUpstream::Handle as its upstream, every call made under the lock, so
// the upstream itself need not be thread-safe.
#pragma once

#include <carve/core/errc.hpp>
#include <carve/mr/memory_resource.hpp>

#include <cuda/std/expected>

#include <algorithm>
#include <cstddef>
#include <mutex>
#include <utility>

namespace carve::detail {

template <UpstreamResource Upstream>
class SharedUpstream {
public:
  explicit SharedUpstream(Upstream u) : upstream_(std::move(u)) {}
  SharedUpstream(const SharedUpstream&) = delete;
  SharedUpstream& operator=(const SharedUpstream&) = delete;

  // What a pool holds as its upstream: every call under the shared lock.
  class Handle {
  public:
    explicit Handle(SharedUpstream* s) noexcept : s_(s) {}
    [[nodiscard]] cuda::std::expected<void*, Errc> try_allocate(std::size_t bytes, std::size_t alignment) noexcept {
      const std::lock_guard lock(s_->mutex_);
      auto p = s_->upstream_.try_allocate(bytes, alignment);
      if (p) {
        s_->held_ += bytes;
        s_->peak_ = std::max(s_->peak_, s_->held_);
      }
      return p;
    }
    void deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept {
      const std::lock_guard lock(s_->mutex_);
      s_->upstream_.deallocate(p, bytes, alignment);
      s_->held_ -= bytes;
    }
    std::size_t free_bytes() const { return s_->free_bytes(); }
    std::size_t capacity() const { return s_->capacity(); }
    friend bool operator==(const Handle& a, const Handle& b) noexcept { return a.s_ == b.s_; }

  private:
    SharedUpstream* s_;
  };

  Handle handle() noexcept { return Handle(this); }
  std::size_t free_bytes() const {
    const std::lock_guard lock(mutex_);
    return upstream_.free_bytes();
  }
  std::size_t capacity() const {
    const std::lock_guard lock(mutex_);
    return upstream_.capacity();
  }
  // Bytes the pools hold from the upstream now, and the most they have held at once.
  std::size_t held() const {
    const std::lock_guard lock(mutex_);
    return held_;
  }
  std::size_t peak() const {
    const std::lock_guard lock(mutex_);
    return peak_;
  }
  // The upstream itself, for reading (a thread-safe one's figures; its calls go through handles).
  const Upstream& upstream() const noexcept { return upstream_; }

private:
  Upstream upstream_;
  mutable std::mutex mutex_;
  std::size_t held_ = 0;
  std::size_t peak_ = 0;
};

} // namespace carve::detail
