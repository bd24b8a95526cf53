// What the host runs of the memory-resource contract build their resources from: slot arenas of
// 256 slots of 64 bytes over a buffer aligned to 256 (so every slot start is aligned to 64 and no
// more; a batch of 16 requests of at most 8 slots fits with room to spare), and CachingPool
// options small enough for a simulated card of a few MiB.
#pragma once

#include "mr/resource_contract.hpp"

#include <carve/mr/caching_pool.hpp>
#include <carve/mr/simulated_card.hpp>

#include <cstddef>
#include <cstdint>

namespace carve::test {

inline constexpr std::size_t KiB = std::size_t{1} << 10;
inline constexpr std::size_t MiB = std::size_t{1} << 20;

inline constexpr std::uint32_t arena_slots = 256;
inline constexpr std::size_t slot_bytes = 64;
struct alignas(256) ArenaBytes {
  std::byte bytes[arena_slots * slot_bytes];
};
inline constexpr ResourceShape arena_shape{
    .largest_request = 500, .batch = 16, .max_alignment = slot_bytes, .never_fits = arena_slots * slot_bytes + 1};

inline constexpr carve::PoolOptions pool_options{.granularity = 512, .segment_size = 256 * KiB};
using Pool = carve::CachingPool<carve::SimulatedCard>;

} // namespace carve::test
