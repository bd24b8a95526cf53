// What a fragmented cache costs per call: a CachingPool (and the BestFitRanges under it) holding
// 1k, 10k and 100k equal free holes, each between two live blocks so none can merge, serving one
// allocate+deallocate pair of the holes' size at a time. Every hole is an exact fit and the
// lowest one wins, so a size class searched whole pays for every hole in it. The target: the cost
// stays flat as the holes grow a hundredfold, 100k holes within 3x of 1k (a search of the whole
// class costs 100x; a tree descent costs log 100k / log 1k = 1.7x the steps, each more likely a
// cache miss in a working set 100x the size).
#include "compare.hpp"

#include <carve/mr.hpp>

#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

using namespace carve;
using namespace carve::bench;

constexpr std::size_t hole_bytes = 4096;
constexpr std::size_t hole_counts[] = {1000, 10000, 100000};

std::string pool_name(std::size_t holes) { return "CachingPool allocate+deallocate/holes=" + std::to_string(holes); }
std::string ranges_name(std::size_t holes) { return "BestFitRanges take+give/holes=" + std::to_string(holes); }

// A pool over a card that backs no bytes, with `holes` free blocks between live ones. The idle
// threshold is 0, so every deallocation also runs the over-threshold release.
void pool_pairs(benchmark::State& state, std::size_t holes) {
  AddressOnlyCard card(std::size_t{4} << 30);
  CachingPool<AddressOnlyCard> pool(card, PoolOptions{.idle_threshold = 0});
  std::vector<void*> blocks(2 * holes);
  for (void*& p : blocks) {
    p = *pool.try_allocate(hole_bytes, 256);
  }
  for (std::size_t i = 0; i < blocks.size(); i += 2) {
    pool.deallocate(blocks[i], hole_bytes, 256);
  }
  if (pool.stats().cached_blocks < holes) {
    state.SkipWithError("the holes merged");
    return;
  }
  for (auto _ : state) {
    void* p = *pool.try_allocate(hole_bytes, 256);
    benchmark::DoNotOptimize(p);
    pool.deallocate(p, hole_bytes, 256);
  }
  for (std::size_t i = 1; i < blocks.size(); i += 2) {
    pool.deallocate(blocks[i], hole_bytes, 256);
  }
}

// The same holes in a BestFitRanges alone: take and give, no lock and no address table.
void ranges_pairs(benchmark::State& state, std::size_t holes) {
  BestFitRanges ranges(0x100000000, 2 * holes * hole_bytes + hole_bytes);
  std::vector<BestFitRanges::Handle> blocks(2 * holes);
  for (BestFitRanges::Handle& h : blocks) {
    h = ranges.take(hole_bytes)->handle;
  }
  for (std::size_t i = 0; i < blocks.size(); i += 2) {
    ranges.give(blocks[i]);
  }
  for (auto _ : state) {
    const auto taken = ranges.take(hole_bytes);
    consume(taken->handle);
    ranges.give(taken->handle);
  }
}

} // namespace

int main(int argc, char** argv) {
  for (const std::size_t holes : hole_counts) {
    benchmark::RegisterBenchmark(pool_name(holes).c_str(), [holes](benchmark::State& s) { pool_pairs(s, holes); });
  }
  for (const std::size_t holes : hole_counts) {
    benchmark::RegisterBenchmark(ranges_name(holes).c_str(), [holes](benchmark::State& s) { ranges_pairs(s, holes); });
  }

  MedianCollector c;
  run_with_medians(argc, argv, c);
  std::printf("\nOne allocate+deallocate pair with N equal free holes cached, median per pair:\n");
  for (const auto& name : {pool_name, ranges_name}) {
    for (const std::size_t holes : hole_counts) {
      if (const auto t = c.ns(name(holes))) {
        std::printf("  %-58s %12.2f ns\n", name(holes).c_str(), *t);
      }
    }
    print_overhead(c, name(100000) + " / 1k", name(100000), name(1000), 3.0);
  }
  return 0;
}
