/// @file carve/vmm/mapping_counts.hpp
/// What an OnDemandReservation asks of its mapper, and how large it makes a new chunk.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>

namespace carve {

/// How large OnDemandReservation::back() makes a new chunk.
struct ChunkRule {
  std::size_t min_bytes = 0; ///< a new chunk maps at least this much (where the granules after its run are unmapped)
  std::size_t limit_bytes = std::numeric_limits<std::size_t>::max(); ///< one back() maps at most this much in all
  /// One physical allocation holds at most this much (whole granules, at least one): a longer run
  /// is cut into several chunks, each unmapped on its own.
  std::size_t max_bytes = std::numeric_limits<std::size_t>::max();
};

/// What an OnDemandReservation has asked of its mapper.
struct MappingCounts {
  std::uint64_t creates = 0;  ///< physical allocations made
  std::uint64_t maps = 0;     ///< mappings made (lend()'s second mappings among them)
  std::uint64_t unmaps = 0;   ///< mappings removed
  std::uint64_t accesses = 0; ///< access calls: one per map and peer granted, one per chunk grant() opens or closes
  std::uint64_t peer_refusals =
      0;                      ///< a new chunk's grants to a peer the mapper refused (the chunk stays, closed to it)
  std::uint64_t releases = 0; ///< handles released (one per create)
  std::uint64_t failures = 0; ///< calls the mapper refused
};

} // namespace carve
