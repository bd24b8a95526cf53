// carve/vmm/detail/hole_lending.hpp — an ExpandablePool's holes: granules inside chunks that live
// blocks pin, which no block uses. A chunk is one physical allocation, freed only whole, so a hole
// costs its memory until every block in its chunk dies. Past the headroom line, a large block maps
// holes a second time (OnDemandReservation::lend) instead of new memory, and the hole's own
// addresses are taken out of best fit's way until that second mapping is unmapped.
#pragma once

#include <carve/core/errc.hpp>
#include <carve/mr/best_fit_ranges.hpp>
#include <carve/vmm/detail/idle_chunks.hpp>
#include <carve/vmm/detail/watched_chunks.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <new>
#include <optional>
#include <utility>
#include <vector>

namespace carve::detail {

// A hole lent now: the taken range that keeps blocks out of it, and where its second mapping is.
struct LentHole {
  BestFitRanges::Handle kept = 0;
  std::uintptr_t at = 0;
  std::size_t bytes = 0;
};
// The holes lent now, by first address.
using LentHoles = std::map<std::uintptr_t, LentHole>;

// The holes of `memory` (an OnDemandReservation) under `free`'s ranges: whole granules of chunks
// with memory of their own that a free range covers only in part (a chunk wholly free is idle, to
// unmap, not to lend). Largest first, so a block takes few of them.
template <class Memory>
std::vector<std::pair<std::uintptr_t, std::size_t>> find_holes(const BestFitRanges& free, const Memory& memory) {
  std::vector<std::pair<std::uintptr_t, std::size_t>> holes;
  const std::size_t g = memory.granule();
  free.for_each_free(
      [&](std::uintptr_t a, std::size_t n) {
        const std::uintptr_t lo = (a + g - 1) / g * g;
        const std::uintptr_t hi = (a + n) / g * g;
        if (hi > lo) {
          memory.for_each_chunk_in(lo, hi - lo, [&](std::uintptr_t c, std::size_t bytes) {
            if (!memory.lent_at(c) && (c < lo || c + bytes > hi)) {
              holes.emplace_back(std::max(c, lo), std::min(c + bytes, hi) - std::max(c, lo));
            }
          });
        }
      },
      g);
  std::stable_sort(holes.begin(), holes.end(), [](const auto& x, const auto& y) { return x.second > y.second; });
  return holes;
}

// Watches the chunk of the hole at `hole` (kept out of use by `kept`), with the blocks in it now
// (its taken ranges, less its lent holes and the block at `block`, taken but not yet counted), and
// the second mapping [at, at + bytes) of that hole, lent to that block: where a free may bring
// holes home. Where the tables cannot grow, the hole stays lent until its second mapping is
// unmapped some other way (trim, the headroom line).
template <class Memory>
void watch_lent(const BestFitRanges& free, const Memory& memory, const LentHoles& lent, WatchedChunks& watched,
                std::uintptr_t block, std::uintptr_t hole, BestFitRanges::Handle kept, std::uintptr_t at,
                std::size_t bytes) noexcept {
  if (!watched.on()) {
    return;
  }
  try {
    memory.for_each_chunk_in(hole, 1, [&](std::uintptr_t c, std::size_t n) {
      if (!watched.watched(c)) { // its blocks: the taken ranges in it, less its lent holes and the new block
        std::size_t taken = 0;
        free.for_each_range_near(kept, c, c + n, [&](std::uintptr_t start, std::size_t, bool is_free) {
          taken += is_free || start == block ? 0u : 1u;
        });
        const auto holes = std::distance(lent.lower_bound(c), lent.lower_bound(c + n));
        watched.watch_home(c, n, taken - static_cast<std::size_t>(holes));
      }
      watched.watch_second(at, bytes, c);
    });
  } catch (const std::bad_alloc&) {
  }
}

// Maps holes of `memory` under the unmapped granules of the block [addr, addr + size) (taken from
// `free` already), each hole's range taken from `free` and recorded in `lent`, and its chunk taken
// off `idle` (as reservation `space`'s): a chunk listed idle until the block's own range cut it may
// lend its rest, and if the block then fails to map the rest of its own, that chunk stays cut, its
// memory lent, and must not be unmapped as idle. Returns the bytes lent. Lending only saves memory:
// when anything fails it stops, leaving the rest of the block to new memory, and what it lent so
// far stays lent. `refused` is set when the mapper refused a second mapping (CUDA documents that
// cuMemMap's offset must be 0, and a mapper that cannot tell beforehand says so here), not when the
// tables could not grow or the device was out of memory.
template <class Memory>
std::size_t lend_holes(BestFitRanges& free, Memory& memory, LentHoles& lent, WatchedChunks& watched, IdleChunks& idle,
                       std::uint32_t space, std::uintptr_t addr, std::size_t size, bool& refused) noexcept {
  const std::size_t g = memory.granule();
  std::size_t done = 0;
  try {
    auto holes = find_holes(free, memory);
    auto hole = holes.begin();
    const std::uintptr_t end = (addr + size + g - 1) / g * g;
    for (std::uintptr_t at = addr / g * g; at < end && hole != holes.end();) {
      std::uintptr_t run = at; // [at, run): the next run of unmapped granules
      while (run < end && !memory.backed(run, 1)) {
        run += g;
      }
      if (run == at) {
        at += g;
        continue;
      }
      for (; at < run && hole != holes.end(); hole = hole->second == 0 ? std::next(hole) : hole) {
        const std::size_t n = std::min(run - at, hole->second);
        const auto kept = free.take_at(hole->first, n); // throws with nothing changed
        if (!kept) {
          return done; // not free after all: the tables disagree, so lend nothing more
        }
        const auto failures = memory.counts().failures;
        bool lent_now = false;
        Errc why = Errc::no_space;
        try {
          const auto entry = lent.emplace(hole->first, LentHole{kept->handle, at, n});
          if (entry.second) {
            const auto mapped = memory.lend(at, hole->first, n);
            lent_now = mapped.has_value();
            why = lent_now ? why : mapped.error().code;
          }
          if (entry.second && !lent_now) {
            lent.erase(entry.first);
          }
        } catch (const std::bad_alloc&) { // before the mapping (its error's text, the map's node)
          lent.erase(hole->first);
        }
        if (!lent_now) {
          (void)free.give(kept->handle);
          // The mapper's refusal, not the tables': whatever the driver's reason (CUDA documents an
          // offset of 0 only, and says no to it in more than one way), except a device out of
          // memory for the moment, which leaves lending on for later blocks.
          refused = memory.counts().failures != failures && why != Errc::no_space;
          return done;
        }
        watch_lent(free, memory, lent, watched, addr, hole->first, kept->handle, at, n);
        memory.for_each_chunk_in(hole->first, 1, [&](std::uintptr_t c, std::size_t) { idle.in_use(space, c); });
        done += n;
        at += n;
        hole->first += n;
        hole->second -= n;
      }
    }
  } catch (const std::bad_alloc&) {
  }
  return done;
}

// The second mapping of the hole at `start` was unmapped: it is lent no more, and neither its
// second mapping nor (where no other hole of it is lent) its chunk is watched. Returns the range
// that kept its addresses out of use, to give back; nullopt for a hole not lent.
template <class Memory>
std::optional<BestFitRanges::Handle> hole_returned(const Memory& memory, LentHoles& lent, WatchedChunks& watched,
                                                   std::uintptr_t start) noexcept {
  const auto it = lent.find(start);
  if (it == lent.end()) {
    return std::nullopt;
  }
  const auto kept = it->second.kept;
  watched.forget(it->second.at);
  lent.erase(it);
  memory.for_each_chunk_in(start, 1, [&](std::uintptr_t c, std::size_t n) {
    if (const auto next = lent.lower_bound(c); next == lent.end() || next->first >= c + n) {
      watched.forget(c);
    }
  });
  return kept;
}

// The second mappings (start, bytes) to unmap so that the holes of the chunk at `home` come home,
// now that no block touches that chunk nor any of its second mappings (WatchedChunks::ready):
// appended to `out` (which lists any home once). That frees no memory (the chunk is still mapped
// where it lives) but makes the chunk one free range again: a second mapping left after the block
// it was lent to dies keeps its hole's addresses out of use, so the chunk stays cut in pieces step
// after step, and larger blocks map new memory beside it. They wait for the whole chunk: while a
// block still pins it, a hole brought home would be a hole again, its memory of use to no one.
// Throws std::bad_alloc (where `out` cannot grow).
template <class Memory>
void find_homecomings(const Memory& memory, const LentHoles& lent, const WatchedChunks& watched, std::uintptr_t home,
                      std::vector<std::pair<std::uintptr_t, std::size_t>>& out) {
  std::size_t bytes = 0;
  memory.for_each_chunk_in(home, 1, [&](std::uintptr_t, std::size_t n) { bytes = n; });
  const auto first = lent.lower_bound(home);
  if (first == lent.end() || first->first >= home + bytes || !watched.ready(home) ||
      std::any_of(out.begin(), out.end(), [&](const auto& m) { return m.first == first->second.at; })) {
    return; // no hole of its own is lent, a block touches it, or it is listed already
  }
  const std::size_t listed = out.size();
  for (auto it = first; it != lent.end() && it->first < home + bytes; ++it) {
    if (!watched.unused(it->second.at)) { // not watched: it stays lent (watch_lent could not)
      out.resize(listed);
      return;
    }
    out.emplace_back(it->second.at, it->second.bytes);
  }
}

} // namespace carve::detail
