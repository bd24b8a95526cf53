/// @file carve/mr/caching_pool.hpp
/// A memory resource adaptor that keeps freed blocks for reuse, and
/// gives them back when too many sit idle.
///
/// @code
/// carve::CachingPool pool(carve::SimulatedCard(16ull << 30), {.idle_threshold = 1ull << 30});
/// auto p = pool.try_allocate(3 << 20);            // expected<void*, Errc>
/// pool.deallocate(*p, 3 << 20);                   // cached, not freed
/// pool.trim();                                    // free segments back to the card
/// @endcode
///
/// Serving a request: a cached block of exactly the rounded size; else the smallest larger one,
/// split (the rest stays cached); else a new segment from the upstream (small requests share
/// segments of PoolOptions::segment_size). If the upstream says no, the pool returns its free
/// segments and asks once more. Freed blocks merge with free neighbours of the same segment.
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
/// The pool is a carve::MemoryResource over any carve::UpstreamResource (so pools stack on
/// borrowed memory, spill shares, or other pools), and thread-safe (one mutex). It also
/// satisfies carve::SynchronousResource (what CCCL's
/// cuda::mr::synchronous_resource requires, checked on every build) and CCCL's own concept where
/// `<cuda/memory_resource>` is available (resource in CCCL 3.0, synchronous_resource from 3.1; see
/// carve/mr/cuda_mr.hpp), and forwards its upstream's properties (host_accessible for
/// SimulatedCard, device_accessible for CudaDeviceResource).
#pragma once

#include <carve/core/error.hpp>
#include <carve/core/misuse.hpp>
#include <carve/mr/cuda_mr.hpp>
#include <carve/mr/detail/block_lookup.hpp>
#include <carve/mr/memory_resource.hpp>
#include <carve/mr/pool_stats.hpp>
#include <carve/mr/simulated_card.hpp>

#include <cuda/std/expected>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <mutex>
#include <new>
#include <set>
#include <utility>

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
  /// segment size a positive multiple of it.
  explicit CachingPool(Upstream upstream, PoolOptions options = {})
      : upstream_(std::move(upstream)), options_(options) {
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
    for (const auto& [base, size] : segments_) {
      upstream_.deallocate(to_ptr(base), size, options_.granularity);
    }
  }

  /// Errors (nothing changes): invalid_size for 0 bytes or an alignment that is not a power of
  /// two; no_space for an alignment above the granularity, a size too large to round, or when
  /// neither the cache nor the upstream (after the cache is returned to it) can hold the request.
  cuda::std::expected<void*, Errc> try_allocate(std::size_t bytes, std::size_t alignment = default_alignment) noexcept {
    if (const auto ok = check_request(bytes, alignment); !ok) {
      return cuda::std::unexpected(ok.error());
    }
    const std::size_t size = rounded(bytes, alignment);
    if (size == 0) {
      return cuda::std::unexpected(Errc::no_space);
    }
    try {
      const std::lock_guard lock(mutex_);
      std::uintptr_t addr = take_cached(size);
      if (addr != 0) {
        ++counters_.cache_hits;
      } else {
        addr = take_new_segment(size);
        if (addr == 0) {
          return cuda::std::unexpected(Errc::no_space);
        }
      }
      ++counters_.allocations;
      in_use_ += size;
      ++live_;
      counters_.peak_in_use = std::max(counters_.peak_in_use, in_use_);
      return to_ptr(addr);
    } catch (const std::bad_alloc&) { // the pool's own bookkeeping could not grow
      return cuda::std::unexpected(Errc::no_space);
    }
  }

  /// Errors (nothing changes): not_allocated when `p` is not a live block of this pool (never
  /// allocated, or freed already); invalid_size when `bytes` does not match its allocation.
  cuda::std::expected<void, Errc> try_deallocate(void* p, std::size_t bytes,
                                                 std::size_t alignment = default_alignment) noexcept {
    const std::lock_guard lock(mutex_);
    const auto it = blocks_.find(to_addr(p));
    if (p == nullptr || it == blocks_.end() || it->second.free) {
      return cuda::std::unexpected(Errc::not_allocated);
    }
    if (!check_request(bytes, alignment) || rounded(bytes, alignment) != it->second.size) {
      return cuda::std::unexpected(Errc::invalid_size);
    }
    ++counters_.deallocations;
    in_use_ -= it->second.size;
    --live_;
    give_back(it);
    if (cached_ > options_.idle_threshold) {
      release_free_segments(options_.idle_threshold);
    }
    return {};
  }

  /// deallocate cannot report an error (it is noexcept), so misuse ends the program with a
  /// message (core/misuse.hpp); try_deallocate reports it instead.
  void deallocate(void* p, std::size_t bytes, std::size_t alignment = default_alignment) noexcept {
    if (const auto r = try_deallocate(p, bytes, alignment); !r) {
      report_misuse("carve::CachingPool::deallocate", p, bytes, r.error());
    }
  }

  /// Returns whole free segments (no byte of them handed out) to the upstream, least recently
  /// freed first, one at a time while more than `keep_cached` bytes are cached; stops when the
  /// cache is at or below `keep_cached` or no whole free segment is left. So it releases whole
  /// segments only, never part of one: the cache can end below `keep_cached` (by less than the
  /// last segment released) or above it (by free blocks in segments still partly in use).
  /// Returns the bytes released (the sizes of the segments returned).
  std::size_t trim(std::size_t keep_cached = 0) {
    const std::lock_guard lock(mutex_);
    return release_free_segments(keep_cached);
  }

  /// The pool's counters now, taken under its lock.
  PoolStats stats() const {
    const std::lock_guard lock(mutex_);
    PoolStats s = counters_;
    s.bytes_in_use = in_use_;
    s.bytes_cached = cached_;
    s.bytes_reserved = reserved_;
    s.live_blocks = live_;
    s.cached_blocks = free_.size();
    s.segments = segments_.size();
    s.largest_cached_block = free_.empty() ? 0 : free_.rbegin()->first;
    return s;
  }

  /// Bytes the card could still hand out through this pool: cached plus the upstream's free.
  std::size_t free_bytes() const {
    const std::lock_guard lock(mutex_);
    return cached_ + upstream_.free_bytes();
  }
  /// The upstream's capacity: what this pool could ever hold.
  std::size_t capacity() const { return upstream_.capacity(); }

  /// Whether `p` lies in a segment this pool holds (a live block or a cached one).
  bool owns(const void* p) const noexcept {
    const std::lock_guard lock(mutex_);
    return detail::block_containing(segments_, p, [](std::size_t size) { return size; }) != segments_.end();
  }

  /// The largest request that would succeed now, assuming the upstream's free memory is in one
  /// piece (true for SimulatedCard, nearly so for a GPU's virtual address space): the largest
  /// cached block, or the upstream's free memory plus the whole free segments the pool would
  /// return to it first.
  std::size_t largest_allocation() const {
    const std::lock_guard lock(mutex_);
    std::size_t from_upstream = upstream_.free_bytes();
    for (const auto& [size, addr] : free_) {
      if (addr == blocks_.at(addr).segment && size == segments_.at(addr)) {
        from_upstream += size;
      }
    }
    from_upstream -= from_upstream % options_.granularity;
    return std::max(free_.empty() ? 0 : free_.rbegin()->first, from_upstream);
  }

  /// The upstream resource.
  const Upstream& upstream() const noexcept { return upstream_; }
  /// The options the pool was built with.
  const PoolOptions& options() const noexcept { return options_; }

  /// Checks every invariant: blocks tile their segments exactly, no two free neighbours are left
  /// unmerged, the size index matches the blocks, and the byte counts add up. For tests.
  bool consistent() const {
    const std::lock_guard lock(mutex_);
    std::size_t in_use = 0;
    std::size_t cached = 0;
    std::size_t live = 0;
    std::size_t free_blocks = 0;
    std::uintptr_t expected_next = 0;
    std::uintptr_t segment = 0;
    bool previous_free = false;
    std::size_t segments_seen = 0;
    for (const auto& [addr, b] : blocks_) {
      const auto seg = segments_.find(b.segment);
      if (seg == segments_.end() || addr < b.segment || addr + b.size > b.segment + seg->second ||
          b.size % options_.granularity != 0 || b.size == 0) {
        return false;
      }
      if (b.segment != segment) { // first block of a new segment starts at its base
        if (expected_next != 0 && expected_next != segment + segments_.at(segment)) {
          return false;
        }
        segment = b.segment;
        ++segments_seen;
        if (addr != segment) {
          return false;
        }
        previous_free = false;
      } else if (addr != expected_next || (previous_free && b.free)) {
        return false;
      }
      expected_next = addr + b.size;
      previous_free = b.free;
      if (b.free) {
        cached += b.size;
        ++free_blocks;
        if (free_.count({b.size, addr}) != 1) {
          return false;
        }
      } else {
        in_use += b.size;
        ++live;
      }
    }
    if (segment != 0 && expected_next != segment + segments_.at(segment)) {
      return false;
    }
    std::size_t reserved = 0;
    for (const auto& [base, size] : segments_) {
      reserved += size;
    }
    return segments_seen == segments_.size() && in_use == in_use_ && cached == cached_ && live == live_ &&
           free_blocks == free_.size() && reserved == reserved_ && in_use + cached == reserved;
  }

  /// Equal only to itself: blocks go back to the pool that gave them.
  friend bool operator==(const CachingPool& a, const CachingPool& b) noexcept { return &a == &b; }

  /// Forwards every property the upstream declares (CCCL's get_property protocol).
  template <class Property>
  requires detail::declares_property<Upstream, Property>
  friend constexpr void get_property(const CachingPool&, Property) noexcept {}

private:
  struct Block {
    std::size_t size = 0;
    std::uintptr_t segment = 0; ///< base address of the segment it belongs to
    bool free = false;
    std::uint64_t freed_at = 0; ///< for least-recently-used release
  };
  using BlockMap = std::map<std::uintptr_t, Block>;

  static void* to_ptr(std::uintptr_t a) noexcept { return reinterpret_cast<void*>(a); }
  static std::uintptr_t to_addr(void* p) noexcept { return reinterpret_cast<std::uintptr_t>(p); }

  /// The block size for a valid request (check_request), or 0 when the pool cannot serve it: an
  /// alignment above the granularity, or a size that overflows when rounded.
  std::size_t rounded(std::size_t bytes, std::size_t alignment) const noexcept {
    return alignment > options_.granularity ? 0 : round_up(bytes, options_.granularity);
  }

  /// Best fit from the cache: exact size, else the smallest larger block, split. 0 if none.
  std::uintptr_t take_cached(std::size_t size) {
    const auto it = free_.lower_bound({size, 0});
    if (it == free_.end()) {
      return 0;
    }
    const std::uintptr_t addr = it->second;
    Block& b = blocks_.at(addr);
    free_.erase(it);
    cached_ -= b.size;
    b.free = false;
    split(addr, b, size);
    return addr;
  }

  /// Cuts `b` (at `addr`, just taken) down to `size`; the rest becomes a cached block.
  void split(std::uintptr_t addr, Block& b, std::size_t size) {
    if (b.size == size) {
      return;
    }
    const std::size_t rest = b.size - size;
    Block tail{rest, b.segment, true, tick_};
    b.size = size;
    blocks_.emplace(addr + size, tail);
    free_.insert({rest, addr + size});
    cached_ += rest;
    ++counters_.splits;
  }

  std::uintptr_t take_new_segment(std::size_t size) {
    const std::size_t preferred = std::max(size, options_.segment_size);
    auto got_segment = upstream_.try_allocate(preferred, options_.granularity);
    std::size_t got = preferred;
    if (!got_segment) {
      ++counters_.upstream_failures;
      release_free_segments(0); // the card may fit the request once the cache is returned
      got = size;               // and ask for no more than needed
      got_segment = upstream_.try_allocate(size, options_.granularity);
      if (!got_segment) {
        ++counters_.upstream_failures;
        return 0;
      }
    }
    void* const p = *got_segment;
    const std::uintptr_t base = to_addr(p);
    try {
      segments_.emplace(base, got);
      try {
        auto [it, inserted] = blocks_.emplace(base, Block{got, base, false, tick_});
        split(base, it->second, size);
      } catch (...) {
        blocks_.erase(base);
        segments_.erase(base);
        throw;
      }
    } catch (...) {
      upstream_.deallocate(p, got, options_.granularity);
      throw;
    }
    ++counters_.upstream_allocations;
    reserved_ += got;
    counters_.peak_reserved = std::max(counters_.peak_reserved, reserved_);
    return base;
  }

  /// Marks a live block free and merges it with free neighbours in its segment.
  void give_back(typename BlockMap::iterator it) {
    ++tick_;
    it->second.free = true;
    it->second.freed_at = tick_;
    cached_ += it->second.size;
    if (const auto next = std::next(it);
        next != blocks_.end() && next->second.free && next->second.segment == it->second.segment) {
      free_.erase({next->second.size, next->first});
      it->second.size += next->second.size;
      blocks_.erase(next);
      ++counters_.merges;
    }
    if (it != blocks_.begin()) {
      const auto prev = std::prev(it);
      if (prev->second.free && prev->second.segment == it->second.segment) {
        free_.erase({prev->second.size, prev->first});
        prev->second.size += it->second.size;
        prev->second.freed_at = tick_;
        blocks_.erase(it);
        ++counters_.merges;
        it = prev;
      }
    }
    free_.insert({it->second.size, it->first});
  }

  /// Oldest idle whole segment first. A linear scan per segment released: no allocation, so it
  /// is safe inside the noexcept deallocation path, and pools hold few segments.
  std::size_t release_free_segments(std::size_t keep_cached) noexcept {
    std::size_t released = 0;
    while (cached_ > keep_cached) {
      std::uintptr_t oldest = 0;
      std::uint64_t oldest_at = std::numeric_limits<std::uint64_t>::max();
      for (const auto& [size, addr] : free_) {
        const Block& b = blocks_.find(addr)->second;
        if (addr == b.segment && size == segments_.find(addr)->second && b.freed_at < oldest_at) {
          oldest = addr;
          oldest_at = b.freed_at;
        }
      }
      if (oldest == 0) {
        break;
      }
      const std::size_t size = segments_.find(oldest)->second;
      free_.erase({size, oldest});
      blocks_.erase(oldest);
      segments_.erase(oldest);
      upstream_.deallocate(to_ptr(oldest), size, options_.granularity);
      cached_ -= size;
      reserved_ -= size;
      released += size;
      ++counters_.upstream_frees;
    }
    return released;
  }

  Upstream upstream_;
  PoolOptions options_;
  mutable std::mutex mutex_;
  BlockMap blocks_;                                       ///< every block, by address
  std::set<std::pair<std::size_t, std::uintptr_t>> free_; ///< free blocks by (size, address)
  std::map<std::uintptr_t, std::size_t> segments_;        ///< upstream allocations: base -> size
  std::size_t in_use_ = 0;
  std::size_t cached_ = 0;
  std::size_t reserved_ = 0;
  std::size_t live_ = 0;
  std::uint64_t tick_ = 0;
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
