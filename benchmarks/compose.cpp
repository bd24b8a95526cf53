// What stacking costs: small allocate+deallocate pairs through combinators over a SlotArena,
// beside the bare SlotArena in the same run. The target: a Segregator (small requests to the
// arena, large ones to a CachingPool) within 1.1x of the arena alone. The other stacks are
// printed for scale, with the CachingPool and malloc as references.
#include "compare.hpp"

#include <carve/mr.hpp>
#include <carve/slot.hpp>

#include <benchmark/benchmark.h>

#include <array>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <tuple>
#include <utility>

namespace {

using namespace carve;
using namespace carve::bench;

constexpr std::size_t slot_bytes = 64;
constexpr std::uint32_t slots = 512;
using Arena = SlotArena<SlotAllocator<slots, BoundaryNearestFit>>;
using Pool = CachingPool<SimulatedCard>;

// 16 requests of 8 to 1000 bytes, all small: every stack sends them to the arena.
constexpr std::array<std::size_t, 16> sizes = {8, 200, 64, 1000, 24, 512, 96, 300, 16, 768, 128, 40, 640, 72, 256, 900};

alignas(4096) std::byte arena_memory[slots * slot_bytes];

// Allocates the 16 sizes, then frees them in allocation order: the arena holds up to 16 blocks.
template <class R>
void pairs(benchmark::State& state, R& r) {
  std::array<void*, sizes.size()> live{};
  for (auto _ : state) {
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      live[i] = *r.try_allocate(sizes[i], 8);
    }
    benchmark::DoNotOptimize(live.data());
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      r.deallocate(live[i], sizes[i], 8);
    }
  }
  state.counters["per_item"] = per_item(sizes.size());
}

struct Malloc {
  cuda::std::expected<void*, Errc> try_allocate(std::size_t bytes, std::size_t) noexcept { return std::malloc(bytes); }
  void deallocate(void* p, std::size_t, std::size_t) noexcept { std::free(p); }
};

const std::string prefix = "allocate+deallocate/";

} // namespace

int main(int argc, char** argv) {
  benchmark::RegisterBenchmark((prefix + "SlotArena").c_str(), [](benchmark::State& s) {
    Arena arena(arena_memory, sizeof arena_memory, slot_bytes);
    pairs(s, arena);
  });
  benchmark::RegisterBenchmark((prefix + "Segregator<4096, SlotArena, CachingPool>").c_str(), [](benchmark::State& s) {
    Segregator<4096, Arena, Pool> heap(Arena(arena_memory, sizeof arena_memory, slot_bytes), SimulatedCard(64 << 20));
    pairs(s, heap);
  });
  benchmark::RegisterBenchmark((prefix + "FallbackResource<SlotArena, CachingPool>").c_str(), [](benchmark::State& s) {
    FallbackResource<Arena, Pool> heap(Arena(arena_memory, sizeof arena_memory, slot_bytes), SimulatedCard(64 << 20));
    pairs(s, heap);
  });
  benchmark::RegisterBenchmark((prefix + "StatsResource<SlotArena>").c_str(), [](benchmark::State& s) {
    StatsResource<Arena> counted(std::piecewise_construct,
                                 std::forward_as_tuple(arena_memory, sizeof arena_memory, slot_bytes));
    pairs(s, counted);
  });
  benchmark::RegisterBenchmark((prefix + "CachingPool").c_str(), [](benchmark::State& s) {
    Pool pool(SimulatedCard(64 << 20));
    pairs(s, pool);
  });
  benchmark::RegisterBenchmark((prefix + "malloc").c_str(), [](benchmark::State& s) {
    Malloc m;
    pairs(s, m);
  });

  MedianCollector c;
  run_with_medians(argc, argv, c);
  std::printf("\nSmall requests (8 to 1000 bytes), median per allocate+deallocate pair:\n");
  print_overhead(c, "Segregator<4096, SlotArena, CachingPool> / SlotArena",
                 prefix + "Segregator<4096, SlotArena, CachingPool>", prefix + "SlotArena", 1.1);
  std::printf("for scale (no target):\n");
  const auto scale = [&](const std::string& name) {
    if (const auto a = c.ns(prefix + name), b = c.ns(prefix + "SlotArena"); a && b) {
      std::printf("  %-58s %9.2f ns / %7.2f ns = %8.3fx\n", (name + " / SlotArena").c_str(), *a, *b, *a / *b);
    }
  };
  scale("FallbackResource<SlotArena, CachingPool>");
  scale("StatsResource<SlotArena>");
  scale("CachingPool");
  scale("malloc");
  return 0;
}
