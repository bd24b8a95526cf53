// ExpandablePool lending holes while streams' work runs late (as a GPU's does, behind the host),
// with a release threshold and a device that runs out of memory: a chunk whose holes are lent stays
// mapped, no block lands on memory another stream's queued work still uses, nothing is unmapped
// under queued work, and the tables stay consistent.
#include "support/late_stream_work.hpp"
#include "support/refusing_mapper.hpp"

#include <carve/mr/stream_events.hpp>
#include <carve/vmm/expandable_pool.hpp>
#include <carve/vmm/host_memory_mapper.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <random>

// In a namespace of its own: the area's test files may compile as one translation unit.
namespace test_expandable_pool_late_work {

using carve::Errc;
using carve::ExpandablePoolOptions;
using carve::HostMemoryMapper;
using carve::SimulatedStream;
using carve::SimulatedStreams;

namespace {

constexpr std::size_t page = 4096; // the granule: pages keep every byte checked after every step cheap

// A device that runs out of memory while told to (creates_left 0), and has room again (the most).
using carve::test::RefusingMapper;
constexpr int out_of_memory = 0;
constexpr int room = 1 << 30;

using Pool = carve::ExpandablePool<RefusingMapper, SimulatedStreams>;

ExpandablePoolOptions small(ExpandablePoolOptions o) {
  o.address_space_bytes = std::size_t{16} << 20;
  return o;
}

} // namespace

TEST_CASE("a chunk whose holes a refused block borrowed is not unmapped as idle") {
  RefusingMapper device({.granularity = page});
  Pool pool(device,
            small({.growth_divisor = 0, .release_threshold = page, .headroom_permille = 0, .lend_min_bytes = page}),
            SimulatedStreams(2));
  const SimulatedStream s0{0}, s1{1};
  void* a1 = *pool.try_allocate(s0, 2 * page, 512); // [0, 2)
  void* a2 = *pool.try_allocate(s0, 2 * page, 512); // [2, 4): the chunk C
  auto* base = static_cast<unsigned char*>(a1);
  REQUIRE(a2 == base + 2 * page);
  pool.deallocate(s0, a1, 2 * page, 512); // idle past the threshold, its stream's work done: unmapped
  REQUIRE_FALSE(pool.owns(base));
  void* z = *pool.try_allocate(s1, 4 * page, 512); // another stream's memory, idle below behind queued work
  pool.streams().enqueue(s1);
  pool.deallocate(s1, z, 4 * page, 512);
  pool.streams().enqueue(s0);             // a kernel still using a2
  pool.deallocate(s0, a2, 2 * page, 512); // C falls idle behind that work: listed, kept
  CHECK(pool.stats().bytes_reserved == 6 * page);

  // Three pages at [0, 3) cut C, whose last page is lent to [0, 1) (the line is passed: nothing idle
  // can go, both streams' work is queued); the device then refuses the page left to map.
  *device.creates_left = out_of_memory;
  CHECK(pool.try_allocate(s0, 3 * page, 512).error() == Errc::no_space);
  *device.creates_left = room;
  CHECK(pool.stats().lent_bytes == page);
  CHECK(pool.consistent());

  // The work runs; a free past the threshold unmaps idle chunks, oldest first, but not C, whose
  // last page is the memory mapped at [0, 1).
  pool.streams().complete(s0);
  pool.streams().complete(s1);
  void* w = *pool.try_allocate(s1, page, 512); // on z's chunk
  pool.deallocate(s1, w, page, 512);           // z's chunk goes
  CHECK(pool.owns(base + 2 * page));
  CHECK(pool.owns(base + 3 * page));
  CHECK(pool.stats().bytes_reserved == 2 * page); // C: what the device still holds
  CHECK(pool.consistent());
  CHECK(pool.trim() == 2 * page); // the second mapping goes, then C
  CHECK(pool.stats().bytes_reserved == 0);
  CHECK(pool.stats().lent_bytes == 0);
  CHECK(pool.consistent());
}

// One seed of LateStreamWork's random steps over a pool on `Streams`; the pool's waits.
template <class Streams>
std::uint64_t run_seed(unsigned seed) {
  std::mt19937_64 rng(seed);
  const auto streams = static_cast<std::uint32_t>(1 + seed % 3);
  RefusingMapper device({.granularity = page});
  carve::ExpandablePool<RefusingMapper, Streams> pool(device,
                                                      small({.growth_divisor = seed % 2 == 0 ? 8u : 0u,
                                                             .max_chunk_bytes = seed % 4 < 2 ? 2 * page : SIZE_MAX,
                                                             .release_threshold = 4 * page,
                                                             .headroom_permille = seed % 5 == 0 ? 50u : 1u,
                                                             .lend_min_bytes = 3 * page,
                                                             .bring_holes_home = seed % 3 != 0}),
                                                      Streams(streams));
  carve::test::LateStreamWork work(pool, streams);
  work.random_steps(rng, 3000, {.small = 2 * page, .large = 9 * page}, [&](int step) {
    *device.creates_left = rng() % 16 == 0 ? out_of_memory : room;
    work.for_each_queued([&](const unsigned char* p, std::size_t bytes) { // its memory stays mapped
      REQUIRE((pool.owns(p) && pool.owns(p + bytes - 1)));
    });
    if (step % 25 == 0) {
      REQUIRE(pool.consistent());
    }
  });
  *device.creates_left = room;
  CHECK(work.intact());
  pool.trim();
  CHECK(pool.consistent());
  CHECK(pool.stats().bytes_reserved == 0);
  CHECK(pool.stats().lent_bytes == 0);
  CHECK(device.mapping_count() == 0);
  return pool.stats().stream_waits;
}

TEST_CASE("random blocks on streams whose work runs late: nothing disturbed, nothing unmapped under work") {
  // LateStreamWork's random steps, with lending, holes coming home, a release threshold and a
  // device that runs out by turns, on one to three streams. Seeds 28, 47, 62 and 77 unmapped a chunk
  // whose holes were lent while lending left it on the idle list.
  for (const unsigned seed : {7u, 20u, 28u, 44u, 47u, 62u, 77u, 93u}) {
    CAPTURE(seed);
    CHECK(run_seed<SimulatedStreams>(seed) == 0); // these streams cannot be waited on
  }
}

TEST_CASE("the same where the pool waits for the streams' work (as over CUDA streams)") {
  // The headroom line then unmaps a chunk once the work before its last free has run: the work
  // queued after it stays queued, and must find its memory mapped and its bytes intact.
  std::uint64_t waits = 0;
  for (const unsigned seed : {3u, 7u, 28u, 44u, 47u, 62u, 77u, 93u}) {
    CAPTURE(seed);
    waits += run_seed<carve::test::WaitingSimulatedStreams>(seed);
  }
  CHECK(waits > 100); // the pool waited, and the work it left queued ran later
}

} // namespace test_expandable_pool_late_work
