// carve/vmm/detail/idle_chunks.hpp — the chunks of an ExpandablePool that no block touches: listed
// least recently idle first (what the pool unmaps once more than its release threshold lies
// idle), or found in its free ranges (what it unmaps to stay under its headroom line).
#pragma once

#include <carve/core/checked_math.hpp>
#include <carve/mr/best_fit_ranges.hpp>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <new>
#include <optional>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

namespace carve::detail {

// Idle chunks by (reservation, start), each with the pool's free count when it fell idle (its
// age, and what tells the pool whether the stream work before it has run) and its size. Finding
// the oldest is a lookup, not a search. Not thread-safe: the pool holds its lock.
class IdleChunks {
public:
  struct Chunk {
    std::uint32_t space = 0;
    std::uintptr_t start = 0;
    std::size_t bytes = 0;
    std::uint64_t since = 0; ///< the pool's free count when it fell idle
  };

  // A chunk no block touches now; `own_memory`: false for a hole mapped a second time, which is
  // listed (to be unmapped in turn) but holds no memory of its own, so bytes() leaves it out. A
  // chunk the tables have no room for is not listed: trim() and the retry under pressure still
  // find it by looking at the free ranges.
  void fell_idle(std::uint32_t space, std::uintptr_t start, std::size_t bytes, std::uint64_t since,
                 bool own_memory = true) noexcept {
    try {
      const auto [it, added] = chunks_.try_emplace({space, start}, Entry{since, bytes, own_memory ? bytes : 0});
      if (!added) {
        return;
      }
      try {
        by_age_.emplace(since, space, start);
      } catch (const std::bad_alloc&) {
        chunks_.erase(it);
        return;
      }
      bytes_ += it->second.counted;
    } catch (const std::bad_alloc&) {
    }
  }
  // A block landed on the chunk: it is in use again.
  void in_use(std::uint32_t space, std::uintptr_t start) noexcept {
    if (const auto it = chunks_.find({space, start}); it != chunks_.end()) {
      forget(it);
    }
  }
  // The chunks of `space` that start in [start, start + bytes) were unmapped.
  void unmapped(std::uint32_t space, std::uintptr_t start, std::size_t bytes) noexcept {
    for (auto it = chunks_.lower_bound({space, start});
         it != chunks_.end() && it->first.first == space && it->first.second - start < bytes;) {
      it = forget(it);
    }
  }
  // The least recently idle chunk (still listed); nullopt when none is.
  std::optional<Chunk> oldest() const noexcept {
    if (by_age_.empty()) {
      return std::nullopt;
    }
    const auto& [since, space, start] = *by_age_.begin();
    return Chunk{space, start, chunks_.find({space, start})->second.bytes, since};
  }
  // Takes the chunk oldest() names off the list.
  void drop_oldest() noexcept {
    if (!by_age_.empty()) {
      const auto& [since, space, start] = *by_age_.begin();
      forget(chunks_.find({space, start}));
    }
  }
  // Bytes of memory in the listed chunks (holes mapped a second time hold none).
  std::size_t bytes() const noexcept { return bytes_; }

private:
  using Key = std::pair<std::uint32_t, std::uintptr_t>;
  struct Entry {
    std::uint64_t since;
    std::size_t bytes;   ///< what it maps
    std::size_t counted; ///< of that, memory of its own
  };
  using Map = std::map<Key, Entry>;

  Map::iterator forget(Map::iterator it) noexcept {
    by_age_.erase({it->second.since, it->first.first, it->first.second});
    bytes_ -= it->second.counted;
    return chunks_.erase(it);
  }

  Map chunks_;
  std::set<std::tuple<std::uint64_t, std::uint32_t, std::uintptr_t>> by_age_; // (since, space, start)
  std::size_t bytes_ = 0;
};

// The most an ExpandablePool maps before it unmaps idle memory to map more: `peak` (the running
// peak of live bytes) plus `permille` thousandths of it; max() for a permille of max() or on
// overflow (no line).
constexpr std::size_t headroom_line(std::size_t peak, std::size_t permille) noexcept {
  constexpr std::size_t unbounded = std::numeric_limits<std::size_t>::max();
  const auto extra = permille == unbounded ? cuda::std::nullopt : checked_mul(peak / 1000, permille);
  const auto line = extra ? checked_add(peak, *extra) : cuda::std::nullopt;
  return line ? *line : unbounded;
}

// Appends to `out` every chunk of `memory` (an OnDemandReservation) that lies wholly in one of
// `free`'s ranges: the chunks of reservation `space` no block touches. Only ranges of a granule
// or more can hold one, so only those are walked. When `out` cannot grow, what was found stays.
template <class Memory>
void find_idle_chunks(const BestFitRanges& free, const Memory& memory, std::uint32_t space,
                      std::vector<IdleChunks::Chunk>& out) noexcept {
  try {
    free.for_each_free(
        [&](std::uintptr_t start, std::size_t bytes) {
          memory.for_each_chunk_in(start, bytes, [&](std::uintptr_t c, std::size_t n) {
            if (c >= start && c + n <= start + bytes) {
              out.push_back(IdleChunks::Chunk{space, c, n, 0});
            }
          });
        },
        memory.granule());
  } catch (const std::bad_alloc&) {
  }
}

} // namespace carve::detail
