// src/torch/device_stack.hpp — one device's carve pool behind libcarve_torch's C functions, in
// the three kinds CARVE_TORCH_POOL names:
//
// - expandable: ExpandablePool over the device's virtual memory (CountingMapper counts what it
//   maps). It orders frees on streams itself.
// - stream-ordered: StreamOrderedPool over cudaMalloc (CountingUpstream): a block freed on a
//   stream is reused there at once and on another stream once an event recorded at the free has
//   completed.
// - caching: a CachingPool per stream over cudaMalloc, PyTorch's own rule (a block serves only
//   the stream it was allocated on; memory moves between streams only through the device, once
//   the stream that held it has finished its work). A block freed on another stream than its own
//   goes back to its pool once an event recorded on the freeing stream has completed.
//
// Every kind hands out blocks aligned to 512 bytes (PyTorch's own), is thread-safe, and counts
// into its Books. Stacks are built once per device and live as long as the process.
#pragma once

#include "backends.hpp"
#include "books.hpp"

#include <carve/core/errc.hpp>
#include <carve/core/misuse.hpp>
#include <carve/mr/caching_pool.hpp>
#include <carve/mr/stream_ordered_pool.hpp>
#include <carve/vmm/detail/stream_frees.hpp>
#include <carve/vmm/expandable_pool.hpp>

#include <atomic>
#include <cstddef>
#include <limits>
#include <mutex>
#include <new>
#include <optional>

namespace carve::torch {

// The alignment of every block (and the rounding of the live counts): PyTorch's.
inline constexpr std::size_t block_alignment = 512;

// What CARVE_TORCH_POOL and the size variables chose.
enum class PoolKind { caching, stream_ordered, expandable };

// The options a stack is built with.
struct StackOptions {
  PoolKind pool = PoolKind::expandable;
  std::size_t max_reserved = std::numeric_limits<std::size_t>::max(); // per device
  std::size_t idle_threshold = std::numeric_limits<std::size_t>::max();
};

// One device's pool behind the C functions (see the top of this file).
class DeviceStack {
public:
  // What a free did: nothing (and why) or its work.
  using Freed = cuda::std::expected<void, Errc>;

  explicit DeviceStack(const StackOptions& options) { books_.cap = options.max_reserved; }
  virtual ~DeviceStack() = default;
  DeviceStack(const DeviceStack&) = delete;
  DeviceStack& operator=(const DeviceStack&) = delete;

  // A block of `bytes` (> 0) for work on `stream`, or null when the device is full. Before it
  // refuses, the stack gives back what it caches (empty_cache: only memory no stream's work may
  // still touch) and tries once more, as PyTorch's own allocator does; `released`, when given,
  // gets the bytes that gave back (0 when the first try served).
  void* allocate(cudaStream_t stream, std::size_t bytes, std::size_t* released = nullptr) noexcept {
    void* p = take(stream, bytes);
    std::size_t gave_back = 0;
    if (p == nullptr) {
      const std::size_t before = books_.reserved.now();
      empty_cache();
      const std::size_t after = books_.reserved.now();
      gave_back = before > after ? before - after : 0;
      p = take(stream, bytes);
    }
    if (released != nullptr) {
      *released = gave_back;
    }
    if (p == nullptr) {
      count(books_.failures);
      return nullptr;
    }
    books_.live.add(rounded(bytes));
    count(books_.mallocs);
    return p;
  }
  // Frees `p` for work queued on `stream` after the work that used it. not_allocated when the
  // stack never handed `p` out (or it is free), invalid_size when `bytes` is not its size.
  Freed deallocate(cudaStream_t stream, void* p, std::size_t bytes) noexcept {
    Freed why = give(stream, p, bytes);
    if (why) {
      books_.live.sub(rounded(bytes));
      count(books_.frees);
    }
    return why;
  }
  // Gives the device every byte no block uses and no stream's work may still touch.
  virtual void empty_cache() noexcept = 0;

  const Books& books() const noexcept { return books_; }
  void reset_peak() noexcept {
    books_.live.reset_peak();
    books_.reserved.reset_peak();
  }

protected:
  static std::size_t rounded(std::size_t bytes) noexcept {
    return bytes > std::numeric_limits<std::size_t>::max() - (block_alignment - 1)
               ? bytes
               : (bytes + block_alignment - 1) & ~(block_alignment - 1);
  }
  virtual void* take(cudaStream_t stream, std::size_t bytes) noexcept = 0;
  virtual Freed give(cudaStream_t stream, void* p, std::size_t bytes) noexcept = 0;

  Books books_; // before the pools, which count into it
};

// A block from a pool with CCCL's stream-ordered spellings, on `device`; null when it says no.
template <class Backend, class Pool>
void* take_on_stream(int device, Pool& pool, cudaStream_t stream, std::size_t bytes) noexcept {
  const typename Backend::DeviceScope scope(device);
  const auto p = pool.try_allocate(Backend::stream(stream), bytes, block_alignment);
  return p ? *p : nullptr;
}

template <class Backend>
class ExpandableStack final : public DeviceStack {
public:
  ExpandableStack(int device, const StackOptions& o)
      : DeviceStack(o), device_(device),
        pool_(CountingMapper<typename Backend::Mapper>(Backend::mapper(device), &books_), options(device, o)) {}
  void empty_cache() noexcept override {
    const typename Backend::DeviceScope scope(device_);
    (void)pool_.trim();
  }

private:
  using Pool = ExpandablePool<CountingMapper<typename Backend::Mapper>, typename Backend::Streams>;
  static ExpandablePoolOptions options(int device, const StackOptions& o) {
    ExpandablePoolOptions out;
    out.device = device;
    out.granularity = block_alignment;
    out.max_reserved_bytes = o.max_reserved;
    out.release_threshold = o.idle_threshold;
    return out;
  }
  void* take(cudaStream_t stream, std::size_t bytes) noexcept override {
    return take_on_stream<Backend>(device_, pool_, stream, bytes);
  }
  Freed give(cudaStream_t stream, void* p, std::size_t bytes) noexcept override {
    const typename Backend::DeviceScope scope(device_);
    return pool_.try_deallocate(Backend::stream(stream), p, bytes, block_alignment);
  }
  int device_;
  Pool pool_;
};

template <class Backend>
class StreamOrderedStack final : public DeviceStack {
public:
  StreamOrderedStack(int device, const StackOptions& o)
      : DeviceStack(o), device_(device), memory_(Backend::upstream(device)), idle_threshold_(o.idle_threshold),
        pool_(Upstream(&memory_, &books_), typename Backend::Streams(), StreamPoolOptions{block_alignment}) {}
  void empty_cache() noexcept override {
    Backend::synchronize(device_);
    const typename Backend::DeviceScope scope(device_);
    (void)pool_.trim();
  }

private:
  using Upstream = CountingUpstream<typename Backend::Upstream>;
  void* take(cudaStream_t stream, std::size_t bytes) noexcept override {
    return take_on_stream<Backend>(device_, pool_, stream, bytes);
  }
  Freed give(cudaStream_t stream, void* p, std::size_t bytes) noexcept override {
    const typename Backend::DeviceScope scope(device_);
    Freed why = pool_.try_deallocate(Backend::stream(stream), p, bytes, block_alignment);
    if (why && idle_threshold_ != std::numeric_limits<std::size_t>::max() &&
        pool_.stats().bytes_cached > idle_threshold_) {
      (void)pool_.trim(); // what the streams' work has passed goes back to the device
    }
    return why;
  }
  int device_;
  typename Backend::Upstream memory_;
  std::size_t idle_threshold_;
  StreamOrderedPool<Upstream, typename Backend::Streams> pool_;
};

template <class Backend>
class CachingStack final : public DeviceStack {
public:
  CachingStack(int device, const StackOptions& o)
      : DeviceStack(o), device_(device), memory_(Backend::upstream(device)), idle_threshold_(o.idle_threshold) {}
  ~CachingStack() override {
    for (StreamPool* s = head_.load(std::memory_order_acquire); s != nullptr;) {
      StreamPool* next = s->next;
      delete s;
      s = next;
    }
  }
  void empty_cache() noexcept override {
    Backend::synchronize(device_);
    const typename Backend::DeviceScope scope(device_);
    collect_deferred();
    for (StreamPool* s = head_.load(std::memory_order_acquire); s != nullptr; s = s->next) {
      if (settled(s->stream)) {
        (void)s->pool.trim();
      }
    }
  }

private:
  using Upstream = CountingUpstream<typename Backend::Upstream>;
  using Streams = typename Backend::Streams;
  using stream_type = typename Streams::stream_type;
  struct StreamPool {
    stream_type stream;
    CachingPool<Upstream> pool;
    StreamPool* next = nullptr;
  };
  struct Deferred { // a block freed on another stream than its pool's
    void* p = nullptr;
    std::size_t bytes = 0;
    StreamPool* owner = nullptr;
  };

  void* take(cudaStream_t stream, std::size_t bytes) noexcept override {
    const typename Backend::DeviceScope scope(device_);
    if (deferred_count_.load(std::memory_order_acquire) != 0) {
      collect_deferred();
    }
    StreamPool* own = pool_for(Backend::stream(stream), true);
    if (own == nullptr) {
      return nullptr;
    }
    auto p = own->pool.try_allocate(bytes, block_alignment);
    if (!p && p.error() == Errc::no_space && release_other_streams(own)) {
      p = own->pool.try_allocate(bytes, block_alignment);
    }
    return p ? *p : nullptr;
  }

  Freed give(cudaStream_t stream, void* p, std::size_t bytes) noexcept override {
    const typename Backend::DeviceScope scope(device_);
    StreamPool* own = pool_for(Backend::stream(stream), false);
    if (own != nullptr) {
      const auto r = own->pool.try_deallocate(p, bytes, block_alignment);
      if (r || r.error() != Errc::not_allocated) {
        return r;
      }
    }
    for (StreamPool* s = head_.load(std::memory_order_acquire); s != nullptr; s = s->next) {
      if (s != own && s->pool.owns(p)) {
        return defer(Backend::stream(stream), Deferred{p, bytes, s});
      }
    }
    return cuda::std::unexpected(Errc::not_allocated);
  }

  // The pool of `stream`; made on first use when `make` (null when that fails for want of memory).
  StreamPool* pool_for(stream_type stream, bool make) noexcept {
    for (StreamPool* s = head_.load(std::memory_order_acquire); s != nullptr; s = s->next) {
      if (s->stream == stream) {
        return s;
      }
    }
    if (!make) {
      return nullptr;
    }
    const std::lock_guard lock(grow_);
    StreamPool* first = head_.load(std::memory_order_acquire);
    for (StreamPool* s = first; s != nullptr; s = s->next) {
      if (s->stream == stream) {
        return s; // made by another thread meanwhile
      }
    }
    PoolOptions options;
    options.granularity = block_alignment;
    options.idle_threshold = idle_threshold_;
    auto* made =
        new (std::nothrow) StreamPool{stream, CachingPool<Upstream>(Upstream(&memory_, &books_), options), first};
    if (made != nullptr) {
      head_.store(made, std::memory_order_release);
    }
    return made;
  }

  // Waits (where the streams can) for the work queued on `stream` so far; whether it has run.
  bool settled(stream_type stream) noexcept {
    const std::lock_guard lock(events_);
    try {
      auto e = streams_.record(stream);
      if (!e) {
        return false;
      }
      if constexpr (StreamEventsThatWait<Streams>) {
        streams_.wait(*e);
      }
      const bool done = streams_.completed(*e);
      streams_.release(*e);
      return done;
    } catch (const std::bad_alloc&) {
      return false;
    }
  }

  // The device said no to `own`'s pool: the other streams' pools give back their free segments,
  // each once its stream's work has run. Whether any did.
  bool release_other_streams(StreamPool* own) noexcept {
    collect_deferred();
    std::size_t released = 0;
    for (StreamPool* s = head_.load(std::memory_order_acquire); s != nullptr; s = s->next) {
      if (s != own && settled(s->stream)) {
        released += s->pool.trim();
      }
    }
    return released != 0;
  }

  Freed defer(stream_type freed_on, Deferred d) noexcept {
    const std::lock_guard lock(events_);
    try {
      deferred_.add(streams_, d, freed_on);
    } catch (const std::bad_alloc&) {
      return cuda::std::unexpected(Errc::no_space);
    }
    deferred_count_.fetch_add(1, std::memory_order_release);
    return {};
  }

  // Blocks freed on another stream whose free that stream's work has passed go back to their pools.
  void collect_deferred() noexcept {
    const std::lock_guard lock(events_);
    try {
      deferred_.collect(streams_, [&](Deferred d) {
        deferred_count_.fetch_sub(1, std::memory_order_relaxed);
        if (const auto r = d.owner->pool.try_deallocate(d.p, d.bytes, block_alignment); !r) {
          report_misuse("carve_torch_free", d.p, d.bytes, r.error()); // freed on another stream
        }
      });
    } catch (const std::bad_alloc&) { // the rest stay deferred
    }
  }

  int device_;
  typename Backend::Upstream memory_;
  std::size_t idle_threshold_;
  std::atomic<StreamPool*> head_{nullptr}; // the streams' pools, newest first; never unlinked
  std::mutex grow_;                        // one thread at a time makes a pool
  std::mutex events_;                      // streams_ and deferred_
  Streams streams_;
  detail::CrossStreamFrees<Streams, Deferred> deferred_;
  std::atomic<std::size_t> deferred_count_{0};
};

} // namespace carve::torch
