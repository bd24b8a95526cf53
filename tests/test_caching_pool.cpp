#include <carve/carve.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <map>
#include <random>
#include <vector>

using carve::CachingPool;
using carve::Errc;
using carve::PoolOptions;
using carve::SimulatedCard;

namespace {

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;

std::size_t round_up(std::size_t n, std::size_t g) { return (n + g - 1) / g * g; }

} // namespace

TEST_CASE("exact size from the cache, else the smallest larger block split") {
  CachingPool pool(SimulatedCard(64 * MiB), PoolOptions{.granularity = 512, .segment_size = 2 * MiB});
  void* a = *pool.try_allocate(100 * KiB);
  void* b = *pool.try_allocate(300 * KiB);
  void* c = *pool.try_allocate(100 * KiB);
  auto s = pool.stats();
  CHECK(s.upstream_allocations == 1); // all three share one 2 MiB segment
  CHECK(s.segments == 1);
  CHECK(s.bytes_reserved == 2 * MiB);
  CHECK(s.bytes_in_use == 500 * KiB);
  CHECK(s.bytes_cached == 2 * MiB - 500 * KiB);
  CHECK(static_cast<char*>(b) == static_cast<char*>(a) + 100 * KiB);

  REQUIRE(pool.try_deallocate(b, 300 * KiB));
  // 300 KiB sits between two live blocks; the tail (1548 KiB) is larger. An exact fit wins.
  void* b2 = *pool.try_allocate(300 * KiB);
  CHECK(b2 == b);
  REQUIRE(pool.try_deallocate(b2, 300 * KiB));
  // 200 KiB: the smallest block that holds it is the 300 KiB hole, split; 100 KiB stays cached.
  const auto splits = pool.stats().splits;
  void* d = *pool.try_allocate(200 * KiB);
  CHECK(d == b);
  CHECK(pool.stats().splits == splits + 1);
  CHECK(pool.stats().cached_blocks == 2);
  CHECK(pool.stats().upstream_allocations == 1);
  CHECK(pool.consistent());

  // Freeing everything merges the segment back into one block.
  REQUIRE(pool.try_deallocate(a, 100 * KiB));
  REQUIRE(pool.try_deallocate(c, 100 * KiB));
  REQUIRE(pool.try_deallocate(d, 200 * KiB));
  s = pool.stats();
  CHECK(s.cached_blocks == 1);
  CHECK(s.largest_cached_block == 2 * MiB);
  CHECK(s.fragmentation() == 0.0);
  CHECK(s.bytes_in_use == 0);
  CHECK(pool.consistent());
  CHECK(pool.trim() == 2 * MiB);
  CHECK(pool.upstream().used_bytes() == 0);
}

TEST_CASE("bad requests return an error and change nothing") {
  CachingPool pool(SimulatedCard(4 * MiB), PoolOptions{.granularity = 512, .segment_size = 1 * MiB});
  void* p = *pool.try_allocate(1000);
  const auto before = pool.stats();
  CHECK(pool.try_allocate(0).error() == Errc::invalid_size);
  CHECK(pool.try_allocate(64, 1024).error() == Errc::invalid_size); // alignment above the granularity
  CHECK(pool.try_allocate(64, 3).error() == Errc::invalid_size);
  CHECK(pool.try_allocate(SIZE_MAX).error() == Errc::invalid_size);
  CHECK(pool.try_allocate(5 * MiB).error() == Errc::no_space);
  int on_stack = 0;
  CHECK(pool.try_deallocate(&on_stack, 4).error() == Errc::not_allocated);
  CHECK(pool.try_deallocate(nullptr, 4).error() == Errc::not_allocated);
  CHECK(pool.try_deallocate(p, 4096).error() == Errc::invalid_size); // wrong size for the block
  CHECK(pool.try_deallocate(static_cast<char*>(p) + 512, 512).error() == Errc::not_allocated);
  const auto after = pool.stats();
  CHECK(after.bytes_in_use == before.bytes_in_use);
  CHECK(after.bytes_reserved == before.bytes_reserved);
  CHECK(after.live_blocks == 1);
  REQUIRE(pool.try_deallocate(p, 1000));
  CHECK(pool.try_deallocate(p, 1000).error() == Errc::not_allocated); // double free
  CHECK(pool.consistent());
  CHECK_THROWS_AS((void)pool.allocate(5 * MiB), std::bad_alloc);
  CHECK_THROWS_AS((void)pool.allocate(0), std::invalid_argument);
  CHECK_THROWS_AS(CachingPool(SimulatedCard(MiB), PoolOptions{.granularity = 384}), std::invalid_argument);
  CHECK_THROWS_AS(CachingPool(SimulatedCard(MiB), PoolOptions{.granularity = 512, .segment_size = 1000}),
                  std::invalid_argument);
}

TEST_CASE("the pool shrinks: idle bytes above the threshold go back, oldest first") {
  const std::size_t seg = 1 * MiB;
  CachingPool pool(SimulatedCard(32 * MiB),
                   PoolOptions{.granularity = 512, .segment_size = seg, .idle_threshold = 3 * seg});
  std::vector<void*> blocks;
  for (int i = 0; i < 8; ++i) {
    blocks.push_back(*pool.try_allocate(seg)); // one segment each
  }
  CHECK(pool.stats().segments == 8);
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    REQUIRE(pool.try_deallocate(blocks[i], seg));
    // Never more than the threshold stays cached, and nothing is released before it is passed.
    CHECK(pool.stats().bytes_cached == std::min<std::size_t>(i + 1, 3) * seg);
    const std::size_t released = i + 1 - std::min<std::size_t>(i + 1, 3);
    CHECK(pool.upstream().used_bytes() == (8 - released) * seg);
  }
  // The three kept are the three freed last.
  std::vector<void*> again;
  for (int i = 0; i < 3; ++i) {
    again.push_back(*pool.try_allocate(seg));
  }
  std::sort(again.begin(), again.end());
  std::vector<void*> newest(blocks.end() - 3, blocks.end());
  std::sort(newest.begin(), newest.end());
  CHECK(again == newest);
  CHECK(pool.stats().upstream_allocations == 8);
}

TEST_CASE("trim releases exactly the excess, in whole segments") {
  const std::size_t seg = 1 * MiB;
  CachingPool pool(SimulatedCard(32 * MiB), PoolOptions{.granularity = 512, .segment_size = seg});
  std::vector<void*> blocks;
  for (int i = 0; i < 6; ++i) {
    blocks.push_back(*pool.try_allocate(seg));
  }
  for (void* p : blocks) {
    REQUIRE(pool.try_deallocate(p, seg));
  }
  CHECK(pool.stats().bytes_cached == 6 * seg);
  CHECK(pool.trim(6 * seg) == 0);                 // not over: nothing goes
  CHECK(pool.trim(2 * seg + seg / 2) == 4 * seg); // 3.5 segments too many: 4 go, 2 stay
  CHECK(pool.stats().bytes_cached == 2 * seg);
  CHECK(pool.upstream().used_bytes() == 2 * seg);
  CHECK(pool.stats().upstream_frees == 4);
  // A segment with a live block in it cannot go back, even on trim().
  void* small = *pool.try_allocate(4 * KiB);
  CHECK(pool.trim() == seg);
  CHECK(pool.stats().bytes_reserved == seg);
  REQUIRE(pool.try_deallocate(small, 4 * KiB));
  CHECK(pool.trim() == seg);
  CHECK(pool.upstream().used_bytes() == 0);
}

TEST_CASE("a full card: the cache goes back to the upstream and the request is retried") {
  const std::size_t seg = 1 * MiB;
  CachingPool pool(SimulatedCard(4 * MiB), PoolOptions{.granularity = 512, .segment_size = seg});
  void* a = *pool.try_allocate(seg);
  void* b = *pool.try_allocate(seg);
  void* c = *pool.try_allocate(2 * seg);
  REQUIRE(pool.try_deallocate(a, seg));
  REQUIRE(pool.try_deallocate(b, seg));
  CHECK(pool.largest_allocation() == 2 * seg);
  CHECK(pool.free_bytes() == 2 * seg);
  // 2 MiB fits in no cached block and the card is full, but the two cached segments add up.
  void* d = *pool.try_allocate(2 * seg);
  CHECK(pool.stats().upstream_failures == 1);
  CHECK(pool.stats().upstream_frees == 2);
  CHECK(pool.largest_allocation() == 0);
  REQUIRE(pool.try_deallocate(c, 2 * seg));
  REQUIRE(pool.try_deallocate(d, 2 * seg));
  // A request smaller than a segment when less than a segment is free gets an exact one.
  CachingPool tight(SimulatedCard(seg + 4 * KiB), PoolOptions{.granularity = 512, .segment_size = seg});
  void* e = *tight.try_allocate(seg);
  void* f = *tight.try_allocate(4 * KiB);
  CHECK(tight.stats().segments == 2);
  CHECK(tight.try_allocate(512).error() == Errc::no_space);
  REQUIRE(tight.try_deallocate(e, seg));
  REQUIRE(tight.try_deallocate(f, 4 * KiB));
}

// The reference model: every live block, its size and a byte pattern written into it.
TEST_CASE("random allocate/free against a reference model: nothing lost, nothing handed out twice") {
  for (const std::uint32_t seed : {1u, 2u, 3u, 4u}) {
    std::mt19937 rng(seed);
    const std::size_t granularity = 512;
    const PoolOptions options{
        .granularity = granularity, .segment_size = 256 * KiB, .idle_threshold = seed % 2 == 0 ? 1 * MiB : SIZE_MAX};
    CachingPool pool(SimulatedCard(8 * MiB), options);
    struct Live {
      std::size_t bytes;
      unsigned char pattern;
    };
    std::map<std::uintptr_t, Live> live;
    std::size_t in_use = 0;
    std::uint64_t allocations = 0;
    for (int step = 0; step < 4000; ++step) {
      const int op = static_cast<int>(rng() % 100);
      if (op < 55) {
        const std::size_t bytes =
            rng() % 4 == 0 ? 1 + rng() % (600 * KiB) : 1 + rng() % (8 * KiB); // mostly small, some large
        const auto r = pool.try_allocate(bytes);
        if (!r) {
          CHECK(r.error() == Errc::no_space);
          CHECK(round_up(bytes, granularity) > pool.largest_allocation());
          continue;
        }
        const auto addr = reinterpret_cast<std::uintptr_t>(*r);
        CHECK(addr % granularity == 0);
        // No overlap with any live block.
        const auto next = live.lower_bound(addr);
        if (next != live.end()) {
          CHECK(addr + bytes <= next->first);
        }
        if (next != live.begin()) {
          const auto prev = std::prev(next);
          CHECK(prev->first + prev->second.bytes <= addr);
        }
        const auto pattern = static_cast<unsigned char>(rng());
        std::memset(*r, pattern, bytes);
        live[addr] = {bytes, pattern};
        in_use += round_up(bytes, granularity);
        ++allocations;
      } else if (op < 95 && !live.empty()) {
        auto it = live.begin();
        std::advance(it, static_cast<long>(rng() % live.size()));
        const auto* bytes = reinterpret_cast<const unsigned char*>(it->first);
        CHECK(bytes[0] == it->second.pattern); // nobody else wrote here
        CHECK(bytes[it->second.bytes - 1] == it->second.pattern);
        REQUIRE(pool.try_deallocate(reinterpret_cast<void*>(it->first), it->second.bytes));
        in_use -= round_up(it->second.bytes, granularity);
        live.erase(it);
      } else {
        const auto before = pool.stats();
        const std::size_t keep = rng() % (2 * MiB);
        const std::size_t released = pool.trim(keep);
        const auto after = pool.stats();
        CHECK(before.bytes_reserved - after.bytes_reserved == released);
        CHECK(before.bytes_cached - after.bytes_cached == released);
        if (before.bytes_cached <= keep) {
          CHECK(released == 0);
        } else if (after.bytes_cached > keep) {
          CHECK(pool.trim(keep) == 0); // stopped only because no whole free segment was left
        } else if (released != 0) {
          CHECK(after.bytes_cached + 600 * KiB > keep); // no segment more than needed went back
        }
      }
      const auto s = pool.stats();
      CHECK(s.bytes_in_use == in_use);
      CHECK(s.live_blocks == live.size());
      CHECK(s.allocations == allocations);
      CHECK(s.bytes_reserved == pool.upstream().used_bytes());
      CHECK(s.bytes_reserved == s.bytes_in_use + s.bytes_cached);
      CHECK(s.peak_in_use >= s.bytes_in_use);
      CHECK(s.fragmentation() >= 0.0);
      CHECK(s.fragmentation() < 1.0);
      if (s.bytes_cached > options.idle_threshold) {
        CHECK(pool.trim(options.idle_threshold) == 0); // over only by segments still partly in use
      }
      if (step % 50 == 0) {
        REQUIRE(pool.consistent());
      }
    }
    for (const auto& [addr, l] : live) {
      REQUIRE(pool.try_deallocate(reinterpret_cast<void*>(addr), l.bytes));
    }
    CHECK(pool.consistent());
    CHECK(pool.stats().bytes_in_use == 0);
    pool.trim();
    CHECK(pool.upstream().used_bytes() == 0);
  }
}
