// carve/mr/detail/near_full.hpp — the bytes held past which a pool counts its upstream as nearly
// full (StreamPoolOptions::near_full_permille, PoolOptions::near_full_permille).
#pragma once

#include <carve/mr/memory_resource.hpp>

#include <cstddef>
#include <limits>

namespace carve::detail {

// The upstream's capacity, read now; max() (unknown) where it reports none, reports 0
// (CudaDeviceResource's when cudaMemGetInfo fails) or throws asking (a remote upstream's lost
// connection): the pools' constructors and their callers' noexcept paths must not fail for a hint.
template <class Upstream>
std::size_t upstream_capacity(const Upstream& upstream) noexcept {
  if constexpr (ReportsCapacity<Upstream>) {
    try {
      if (const std::size_t capacity = upstream.capacity(); capacity != 0) {
        return capacity;
      }
    } catch (...) {
    }
  }
  (void)upstream;
  return std::numeric_limits<std::size_t>::max();
}

// `permille` of the upstream's capacity (upstream_capacity); max() (never) for 1000 or more, or
// where the capacity is unknown.
template <class Upstream>
std::size_t near_full_bytes(const Upstream& upstream, std::size_t permille) noexcept {
  const std::size_t capacity = permille < 1000 ? upstream_capacity(upstream) : std::numeric_limits<std::size_t>::max();
  return capacity == std::numeric_limits<std::size_t>::max()
             ? capacity
             : capacity / 1000 * permille + capacity % 1000 * permille / 1000;
}

} // namespace carve::detail
