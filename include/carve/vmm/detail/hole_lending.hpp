// carve/vmm/detail/hole_lending.hpp — an ExpandablePool's holes: granules inside chunks that live
// blocks pin, which no block uses. A chunk is one physical allocation, freed only whole, so a hole
// costs its memory until every block in its chunk dies. Past the headroom line, a large block maps
// holes a second time (OnDemandReservation::lend) instead of new memory, and the hole's own
// addresses are taken out of best fit's way until that second mapping is unmapped.
#pragma once

#include <carve/core/errc.hpp>
#include <carve/mr/best_fit_ranges.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <new>
#include <utility>
#include <vector>

namespace carve::detail {

// The ranges lent now: each hole's first address -> the taken range that keeps blocks out of it.
using LentHoles = std::map<std::uintptr_t, BestFitRanges::Handle>;

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

// Maps holes of `memory` under the unmapped granules of the block [addr, addr + size) (taken from
// `free` already), each hole's range taken from `free` and recorded in `lent`; returns the bytes
// lent. Lending only saves memory: when anything fails it stops, leaving the rest of the block to
// new memory, and what it lent so far stays lent. `refused` is set when the mapper refused a
// second mapping (CUDA documents that cuMemMap's offset must be 0, and a mapper that cannot tell
// beforehand says so here), not when the tables could not grow or the device was out of memory.
template <class Memory>
std::size_t lend_holes(BestFitRanges& free, Memory& memory, LentHoles& lent, std::uintptr_t addr, std::size_t size,
                       bool& refused) noexcept {
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
          const auto entry = lent.emplace(hole->first, kept->handle);
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

} // namespace carve::detail
