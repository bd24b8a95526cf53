// carve/mr/detail/near_full.hpp — the bytes held past which a pool counts its upstream as nearly
// full (StreamPoolOptions::near_full_permille, PoolOptions::near_full_permille).
#pragma once

#include <carve/mr/memory_resource.hpp>

#include <cstddef>
#include <limits>

namespace carve::detail {

// `permille` of the upstream's capacity, read now; max() (never) for 1000 or more, or where the
// upstream reports no capacity, or 0 (CudaDeviceResource's when cudaMemGetInfo fails).
template <class Upstream>
std::size_t near_full_bytes(const Upstream& upstream, std::size_t permille) {
  if constexpr (ReportsCapacity<Upstream>) {
    const std::size_t capacity = upstream.capacity();
    if (permille < 1000 && capacity != 0) {
      return capacity / 1000 * permille + capacity % 1000 * permille / 1000;
    }
  }
  (void)upstream;
  return std::numeric_limits<std::size_t>::max();
}

} // namespace carve::detail
