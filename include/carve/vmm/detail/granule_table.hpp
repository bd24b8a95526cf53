// carve/vmm/detail/granule_table.hpp — the invariant an OnDemandReservation's two tables keep:
// per granule, one past the end of the chunk that maps it (0 where none does), and the chunks by
// first granule. Checked by OnDemandReservation::consistent() in tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace carve::detail {

// Whether `owner` (per granule: one past its chunk's end, or 0) and `chunks` (first granule ->
// a chunk with `granules`) agree, every chunk lies in the `total` granules, and the chunks with
// memory of their own (`own_memory(chunk)`) add up to `mapped` bytes in granules of `granule`.
template <class Chunks, class OwnMemory>
bool granule_table_consistent(const std::vector<std::uint32_t>& owner, const Chunks& chunks, std::size_t total,
                              std::size_t granule, std::size_t mapped, OwnMemory&& own_memory) {
  const auto unmapped = [&](std::size_t from, std::size_t to) {
    for (std::size_t i = from; i < to && i < owner.size(); ++i) {
      if (owner[i] != 0) {
        return false;
      }
    }
    return true;
  };
  std::size_t sum = 0;
  std::size_t next = 0;
  for (const auto& [g, chunk] : chunks) {
    const std::size_t n = chunk.granules;
    if (n == 0 || g < next || g + n > total || g + n > owner.size() || !unmapped(next, g)) {
      return false;
    }
    for (std::size_t i = g; i < g + n; ++i) {
      if (owner[i] != g + n) {
        return false;
      }
    }
    next = g + n;
    sum += own_memory(chunk) ? n * granule : 0;
  }
  return unmapped(next, owner.size()) && sum == mapped;
}

} // namespace carve::detail
