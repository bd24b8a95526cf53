// src/torch/device_stack.hpp — one device's carve pool behind libcarve_torch's C functions, in
// the three kinds CARVE_TORCH_POOL names:
//
// - expandable: ExpandablePool over the device's virtual memory (CountingMapper counts what it
//   maps). It orders frees on streams itself.
// - stream-ordered: StreamOrderedPool over cudaMalloc (CountingUpstream): a block freed on a
//   stream is reused there at once and on another stream once an event recorded at the free has
//   completed; the idle threshold is its StreamPoolOptions::idle_threshold.
// - caching: StreamCachingPool over cudaMalloc (CountingUpstream), PyTorch's own rule: a
//   CachingPool per stream (a block serves only the stream it was allocated on; memory moves
//   between streams only through the device, once the stream that held it has finished its work),
//   a block freed on another stream than its own back once an event recorded on the freeing stream
//   has completed.
//
// The rules are the library pools' own: a stack adds the device scope and the counting, nothing
// else, so carve_replay's rows (examples/carve_replay/contenders.hpp) measure the pools built here.
// Every kind hands out blocks aligned to 512 bytes (PyTorch's own), is thread-safe, and counts
// into its Books. Stacks are built once per device and live as long as the process.
#pragma once

#include "backends.hpp"
#include "books.hpp"

#include <carve/core/errc.hpp>
#include <carve/mr/caching_pool_options.hpp>
#include <carve/mr/stream_caching_pool.hpp>
#include <carve/mr/stream_ordered_pool.hpp>
#include <carve/mr/stream_ordered_pool_options.hpp>
#include <carve/vmm/expandable_pool.hpp>

#include <cstddef>
#include <limits>

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
      : DeviceStack(o), device_(device), memory_(Backend::upstream(device)),
        pool_(Upstream(&memory_, &books_), options(o), typename Backend::Streams()) {}
  void empty_cache() noexcept override {
    Backend::synchronize(device_);
    const typename Backend::DeviceScope scope(device_);
    (void)pool_.trim();
  }

private:
  using Upstream = CountingUpstream<typename Backend::Upstream>;
  static StreamPoolOptions options(const StackOptions& o) {
    StreamPoolOptions out;
    out.granularity = block_alignment;
    out.idle_threshold = o.idle_threshold;
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
  typename Backend::Upstream memory_;
  StreamOrderedPool<Upstream, typename Backend::Streams> pool_;
};

template <class Backend>
class CachingStack final : public DeviceStack {
public:
  CachingStack(int device, const StackOptions& o)
      : DeviceStack(o), device_(device), memory_(Backend::upstream(device)),
        pool_(Upstream(&memory_, &books_), options(o), typename Backend::Streams()) {}
  void empty_cache() noexcept override {
    Backend::synchronize(device_);
    const typename Backend::DeviceScope scope(device_);
    (void)pool_.trim();
  }

private:
  using Upstream = CountingUpstream<typename Backend::Upstream>;
  static PoolOptions options(const StackOptions& o) {
    PoolOptions out;
    out.granularity = block_alignment;
    out.idle_threshold = o.idle_threshold;
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
  typename Backend::Upstream memory_;
  StreamCachingPool<Upstream, typename Backend::Streams> pool_;
};

} // namespace carve::torch
