/// @file carve/mr/caching_pool_options.hpp
/// How a CachingPool sizes, shares and keeps its blocks, and what it reports about itself.
///
/// Every pool keeps its options and its stats in a header of their own beside it, named for the
/// pool: this one for CachingPool (and StreamCachingPool, which runs one CachingPool per stream
/// with these options), stream_ordered_pool_options.hpp, stream_caching_pool_options.hpp, and
/// carve/vmm/expandable_pool_options.hpp. So a program that only configures a pool, or only reads
/// its figures, includes the small header, not the pool.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>

namespace carve {

/// How a CachingPool sizes, shares and keeps its blocks.
struct PoolOptions {
  /// Block sizes are multiples of this, so every block starts this aligned; it is also the
  /// largest alignment a request may ask for. cudaMalloc aligns to 256; 512 is PyTorch's and
  /// CUB's smallest size class.
  std::size_t granularity = 512;
  /// Requests smaller than this share segments of this size from the upstream (fewer upstream
  /// calls, which cost ~100 us each on a GPU); larger ones get a segment of their own, their size
  /// rounded up to a multiple of this, unless shared_segment_size takes them.
  std::size_t segment_size = std::size_t{2} << 20;
  /// Cached bytes kept for reuse. When a deallocation leaves the cache above it, whole free
  /// segments go back to the upstream, least recently freed first, until the cache is at or
  /// below it or no whole free segment is left (free blocks in a segment that still holds a live
  /// block cannot go back, so the cache may stay above it).
  std::size_t idle_threshold = std::numeric_limits<std::size_t>::max();
  /// Requests of at least segment_size and below half this share segments of this size (rounded up
  /// to whole segment_size units): PyTorch's 20 MiB segments for its requests of 1 to 10 MiB. Why:
  /// segments never merge, so a mid-size request's own segment can later serve nothing larger, and
  /// its rounding waits for small requests; shared, their frees merge into blocks of up to this
  /// size. Where the upstream cannot give that much, the request's own segment is asked for before
  /// the cache goes back. 0, or no more than twice segment_size: no such requests.
  std::size_t shared_segment_size = std::size_t{20} << 20;
  /// Once the pool holds more than this share (per mille) of its upstream's capacity, a request
  /// whose best fit is a wholly free segment 4 or more times its size, and larger than the segment
  /// the request would get, takes that new segment where the upstream has room, rather than cut the
  /// big one: its rest could serve only smaller requests while the block lives, and near a full
  /// card a later large request found no room (carve_replay: ResNet-50 ran on a 22.359 GiB card,
  /// 21.742 with this, PyTorch's model on 22.115). Not while held (hold()), where the big segment
  /// could not go back if a later request needed its memory. The capacity is read when the pool is
  /// made; 1000 or more, or an upstream that reports no capacity (0, or throws): never. Each pool of
  /// a StreamCachingPool weighs its own bytes against the whole card.
  std::size_t near_full_permille = 900;
};

/// A CachingPool's counters at one moment (CachingPool::stats()).
struct PoolStats {
  std::size_t bytes_in_use = 0;         ///< in live blocks (rounded to the granularity)
  std::size_t bytes_cached = 0;         ///< in free blocks kept for reuse
  std::size_t bytes_reserved = 0;       ///< held from the upstream: in use + cached
  std::size_t peak_in_use = 0;          ///< the most bytes_in_use has been
  std::size_t peak_reserved = 0;        ///< the most bytes_reserved has been
  std::size_t live_blocks = 0;          ///< blocks handed out and not yet freed
  std::size_t cached_blocks = 0;        ///< free blocks kept for reuse
  std::size_t segments = 0;             ///< upstream allocations currently held
  std::size_t largest_cached_block = 0; ///< the largest request the cache alone could serve
  std::uint64_t allocations = 0;        ///< successful allocate calls
  std::uint64_t deallocations = 0;      ///< successful deallocate calls
  /// Allocations served from the cache (near a full upstream, some after it refused a new segment).
  std::uint64_t cache_hits = 0;
  std::uint64_t splits = 0;               ///< cached blocks cut to size (the rest stayed cached)
  std::uint64_t merges = 0;               ///< freed blocks joined with a free neighbour
  std::uint64_t upstream_allocations = 0; ///< segments taken from the upstream
  std::uint64_t upstream_frees = 0;       ///< segments given back to it
  /// Refusals by the upstream: of a shared segment, of a new segment near full, or once the pool trimmed and retried.
  std::uint64_t upstream_failures = 0;

  /// How scattered the cache is: 0 when all cached bytes form one block (or nothing is cached),
  /// approaching 1 as they split into many small blocks. 1 - largest cached block / cached bytes.
  double fragmentation() const noexcept {
    return bytes_cached == 0 ? 0.0
                             : 1.0 - static_cast<double>(largest_cached_block) / static_cast<double>(bytes_cached);
  }
};

} // namespace carve
