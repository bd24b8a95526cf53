/// @file carve/mr/stream_ordered_pool.hpp
/// A caching pool whose frees are ordered on streams: a block freed on a stream is reused on that
/// stream at once, and on another only after an event recorded on it at or after the free has
/// completed.
///
/// @code
/// carve::StreamOrderedPool<carve::CudaDeviceResource, carve::CudaStreams> pool(carve::CudaDeviceResource(0));
/// void* p = pool.allocate(stream_a, 1 << 20, 256);   // CCCL's stream-ordered spelling
/// kernel<<<grid, block, 0, stream_a.get()>>>(p);
/// pool.deallocate(stream_a, p, 1 << 20, 256);         // the kernel may still be running
/// void* q = pool.allocate(stream_b, 1 << 20, 256);   // not p, until stream_a has passed the free
/// @endcode
///
/// A plain caching pool hands a freed block out again at once, while kernels queued before the
/// free may still be using it; that is safe only when the next user is queued behind them on the
/// same stream. Here a free on a stream is followed by an event (Streams::record) on that stream.
/// An allocation on stream S takes, in this order: a cached block freed on S (stream order makes
/// it safe), a cached block from any stream whose event has completed, or new memory from the
/// upstream. This is the rule of PyTorch's CUDA caching allocator and of cudaMallocAsync pools.
///
/// When the events are recorded: while one stream is all the pool has seen (as in a training loop
/// with no side streams), frees record none, since an event is a driver call on a GPU. When a
/// cached block must be known to be past that stream's work (another user wants it, trim(), a
/// refusal, the idle threshold), one event recorded then answers for every free before it; trim()
/// and a refusal wait for it where the Streams can. Once a second stream has used the pool, each
/// free records its own event, so another stream may reuse a block as soon as its stream passes the
/// free. While held (hold(): a CUDA graph capture) no event is recorded; a free's own event is
/// recorded at the end of the hold. So the lone stream must stay valid while blocks it freed are
/// cached (the pool may record on it later), on the device current when the pool is used (CudaStreams).
///
/// Blocks are cached whole, keyed by their size (a request rounded up to `granularity`); a cached
/// block serves requests between half its size and its size (2/3 near a full card:
/// StreamPoolOptions::near_full_permille), so small requests do not pin large blocks. A new block
/// is an upstream allocation of its own, except a small one (at most
/// StreamPoolOptions::small_block_max), which is cut from a 2 MiB segment small blocks share (a
/// CachingPool over the upstream, where the upstream is a card: UpstreamResource) and goes back to
/// it, merging with its free neighbours, when the pool gives it back. The synchronous spellings
/// (try_allocate / deallocate without a stream) are for callers that have synchronised: a
/// synchronous free is reusable by any stream at once, and a synchronous allocation takes only
/// blocks whose events have completed. Cached blocks go back on trim(), when the upstream refuses a
/// request, and beyond StreamPoolOptions::idle_threshold (these two not while held: hold()); in
/// each case only blocks whose events have completed, and then every shared segment none of whose
/// blocks is left goes back to the upstream. The shared segments have run on the host only; over
/// cudaMalloc they have not yet run on a GPU.
/// Options and stats: carve/mr/stream_ordered_pool_options.hpp.
///
/// Errors: invalid_size (check_request, or a size that overflows when rounded to the granularity);
/// no_space when the upstream refuses, even after every
/// cached block whose event has completed went back to it (as PyTorch frees its cache and retries
/// before failing; while held, without that), and no cached block fits. A refused request makes no block; the cached
/// blocks it gave back to the upstream in trying stay given back. A free whose own event cannot be recorded keeps its
/// block with its stream (reused there; elsewhere only if a later hold's end records one). Thread-safe (one lock).
/// Host-only: the streams are driven from the host, whatever memory the upstream hands out.
#pragma once

#include <carve/core/error.hpp>
#include <carve/core/misuse.hpp>
#include <carve/mr/cuda_mr.hpp>
#include <carve/mr/detail/address_table.hpp>
#include <carve/mr/detail/near_full.hpp>
#include <carve/mr/detail/small_block_segments.hpp>
#include <carve/mr/detail/stream_fence.hpp>
#include <carve/mr/memory_resource.hpp>
#include <carve/mr/simulated_card.hpp>
#include <carve/mr/stream_events.hpp>
#include <carve/mr/stream_ordered_pool_options.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <limits>
#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <utility>

namespace carve {

/// A stream-ordered caching pool over `Upstream`, with streams and events from `Streams`.
template <MemoryResource Upstream, StreamEvents Streams = SynchronousStreams>
class StreamOrderedPool
    : public StreamOrderedSpellings<StreamOrderedPool<Upstream, Streams>, typename Streams::stream_type> {
public:
  /// The name misuse reports give.
  static constexpr const char* resource_name = "carve::StreamOrderedPool::deallocate";
  /// The stream type allocations name.
  using stream_type = typename Streams::stream_type;

  /// The arguments in the order of every carve pool: what it takes memory from, its options, its
  /// streams. Throws carve::Exception (invalid_argument) for a granularity that is not a power of
  /// two.
  explicit StreamOrderedPool(Upstream upstream, StreamPoolOptions options = {}, Streams streams = Streams())
      : upstream_(std::move(upstream)), small_(checked(options), upstream_), streams_(std::move(streams)),
        options_(options), near_full_(detail::near_full_bytes(upstream_, options.near_full_permille)) {}
  /// Gives every cached block back, then every small blocks' segment: small blocks still handed
  /// out become invalid with their segments (a larger one stays with the upstream).
  ~StreamOrderedPool() { release_all(); }
  StreamOrderedPool(const StreamOrderedPool&) = delete;
  StreamOrderedPool& operator=(const StreamOrderedPool&) = delete;

  /// A block for work queued on `stream`. Errors: see the top of this header.
  [[nodiscard]] cuda::std::expected<void*, Errc> try_allocate(stream_type stream, std::size_t bytes,
                                                              std::size_t alignment) noexcept {
    return take(bytes, alignment, stream);
  }
  /// Frees `p` for work queued on `stream` after the work that used it. Errors (nothing
  /// changes): not_allocated when `p` is not a live block of this pool; invalid_size when
  /// `bytes` or `alignment` are not the allocation's.
  [[nodiscard]] cuda::std::expected<void, Errc> try_deallocate(stream_type stream, void* p, std::size_t bytes,
                                                               std::size_t alignment) noexcept {
    return give(p, bytes, alignment, stream);
  }
  /// What try_deallocate(stream, p, bytes, alignment) would say now, without freeing anything:
  /// success, not_allocated or invalid_size. For a caller that holds a free to make it later.
  [[nodiscard]] cuda::std::expected<void, Errc> check_deallocate(void* p, std::size_t bytes,
                                                                 std::size_t alignment) const noexcept {
    const std::lock_guard lock(mutex_);
    return detail::answered(refusal(live_.find(reinterpret_cast<std::uintptr_t>(p)), bytes, alignment));
  }

  /// The synchronous form (carve::MemoryResource): only blocks whose events have completed.
  [[nodiscard]] cuda::std::expected<void*, Errc> try_allocate(std::size_t bytes, std::size_t alignment) noexcept {
    return take(bytes, alignment, std::nullopt);
  }
  /// The synchronous free: the caller has synchronised, so any stream may reuse the block at once.
  [[nodiscard]] cuda::std::expected<void, Errc> try_deallocate(void* p, std::size_t bytes,
                                                               std::size_t alignment) noexcept {
    return give(p, bytes, alignment, std::nullopt);
  }

  /// Gives every cached block whose event has completed back (a small one to its segment), then
  /// every shared segment no block holds; returns the bytes that went back to the upstream.
  std::size_t trim() noexcept {
    const std::lock_guard lock(mutex_);
    return release_ready(0, true).to_upstream + small_.trim();
  }

  /// While `held`, nothing goes back to the upstream by itself: not beyond idle_threshold, not
  /// when the upstream refuses a request (which is then refused); trim() still does what it is
  /// asked. No event is recorded: a block freed on a stream meanwhile serves that stream at once
  /// and waits for the end of the hold, when its event is recorded, to go to another user. For a
  /// CUDA stream capture: an event recorded into a capture is never recorded on the stream.
  void hold(bool held) noexcept {
    const std::lock_guard lock(mutex_);
    on_hold_ = held;
    small_.hold(held);
    if (!held && many_streams_) {
      for (auto& [size, c] : cached_) {
        if (c.freed_on && !c.event && !(*c.freed_on == *only_stream_)) { // the lone stream's fence answers for it
          record_event(c);
        }
      }
    }
  }

  /// Whether `p` lies in a block this pool holds from its upstream (handed out or cached).
  bool owns(const void* p) const noexcept {
    const std::lock_guard lock(mutex_);
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    if (live_.find(a) != nullptr) {
      return true; // a block's start: what a FallbackResource asks about when it routes a free
    }
    const auto after = held_.upper_bound(a); // an interior pointer, or another resource's block
    return after != held_.begin() && a - std::prev(after)->first < std::prev(after)->second;
  }
  /// The figures so far.
  StreamPoolStats stats() const noexcept {
    const std::lock_guard lock(mutex_);
    StreamPoolStats out = stats_;
    out.bytes_reserved = stats_.bytes_in_use + stats_.bytes_cached + small_.spare();
    return out;
  }
  /// The streams and events (a test's SimulatedStreams, to queue and complete work).
  Streams& streams() noexcept { return streams_; }
  /// The upstream.
  const Upstream& upstream() const noexcept { return upstream_; }
  /// The options the pool was built with.
  const StreamPoolOptions& options() const noexcept { return options_; }
  /// Pools are equal only to themselves.
  friend bool operator==(const StreamOrderedPool& a, const StreamOrderedPool& b) noexcept { return &a == &b; }

private:
  using event_type = typename Streams::event_type;
  struct Cached { // hand_out() drops a kept node's event, give() fills the rest: nothing stale
    void* address = nullptr;
    std::size_t alignment = 0;           ///< what the upstream was asked for (Live::upstream_alignment)
    std::optional<stream_type> freed_on; ///< nullopt: freed synchronously, reusable anywhere
    std::optional<event_type> event;     ///< recorded at the free (while held: at its end); nullopt when none is needed
    std::uint64_t free_number = 0;       ///< which free it was (the pool's count of frees)
  };
  using Cache = std::multimap<std::size_t, Cached>;
  struct Live {
    std::size_t size = 0;      ///< the block's whole size
    std::size_t bytes = 0;     ///< as asked for
    std::size_t alignment = 0; ///< as asked for
    /// What the upstream was asked for when it made the block, and must be told when it takes the
    /// block back: a cached block serves later requests at other alignments.
    std::size_t upstream_alignment = 0;
  };

  static const StreamPoolOptions& checked(const StreamPoolOptions& options) {
    if (options.granularity == 0 || (options.granularity & (options.granularity - 1)) != 0) {
      throw Exception(Errc::invalid_argument, "carve::StreamOrderedPool: granularity must be a power of two");
    }
    return options;
  }

  /// A new block: cut from the small blocks' segments, or an upstream allocation of its own.
  cuda::std::expected<void*, Errc> make(std::size_t size, std::size_t alignment) noexcept {
    return small_.cuts(size, alignment) ? small_.take(size, alignment) : upstream_.try_allocate(size, alignment);
  }
  /// A block back to where make() took it (`alignment` as make() was asked); returns the bytes
  /// that went back to the upstream (none for a small block: its segment goes on trim).
  std::size_t unmake(void* p, std::size_t size, std::size_t alignment) noexcept {
    if (small_.cuts(size, alignment)) {
      small_.give(p, size, alignment);
      return 0;
    }
    upstream_.deallocate(p, size, alignment);
    return size;
  }

  /// Whether any stream may take the block now (`wait`: see release_ready).
  bool ready(Cached& c, bool wait = false) noexcept {
    if (c.event) {
      return static_cast<bool>(streams_.completed(*c.event));
    }
    if (!c.freed_on) {
      return true; // a synchronous free
    }
    // Freed on the first stream the pool saw, with no event of its own: that stream's fence says.
    // While held it records none: the stream may be capturing a graph, and an event recorded into
    // a capture is never recorded on the stream, so a query would say complete. Another stream's
    // free without an event is one made while held (its event comes at the end of the hold) or one
    // whose event could not be recorded: not yet.
    return *c.freed_on == *only_stream_ &&
           fence_.settled(streams_, *c.freed_on, c.free_number, frees_, wait, !on_hold_);
  }
  /// Notes that `stream` uses the pool: the second stream seen turns per-free events on.
  void saw(const std::optional<stream_type>& stream) noexcept {
    if (!stream || many_streams_) {
      return;
    }
    if (!only_stream_) {
      only_stream_ = stream;
    } else if (!(*only_stream_ == *stream)) {
      many_streams_ = true;
    }
  }
  /// Records the event another stream waits for before it takes `c`, on the stream that freed
  /// it. Without one (out of host memory, or the Streams refused) the block stays with that stream.
  void record_event(Cached& c) noexcept {
    try {
      if (auto e = streams_.record(*c.freed_on)) {
        c.event = *e;
      }
    } catch (const std::bad_alloc&) {
    }
  }
  void drop_event(Cached& c) noexcept {
    if (c.event) {
      streams_.release(*c.event);
      c.event.reset();
    }
  }

  /// The smallest cached block of `least` to `most` bytes that `stream` may take now, at
  /// `alignment`: one freed on `stream` first (stream order makes it safe), else one whose free's
  /// event has completed; cached_.end() when none. Under the lock.
  auto cached_block(std::size_t least, std::size_t most, std::size_t alignment,
                    const std::optional<stream_type>& stream) noexcept {
    const auto first = cached_.lower_bound(least);
    // Walked to the first block past `most`, not found by a second descent: most requests take
    // the first block they look at.
    const auto within = [&](const auto& it) { return it != cached_.end() && it->first <= most; };
    const auto aligned = [&](const auto& it) {
      return reinterpret_cast<std::uintptr_t>(it->second.address) % alignment == 0;
    };
    for (auto it = first; within(it); ++it) {
      if (aligned(it) && stream && it->second.freed_on == stream) {
        ++stats_.same_stream_reuses;
        return it;
      }
    }
    for (auto it = first; within(it); ++it) {
      if (!aligned(it)) {
        continue;
      }
      if (ready(it->second)) {
        stats_.cross_stream_reuses += it->second.freed_on ? 1u : 0u;
        return it;
      }
      ++stats_.waits_avoided;
    }
    return cached_.end();
  }
  /// The cached block at `pick`, handed out for a request of `bytes` at `alignment`. Under the lock.
  void* hand_out(typename Cache::iterator pick, std::size_t bytes, std::size_t alignment) {
    void* p = pick->second.address;
    const std::size_t whole = pick->first;
    live_.insert(reinterpret_cast<std::uintptr_t>(p), Live{whole, bytes, alignment, pick->second.alignment});
    drop_event(pick->second);
    if (spare_count_ < spare_nodes_.size()) { // kept for the next free: no allocation there
      spare_nodes_[spare_count_++] = cached_.extract(pick);
    } else {
      cached_.erase(pick);
    }
    stats_.bytes_cached -= whole;
    stats_.bytes_in_use += whole;
    stats_.peak_in_use = std::max(stats_.peak_in_use, stats_.bytes_in_use);
    return p;
  }

  [[nodiscard]] cuda::std::expected<void*, Errc> take(std::size_t bytes, std::size_t alignment,
                                                      const std::optional<stream_type>& stream) noexcept {
    const std::size_t size = valid_request(bytes, alignment) ? round_up(bytes, options_.granularity) : 0;
    if (size == 0) { // invalid, or overflows when rounded: no resource could serve it
      return cuda::std::unexpected(Errc::invalid_size);
    }
    try {
      const std::lock_guard lock(mutex_);
      saw(stream);
      // A cached block between `size` and twice it (1.5 times it near a full card); else a new one.
      const std::size_t twice = size > ~std::size_t{0} / 2 ? ~std::size_t{0} : 2 * size;
      const bool snug = stats_.bytes_in_use + stats_.bytes_cached > near_full_;
      const std::size_t most = snug && size <= ~std::size_t{0} - size / 2 ? std::min(twice, size + size / 2) : twice;
      if (const auto pick = cached_block(size, most, alignment, stream); pick != cached_.end()) {
        return hand_out(pick, bytes, alignment);
      }
      auto fresh = make(size, alignment);
      if (!fresh && fresh.error() != Errc::invalid_size) {
        ++stats_.upstream_failures;
        if (!on_hold_) { // the card, or a small block's segment, may hold it once the cache is back
          const Released back = release_ready(0, true);
          const std::size_t trimmed = small_.trim();
          if (back.to_upstream + trimmed != 0 || (small_.cuts(size, alignment) && back.blocks != 0)) {
            fresh = make(size, alignment);
          }
        }
        // Still none: a cached block up to twice the request is better than none, near a full
        // card too (one that stayed cached: its stream's work still queued, or the pool held).
        if (!fresh && most < twice) {
          if (const auto pick = cached_block(most + 1, twice, alignment, stream); pick != cached_.end()) {
            return hand_out(pick, bytes, alignment);
          }
        }
      }
      if (!fresh) {
        return cuda::std::unexpected(fresh.error() == Errc::invalid_size ? Errc::invalid_size : Errc::no_space);
      }
      try {
        live_.make_room();
        held_.emplace(reinterpret_cast<std::uintptr_t>(*fresh), size);
      } catch (...) {
        unmake(*fresh, size, alignment);
        throw;
      }
      live_.insert(reinterpret_cast<std::uintptr_t>(*fresh), Live{size, bytes, alignment, alignment});
      ++stats_.upstream_allocations;
      stats_.bytes_in_use += size;
      stats_.peak_in_use = std::max(stats_.peak_in_use, stats_.bytes_in_use);
      stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.bytes_in_use + stats_.bytes_cached + small_.spare());
      return *fresh;
    } catch (const std::exception&) { // the pool's own bookkeeping could not grow
      return cuda::std::unexpected(Errc::no_space);
    }
  }

  // Why `found` (the live block at an address, null for none) may not be freed as `bytes` at
  // `alignment`: not_allocated, invalid_size, or Errc{} (no reason) when it may.
  static Errc refusal(const Live* found, std::size_t bytes, std::size_t alignment) noexcept {
    return found == nullptr                                         ? Errc::not_allocated
           : found->bytes == bytes && found->alignment == alignment ? Errc{}
                                                                    : Errc::invalid_size;
  }

  [[nodiscard]] cuda::std::expected<void, Errc> give(void* p, std::size_t bytes, std::size_t alignment,
                                                     const std::optional<stream_type>& stream) noexcept {
    try {
      const std::lock_guard lock(mutex_);
      const auto address = reinterpret_cast<std::uintptr_t>(p);
      const Live* found = live_.find(address);
      if (const Errc why = refusal(found, bytes, alignment); why != Errc{}) {
        return cuda::std::unexpected(why);
      }
      const std::size_t size = found->size;
      saw(stream);
      // Filled in its node: a Cached built on the stack is stored in pieces and copied whole, a stall.
      const auto cached = file(size);
      cached->second.address = p;
      cached->second.alignment = found->upstream_alignment;
      cached->second.freed_on = stream;
      cached->second.free_number = ++frees_;
      if (stream && many_streams_ && !on_hold_) { // recorded once the block is filed, so that the event cannot be lost
        record_event(cached->second);
      }
      live_.erase(address);
      stats_.bytes_in_use -= size;
      stats_.bytes_cached += size;
      if (!on_hold_ && stats_.bytes_cached > options_.idle_threshold) {
        stats_.idle_releases += released_blocks(options_.idle_threshold);
        small_.trim();
      }
      return succeeded;
    } catch (const std::exception&) {
      return cuda::std::unexpected(Errc::no_space);
    }
  }

  // A cached entry of `size` (its Cached to fill), in a node a hand-out left where there is one.
  typename Cache::iterator file(std::size_t size) {
    if (spare_count_ == 0) {
      return cached_.emplace(size, Cached{});
    }
    typename Cache::node_type node = std::move(spare_nodes_[--spare_count_]);
    node.key() = size;
    return cached_.insert(std::move(node));
  }

  // What release_ready gave back: the blocks' bytes, and of them those that went to the upstream
  // (small blocks go to their segments, which go back on trim).
  struct Released {
    std::size_t blocks = 0;
    std::size_t to_upstream = 0;
  };
  // Cached blocks whose events have completed go back where they were made, largest first, while
  // more than `keep` bytes are cached. `wait`: for the lone stream's fence, where the Streams can
  // (its event is recorded only now, and on a GPU the host runs ahead of it).
  Released release_ready(std::size_t keep, bool wait) noexcept {
    Released freed;
    for (auto it = cached_.end(); it != cached_.begin() && stats_.bytes_cached > keep;) {
      --it;
      if (!ready(it->second, wait)) {
        continue;
      }
      drop_event(it->second);
      held_.erase(reinterpret_cast<std::uintptr_t>(it->second.address));
      freed.blocks += it->first;
      freed.to_upstream += unmake(it->second.address, it->first, it->second.alignment);
      stats_.bytes_cached -= it->first;
      it = cached_.erase(it);
    }
    return freed;
  }
  // release_ready(keep), counting the blocks given back.
  std::size_t released_blocks(std::size_t keep) noexcept {
    const std::size_t before = cached_.size();
    release_ready(keep, false); // at a free: never waits
    return before - cached_.size();
  }

  void release_all() noexcept {
    for (auto& [size, c] : cached_) {
      drop_event(c);
      unmake(c.address, size, c.alignment);
    }
    cached_.clear();
    held_.clear();
    fence_.close(streams_);
  }

  Upstream upstream_;
  detail::SmallBlockSegments<Upstream> small_; ///< after upstream_, which it takes segments from
  Streams streams_;
  StreamPoolOptions options_;
  mutable std::mutex mutex_;
  bool on_hold_ = false;                                  ///< hold(): nothing goes back by itself
  Cache cached_;                                          ///< by block size
  std::array<typename Cache::node_type, 64> spare_nodes_; ///< entries' nodes hand-outs left, to reuse
  std::size_t spare_count_ = 0;
  detail::AddressTable<Live> live_;            ///< by address
  std::map<std::uintptr_t, std::size_t> held_; ///< every block from the upstream (live or cached): start -> size
  StreamPoolStats stats_;
  std::size_t near_full_; ///< bytes held past which a cached block serves down to 2/3 of its size
  // The streams seen (saw()), and for the only one, which of its frees its work has passed.
  std::optional<stream_type> only_stream_;
  bool many_streams_ = false;
  std::uint64_t frees_ = 0; ///< frees so far (Cached::free_number)
  detail::StreamFence<Streams> fence_;
};

static_assert(MemoryResource<StreamOrderedPool<SimulatedCard, SimulatedStreams>> &&
              OwnsMemory<StreamOrderedPool<SimulatedCard, SimulatedStreams>> &&
              Trimmable<StreamOrderedPool<SimulatedCard, SimulatedStreams>> &&
              ReportsStats<StreamOrderedPool<SimulatedCard, SimulatedStreams>> &&
              ChecksDeallocation<StreamOrderedPool<SimulatedCard, SimulatedStreams>>);

} // namespace carve
