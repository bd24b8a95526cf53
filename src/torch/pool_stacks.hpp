// src/torch/pool_stacks.hpp — one device's carve pool behind libcarve_torch's C functions, in
// the three kinds CARVE_TORCH_POOL names:
//
// - expandable: ExpandablePool over the device's virtual memory (CountingMapper counts what it
//   maps). It orders frees on streams itself.
// - stream-ordered: StreamOrderedPool over cudaMalloc (CountingUpstream): a block freed on a
//   stream is reused there at once and on another stream once an event recorded at or after the
//   free has completed (none at the free while one stream is all it has seen); the idle threshold
//   is its StreamPoolOptions::idle_threshold.
// - caching: StreamCachingPool over cudaMalloc (CountingUpstream), PyTorch's own rule: a
//   CachingPool per stream (a block serves only the stream it was allocated on; memory moves
//   between streams only through the device, once the stream that held it has finished its work),
//   a block freed on another stream than its own back once an event recorded on the freeing stream
//   has completed.
//
// The rules are the library's own: each pool sits in a StreamUsesPool, which holds the free of a
// block used on other streams (Tensor.record_stream) until their work has run, and a stack adds
// only the device scope and the counting, so carve_replay's rows
// (examples/carve_replay/contenders.hpp) measure the pools built here.
// Every kind hands out blocks aligned to 512 bytes (PyTorch's own), is thread-safe, and counts
// into its Books. Stacks are built once per device and live as long as the process.
#pragma once

#include "backends.hpp"
#include "device_stack.hpp"

#include <carve/core/errc.hpp>
#include <carve/core/misuse.hpp>
#include <carve/mr/caching_pool_options.hpp>
#include <carve/mr/stream_caching_pool.hpp>
#include <carve/mr/stream_ordered_pool.hpp>
#include <carve/mr/stream_ordered_pool_options.hpp>
#include <carve/mr/stream_uses_pool.hpp>
#include <carve/vmm/expandable_pool.hpp>

#include <cstddef>
#include <exception>
#include <string>
#include <system_error>

namespace carve::torch {

// The parts of a stack that depend only on its backend, device and pool: the pool is wrapped in a
// StreamUsesPool, which holds the free of a block used on other streams (Tensor.record_stream)
// until their work has run.
template <class Backend, class Pool>
class BackendStack : public DeviceStack {
public:
  BackendStack(int device, const StackOptions& o) : DeviceStack(o), device_(device) {}

  Done record_stream(void* p, cudaStream_t stream) noexcept override {
    return pool().record_stream(p, Backend::stream(stream));
  }

protected:
  using Uses = StreamUsesPool<Pool, typename Backend::Streams>;
  static_assert(
      requires(Pool & pool) { pool.hold(true); }, "a capture holds the pool: see DeviceStack::hold");
  virtual Uses& pool() noexcept = 0;

  void synchronize() noexcept override { Backend::synchronize(device_); }
  bool stream_capturing(cudaStream_t stream) noexcept override {
    const typename Backend::DeviceScope scope(device_);
    return Backend::capturing(stream);
  }
  // A block (CCCL's stream-ordered spellings); null when the pool says no. During a capture the
  // driver calls it may make are allowed on this thread.
  void* take(cudaStream_t stream, std::size_t bytes) noexcept override {
    const typename Backend::DeviceScope scope(device_);
    const typename Backend::RelaxedCapture relaxed(capturing());
    const auto p = pool().try_allocate(Backend::stream(stream), bytes, block_alignment);
    return p ? *p : nullptr;
  }
  Freed give(cudaStream_t stream, void* p, std::size_t bytes) noexcept override {
    const typename Backend::DeviceScope scope(device_);
    return pool().try_deallocate(Backend::stream(stream), p, bytes, block_alignment);
  }
  bool used_elsewhere(void* p, cudaStream_t own) noexcept override {
    return pool().used_elsewhere(p, Backend::stream(own));
  }
  void forget_uses(void* p) noexcept override { pool().forget(p); }
  void hold(bool held) noexcept override { pool().hold(held); }

  int device_;
};

template <class Backend>
using ExpandablePoolOver = ExpandablePool<CountingMapper<typename Backend::Mapper>, typename Backend::Streams>;

template <class Backend>
class ExpandableStack final : public BackendStack<Backend, ExpandablePoolOver<Backend>> {
public:
  ExpandableStack(int device, const StackOptions& o)
      : BackendStack<Backend, ExpandablePoolOver<Backend>>(device, o), mapper_(Backend::mapper(device)),
        pool_(std::piecewise_construct,
              std::forward_as_tuple(CountingMapper<typename Backend::Mapper>(mapper_, &this->books_),
                                    options(device, o))) {}

  // From the thread building another device's stack, perhaps while this one captures a graph:
  // cuMemSetAccess is no stream work, and a global-mode capture would refuse it otherwise.
  std::string grant_access(int peer) override {
    const typename Backend::DeviceScope scope(this->device_);
    const typename Backend::RelaxedCapture relaxed(true);
    const auto granted = pool_.pool().grant_access(peer);
    return granted ? std::string() : granted.error().message;
  }
  // Only where this pool has mapped: the driver would answer for any mapping at `p`.
  int access(const void* p, int peer) const noexcept override {
    if (!pool_.owns(p)) {
      return -1;
    }
    try {
      const typename Backend::DeviceScope scope(this->device_);
      const auto right = mapper_.access(const_cast<void*>(p), peer);
      return right ? static_cast<int>(*right) : -1;
    } catch (const std::exception&) { // the reason's text could not be built
      return -1;
    }
  }
  DeviceStack::MappingFigures mapping_figures() const noexcept override {
    try {
      const ExpandablePoolStats s = pool_.pool().stats();
      return {s.lending_refused, s.lent_bytes, s.stream_waits, s.refusals_served};
    } catch (const std::system_error&) { // the lock could not be taken
      return {};
    }
  }

private:
  using Uses = typename BackendStack<Backend, ExpandablePoolOver<Backend>>::Uses;
  static_assert(TellsPartialMaps<CountingMapper<typename Backend::Mapper>>, "the pool asks the driver before it lends");
  static ExpandablePoolOptions options(int device, const StackOptions& o) {
    ExpandablePoolOptions out;
    out.device = device;
    out.granularity = block_alignment;
    out.max_reserved_bytes = o.max_reserved;
    out.release_threshold = o.idle_threshold;
    out.max_chunk_bytes = o.max_chunk;
    out.lend_min_bytes = o.lend_min;
    out.bring_holes_home = o.holes_home;
    return out;
  }
  Uses& pool() noexcept override { return pool_; }
  // As PyTorch's empty_cache: the other streams' work on held frees is waited for, and only
  // memory no stream may still touch is unmapped.
  void release_cache() noexcept override {
    const typename Backend::DeviceScope scope(this->device_);
    (void)pool_.trim();
  }
  typename Backend::Mapper mapper_; // the pool's, copied: to ask what a device may do at an address
  Uses pool_;
};

// A pool over the device's cudaMalloc (CountingUpstream counts into the Books): StreamOrderedPool
// (stream-ordered) or StreamCachingPool (caching), both taking the granularity and idle threshold.
template <class Backend, template <class, class> class PoolOver, class Options>
class CudaMallocStack final
    : public BackendStack<Backend, PoolOver<CountingUpstream<typename Backend::Upstream>, typename Backend::Streams>> {
public:
  CudaMallocStack(int device, const StackOptions& o)
      : Base(device, o), memory_(Backend::upstream(device)),
        pool_(std::piecewise_construct,
              std::forward_as_tuple(Upstream(&memory_, &this->books_), options(o), typename Backend::Streams())) {}

private:
  using Upstream = CountingUpstream<typename Backend::Upstream>;
  using Base = BackendStack<Backend, PoolOver<Upstream, typename Backend::Streams>>;
  using Uses = typename Base::Uses;
  static Options options(const StackOptions& o) {
    Options out;
    out.granularity = block_alignment;
    out.idle_threshold = o.idle_threshold;
    return out;
  }
  Uses& pool() noexcept override { return pool_; }
  // As PyTorch's empty_cache: the device's work is run first. During a capture nothing goes back
  // to the device (no cudaFree), as under PyTorch's allocator: see DeviceStack::hold.
  void release_cache() noexcept override {
    Backend::synchronize(this->device_);
    const typename Backend::DeviceScope scope(this->device_);
    (void)pool_.trim();
  }
  typename Backend::Upstream memory_;
  Uses pool_;
};

template <class Backend>
using StreamOrderedStack = CudaMallocStack<Backend, StreamOrderedPool, StreamPoolOptions>;
template <class Backend>
using CachingStack = CudaMallocStack<Backend, StreamCachingPool, PoolOptions>;

} // namespace carve::torch
