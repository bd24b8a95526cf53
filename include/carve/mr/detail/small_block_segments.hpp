/// @file carve/mr/detail/small_block_segments.hpp
/// Where a StreamOrderedPool cuts its small blocks: segments of 2 MiB that they share, a
/// CachingPool over the pool's upstream (StreamPoolOptions::small_block_max says why).
#pragma once

#include <carve/core/errc.hpp>
#include <carve/mr/caching_pool.hpp>
#include <carve/mr/memory_resource.hpp>
#include <carve/mr/resource_ref.hpp>
#include <carve/mr/stream_ordered_pool_options.hpp>

#include <cuda/std/expected>

#include <algorithm>
#include <cstddef>

namespace carve::detail {

/// The shared segments over `Upstream`, which must outlive them. Where the upstream cannot say
/// its capacity and free bytes (a CachingPool needs both), there are none: cuts() is always false.
/// Not thread-safe beyond the CachingPool's own lock: the pool calls it under its lock.
template <MemoryResource Upstream>
class SmallBlockSegments {
public:
  SmallBlockSegments(const StreamPoolOptions&, Upstream&) noexcept {}

  bool cuts(std::size_t, std::size_t) const noexcept { return false; }
  cuda::std::expected<void*, Errc> take(std::size_t, std::size_t) noexcept {
    return cuda::std::unexpected(Errc::no_space);
  }
  void give(void*, std::size_t, std::size_t) noexcept {}
  std::size_t trim() noexcept { return 0; }
  void hold(bool) noexcept {}
  std::size_t spare() const noexcept { return 0; }
};

template <MemoryResource Upstream>
requires UpstreamResource<ResourceRef<Upstream>>
class SmallBlockSegments<Upstream> {
public:
  /// Segments of 2 MiB (of one granule where `options.granularity` is larger), blocks rounded to
  /// the granularity, which must be a power of two.
  SmallBlockSegments(const StreamPoolOptions& options, Upstream& upstream)
      : max_(options.small_block_max), granularity_(options.granularity),
        segments_(ResourceRef<Upstream>(upstream),
                  PoolOptions{.granularity = options.granularity,
                              .segment_size = std::max(std::size_t{2} << 20, options.granularity),
                              .shared_segment_size = 0,
                              // Its blocks are at most its segment: no free segment is 4x one.
                              .near_full_permille = 1000}) {}

  /// Whether a block of `size` bytes (a multiple of the granularity) at `alignment` is cut here.
  bool cuts(std::size_t size, std::size_t alignment) const noexcept {
    return size <= max_ && alignment <= granularity_;
  }
  cuda::std::expected<void*, Errc> take(std::size_t size, std::size_t alignment) noexcept {
    return segments_.try_allocate(size, alignment);
  }
  void give(void* p, std::size_t size, std::size_t alignment) noexcept { segments_.deallocate(p, size, alignment); }
  /// Gives every segment none of whose blocks is left back to the upstream; returns the bytes.
  std::size_t trim() noexcept { return segments_.trim(); }
  void hold(bool held) noexcept { segments_.hold(held); }
  /// Bytes of the segments that no block holds: reserved, neither in use nor cached as a block.
  std::size_t spare() const { return segments_.stats().bytes_cached; }

private:
  std::size_t max_;
  std::size_t granularity_;
  CachingPool<ResourceRef<Upstream>> segments_;
};

} // namespace carve::detail
