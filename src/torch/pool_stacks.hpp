// src/torch/pool_stacks.hpp — one device's carve pool behind libcarve_torch's C functions, in
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
// The rules are the library pools' own: a stack adds the device scope, the counting, and the frees
// held for other streams' work (Tensor.record_stream: stream_uses.hpp), so carve_replay's rows
// (examples/carve_replay/contenders.hpp) measure the pools built here.
// Every kind hands out blocks aligned to 512 bytes (PyTorch's own), is thread-safe, and counts
// into its Books. Stacks are built once per device and live as long as the process.
#pragma once

#include "backends.hpp"
#include "device_stack.hpp"
#include "stream_uses.hpp"

#include <carve/core/errc.hpp>
#include <carve/core/misuse.hpp>
#include <carve/mr/caching_pool_options.hpp>
#include <carve/mr/stream_caching_pool.hpp>
#include <carve/mr/stream_ordered_pool.hpp>
#include <carve/mr/stream_ordered_pool_options.hpp>
#include <carve/vmm/expandable_pool.hpp>

#include <cstddef>
#include <exception>
#include <string>
#include <system_error>

namespace carve::torch {

// The parts of a stack that depend only on its backend and device.
template <class Backend>
class BackendStack : public DeviceStack {
public:
  BackendStack(int device, const StackOptions& o) : DeviceStack(o), device_(device) {}

protected:
  void synchronize() noexcept override { Backend::synchronize(device_); }
  bool stream_capturing(cudaStream_t stream) noexcept override {
    const typename Backend::DeviceScope scope(device_);
    return Backend::capturing(stream);
  }
  // A block from `pool` (CCCL's stream-ordered spellings); null when it says no. During a capture
  // the driver calls it may make are allowed on this thread.
  template <class Pool>
  void* take_from(Pool& pool, cudaStream_t stream, std::size_t bytes) noexcept {
    const typename Backend::DeviceScope scope(device_);
    const typename Backend::RelaxedCapture relaxed(capturing());
    collect_used(pool);
    const auto p = pool.try_allocate(Backend::stream(stream), bytes, block_alignment);
    return p ? *p : nullptr;
  }
  // `p` back to `pool` for work on `stream` (its own), or held while it is used on other streams
  // (record_stream: stream_uses.hpp).
  template <class Pool>
  Freed give_to(Pool& pool, cudaStream_t stream, void* p, std::size_t bytes) noexcept {
    const typename Backend::DeviceScope scope(device_);
    collect_used(pool);
    if (used_.holds(p)) {
      return cuda::std::unexpected(Errc::not_allocated); // its free waits already
    }
    if (StreamUses& uses = StreamUses::instance(); uses.any()) {
      if (!uses.used_elsewhere(p, stream)) {
        uses.forget(p); // only its own stream was named, if any
      } else if (const Freed r = pool.check_deallocate(p, bytes, block_alignment); !r) {
        return r; // refused now, as a free made at once would be; its uses kept
      } else if (!capturing() && used_.hold(stream, p, bytes)) { // (no capture begins: see capture_gate_)
        return {};
      }
    }
    return pool.try_deallocate(Backend::stream(stream), p, bytes, block_alignment);
  }
  // The frees held for other streams whose streams have run past them go back to `pool`, first
  // waiting for the streams when `wait`. Not during a capture: it asks events about work on
  // streams a capture may take in.
  template <class Pool>
  void collect_used(Pool& pool, bool wait = false) noexcept {
    if (!used_.any() || capturing()) {
      return;
    }
    used_.collect(
        [&](cudaStream_t own, void* p, std::size_t bytes) {
          const Freed r = pool.try_deallocate(Backend::stream(own), p, bytes, block_alignment);
          if (!r && r.error() == Errc::no_space) {
            return false; // the pool's tables could not grow: later
          }
          if (!r) {
            report_misuse("carve_torch_free", p, bytes, r.error()); // checked now that it is made
          }
          return true;
        },
        wait);
  }

  int device_;
  UsedFrees<Backend> used_;
};

template <class Backend>
class ExpandableStack final : public BackendStack<Backend> {
public:
  ExpandableStack(int device, const StackOptions& o)
      : BackendStack<Backend>(device, o), mapper_(Backend::mapper(device)),
        pool_(CountingMapper<typename Backend::Mapper>(mapper_, &this->books_), options(device, o)) {}

  // From the thread building another device's stack, perhaps while this one captures a graph:
  // cuMemSetAccess is no stream work, and a global-mode capture would refuse it otherwise.
  std::string grant_access(int peer) override {
    const typename Backend::DeviceScope scope(this->device_);
    const typename Backend::RelaxedCapture relaxed(true);
    const auto granted = pool_.grant_access(peer);
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
  bool lending_refused() const noexcept override {
    try {
      return pool_.stats().lending_refused;
    } catch (const std::system_error&) { // the lock could not be taken
      return false;
    }
  }

private:
  using Freed = DeviceStack::Freed;
  void release_cache() noexcept override {
    const typename Backend::DeviceScope scope(this->device_);
    this->collect_used(pool_, true); // as PyTorch's empty_cache: the other streams' work waited for
    (void)pool_.trim();
  }
  void hold(bool held) noexcept override { pool_.hold(held); }
  using Pool = ExpandablePool<CountingMapper<typename Backend::Mapper>, typename Backend::Streams>;
  static_assert(TellsPartialMaps<CountingMapper<typename Backend::Mapper>>, "the pool asks the driver before it lends");
  static ExpandablePoolOptions options(int device, const StackOptions& o) {
    ExpandablePoolOptions out;
    out.device = device;
    out.granularity = block_alignment;
    out.max_reserved_bytes = o.max_reserved;
    out.release_threshold = o.idle_threshold;
    out.max_chunk_bytes = o.max_chunk;
    return out;
  }
  void* take(cudaStream_t stream, std::size_t bytes) noexcept override { return this->take_from(pool_, stream, bytes); }
  Freed give(cudaStream_t stream, void* p, std::size_t bytes) noexcept override {
    return this->give_to(pool_, stream, p, bytes);
  }
  typename Backend::Mapper mapper_; // the pool's, copied: to ask what a device may do at an address
  Pool pool_;
};

// A pool over the device's cudaMalloc (CountingUpstream counts into the Books): StreamOrderedPool
// (stream-ordered) or StreamCachingPool (caching), both taking the granularity and idle threshold.
template <class Backend, template <class, class> class PoolOver, class Options>
class CudaMallocStack final : public BackendStack<Backend> {
public:
  CudaMallocStack(int device, const StackOptions& o)
      : BackendStack<Backend>(device, o), memory_(Backend::upstream(device)),
        pool_(Upstream(&memory_, &this->books_), options(o), typename Backend::Streams()) {}

private:
  using Freed = DeviceStack::Freed;
  using Upstream = CountingUpstream<typename Backend::Upstream>;
  static Options options(const StackOptions& o) {
    Options out;
    out.granularity = block_alignment;
    out.idle_threshold = o.idle_threshold;
    return out;
  }
  void release_cache() noexcept override {
    Backend::synchronize(this->device_);
    const typename Backend::DeviceScope scope(this->device_);
    this->collect_used(pool_);
    (void)pool_.trim();
  }
  // During a capture nothing goes back to the device (no cudaFree), as under PyTorch's allocator.
  void hold(bool held) noexcept override { pool_.hold(held); }
  void* take(cudaStream_t stream, std::size_t bytes) noexcept override { return this->take_from(pool_, stream, bytes); }
  Freed give(cudaStream_t stream, void* p, std::size_t bytes) noexcept override {
    return this->give_to(pool_, stream, p, bytes);
  }
  typename Backend::Upstream memory_;
  PoolOver<Upstream, typename Backend::Streams> pool_;
};

template <class Backend>
using StreamOrderedStack = CudaMallocStack<Backend, StreamOrderedPool, StreamPoolOptions>;
template <class Backend>
using CachingStack = CudaMallocStack<Backend, StreamCachingPool, PoolOptions>;

} // namespace carve::torch
