/// @file carve/mr/stream_caching_pool_options.hpp
/// What a StreamCachingPool reports about itself. Its options are CachingPool's PoolOptions
/// (caching_pool_options.hpp), applied to each stream's pool; each pool's options and stats sit in a
/// header of their own beside it.
#pragma once

#include <carve/mr/caching_pool_options.hpp>

#include <cstddef>
#include <cstdint>

namespace carve {

/// A StreamCachingPool's figures at one moment (StreamCachingPool::stats()): its streams' pools'
/// PoolStats summed, and what the streams add. Two fields are not plain sums: largest_cached_block
/// is the largest of any one pool (a stream's cache serves only that stream), and peak_reserved is
/// the most the pools held from the upstream at once. peak_in_use is the sum of the streams'
/// peaks: exact with one stream, an upper bound with more (an exact one would cost every call an
/// atomic update shared by all streams).
struct StreamCachingPoolStats : PoolStats {
  std::size_t pools = 0;         ///< CachingPools: one per stream that has allocated, one for the synchronous calls
  std::size_t pending_frees = 0; ///< blocks freed on another stream, waiting for that stream's work
  std::uint64_t cross_stream_frees = 0; ///< frees made on another stream than the block's
  std::uint64_t pressure_retries = 0;   ///< requests retried after the other streams' pools gave back memory
  std::uint64_t bytes_given_back = 0;   ///< what the other streams' pools gave back for those retries
};

} // namespace carve
