/// @file carve/mr/stream_caching_pool.hpp
/// PyTorch's caching rule as a pool: one CachingPool per stream over one shared upstream, so a
/// block serves only the stream it was allocated on, and memory moves between streams only through
/// the upstream, once the stream that held it has run its work.
///
/// @code
/// carve::StreamCachingPool<carve::CudaDeviceResource, carve::CudaStreams> pool(carve::CudaDeviceResource(0));
/// void* p = pool.allocate(stream_a, 1 << 20, 512);  // from stream_a's pool
/// kernel<<<grid, block, 0, stream_a.get()>>>(p);
/// pool.deallocate(stream_a, p, 1 << 20, 512);       // cached for stream_a: reused there at once
/// void* q = pool.allocate(stream_b, 1 << 20, 512);  // never p: stream_b has a pool of its own
/// pool.deallocate(stream_a, q, 1 << 20, 512);       // stream_b's block: home once stream_a passes the free
/// @endcode
///
/// Why this pool: a cache shared by every stream must know, for each cached block, when the work
/// that used it has run (StreamOrderedPool records events on the freeing streams). PyTorch's CUDA caching
/// allocator avoids the events on the common path instead: the next user of a block is always
/// queued on the same stream as the last, behind it. carve_gpu.torch.use("caching") runs this
/// type, and carve_replay's `caching-pool` row measures this same type over the replay's streams,
/// so the figures the replay prints are those of the pool a PyTorch program gets.
///
/// The rules:
/// - Each stream gets a CachingPool at its first allocation, built with the pool's PoolOptions
///   (each of its options applies to each stream's pool); the synchronous
///   spellings (no stream) have one of their own. Within a stream's pool, CachingPool's rules:
///   best fit, segments from the upstream, whole free segments back beyond idle_threshold.
/// - A block freed on its own stream goes back to its pool at once. Freed on another stream T
///   (PyTorch's record_stream case), it waits for an event recorded on T at the free, and goes
///   back to its pool at the first allocation or trim() after that event has completed. A
///   synchronous free (the caller has synchronised) goes back at once.
/// - When the upstream refuses a stream's pool (which first returns its own free segments and
///   asks again: CachingPool's rule), the blocks freed on other streams come home and the other
///   streams' pools return their whole free segments, each once the work queued on its stream has
///   run, waiting for that work where the Streams can (StreamEventsThatWait: CudaStreams); then the
///   request is tried once more. trim() does the same for every stream's pool.
///
/// What is not waited for: a stream's own pool gives segments back to the upstream beyond
/// idle_threshold and under pressure without asking its stream, as PyTorch's allocator does; over
/// cudaMalloc that is safe because cudaFree waits for the device. Over an upstream that hands memory
/// out again at once, only trim() and the other streams' pools under pressure wait.
///
/// The pools share the one upstream, which this pool holds and calls under a lock of its own, so
/// the upstream need not be thread-safe. Thread-safe: finding a stream's pool takes no lock (the
/// pools are kept on a list that only grows), each pool has its lock, and the streams and the
/// waiting frees one more. A MemoryResource and an UpstreamResource (static_asserts below). Host
/// only. Options: PoolOptions (caching_pool_options.hpp); stats: StreamCachingPoolStats
/// (stream_caching_pool_options.hpp).
///
/// Errors (nothing changes): try_allocate: invalid_size for 0 bytes, an alignment that is not a
/// power of two or a size that overflows when rounded; no_space for an alignment above the
/// granularity, or when neither the stream's cache nor the upstream can hold the request after the
/// retry above (blocks given back in trying stay given back). try_deallocate: not_allocated when `p`
/// is not a live block of this pool (never handed out, freed already, or waiting on its stream);
/// invalid_size when `bytes` does not match its allocation; no_space when the pool's bookkeeping
/// cannot grow to hold a free made on another stream.
#pragma once

#include <carve/core/errc.hpp>
#include <carve/core/misuse.hpp>
#include <carve/mr/caching_pool.hpp>
#include <carve/mr/caching_pool_options.hpp>
#include <carve/mr/cuda_mr.hpp>
#include <carve/mr/detail/cross_stream_frees.hpp>
#include <carve/mr/detail/shared_upstream.hpp>
#include <carve/mr/memory_resource.hpp>
#include <carve/mr/simulated_card.hpp>
#include <carve/mr/stream_caching_pool_options.hpp>
#include <carve/mr/stream_events.hpp>

#include <cuda/std/expected>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <mutex>
#include <new>
#include <optional>
#include <utility>

namespace carve {

/// PyTorch's caching rule: a CachingPool per stream over one shared `Upstream`, cross-stream frees
/// held until the freeing stream's work has passed them (see the file's description).
template <UpstreamResource Upstream, StreamEvents Streams = SynchronousStreams>
requires std::move_constructible<Upstream>
class StreamCachingPool
    : public StreamOrderedSpellings<StreamCachingPool<Upstream, Streams>, typename Streams::stream_type> {
public:
  /// The name misuse reports give.
  static constexpr const char* resource_name = "carve::StreamCachingPool::deallocate";
  /// The stream type allocations name.
  using stream_type = typename Streams::stream_type;
  /// The resource the streams' pools take segments from.
  using upstream_type = Upstream;

  /// The arguments in the order of every carve pool: what it takes memory from, its options, its
  /// streams. Throws carve::Exception (invalid_argument) as CachingPool does for bad options.
  explicit StreamCachingPool(Upstream upstream, PoolOptions options = {}, Streams streams = Streams())
      : shared_(std::move(upstream)), options_(options), streams_(std::move(streams)) {
    // The synchronous calls' pool, made first: its CachingPool checks the options.
    head_.store(new StreamPool{std::nullopt, Pool(shared_.handle(), options_), nullptr}, std::memory_order_release);
  }
  StreamCachingPool(const StreamCachingPool&) = delete;
  StreamCachingPool& operator=(const StreamCachingPool&) = delete;

  /// Gives back the waiting frees' events (waiting for them first where the Streams can), then
  /// every segment to the upstream; blocks still handed out become invalid with it.
  ~StreamCachingPool() {
    {
      const std::lock_guard lock(events_);
      deferred_.close(streams_);
    }
    for (StreamPool* s = head_.load(std::memory_order_acquire); s != nullptr;) {
      StreamPool* next = s->next;
      delete s;
      s = next;
    }
  }

  /// A block for work queued on `stream`, from that stream's pool. Errors: see the top of this header.
  [[nodiscard]] cuda::std::expected<void*, Errc> try_allocate(stream_type stream, std::size_t bytes,
                                                              std::size_t alignment) noexcept {
    return take(std::optional<stream_type>(stream), bytes, alignment);
  }
  /// Frees `p` for work queued on `stream` after the work that used it: back to its pool at once
  /// when `stream` is the block's, else once `stream` has passed the free. Errors: see the top.
  [[nodiscard]] cuda::std::expected<void, Errc> try_deallocate(stream_type stream, void* p, std::size_t bytes,
                                                               std::size_t alignment) noexcept {
    return give(std::optional<stream_type>(stream), p, bytes, alignment);
  }
  /// The synchronous form (carve::MemoryResource): a block from the synchronous calls' pool.
  [[nodiscard]] cuda::std::expected<void*, Errc> try_allocate(std::size_t bytes, std::size_t alignment) noexcept {
    return take(std::nullopt, bytes, alignment);
  }
  /// The synchronous free: the caller has synchronised, so the block goes back to its pool at once.
  [[nodiscard]] cuda::std::expected<void, Errc> try_deallocate(void* p, std::size_t bytes,
                                                               std::size_t alignment) noexcept {
    return give(std::nullopt, p, bytes, alignment);
  }

  /// Brings home the frees made on other streams and gives every stream's whole free segments back
  /// to the upstream, each once its stream's queued work has run (waiting for it where the Streams
  /// can; a stream whose work has not run, or whose pool took a free meanwhile, keeps its pool's
  /// segments; while held, only the synchronous calls' pool gives any back). Returns the bytes
  /// released.
  std::size_t trim() noexcept {
    collect(true, nullptr);
    std::size_t released = 0;
    for (StreamPool* s = head_.load(std::memory_order_acquire); s != nullptr; s = s->next) {
      released += trim_settled(*s);
    }
    return released;
  }

  /// What try_deallocate(stream, p, bytes, alignment) would say now, without freeing anything,
  /// from any stream: success, not_allocated (a block freed on another stream already among them)
  /// or invalid_size. For a caller that holds a free to make it later.
  [[nodiscard]] cuda::std::expected<void, Errc> check_deallocate(void* p, std::size_t bytes,
                                                                 std::size_t alignment) noexcept {
    if (pending_.load(std::memory_order_acquire) != 0 && waiting(p)) {
      return cuda::std::unexpected(Errc::not_allocated);
    }
    for (StreamPool* s = head_.load(std::memory_order_acquire); s != nullptr; s = s->next) {
      if (const auto r = s->pool.check_deallocate(p, bytes, alignment); r || r.error() != Errc::not_allocated) {
        return r;
      }
    }
    return cuda::std::unexpected(Errc::not_allocated);
  }

  /// While `held`, no event is recorded (a free on another stream than its block's waits for the
  /// end of the hold to record its event), a refused request does not take memory from the other
  /// streams' pools but is refused, and no stream's pool gives memory back by itself
  /// (CachingPool::hold): for a CUDA stream capture, into which such an event would fall and
  /// during which PyTorch's allocator frees nothing either. hold(true) returns once a release
  /// from the other streams, a collection or a free on another stream under way has ended, so a
  /// capture begun after it sees none of their calls.
  void hold(bool held) noexcept {
    const std::lock_guard lock(pressure_);
    const std::lock_guard grow(grow_);     // a pool made meanwhile is held too (pool_for)
    const std::lock_guard events(events_); // a collection or free about to record an event ends first
    held_.store(held, std::memory_order_relaxed);
    for (StreamPool* s = head_.load(std::memory_order_acquire); s != nullptr; s = s->next) {
      s->pool.hold(held);
    }
  }

  /// The streams' pools' figures, summed (see StreamCachingPoolStats).
  StreamCachingPoolStats stats() const {
    StreamCachingPoolStats out;
    for (const StreamPool* s = head_.load(std::memory_order_acquire); s != nullptr; s = s->next) {
      const PoolStats p = s->pool.stats();
      out.bytes_in_use += p.bytes_in_use;
      out.peak_in_use += p.peak_in_use;
      out.bytes_cached += p.bytes_cached;
      out.bytes_reserved += p.bytes_reserved;
      out.live_blocks += p.live_blocks;
      out.cached_blocks += p.cached_blocks;
      out.segments += p.segments;
      out.largest_cached_block = std::max(out.largest_cached_block, p.largest_cached_block);
      out.allocations += p.allocations;
      out.deallocations += p.deallocations;
      out.cache_hits += p.cache_hits;
      out.splits += p.splits;
      out.merges += p.merges;
      out.upstream_allocations += p.upstream_allocations;
      out.upstream_frees += p.upstream_frees;
      out.upstream_failures += p.upstream_failures;
      ++out.pools;
    }
    out.peak_reserved = shared_.peak();
    out.pending_frees = pending_.load(std::memory_order_relaxed);
    out.cross_stream_frees = cross_stream_frees_.load(std::memory_order_relaxed);
    out.pressure_retries = pressure_retries_.load(std::memory_order_relaxed);
    out.bytes_given_back = bytes_given_back_.load(std::memory_order_relaxed);
    return out;
  }

  /// Bytes the pool could still hand out: every stream's cache plus the upstream's free memory (a
  /// stream's cache serves only that stream).
  std::size_t free_bytes() const {
    std::size_t cached = 0;
    for (const StreamPool* s = head_.load(std::memory_order_acquire); s != nullptr; s = s->next) {
      cached += s->pool.stats().bytes_cached;
    }
    return cached + shared_.free_bytes();
  }
  /// The upstream's capacity: what this pool could ever hold.
  std::size_t capacity() const { return shared_.capacity(); }
  /// Whether `p` lies in a segment some stream's pool holds (a live block or a cached one).
  bool owns(const void* p) const noexcept {
    for (const StreamPool* s = head_.load(std::memory_order_acquire); s != nullptr; s = s->next) {
      if (s->pool.owns(p)) {
        return true;
      }
    }
    return false;
  }

  /// The streams and events (a test's SimulatedStreams, to queue and complete work; the pool calls
  /// them under its lock, so only a thread-safe Streams may be used from outside meanwhile).
  Streams& streams() noexcept { return streams_; }
  /// The upstream (the pool calls it under its lock).
  const Upstream& upstream() const noexcept { return shared_.upstream(); }
  /// The options each stream's pool was built with.
  const PoolOptions& options() const noexcept { return options_; }

  /// Every stream's pool is consistent (CachingPool::consistent), and what they hold adds up to
  /// what the upstream gave them. For tests, with no call running.
  bool consistent() const {
    std::size_t reserved = 0;
    for (const StreamPool* s = head_.load(std::memory_order_acquire); s != nullptr; s = s->next) {
      if (!s->pool.consistent()) {
        return false;
      }
      reserved += s->pool.stats().bytes_reserved;
    }
    return reserved == shared_.held();
  }

  /// Equal only to itself: blocks go back to the pool that gave them.
  friend bool operator==(const StreamCachingPool& a, const StreamCachingPool& b) noexcept { return &a == &b; }

  /// Forwards every property the upstream declares (CCCL's get_property protocol).
  template <class Property>
  requires detail::declares_property<Upstream, Property>
  friend constexpr void get_property(const StreamCachingPool&, Property) noexcept {}

private:
  using Pool = CachingPool<typename detail::SharedUpstream<Upstream>::Handle>;
  // One stream's pool; on a list that only grows, newest first, freed with this pool.
  struct StreamPool {
    std::optional<stream_type> stream; ///< nullopt: the synchronous calls' pool
    Pool pool;
    StreamPool* next = nullptr;
  };
  // A block freed on another stream than its pool's: what goes back to `owner` once the freeing
  // stream has passed the free.
  struct Deferred {
    void* p = nullptr;
    std::size_t bytes = 0;
    std::size_t alignment = 0;
    StreamPool* owner = nullptr;
  };

  [[nodiscard]] cuda::std::expected<void*, Errc> take(const std::optional<stream_type>& stream, std::size_t bytes,
                                                      std::size_t alignment) noexcept {
    // Checked before a stream's pool is made for it, rounding included.
    if (!valid_request(bytes, alignment) || bytes > std::numeric_limits<std::size_t>::max() - options_.granularity) {
      return cuda::std::unexpected(Errc::invalid_size);
    }
    if (alignment > options_.granularity) {
      return cuda::std::unexpected(Errc::no_space);
    }
    if (pending_.load(std::memory_order_acquire) != 0) {
      collect(false, nullptr);
    }
    StreamPool* own = pool_for(stream);
    if (own == nullptr) {
      return cuda::std::unexpected(Errc::no_space);
    }
    auto p = own->pool.try_allocate(bytes, alignment);
    if (!p && p.error() == Errc::no_space && alignment <= options_.granularity &&
        !held_.load(std::memory_order_relaxed) && release_others(own)) {
      p = own->pool.try_allocate(bytes, alignment);
    }
    return p;
  }

  [[nodiscard]] cuda::std::expected<void, Errc> give(const std::optional<stream_type>& stream, void* p,
                                                     std::size_t bytes, std::size_t alignment) noexcept {
    if (pending_.load(std::memory_order_acquire) != 0 && waiting(p)) {
      return cuda::std::unexpected(Errc::not_allocated); // freed on another stream already
    }
    StreamPool* own = stream ? find(stream) : nullptr;
    if (own != nullptr) {
      if (const auto r = freed(*own, p, bytes, alignment); r || r.error() != Errc::not_allocated) {
        return r;
      }
    }
    for (StreamPool* s = head_.load(std::memory_order_acquire); s != nullptr; s = s->next) {
      if (s == own) {
        continue;
      }
      if (!stream) { // synchronous: straight back to its pool
        if (const auto r = freed(*s, p, bytes, alignment); r || r.error() != Errc::not_allocated) {
          return r;
        }
      } else if (const auto r = s->pool.check_deallocate(p, bytes, alignment); r || r.error() != Errc::not_allocated) {
        return r ? defer(*stream, s, p, bytes, alignment) : r;
      }
    }
    return cuda::std::unexpected(Errc::not_allocated);
  }

  // `p` back to `s`'s pool now.
  cuda::std::expected<void, Errc> freed(StreamPool& s, void* p, std::size_t bytes, std::size_t alignment) noexcept {
    return s.pool.try_deallocate(p, bytes, alignment);
  }

  StreamPool* find(const std::optional<stream_type>& stream) const noexcept {
    for (StreamPool* s = head_.load(std::memory_order_acquire); s != nullptr; s = s->next) {
      if (s->stream == stream) {
        return s;
      }
    }
    return nullptr;
  }

  // The pool of `stream`, made at its first use (null when there is no memory to make it).
  StreamPool* pool_for(const std::optional<stream_type>& stream) noexcept {
    if (StreamPool* s = find(stream)) {
      return s;
    }
    const std::lock_guard lock(grow_);
    if (StreamPool* s = find(stream)) {
      return s; // made by another thread meanwhile
    }
    // The options were checked when the synchronous pool was made: CachingPool does not throw.
    auto* made =
        new (std::nothrow) StreamPool{stream, Pool(shared_.handle(), options_), head_.load(std::memory_order_acquire)};
    if (made != nullptr) {
      made->pool.hold(held_.load(std::memory_order_relaxed));
      head_.store(made, std::memory_order_release);
    }
    return made;
  }

  // `s`'s pool's whole free segments back to the upstream once the work queued on its stream so
  // far has run (waited for where the Streams can; never while held, when no event is recorded),
  // and only if no block went back to that pool meanwhile: one freed after the wait may still be
  // in use by work queued after it. The bytes released.
  std::size_t trim_settled(StreamPool& s) noexcept {
    const std::uint64_t frees = s.pool.stats().deallocations;
    return settled(s) ? s.pool.trim(0, frees) : 0;
  }

  // Whether the work queued on `s`'s stream so far has run, waiting for it where the Streams can.
  bool settled(const StreamPool& s) noexcept {
    if (!s.stream) {
      return true; // the synchronous calls' callers have synchronised
    }
    const std::lock_guard lock(events_);
    if (held_.load(std::memory_order_relaxed)) {
      return false;
    }
    try {
      auto e = streams_.record(*s.stream);
      if (!e) {
        return false;
      }
      if constexpr (StreamEventsThatWait<Streams>) {
        streams_.wait(*e);
      }
      const bool done = streams_.completed(*e);
      streams_.release(*e);
      return done;
    } catch (const std::exception&) {
      return false;
    }
  }

  // The upstream refused `own`: the frees made on other streams come home, and the other streams'
  // pools give back their whole free segments once their streams' work has run. Whether anything
  // changed that could let the request through.
  bool release_others(const StreamPool* own) noexcept {
    const std::lock_guard lock(pressure_);
    if (held_.load(std::memory_order_relaxed)) {
      return false; // held since the request looked
    }
    pressure_retries_.fetch_add(1, std::memory_order_relaxed);
    const std::size_t home = collect(true, own);
    std::size_t released = 0;
    for (StreamPool* s = head_.load(std::memory_order_acquire); s != nullptr; s = s->next) {
      released += s != own ? trim_settled(*s) : 0;
    }
    bytes_given_back_.fetch_add(released, std::memory_order_relaxed);
    return home != 0 || released != 0;
  }

  // Whether `p` waits on another stream.
  bool waiting(const void* p) noexcept {
    const std::lock_guard lock(events_);
    return deferred_.any_of([&](const Deferred& d) { return d.p == p; });
  }

  cuda::std::expected<void, Errc> defer(const stream_type& freed_on, StreamPool* owner, void* p, std::size_t bytes,
                                        std::size_t alignment) noexcept {
    try {
      const std::lock_guard lock(events_);
      deferred_.add(streams_, Deferred{p, bytes, alignment, owner}, freed_on, !held_.load(std::memory_order_relaxed));
      pending_.fetch_add(1, std::memory_order_release);
      cross_stream_frees_.fetch_add(1, std::memory_order_relaxed);
      return {};
    } catch (const std::exception&) {
      return cuda::std::unexpected(Errc::no_space);
    }
  }

  // The waiting frees whose streams have passed them (waited for first when `wait`, where the
  // Streams can) go back to their pools; one whose pool's bookkeeping cannot grow now stays for
  // later, and one freed twice meanwhile is reported. Returns how many went to `into`'s pool.
  std::size_t collect(bool wait, const StreamPool* into) noexcept {
    const std::lock_guard lock(events_);
    std::size_t home = 0;
    try {
      deferred_.collect(
          streams_,
          [&](const Deferred& d) {
            if (const auto r = freed(*d.owner, d.p, d.bytes, d.alignment); !r) {
              if (r.error() == Errc::no_space) {
                return false;
              }
              report_misuse(resource_name, d.p, d.bytes, r.error()); // checked at the free
            }
            home += d.owner == into ? 1u : 0u;
            return true;
          },
          wait, !held_.load(std::memory_order_relaxed));
    } catch (const std::exception&) { // an event could not be recorded: those frees wait for a later call
    }
    pending_.store(deferred_.size(), std::memory_order_release);
    return home;
  }

  detail::SharedUpstream<Upstream> shared_; ///< the upstream, called under its lock
  PoolOptions options_;
  std::atomic<StreamPool*> head_{nullptr}; ///< the streams' pools, newest first
  std::mutex grow_;                        ///< one thread at a time makes a pool
  std::mutex events_;                      ///< streams_ and deferred_
  Streams streams_;
  detail::CrossStreamFrees<Streams, Deferred> deferred_;
  std::atomic<std::size_t> pending_{0}; ///< deferred_.size(), read without the lock
  std::atomic<std::uint64_t> cross_stream_frees_{0};
  std::atomic<std::uint64_t> pressure_retries_{0};
  std::mutex pressure_;           ///< one release from the other streams at a time, and hold()
  std::atomic<bool> held_{false}; ///< written under pressure_
  std::atomic<std::uint64_t> bytes_given_back_{0};
};

static_assert(UpstreamResource<StreamCachingPool<SimulatedCard>> && OwnsMemory<StreamCachingPool<SimulatedCard>> &&
              Trimmable<StreamCachingPool<SimulatedCard>> && ReportsStats<StreamCachingPool<SimulatedCard>> &&
              ChecksDeallocation<StreamCachingPool<SimulatedCard>>);
static_assert(MemoryResource<StreamCachingPool<SimulatedCard, SimulatedStreams>>);
static_assert(SynchronousResource<StreamCachingPool<SimulatedCard>>);
static_assert(detail::cccl_accepts<StreamCachingPool<SimulatedCard>>());

} // namespace carve
