// carve/vmm/detail/granule_table.hpp — an OnDemandReservation's two tables: per granule, one past
// the end of the chunk that maps it (0 where none does), so a walk skips a chunk in one step; and
// the chunks by first granule, each with its physical allocation's handle, or, for a second
// mapping (OnDemandReservation::lend), the first granule whose memory it maps again.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

namespace carve::detail {

template <class Handle>
struct GranuleTable {
  struct Chunk {
    std::size_t granules = 0;
    std::optional<Handle> handle; // its memory's; none for a second mapping
    std::size_t home = 0;         // a second mapping's: the first granule whose memory it maps
  };
  using Chunks = std::map<std::size_t, Chunk>;

  std::size_t total = 0;            // granules in the reservation
  std::vector<std::uint32_t> owner; // per granule (grown on demand): one past its chunk's end, or 0
  Chunks chunks;                    // by first granule

  bool mapped(std::size_t g) const noexcept { return g < owner.size() && owner[g] != 0; }
  // One past the last granule of the chunk that holds mapped granule `g`.
  std::size_t end_of(std::size_t g) const noexcept { return owner[g]; }

  // Whether granules [first, last] all lie in one chunk (the common case of a block).
  bool one_chunk(std::size_t first, std::size_t last) const noexcept {
    return mapped(first) && last < owner.size() && end_of(first) == end_of(last);
  }

  // Whether every granule [first, last] is mapped.
  bool covered(std::size_t first, std::size_t last) const noexcept {
    for (std::size_t g = first; g <= last; g = end_of(g)) {
      if (!mapped(g)) {
        return false;
      }
    }
    return true;
  }

  // How many granules [first, last] are not mapped, and in how many runs.
  std::pair<std::size_t, std::size_t> unmapped(std::size_t first, std::size_t last) const noexcept {
    std::size_t granules = 0;
    std::size_t runs = 0;
    for (std::size_t g = first; g <= last;) {
      if (mapped(g)) {
        g = end_of(g);
        continue;
      }
      ++runs;
      for (; g <= last && !mapped(g); ++g) {
        ++granules;
      }
    }
    return {granules, runs};
  }

  // Room for a chunk at granule `g` (not yet marked). Throws std::bad_alloc, with nothing changed.
  void add(std::size_t g, const Chunk& chunk) {
    if (owner.size() < g + chunk.granules) {
      owner.resize(std::max(g + chunk.granules, std::min(total, 2 * owner.size())), 0u);
    }
    chunks.emplace(g, chunk);
  }

  // Marks granules [g, g + n) as one chunk's, or (`mapped` false) as unmapped.
  void mark(std::size_t g, std::size_t n, bool mapped = true) noexcept {
    std::fill(owner.begin() + static_cast<std::ptrdiff_t>(g), owner.begin() + static_cast<std::ptrdiff_t>(g + n),
              mapped ? static_cast<std::uint32_t>(g + n) : 0u);
  }

  // Whether the two tables agree, every chunk lies in the reservation, and the chunks with memory
  // of their own hold `mapped` bytes in granules of `granule`.
  bool consistent(std::size_t granule, std::size_t mapped) const {
    const auto none_from = [&](std::size_t from, std::size_t to) {
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
      if (n == 0 || g < next || g + n > total || g + n > owner.size() || !none_from(next, g)) {
        return false;
      }
      for (std::size_t i = g; i < g + n; ++i) {
        if (owner[i] != g + n) {
          return false;
        }
      }
      next = g + n;
      sum += chunk.handle ? n * granule : 0;
    }
    return none_from(next, owner.size()) && sum == mapped;
  }
};

} // namespace carve::detail
