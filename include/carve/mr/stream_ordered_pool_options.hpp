/// @file carve/mr/stream_ordered_pool_options.hpp
/// How a StreamOrderedPool rounds and keeps its blocks, and what it reports about itself (each
/// pool's options and stats sit in a header of their own beside it: see caching_pool_options.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>

namespace carve {

/// How StreamOrderedPool rounds and caches.
struct StreamPoolOptions {
  std::size_t granularity = 512; ///< block sizes are multiples of it (a power of two)
  /// Cached bytes kept for reuse. When a free leaves more than this cached, cached blocks whose
  /// events have completed go back to the upstream, largest first, until the cache is at or below
  /// it or no such block is left (blocks a stream's queued work may still use stay cached, so the
  /// cache may stay above it). The default keeps them all until trim() or the upstream refuses.
  std::size_t idle_threshold = std::numeric_limits<std::size_t>::max();
  /// Blocks of at most this many bytes (asked at most `granularity` aligned) are cut from segments
  /// of 2 MiB they share, a CachingPool over the upstream, instead of each taking an allocation of
  /// its own: on a real training step half or more of the blocks a stream-ordered pool makes are
  /// this small, and each would be one cudaMalloc (carve_replay: 1,053 calls against 499 on GPT-2,
  /// 1,091 against 258 on ResNet-50, the reserve the same to 1 MiB). Only where the upstream tells
  /// its capacity and free bytes (UpstreamResource: a card); 0: every block its own allocation.
  std::size_t small_block_max = std::size_t{1} << 20;
  /// Once the pool holds more than this share of its upstream's capacity, in thousandths (the
  /// capacity read when the pool is made, where the upstream reports one: ReportsCapacity), a
  /// cached block serves requests down to 2/3 of its size instead of half. Near a full card the
  /// third to half of a block that its request leaves unused is memory the card may lack; on a card
  /// with room, the wider window keeps fewer blocks cached. carve_replay: with it GPT-2, ResNet-50,
  /// the variable lengths and TinyLlama run on cards of 24.482, 22.074, 15.389 and 5.629 GiB
  /// (PyTorch's model: 25.064, 22.115, 15.723, 5.879), without it on 24.611, 22.553, 15.973 and
  /// 5.656; nothing changes where the card has room. A request the card then refuses, even once
  /// the cache went back, still takes a cached block up to twice its size. 1000 or more, or an
  /// upstream that reports a capacity of 0: never.
  std::size_t near_full_permille = 500;
};

/// What a StreamOrderedPool has done so far (StreamOrderedPool::stats()).
struct StreamPoolStats {
  std::size_t bytes_in_use = 0;   ///< in blocks handed out
  std::size_t bytes_cached = 0;   ///< in blocks waiting for reuse
  std::size_t bytes_reserved = 0; ///< held from the upstream: in use, cached, and the small blocks' segments' rest
  std::size_t peak_in_use = 0;    ///< the most bytes_in_use has been
  std::size_t peak_reserved = 0;  ///< the most bytes_reserved has been
  std::uint64_t same_stream_reuses = 0;   ///< blocks reused on the stream that freed them
  std::uint64_t cross_stream_reuses = 0;  ///< blocks reused on another stream, after the event
  std::uint64_t upstream_allocations = 0; ///< blocks made: taken from the upstream, or cut from a shared segment
  std::uint64_t waits_avoided = 0;        ///< cached blocks passed over because their event had not completed
  std::uint64_t upstream_failures = 0;    ///< the upstream said no (then the cached blocks whose events had completed
                                          ///< went back, and the request was retried)
  std::uint64_t idle_releases = 0;        ///< cached blocks given back because the cache was over idle_threshold
};

} // namespace carve
