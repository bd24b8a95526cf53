/// @file carve/mr/caching_pool.hpp
/// A memory resource adaptor that keeps freed blocks for reuse, and
/// gives them back when too many sit idle.
///
/// @code
/// carve::CachingPool pool(carve::SimulatedCard(16ull << 30), {.idle_threshold = 1ull << 30});
/// auto p = pool.try_allocate(3 << 20, 256);       // expected<void*, Errc>
/// pool.deallocate(*p, 3 << 20, 256);              // cached, not freed
/// pool.trim();                                    // free segments back to the card
/// @endcode
///
/// Serving a request: a cached block of exactly the rounded size; else the smallest larger one,
/// split (the rest stays cached); else a new segment from the upstream: small requests share
/// segments of PoolOptions::segment_size, mid-size ones (below half of
/// PoolOptions::shared_segment_size) share segments of that size, as in PyTorch's allocator, and a
/// larger one gets a segment of its size rounded up to whole segment_size units (cudaMalloc takes
/// whole 2 MiB pages anyway; in the segment, the difference is cache that later requests use).
/// Mid-size requests in segments of their own left real traces' caches in pieces that later,
/// larger requests did not fit (carve_replay: 3% above PyTorch's reserve on one). If the upstream
/// cannot give a shared segment, the request asks for its own first (near a full card a 20 MiB
/// segment may not fit where the request does, and the cache should not go for that); if the
/// upstream says no again, the pool returns its free segments and asks once more for exactly the
/// request (not while held: hold()). Near a full upstream a request takes a new segment, where
/// there is room, rather than cut a whole free one 4x its size (PoolOptions::near_full_permille).
/// Freed blocks merge with free neighbours of the same segment.
/// Ties between equal-sized cached blocks go to the lowest address, so runs are reproducible.
///
/// Shrinking: an upstream allocation can only be returned whole, so the pool releases whole free
/// segments (segments none of whose bytes is handed out), least recently freed first: on every
/// deallocation while the cache is over PoolOptions::idle_threshold, and on demand with trim().
/// Releasing whole segments means the cache does not land exactly on the threshold: the last
/// segment released may take the cache below it, and free blocks in segments that still hold a
/// live block stay cached above it. stats() reports what is held, used, cached and how
/// fragmented the cache is.
///
/// Bookkeeping: every block is a range of a BestFitRanges with one region per segment (so blocks
/// never merge across segments), live blocks are found by address in an open-addressing table,
/// and whole free segments wait on a list in the order they fell free, their bytes kept as a
/// running sum. So a call costs O(log n) in the cached blocks, however fragmented the cache is,
/// plus O(log segments) for each segment taken from or given back to the upstream; a deallocation
/// that leaves the cache over the threshold with no whole free segment to give back costs nothing
/// more (bench_pool_fragmentation: 1k to 100k cached blocks).
///
/// The pool is a carve::MemoryResource over any carve::UpstreamResource (so pools stack on
/// borrowed memory, spill shares, or other pools), and thread-safe (one mutex). It also satisfies
/// carve::SynchronousResource (what CCCL's cuda::mr::synchronous_resource requires, checked on
/// every build) and CCCL's own concept where `<cuda/memory_resource>` is available (carve/mr/
/// cuda_mr.hpp), and forwards its upstream's properties (host_accessible for SimulatedCard,
/// device_accessible for CudaDeviceResource).
#pragma once

#include <carve/core/error.hpp>
#include <carve/core/misuse.hpp>
#include <carve/mr/best_fit_ranges.hpp>
#include <carve/mr/caching_pool_options.hpp>
#include <carve/mr/cuda_mr.hpp>
#include <carve/mr/detail/address_table.hpp>
#include <carve/mr/detail/block_lookup.hpp>
#include <carve/mr/detail/near_full.hpp>
#include <carve/mr/memory_resource.hpp>
#include <carve/mr/simulated_card.hpp>

#include <cuda/std/expected>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <utility>
#include <vector>

namespace carve {

/// A caching MemoryResource over `Upstream`: freed blocks are kept and reused, idle segments go
/// back. Thread-safe (one mutex).
template <UpstreamResource Upstream>
requires std::move_constructible<Upstream>
class CachingPool : public CcclSpellings<CachingPool<Upstream>> {
public:
  /// The resource the pool takes segments from.
  using upstream_type = Upstream;

  /// Throws carve::Exception (invalid_argument) unless the granularity is a power of two and the
  /// segment size a positive multiple of it. Asks the upstream its capacity (near_full_permille).
  explicit CachingPool(Upstream upstream, PoolOptions options = {})
      : upstream_(std::move(upstream)), options_(options), capacity_(detail::upstream_capacity(upstream_)),
        near_full_(detail::near_full_bytes(upstream_, options.near_full_permille)) {
    const std::size_t g = options_.granularity;
    if (g == 0 || (g & (g - 1)) != 0 || options_.segment_size == 0 || options_.segment_size % g != 0) {
      throw Exception(Errc::invalid_argument,
                      "carve::CachingPool: granularity must be a power of two and segment_size a positive multiple "
                      "of it (granularity " +
                          std::to_string(g) + ", segment_size " + std::to_string(options_.segment_size) + ")");
    }
  }

  CachingPool(const CachingPool&) = delete;
  CachingPool& operator=(const CachingPool&) = delete;

  /// Returns every segment to the upstream; blocks still handed out become invalid with it.
  ~CachingPool() {
    for (const auto& [base, r] : by_base_) {
      upstream_.deallocate(to_ptr(base), segments_[r].size, options_.granularity);
    }
  }

  /// Errors (no block is made): invalid_size for 0 bytes, an alignment that is not a power of
  /// two or a size that overflows when rounded to the granularity; no_space for an alignment above
  /// the granularity or a request above the upstream's capacity (nothing changes), or when neither
  /// the cache nor the upstream (after the cache is returned to it, which stays returned) can hold it.
  [[nodiscard]] cuda::std::expected<void*, Errc> try_allocate(std::size_t bytes, std::size_t alignment) noexcept {
    if (!valid_request(bytes, alignment)) {
      return cuda::std::unexpected(Errc::invalid_size);
    }
    if (alignment > options_.granularity) {
      return cuda::std::unexpected(Errc::no_space);
    }
    const std::size_t size = rounded(bytes, alignment);
    if (size == 0) return cuda::std::unexpected(Errc::invalid_size);
    if (size > capacity_ || own_segment(size) == 0) return cuda::std::unexpected(Errc::no_space); // never fits
    try {
      const std::lock_guard lock(mutex_);
      auto taken = own_segment_near_full(size);
      if (!taken) {
        taken = take_cached(size);
        counters_.cache_hits += taken ? 1u : 0u;
      }
      if (!taken) taken = take_new_segment(size);
      if (!taken) return cuda::std::unexpected(Errc::no_space);
      try {
        live_.insert(taken->start, taken->handle);
      } catch (const std::bad_alloc&) {
        give_back(taken->handle);
        throw;
      }
      ++counters_.allocations;
      in_use_ += size;
      counters_.peak_in_use = std::max(counters_.peak_in_use, in_use_);
      return to_ptr(taken->start);
    } catch (const std::bad_alloc&) { // the pool's own bookkeeping could not grow
      return cuda::std::unexpected(Errc::no_space);
    }
  }

  /// Errors (nothing changes): not_allocated when `p` is not a live block of this pool (never
  /// allocated, or freed already); invalid_size when `bytes` does not round to its block's size.
  [[nodiscard]] cuda::std::expected<void, Errc> try_deallocate(void* p, std::size_t bytes,
                                                               std::size_t alignment) noexcept {
    const std::lock_guard lock(mutex_);
    const BestFitRanges::Handle* found = live_.find(to_addr(p));
    if (found == nullptr) {
      return cuda::std::unexpected(Errc::not_allocated);
    }
    const BestFitRanges::Handle h = *found;
    const std::size_t size = ranges_.size(h);
    if (!valid_request(bytes, alignment) || rounded(bytes, alignment) != size) {
      return cuda::std::unexpected(Errc::invalid_size);
    }
    try {
      give_back(h);
    } catch (const std::bad_alloc&) { // the free ranges could not grow: the block stays live
      return cuda::std::unexpected(Errc::no_space);
    }
    live_.erase(to_addr(p));
    ++counters_.deallocations;
    in_use_ -= size;
    if (!on_hold_ && ranges_.free_bytes() > options_.idle_threshold) {
      release_free_segments(options_.idle_threshold);
    }
    return succeeded;
  }

  /// What try_deallocate(p, bytes, alignment) would say now, without freeing anything: success,
  /// not_allocated or invalid_size as there. For a caller that frees later (StreamCachingPool
  /// holds a free made on another stream until that stream's work has passed it).
  [[nodiscard]] cuda::std::expected<void, Errc> check_deallocate(void* p, std::size_t bytes,
                                                                 std::size_t alignment) const noexcept {
    const std::lock_guard lock(mutex_);
    const BestFitRanges::Handle* found = live_.find(to_addr(p));
    if (found == nullptr) {
      return cuda::std::unexpected(Errc::not_allocated);
    }
    if (!valid_request(bytes, alignment) || rounded(bytes, alignment) != ranges_.size(*found)) {
      return cuda::std::unexpected(Errc::invalid_size);
    }
    return succeeded;
  }

  /// deallocate cannot report an error (it is noexcept), so misuse ends the program with a
  /// message (core/misuse.hpp); try_deallocate reports it instead.
  void deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept {
    if (const auto r = try_deallocate(p, bytes, alignment); !r) {
      report_misuse("carve::CachingPool::deallocate", p, bytes, r.error());
    }
  }

  /// Returns whole free segments (no byte of them handed out) to the upstream, least recently
  /// freed first, one at a time while more than `keep_cached` bytes are cached; stops when the
  /// cache is at or below `keep_cached` or no whole free segment is left. So it releases whole
  /// segments only, never part of one: the cache can end below `keep_cached` (by less than the
  /// last segment released) or above it (by free blocks in segments still partly in use).
  /// With `frees_seen` (stats().deallocations read before), nothing goes if a block was freed
  /// since: for a caller that made sure the work on the blocks freed until then has run
  /// (StreamCachingPool). Returns the bytes released (the sizes of the segments returned).
  std::size_t trim(std::size_t keep_cached = 0, std::optional<std::uint64_t> frees_seen = std::nullopt) {
    const std::lock_guard lock(mutex_);
    return frees_seen && *frees_seen != counters_.deallocations ? 0 : release_free_segments(keep_cached);
  }

  /// While `held`, nothing goes back to the upstream by itself: not beyond idle_threshold, not
  /// when the upstream refuses a request (asked once more for exactly its size, then refused);
  /// trim() still does what it is asked. For a CUDA stream capture, during which PyTorch's
  /// allocator frees nothing either.
  void hold(bool held) noexcept {
    const std::lock_guard lock(mutex_);
    on_hold_ = held;
  }

  /// The pool's counters now, taken under its lock.
  PoolStats stats() const {
    const std::lock_guard lock(mutex_);
    PoolStats s = counters_;
    s.bytes_in_use = in_use_;
    s.bytes_cached = ranges_.free_bytes();
    s.bytes_reserved = reserved_;
    s.live_blocks = live_.size();
    s.cached_blocks = ranges_.count();
    s.segments = by_base_.size();
    s.largest_cached_block = ranges_.largest();
    return s;
  }

  /// Bytes the card could still hand out through this pool: cached plus the upstream's free.
  std::size_t free_bytes() const {
    const std::lock_guard lock(mutex_);
    return ranges_.free_bytes() + upstream_.free_bytes();
  }
  /// The upstream's capacity: what this pool could ever hold.
  std::size_t capacity() const { return upstream_.capacity(); }

  /// Whether `p` lies in a segment this pool holds (a live block or a cached one).
  bool owns(const void* p) const noexcept {
    const std::lock_guard lock(mutex_);
    return detail::block_containing(by_base_, p, [&](BestFitRanges::Region r) { return segments_[r].size; }) !=
           by_base_.end();
  }

  /// The largest request that would succeed now, assuming the upstream's free memory is in one
  /// piece (true for SimulatedCard, nearly so for a GPU's virtual address space): the largest
  /// cached block, or the upstream's free memory plus (unless held) the whole free segments the
  /// pool would return to it first.
  std::size_t largest_allocation() const {
    const std::lock_guard lock(mutex_);
    std::size_t from_upstream = upstream_.free_bytes() + (on_hold_ ? 0 : idle_bytes_);
    from_upstream -= from_upstream % options_.granularity;
    return std::max(ranges_.largest(), from_upstream);
  }

  /// The upstream resource.
  const Upstream& upstream() const noexcept { return upstream_; }
  /// The options the pool was built with.
  const PoolOptions& options() const noexcept { return options_; }

  /// Checks every invariant: the blocks tile their segments exactly with no two free neighbours
  /// left unmerged (BestFitRanges::consistent), the whole free segments are exactly those on the
  /// idle list, and the byte counts add up (the idle list's among them). For tests.
  bool consistent() const {
    const std::lock_guard lock(mutex_);
    std::size_t reserved = 0;
    std::size_t idle = 0;
    for (const auto& [base, r] : by_base_) {
      const Segment& s = segments_[r];
      reserved += s.size;
      idle += ranges_.region_free(r) ? 1u : 0u;
      if (s.base != base || s.idle != ranges_.region_free(r)) {
        return false;
      }
    }
    std::size_t listed = 0;
    std::size_t listed_bytes = 0;
    for (std::uint32_t r = idle_.first; r != none; r = segments_[r].next_idle) {
      ++listed;
      listed_bytes += segments_[r].size;
    }
    return ranges_.consistent() && listed == idle && listed_bytes == idle_bytes_ && reserved == reserved_ &&
           in_use_ + ranges_.free_bytes() == reserved_ && ranges_.taken() == live_.size();
  }

  /// Equal only to itself: blocks go back to the pool that gave them.
  friend bool operator==(const CachingPool& a, const CachingPool& b) noexcept { return &a == &b; }

  /// Forwards every property the upstream declares (CCCL's get_property protocol).
  template <class Property>
  requires detail::declares_property<Upstream, Property>
  friend constexpr void get_property(const CachingPool&, Property) noexcept {}

private:
  static constexpr std::uint32_t none = UINT32_MAX;
  // A segment: an upstream allocation, one region of the ranges. Whole free segments are on the
  // idle list, least recently freed first: the order they go back in.
  struct Segment {
    std::uintptr_t base = 0;
    std::size_t size = 0;
    bool idle = false;
    std::uint32_t prev_idle = none;
    std::uint32_t next_idle = none;
  };
  struct IdleList {
    std::uint32_t first = none; ///< least recently freed
    std::uint32_t last = none;
  };

  static void* to_ptr(std::uintptr_t a) noexcept { return reinterpret_cast<void*>(a); }
  static std::uintptr_t to_addr(void* p) noexcept { return reinterpret_cast<std::uintptr_t>(p); }

  /// The block size for a valid request (valid_request), or 0 when the pool cannot serve it: an
  /// alignment above the granularity, or a size that overflows when rounded.
  std::size_t rounded(std::size_t bytes, std::size_t alignment) const noexcept {
    const std::size_t g = options_.granularity;
    return alignment > g || bytes > std::numeric_limits<std::size_t>::max() - (g - 1) ? 0 : (bytes + g - 1) & ~(g - 1);
  }

  /// Best fit from the cache: exact size, else the smallest larger block, split (the rest stays
  /// cached). nullopt if none fits.
  std::optional<BestFitRanges::Taken> take_cached(std::size_t size) {
    const auto taken = ranges_.take(size);
    if (taken) {
      busy(ranges_.region(taken->handle));
      counters_.splits += taken->rest != 0 ? 1u : 0u;
    }
    return taken;
  }

  /// The segment a request of `size` gets when it shares none (0 when that overflows).
  std::size_t own_segment(std::size_t size) const noexcept {
    return round_up(std::max(size, options_.segment_size), options_.segment_size);
  }

  /// The shared segment a request of `size` asks for first, or 0 where it shares none: see the
  /// file's description (round_up gives 0 for a shared_segment_size that overflows).
  std::size_t shared_segment(std::size_t size) const noexcept {
    const bool mid_size = size >= options_.segment_size && size < options_.shared_segment_size / 2;
    return mid_size ? round_up(options_.shared_segment_size, options_.segment_size) : 0;
  }

  /// Near a full upstream, a new segment for a request whose best fit is a wholly free segment 4
  /// or more times its size and larger than the new one (PoolOptions::near_full_permille); nullopt
  /// otherwise, or when the upstream has no room (the cache is not given back for it).
  std::optional<BestFitRanges::Taken> own_segment_near_full(std::size_t size) {
    const auto best = reserved_ > near_full_ && !on_hold_ ? ranges_.best_range(size) : std::nullopt;
    const auto segment = best ? by_base_.find(best->start) : by_base_.end();
    if (segment == by_base_.end() || best->bytes != segments_[segment->second].size || best->bytes / 4 < size ||
        best->bytes <= std::max(shared_segment(size), own_segment(size))) {
      return std::nullopt;
    }
    return take_new_segment(size, false);
  }

  /// A new segment for `size` (shared where the options say so). Where the upstream refuses,
  /// `may_release`: the free segments go back and exactly `size` is asked for.
  std::optional<BestFitRanges::Taken> take_new_segment(std::size_t size, bool may_release = true) {
    const std::size_t shared = shared_segment(size);
    std::size_t got = shared != 0 ? shared : own_segment(size);
    auto got_segment = upstream_.try_allocate(got, options_.granularity);
    if (!got_segment && shared != 0) { // no room for a shared segment: the request's own
      ++counters_.upstream_failures;
      got = own_segment(size);
      got_segment = upstream_.try_allocate(got, options_.granularity);
    }
    if (!got_segment) {
      ++counters_.upstream_failures;
      if (!may_release) {
        return std::nullopt;
      }
      if (!on_hold_) {
        release_free_segments(0); // the card may fit the request once the cache is returned
      }
      got = size; // and ask for no more than needed
      got_segment = upstream_.try_allocate(size, options_.granularity);
      if (!got_segment) {
        ++counters_.upstream_failures;
        return std::nullopt;
      }
    }
    const std::uintptr_t base = to_addr(*got_segment);
    BestFitRanges::Region r = 0;
    try {
      if (segments_.size() == segments_.capacity()) { // a new region id may be one past the end
        segments_.reserve(std::max<std::size_t>(8, 2 * segments_.capacity()));
      }
      r = ranges_.add_region(base, got);
      if (r == segments_.size()) {
        segments_.emplace_back();
      }
      segments_[r] = Segment{base, got, false, none, none}; // segments_ is indexed by region id
      try {
        by_base_.emplace(base, r);
      } catch (...) {
        ranges_.remove_region(r);
        throw;
      }
    } catch (...) {
      upstream_.deallocate(*got_segment, got, options_.granularity);
      throw;
    }
    ++counters_.upstream_allocations;
    reserved_ += got;
    counters_.peak_reserved = std::max(counters_.peak_reserved, reserved_);
    // Idle until the block is cut from it: if that cannot be done (no memory for the split), the
    // segment stays cached, and releasable, rather than lost.
    idle(r);
    return take_cached(size); // the new segment is the one free range that fits
  }

  /// Frees a block, merging it with free neighbours in its segment; a segment left wholly free
  /// joins the idle list.
  void give_back(BestFitRanges::Handle h) {
    const BestFitRanges::Region r = ranges_.region(h);
    counters_.merges += ranges_.give(h).joined;
    if (ranges_.region_free(r)) {
      idle(r);
    }
  }

  /// A segment now wholly free: last on the idle list.
  void idle(BestFitRanges::Region r) noexcept {
    Segment& s = segments_[r];
    s.idle = true;
    s.prev_idle = idle_.last;
    s.next_idle = none;
    (idle_.last == none ? idle_.first : segments_[idle_.last].next_idle) = r;
    idle_.last = r;
    idle_bytes_ += s.size;
  }

  /// A segment that was wholly free is in use again: off the idle list.
  void busy(BestFitRanges::Region r) noexcept {
    Segment& s = segments_[r];
    if (!s.idle) {
      return;
    }
    (s.prev_idle == none ? idle_.first : segments_[s.prev_idle].next_idle) = s.next_idle;
    (s.next_idle == none ? idle_.last : segments_[s.next_idle].prev_idle) = s.prev_idle;
    s.idle = false;
    idle_bytes_ -= s.size;
  }

  /// Whole free segments, least recently freed first, while more than `keep_cached` bytes are
  /// cached: each one step off the idle list, no search.
  std::size_t release_free_segments(std::size_t keep_cached) noexcept {
    std::size_t released = 0;
    while (ranges_.free_bytes() > keep_cached && idle_.first != none) {
      const std::uint32_t r = idle_.first;
      busy(r);
      const Segment s = segments_[r];
      ranges_.remove_region(r);
      by_base_.erase(s.base);
      upstream_.deallocate(to_ptr(s.base), s.size, options_.granularity);
      reserved_ -= s.size;
      released += s.size;
      ++counters_.upstream_frees;
    }
    return released;
  }

  Upstream upstream_;
  PoolOptions options_;
  mutable std::mutex mutex_;
  bool on_hold_ = false;                                    ///< hold(): nothing goes back by itself
  BestFitRanges ranges_;                                    ///< every block: one region per segment
  std::vector<Segment> segments_;                           ///< by region id (ids are reused)
  std::map<std::uintptr_t, BestFitRanges::Region> by_base_; ///< segments held now, by base address
  std::size_t capacity_;                                    ///< the upstream's, when made (max(): unknown)
  std::size_t near_full_;                                   ///< bytes held past which near_full_permille applies
  IdleList idle_;
  std::size_t idle_bytes_ = 0;                       ///< the sizes of the segments on the idle list
  detail::AddressTable<BestFitRanges::Handle> live_; ///< live blocks by address
  std::size_t in_use_ = 0;
  std::size_t reserved_ = 0;
  PoolStats counters_; ///< the event counters and peaks; sizes are filled in by stats()
};

static_assert(UpstreamResource<CachingPool<SimulatedCard>> && OwnsMemory<CachingPool<SimulatedCard>> &&
              Trimmable<CachingPool<SimulatedCard>> && ReportsStats<CachingPool<SimulatedCard>> &&
              ChecksDeallocation<CachingPool<SimulatedCard>>);
static_assert(SynchronousResource<CachingPool<SimulatedCard>>);
static_assert(detail::cccl_accepts<CachingPool<SimulatedCard>>());
#if defined(CARVE_HAS_CUDA_MR)
static_assert(SynchronousResourceWith<CachingPool<SimulatedCard>, cuda::mr::host_accessible>);
static_assert(!SynchronousResourceWith<CachingPool<SimulatedCard>, cuda::mr::device_accessible>);
#endif

} // namespace carve
