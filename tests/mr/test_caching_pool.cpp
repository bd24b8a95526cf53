#include "support/errors.hpp"
#include <carve/mr.hpp>
#include <carve/tier.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

// In a namespace of its own: the area's test files compile as one translation unit.
namespace test_caching_pool {

using carve::CachingPool;
using carve::Errc;
using carve::PoolOptions;
using carve::SimulatedCard;

// What CCCL's cuda::mr::synchronous_resource requires, checked on every build (the headers
// check their own resources too; these are the ones outside carve/mr).
static_assert(carve::SynchronousResource<carve::MappedFileResource>);
#if __has_include(<numa.h>)
static_assert(carve::SynchronousResource<carve::NumaNodeResource>);
#endif
static_assert(!carve::SynchronousResource<int>);

// Named, not anonymous: these functions exist only to be found by the concepts, which clang
// would otherwise warn are never emitted.
namespace concept_checks {

// A card that declares a property of its own: the pool declares exactly what its upstream does.
struct fake_property {};
struct other_property {};
struct TaggedCard : SimulatedCard {
  using SimulatedCard::SimulatedCard;
  friend constexpr void get_property(const TaggedCard&, fake_property) noexcept {}
};
static_assert(carve::SynchronousResourceWith<TaggedCard, fake_property>);
static_assert(carve::SynchronousResourceWith<CachingPool<TaggedCard>, fake_property>);
static_assert(!carve::SynchronousResourceWith<CachingPool<TaggedCard>, other_property>);
static_assert(!carve::SynchronousResourceWith<CachingPool<SimulatedCard>, fake_property>);

// Not a resource: no deallocate_sync.
struct AllocateOnly {
  void* allocate_sync(std::size_t, std::size_t) { return nullptr; }
  friend bool operator==(const AllocateOnly&, const AllocateOnly&) noexcept { return true; }
};
static_assert(!carve::SynchronousResource<AllocateOnly>);

} // namespace concept_checks

namespace {

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;

std::size_t round_up(std::size_t n, std::size_t g) { return (n + g - 1) / g * g; }

} // namespace

TEST_CASE("exact size from the cache, else the smallest larger block split") {
  CachingPool pool(SimulatedCard(64 * MiB), PoolOptions{.granularity = 512, .segment_size = 2 * MiB});
  void* a = *pool.try_allocate(100 * KiB, 256);
  void* b = *pool.try_allocate(300 * KiB, 256);
  void* c = *pool.try_allocate(100 * KiB, 256);
  auto s = pool.stats();
  CHECK(s.upstream_allocations == 1); // all three share one 2 MiB segment
  CHECK(s.segments == 1);
  CHECK(s.bytes_reserved == 2 * MiB);
  CHECK(s.bytes_in_use == 500 * KiB);
  CHECK(s.bytes_cached == 2 * MiB - 500 * KiB);
  CHECK(static_cast<char*>(b) == static_cast<char*>(a) + 100 * KiB);

  REQUIRE(pool.try_deallocate(b, 300 * KiB, 256));
  // 300 KiB sits between two live blocks; the tail (1548 KiB) is larger. An exact fit wins.
  void* b2 = *pool.try_allocate(300 * KiB, 256);
  CHECK(b2 == b);
  REQUIRE(pool.try_deallocate(b2, 300 * KiB, 256));
  // 200 KiB: the smallest block that holds it is the 300 KiB hole, split; 100 KiB stays cached.
  const auto splits = pool.stats().splits;
  void* d = *pool.try_allocate(200 * KiB, 256);
  CHECK(d == b);
  CHECK(pool.stats().splits == splits + 1);
  CHECK(pool.stats().cached_blocks == 2);
  CHECK(pool.stats().upstream_allocations == 1);
  CHECK(pool.consistent());

  // Freeing everything merges the segment back into one block.
  REQUIRE(pool.try_deallocate(a, 100 * KiB, 256));
  REQUIRE(pool.try_deallocate(c, 100 * KiB, 256));
  REQUIRE(pool.try_deallocate(d, 200 * KiB, 256));
  s = pool.stats();
  CHECK(s.cached_blocks == 1);
  CHECK(s.largest_cached_block == 2 * MiB);
  CHECK(s.fragmentation() == 0.0);
  CHECK(s.bytes_in_use == 0);
  CHECK(pool.consistent());
  CHECK(pool.trim() == 2 * MiB);
  CHECK(pool.upstream().used_bytes() == 0);
}

TEST_CASE("mid-size requests share segments of shared_segment_size, so their frees serve larger requests") {
  CachingPool pool(SimulatedCard(256 * MiB), PoolOptions{}); // PyTorch's sizes: 20 MiB below 10 MiB
  void* a = *pool.try_allocate(3 * MiB, 256);
  void* b = *pool.try_allocate(6 * MiB + 1, 256);
  CHECK(pool.stats().upstream_allocations == 1); // both in one 20 MiB segment
  CHECK(pool.stats().bytes_reserved == 20 * MiB);
  void* c = *pool.try_allocate(11 * MiB + 1, 256); // not below 10 MiB: its own, in whole 2 MiB units
  CHECK(pool.stats().bytes_reserved == 20 * MiB + 12 * MiB);
  REQUIRE(pool.try_deallocate(a, 3 * MiB, 256));
  REQUIRE(pool.try_deallocate(b, 6 * MiB + 1, 256));
  // Segments of their own (4 and 8 MiB) could not hold this; the shared one, merged, does.
  void* e = *pool.try_allocate(16 * MiB, 256);
  CHECK(e == a);
  CHECK(pool.stats().upstream_allocations == 2);
  REQUIRE(pool.try_deallocate(c, 11 * MiB + 1, 256));
  REQUIRE(pool.try_deallocate(e, 16 * MiB, 256));
  CHECK(pool.consistent());
}

TEST_CASE("near a full card, a mid-size request takes a segment of its own rather than the cache") {
  CachingPool pool(SimulatedCard(24 * MiB), PoolOptions{});
  void* small = *pool.try_allocate(1 * MiB, 256); // a 2 MiB segment, then cached
  REQUIRE(pool.try_deallocate(small, 1 * MiB, 256));
  void* big = *pool.try_allocate(16 * MiB, 256); // its own: 16 MiB, 18 reserved in all
  void* mid = *pool.try_allocate(3 * MiB, 256);  // 20 MiB would not fit in the 6 left; 4 MiB does
  CHECK(pool.stats().bytes_reserved == 22 * MiB);
  CHECK(pool.stats().bytes_cached == 2 * MiB + 1 * MiB); // the small one's segment stayed, and 4 - 3
  CHECK(pool.stats().upstream_failures == 1);
  REQUIRE(pool.try_deallocate(mid, 3 * MiB, 256));
  REQUIRE(pool.try_deallocate(big, 16 * MiB, 256));
  CHECK(pool.consistent());
}

TEST_CASE("near a full card a request takes a segment of its own rather than cut a whole free one 4x its size") {
  const PoolOptions options{.segment_size = 1 * MiB, .shared_segment_size = 0, .near_full_permille = 500};
  CachingPool pool(SimulatedCard(11 * MiB), options);
  void* big = *pool.try_allocate(8 * MiB, 256);
  REQUIRE(pool.try_deallocate(big, 8 * MiB, 256)); // a whole free 8 MiB segment, past half the card
  pool.hold(true); // held: the big segment could not go back for a later request, so it is cut
  void* h = *pool.try_allocate(2 * MiB, 256);
  CHECK(h == big);
  REQUIRE(pool.try_deallocate(h, 2 * MiB, 256));
  pool.hold(false);
  void* p = *pool.try_allocate(2 * MiB, 256);
  CHECK(p != big); // a segment of its own
  CHECK(pool.stats().upstream_allocations == 2);
  CHECK(pool.stats().cache_hits == 1);
  CHECK(pool.stats().bytes_cached == 8 * MiB);
  // No room for one more: the free segment is cut after all, and the cache is not given back.
  void* q = *pool.try_allocate(2 * MiB, 256);
  CHECK(q == big);
  CHECK(pool.stats().cache_hits == 2);
  CHECK(pool.stats().upstream_failures == 1);
  CHECK(pool.stats().upstream_frees == 0);
  // The 6 MiB left of it is no whole free segment: cut, though a new 1 MiB segment would fit.
  void* t = *pool.try_allocate(1 * MiB, 256);
  CHECK(pool.stats().upstream_allocations == 2);
  REQUIRE(pool.try_deallocate(t, 1 * MiB, 256));
  REQUIRE(pool.try_deallocate(q, 2 * MiB, 256));
  // Nor is its free first half while a block lives in the second.
  void* first = *pool.try_allocate(4 * MiB, 256); // under 4x: cut
  void* second = *pool.try_allocate(4 * MiB, 256);
  REQUIRE(pool.try_deallocate(first, 4 * MiB, 256));
  void* u = *pool.try_allocate(1 * MiB, 256);
  CHECK(u == big);
  CHECK(pool.stats().upstream_allocations == 2);
  REQUIRE(pool.try_deallocate(u, 1 * MiB, 256));
  REQUIRE(pool.try_deallocate(second, 4 * MiB, 256));
  REQUIRE(pool.try_deallocate(p, 2 * MiB, 256));
  void* r = *pool.try_allocate(3 * MiB, 256); // the whole 8 MiB segment is under 4x 3 MiB: cut
  CHECK(r == big);
  REQUIRE(pool.try_deallocate(r, 3 * MiB, 256));
  CHECK(pool.consistent());

  // A whole free segment no larger than the request's own (segments of 4 MiB): cut.
  CachingPool coarse(SimulatedCard(9 * MiB),
                     PoolOptions{.segment_size = 4 * MiB, .shared_segment_size = 0, .near_full_permille = 400});
  void* c = *coarse.try_allocate(1 * MiB, 256);
  REQUIRE(coarse.try_deallocate(c, 1 * MiB, 256));
  CHECK(*coarse.try_allocate(1 * MiB, 256) == c);
  CHECK(coarse.stats().upstream_allocations == 1);

  // The default line (900 per mille) on a 20 MiB card; with 1000, never; below the line, never.
  const PoolOptions fine{.segment_size = 1 * MiB, .shared_segment_size = 0};
  CachingPool by_default(SimulatedCard(20 * MiB), fine);
  void* d = *by_default.try_allocate(19 * MiB, 256);
  REQUIRE(by_default.try_deallocate(d, 19 * MiB, 256));
  CHECK(*by_default.try_allocate(1 * MiB, 256) != d);
  CachingPool never(SimulatedCard(20 * MiB),
                    PoolOptions{.segment_size = 1 * MiB, .shared_segment_size = 0, .near_full_permille = 1000});
  void* e = *never.try_allocate(19 * MiB, 256);
  REQUIRE(never.try_deallocate(e, 19 * MiB, 256));
  CHECK(*never.try_allocate(1 * MiB, 256) == e);
  CachingPool roomy(SimulatedCard(32 * MiB), options);
  void* b = *roomy.try_allocate(8 * MiB, 256);
  REQUIRE(roomy.try_deallocate(b, 8 * MiB, 256));
  CHECK(*roomy.try_allocate(2 * MiB, 256) == b);
}

// A card that cannot say its capacity (a remote upstream whose server is gone).
struct LostCard : SimulatedCard {
  using SimulatedCard::SimulatedCard;
  std::size_t capacity() const { throw std::runtime_error("the server is gone"); }
};

TEST_CASE("an upstream that cannot say its capacity: the pool is made, and never counts itself near full") {
  CachingPool pool(LostCard(11 * MiB),
                   PoolOptions{.segment_size = 1 * MiB, .shared_segment_size = 0, .near_full_permille = 500});
  void* big = *pool.try_allocate(8 * MiB, 256);
  REQUIRE(pool.try_deallocate(big, 8 * MiB, 256));
  CHECK(*pool.try_allocate(2 * MiB, 256) == big);
}

TEST_CASE("bad requests return an error and change nothing") {
  CachingPool pool(SimulatedCard(4 * MiB), PoolOptions{.granularity = 512, .segment_size = 1 * MiB});
  void* p = *pool.try_allocate(1000, 256);
  pool.deallocate(*pool.try_allocate(MiB, 256), MiB, 256); // a whole free segment, cached
  const auto before = pool.stats();
  CHECK(pool.try_allocate(0, 256).error() == Errc::invalid_size);
  CHECK(pool.try_allocate(64, 1024).error() == Errc::no_space); // an alignment above the granularity: a fallback's
  CHECK(pool.try_allocate(64, 3).error() == Errc::invalid_size);
  CHECK(pool.try_allocate(SIZE_MAX, 256).error() == Errc::invalid_size); // overflows when rounded
  CHECK(pool.try_allocate(5 * MiB, 256).error() == Errc::no_space);      // above the card: the cache stays
  CHECK(pool.try_allocate(SIZE_MAX - 4096, 256).error() == Errc::no_space);
  int on_stack = 0;
  CHECK(pool.try_deallocate(&on_stack, 4, 256).error() == Errc::not_allocated);
  CHECK(pool.try_deallocate(nullptr, 4, 256).error() == Errc::not_allocated);
  CHECK(pool.try_deallocate(p, 4096, 256).error() == Errc::invalid_size); // wrong size for the block
  CHECK(pool.try_deallocate(static_cast<char*>(p) + 512, 512, 256).error() == Errc::not_allocated);
  const auto after = pool.stats();
  CHECK(after.bytes_in_use == before.bytes_in_use);
  CHECK(after.bytes_reserved == before.bytes_reserved);
  CHECK(after.upstream_failures == before.upstream_failures);
  CHECK(after.upstream_frees == before.upstream_frees);
  CHECK(after.live_blocks == 1);
  REQUIRE(pool.try_deallocate(p, 1000, 256));
  CHECK(pool.try_deallocate(p, 1000, 256).error() == Errc::not_allocated); // double free
  CHECK(pool.consistent());
  CHECK_THROWS_ERRC(carve::Errc::no_space, (void)pool.allocate(5 * MiB));
  CHECK_THROWS_ERRC(carve::Errc::invalid_size, (void)pool.allocate(0));
  CHECK_THROWS_ERRC(carve::Errc::invalid_argument, CachingPool(SimulatedCard(MiB), PoolOptions{.granularity = 384}));
  CHECK_THROWS_ERRC(carve::Errc::invalid_argument,
                    CachingPool(SimulatedCard(MiB), PoolOptions{.granularity = 512, .segment_size = 1000}));
}

TEST_CASE("the pool shrinks: idle bytes above the threshold go back, oldest first") {
  const std::size_t seg = 1 * MiB; // no shared segments below: each request of seg gets its own
  CachingPool pool(
      SimulatedCard(32 * MiB),
      PoolOptions{.granularity = 512, .segment_size = seg, .idle_threshold = 3 * seg, .shared_segment_size = 0});
  std::vector<void*> blocks;
  for (int i = 0; i < 8; ++i) {
    blocks.push_back(*pool.try_allocate(seg, 256)); // one segment each
  }
  CHECK(pool.stats().segments == 8);
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    REQUIRE(pool.try_deallocate(blocks[i], seg, 256));
    // Never more than the threshold stays cached, and nothing is released before it is passed.
    CHECK(pool.stats().bytes_cached == std::min<std::size_t>(i + 1, 3) * seg);
    const std::size_t released = i + 1 - std::min<std::size_t>(i + 1, 3);
    CHECK(pool.upstream().used_bytes() == (8 - released) * seg);
  }
  // The three kept are the three freed last.
  std::vector<void*> again;
  for (int i = 0; i < 3; ++i) {
    again.push_back(*pool.try_allocate(seg, 256));
  }
  std::sort(again.begin(), again.end());
  std::vector<void*> newest(blocks.end() - 3, blocks.end());
  std::sort(newest.begin(), newest.end());
  CHECK(again == newest);
  CHECK(pool.stats().upstream_allocations == 8);
}

TEST_CASE("trim releases whole free segments only: the cache may end below keep, or above it") {
  const std::size_t seg = 1 * MiB; // no shared segments: each request of seg gets its own
  CachingPool pool(SimulatedCard(32 * MiB),
                   PoolOptions{.granularity = 512, .segment_size = seg, .shared_segment_size = 0});
  std::vector<void*> blocks;
  for (int i = 0; i < 6; ++i) {
    blocks.push_back(*pool.try_allocate(seg, 256));
  }
  for (void* p : blocks) {
    REQUIRE(pool.try_deallocate(p, seg, 256));
  }
  CHECK(pool.stats().bytes_cached == 6 * seg);
  CHECK(pool.trim(6 * seg) == 0);                 // not over: nothing goes
  CHECK(pool.trim(2 * seg + seg / 2) == 4 * seg); // 3.5 segments too many: 4 whole ones go, 2 stay
  CHECK(pool.stats().bytes_cached == 2 * seg);    // below keep, by less than one segment
  CHECK(pool.upstream().used_bytes() == 2 * seg);
  CHECK(pool.stats().upstream_frees == 4);
  // A segment with a live block in it cannot go back, even on trim(): its free rest stays
  // cached above keep.
  void* small = *pool.try_allocate(4 * KiB, 256);
  CHECK(pool.trim() == seg);
  CHECK(pool.stats().bytes_reserved == seg);
  CHECK(pool.stats().bytes_cached == seg - 4 * KiB);
  REQUIRE(pool.try_deallocate(small, 4 * KiB, 256));
  CHECK(pool.trim() == seg);
  CHECK(pool.upstream().used_bytes() == 0);
}

TEST_CASE("a full card: the cache goes back to the upstream and the request is retried") {
  const std::size_t seg = 1 * MiB; // no shared segments: each request of seg or more gets its own
  CachingPool pool(SimulatedCard(4 * MiB),
                   PoolOptions{.granularity = 512, .segment_size = seg, .shared_segment_size = 0});
  void* a = *pool.try_allocate(seg, 256);
  void* b = *pool.try_allocate(seg, 256);
  void* c = *pool.try_allocate(2 * seg, 256);
  REQUIRE(pool.try_deallocate(a, seg, 256));
  REQUIRE(pool.try_deallocate(b, seg, 256));
  CHECK(pool.largest_allocation() == 2 * seg);
  CHECK(pool.free_bytes() == 2 * seg);
  // 2 MiB fits in no cached block and the card is full, but the two cached segments add up.
  void* d = *pool.try_allocate(2 * seg, 256);
  CHECK(pool.stats().upstream_failures == 1);
  CHECK(pool.stats().upstream_frees == 2);
  CHECK(pool.largest_allocation() == 0);
  REQUIRE(pool.try_deallocate(c, 2 * seg, 256));
  REQUIRE(pool.try_deallocate(d, 2 * seg, 256));
  // A request smaller than a segment when less than a segment is free gets an exact one.
  CachingPool tight(SimulatedCard(seg + 4 * KiB), PoolOptions{.granularity = 512, .segment_size = seg});
  void* e = *tight.try_allocate(seg, 256);
  void* f = *tight.try_allocate(4 * KiB, 256);
  CHECK(tight.stats().segments == 2);
  CHECK(tight.try_allocate(512, 256).error() == Errc::no_space);
  REQUIRE(tight.try_deallocate(e, seg, 256));
  REQUIRE(tight.try_deallocate(f, 4 * KiB, 256));
}

TEST_CASE("held (a stream capture): nothing goes back by itself; a request the card refuses is refused") {
  const std::size_t seg = 1 * MiB;
  CachingPool pool(SimulatedCard(4 * MiB), PoolOptions{.granularity = 512, .segment_size = seg, .idle_threshold = 0});
  void* a = *pool.try_allocate(seg, 256);
  void* b = *pool.try_allocate(seg, 256);
  void* c = *pool.try_allocate(2 * seg, 256);
  pool.hold(true);
  REQUIRE(pool.try_deallocate(a, seg, 256)); // past the threshold, but held: cached
  REQUIRE(pool.try_deallocate(b, seg, 256));
  CHECK(pool.free_bytes() == 2 * seg);
  CHECK(pool.largest_allocation() == seg);                          // the free segments are not given back while held
  CHECK(pool.try_allocate(2 * seg, 256).error() == Errc::no_space); // the cache would fit it: not given back
  CHECK(pool.stats().upstream_frees == 0);
  CHECK(pool.trim() == 2 * seg); // asked for: done
  pool.hold(false);
  void* d = *pool.try_allocate(2 * seg, 256);
  REQUIRE(pool.try_deallocate(c, 2 * seg, 256)); // not held: over the threshold, back at once
  REQUIRE(pool.try_deallocate(d, 2 * seg, 256));
  CHECK(pool.stats().bytes_reserved == 0);
}

TEST_CASE("equal-sized cached blocks: the lowest address wins, for exact and for larger fits") {
  CachingPool pool(SimulatedCard(64 * MiB), PoolOptions{.granularity = 512, .segment_size = 2 * MiB});
  std::vector<void*> p;
  for (const std::size_t kib : {100u, 50u, 100u, 50u, 100u, 50u}) {
    p.push_back(*pool.try_allocate(kib * KiB, 256));
  }
  // Free the 100 KiB blocks at p[4] and p[0] (in that order): two equal holes, plus the tail.
  REQUIRE(pool.try_deallocate(p[4], 100 * KiB, 256));
  REQUIRE(pool.try_deallocate(p[0], 100 * KiB, 256));
  CHECK(*pool.try_allocate(100 * KiB, 256) == p[0]); // exact: the lower of the two
  REQUIRE(pool.try_deallocate(p[0], 100 * KiB, 256));
  CHECK(*pool.try_allocate(60 * KiB, 256) == p[0]); // larger: the smallest (100 KiB), the lower one
  CHECK(*pool.try_allocate(60 * KiB, 256) == p[4]); // the other 100 KiB hole beats 40 KiB and the tail
  CHECK(pool.consistent());
}

namespace {

// The pool's documented policy, written out independently of its code: segments and blocks by
// address; a request takes the cached block of exactly its rounded size, else the smallest
// larger one (equal sizes: the lowest address), split; else a new segment from the upstream:
// segment_size below it, shared_segment_size (in whole segment_size units) below half of that, else
// the size rounded up to whole segment_size units; a shared one the card cannot hold gives way to
// the request's own; when the card cannot hold that, every whole free segment goes back and
// exactly `size` is asked for; freed blocks merge with free neighbours
// in their segment; whole free segments go back least recently freed first (on deallocation above
// the idle threshold, and on trim). It predicts every address handed out from the cache, every
// no_space, every trim's result and every statistic.
class PoolModel {
public:
  PoolModel(std::size_t capacity, PoolOptions options) : capacity_(capacity), o_(options) {}

  std::size_t rounded(std::size_t bytes) const { return round_up(bytes, o_.granularity); }

  // Checks `got`, what the pool answered to a request of `bytes`, and follows it.
  void allocate(std::size_t bytes, const cuda::std::expected<void*, Errc>& got) {
    const std::size_t size = rounded(bytes);
    if (const auto best = best_fit(size)) {
      REQUIRE(got.has_value());
      REQUIRE(to_addr(*got) == *best); // exactly the block best fit with split chooses
      take(*best, size);
      ++s_.cache_hits;
      return;
    }
    const std::size_t unit = o_.segment_size;
    const std::size_t own = round_up(std::max(size, unit), unit);
    std::size_t segment =
        size >= unit && size < o_.shared_segment_size / 2 ? round_up(o_.shared_segment_size, unit) : own;
    if (segment != own && segment > capacity_ - s_.bytes_reserved) { // no room for the shared one: its own
      ++s_.upstream_failures;
      segment = own;
    }
    if (segment > capacity_ - s_.bytes_reserved) {
      ++s_.upstream_failures;
      release(0);
      segment = size;
      if (segment > capacity_ - s_.bytes_reserved) {
        ++s_.upstream_failures;
        REQUIRE_FALSE(got.has_value());
        CHECK(got.error() == Errc::no_space);
        return;
      }
    }
    REQUIRE(got.has_value());
    const std::uintptr_t base = to_addr(*got);
    CHECK(base % o_.granularity == 0);
    const auto next = segments_.lower_bound(base); // a fresh upstream allocation, overlapping none held
    if (next != segments_.end()) {
      CHECK(base + segment <= next->first);
    }
    if (next != segments_.begin()) {
      CHECK(std::prev(next)->first + std::prev(next)->second <= base);
    }
    segments_[base] = segment;
    blocks_[base] = Block{segment, base, true, tick_};
    ++s_.upstream_allocations;
    s_.bytes_reserved += segment;
    s_.peak_reserved = std::max(s_.peak_reserved, s_.bytes_reserved);
    s_.bytes_cached += segment; // take() moves it to in-use
    take(base, size);
  }

  void deallocate(void* p) {
    auto it = blocks_.find(to_addr(p));
    REQUIRE(it != blocks_.end());
    REQUIRE_FALSE(it->second.free);
    ++tick_;
    ++s_.deallocations;
    s_.bytes_in_use -= it->second.size;
    s_.bytes_cached += it->second.size;
    it->second.free = true;
    it->second.freed_at = tick_;
    if (const auto next = std::next(it);
        next != blocks_.end() && next->second.free && next->second.segment == it->second.segment) {
      it->second.size += next->second.size;
      blocks_.erase(next);
      ++s_.merges;
    }
    if (it != blocks_.begin()) {
      if (const auto prev = std::prev(it); prev->second.free && prev->second.segment == it->second.segment) {
        prev->second.size += it->second.size;
        prev->second.freed_at = tick_;
        blocks_.erase(it);
        ++s_.merges;
      }
    }
    if (s_.bytes_cached > o_.idle_threshold) {
      release(o_.idle_threshold);
    }
  }

  // Whole free segments, least recently freed first, while more than `keep` bytes are cached.
  std::size_t release(std::size_t keep) {
    std::size_t released = 0;
    while (s_.bytes_cached > keep) {
      const Block* oldest = nullptr;
      std::uintptr_t at = 0;
      for (const auto& [addr, b] : blocks_) {
        if (b.free && addr == b.segment && b.size == segments_.at(addr) &&
            (oldest == nullptr || b.freed_at < oldest->freed_at)) {
          oldest = &b;
          at = addr;
        }
      }
      if (oldest == nullptr) {
        break;
      }
      const std::size_t size = oldest->size;
      blocks_.erase(at);
      segments_.erase(at);
      s_.bytes_cached -= size;
      s_.bytes_reserved -= size;
      ++s_.upstream_frees;
      released += size;
    }
    return released;
  }

  // Every statistic the pool reports, and what it says it could still hand out.
  void check(const CachingPool<SimulatedCard>& pool) const {
    const auto p = pool.stats();
    CHECK(p.bytes_in_use == s_.bytes_in_use);
    CHECK(p.bytes_cached == s_.bytes_cached);
    CHECK(p.bytes_reserved == s_.bytes_reserved);
    CHECK(p.peak_in_use == s_.peak_in_use);
    CHECK(p.peak_reserved == s_.peak_reserved);
    CHECK(p.live_blocks == count(false));
    CHECK(p.cached_blocks == count(true));
    CHECK(p.segments == segments_.size());
    CHECK(p.largest_cached_block == largest_free());
    CHECK(p.allocations == s_.allocations);
    CHECK(p.deallocations == s_.deallocations);
    CHECK(p.cache_hits == s_.cache_hits);
    CHECK(p.splits == s_.splits);
    CHECK(p.merges == s_.merges);
    CHECK(p.upstream_allocations == s_.upstream_allocations);
    CHECK(p.upstream_frees == s_.upstream_frees);
    CHECK(p.upstream_failures == s_.upstream_failures);
    CHECK(pool.upstream().used_bytes() == s_.bytes_reserved);
    CHECK(pool.free_bytes() == s_.bytes_cached + (capacity_ - s_.bytes_reserved));
    std::size_t from_upstream = capacity_ - s_.bytes_reserved;
    for (const auto& [addr, b] : blocks_) {
      if (b.free && addr == b.segment && b.size == segments_.at(addr)) {
        from_upstream += b.size;
      }
    }
    CHECK(pool.largest_allocation() == std::max(largest_free(), from_upstream / o_.granularity * o_.granularity));
  }

  bool fits_somewhere(std::size_t bytes) const { return best_fit(rounded(bytes)).has_value(); }

private:
  struct Block {
    std::size_t size;
    std::uintptr_t segment;
    bool free;
    std::uint64_t freed_at;
  };

  static std::uintptr_t to_addr(void* p) { return reinterpret_cast<std::uintptr_t>(p); }

  std::optional<std::uintptr_t> best_fit(std::size_t size) const {
    std::optional<std::uintptr_t> best;
    std::size_t best_size = 0;
    for (const auto& [addr, b] : blocks_) { // by address, so the first of equal sizes is the lowest
      if (b.free && b.size >= size && (!best || b.size < best_size)) {
        best = addr;
        best_size = b.size;
      }
    }
    return best;
  }

  // Hands out the first `size` bytes of the free block at `addr`; the rest stays cached.
  void take(std::uintptr_t addr, std::size_t size) {
    Block& b = blocks_.at(addr);
    REQUIRE(b.free);
    b.free = false;
    if (b.size > size) {
      blocks_[addr + size] = Block{b.size - size, b.segment, true, tick_};
      b.size = size;
      ++s_.splits;
    }
    s_.bytes_cached -= size;
    s_.bytes_in_use += size;
    s_.peak_in_use = std::max(s_.peak_in_use, s_.bytes_in_use);
    ++s_.allocations;
  }

  std::size_t count(bool free) const {
    return static_cast<std::size_t>(
        std::count_if(blocks_.begin(), blocks_.end(), [&](const auto& kv) { return kv.second.free == free; }));
  }
  std::size_t largest_free() const {
    std::size_t largest = 0;
    for (const auto& [addr, b] : blocks_) {
      largest = b.free ? std::max(largest, b.size) : largest;
    }
    return largest;
  }

  std::size_t capacity_;
  PoolOptions o_;
  std::map<std::uintptr_t, std::size_t> segments_; // base -> size
  std::map<std::uintptr_t, Block> blocks_;         // every block of every segment, by address
  std::uint64_t tick_ = 0;
  carve::PoolStats s_; // the model's own figures, in the pool's units
};

} // namespace

TEST_CASE("random allocate/free/trim against a reference model: every block and every figure predicted") {
  const std::size_t capacity = 8 * MiB;
  int trims_in_all = 0; // whether a trim releases anything depends on where the host put the segments
  for (const std::uint32_t seed : {1u, 2u, 3u, 4u, 5u, 6u}) {
    CAPTURE(seed);
    std::mt19937 rng(seed);
    const std::size_t granularity = seed % 3 == 0 ? 256 : 512;
    const PoolOptions options{.granularity = granularity,
                              .segment_size = (seed % 3 == 1 ? 128 : 256) * KiB,
                              .idle_threshold = seed % 2 == 0 ? 1 * MiB : SIZE_MAX,
                              .shared_segment_size = seed <= 3 ? 1 * MiB : 0, // shared by [segment, 512 KiB)
                              .near_full_permille = 1000}; // the model has no near-full rule: tested on its own
    CachingPool pool(SimulatedCard(capacity), options);
    PoolModel model(capacity, options);
    struct Live {
      std::size_t bytes;
      unsigned char pattern;
    };
    std::map<std::uintptr_t, Live> live;
    int hits = 0;
    int fresh = 0;
    int refused = 0;
    int trims = 0;
    for (int step = 0; step < 4000; ++step) {
      const int op = static_cast<int>(rng() % 100);
      if (op < 55) {
        const std::size_t bytes =
            rng() % 4 == 0 ? 1 + rng() % (600 * KiB) : 1 + rng() % (8 * KiB); // mostly small, some large
        const bool from_cache = model.fits_somewhere(bytes);
        const auto r = pool.try_allocate(bytes, 256);
        model.allocate(bytes, r);
        if (!r) {
          ++refused;
          continue;
        }
        (from_cache ? hits : fresh) += 1;
        const auto addr = reinterpret_cast<std::uintptr_t>(*r);
        // No overlap with any live block (the model checks the address; this checks the bytes).
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
      } else if (op < 95 && !live.empty()) {
        auto it = live.begin();
        std::advance(it, static_cast<long>(rng() % live.size()));
        const auto* bytes = reinterpret_cast<const unsigned char*>(it->first);
        CHECK(bytes[0] == it->second.pattern); // nobody else wrote here
        CHECK(bytes[it->second.bytes / 2] == it->second.pattern);
        CHECK(bytes[it->second.bytes - 1] == it->second.pattern);
        REQUIRE(pool.try_deallocate(reinterpret_cast<void*>(it->first), it->second.bytes, 256));
        model.deallocate(reinterpret_cast<void*>(it->first));
        live.erase(it);
      } else {
        const std::size_t keep = rng() % (2 * MiB);
        const std::size_t expected = model.release(keep);
        CHECK(pool.trim(keep) == expected);
        trims += expected != 0 ? 1 : 0;
      }
      model.check(pool);
      if (step % 50 == 0) {
        REQUIRE(pool.consistent());
      }
    }
    // Every path was taken: cache hits, new segments, refusals, trims that released something.
    CHECK(hits > 100);
    CHECK(fresh > 5); // fewer where mid-size requests share segments (seeds 1 to 3)
    CHECK(refused > 0);
    trims_in_all += trims;
    for (const auto& [addr, l] : live) {
      REQUIRE(pool.try_deallocate(reinterpret_cast<void*>(addr), l.bytes, 256));
      model.deallocate(reinterpret_cast<void*>(addr));
    }
    model.check(pool);
    CHECK(pool.consistent());
    CHECK(pool.trim() == model.release(0));
    model.check(pool);
    CHECK(pool.upstream().used_bytes() == 0);
  }
  CHECK(trims_in_all > 0);
}

TEST_CASE("threads allocate, write, check, free and trim one pool; the figures balance") {
  constexpr int threads = 4;
  constexpr int steps = 3000;
  CachingPool pool(SimulatedCard(16 * MiB),
                   PoolOptions{.granularity = 512, .segment_size = 256 * KiB, .idle_threshold = 2 * MiB});
  std::atomic<std::uint64_t> allocated{0};
  std::atomic<std::uint64_t> freed{0};
  std::atomic<int> corrupted{0};
  std::atomic<int> errors{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      std::mt19937 rng(static_cast<std::uint32_t>(100 + t));
      struct Mine {
        unsigned char* p;
        std::size_t bytes;
        unsigned char pattern;
      };
      std::vector<Mine> mine;
      // Every byte of a block holds its owner's pattern until the owner frees it.
      const auto intact = [](const Mine& m) {
        return std::all_of(m.p, m.p + m.bytes, [&](unsigned char c) { return c == m.pattern; });
      };
      for (int step = 0; step < steps; ++step) {
        const int op = static_cast<int>(rng() % 100);
        if (op < 50 || mine.empty()) {
          const std::size_t bytes = rng() % 8 == 0 ? 1 + rng() % (300 * KiB) : 1 + rng() % (4 * KiB);
          const auto r = pool.try_allocate(bytes, 256);
          if (!r) {
            errors += r.error() == Errc::no_space ? 0 : 1;
            continue;
          }
          // Patterns differ between threads (t in the high bits), so a block handed to two
          // threads at once shows up as the other thread's bytes.
          const auto pattern = static_cast<unsigned char>((t << 6) | (step & 0x3f));
          std::memset(*r, pattern, bytes);
          mine.push_back({static_cast<unsigned char*>(*r), bytes, pattern});
          ++allocated;
        } else if (op < 95) {
          const std::size_t i = rng() % mine.size();
          corrupted += intact(mine[i]) ? 0 : 1;
          errors += pool.try_deallocate(mine[i].p, mine[i].bytes, 256) ? 0 : 1;
          mine[i] = mine.back();
          mine.pop_back();
          ++freed;
        } else {
          (void)pool.trim(rng() % (1 * MiB));
          (void)pool.stats();
          (void)pool.largest_allocation();
        }
      }
      for (const Mine& m : mine) {
        corrupted += intact(m) ? 0 : 1;
        errors += pool.try_deallocate(m.p, m.bytes, 256) ? 0 : 1;
        ++freed;
      }
    });
  }
  for (std::thread& w : workers) {
    w.join();
  }
  CHECK(corrupted == 0);
  CHECK(errors == 0);
  CHECK(allocated == freed);
  CHECK(allocated > threads * steps / 4);
  const auto s = pool.stats();
  CHECK(s.allocations == allocated);
  CHECK(s.deallocations == freed);
  CHECK(s.bytes_in_use == 0);
  CHECK(s.live_blocks == 0);
  CHECK(s.bytes_reserved == s.bytes_cached);
  CHECK(s.bytes_cached <= 2 * MiB); // the idle threshold held once every block was back
  CHECK(s.upstream_allocations - s.upstream_frees == s.segments);
  CHECK(s.cache_hits + s.upstream_allocations == s.allocations);
  CHECK(s.bytes_reserved == pool.upstream().used_bytes());
  CHECK(pool.consistent());
  CHECK(pool.trim() == s.bytes_reserved);
  CHECK(pool.upstream().used_bytes() == 0);
  CHECK(pool.upstream().allocation_count() == 0);
}

} // namespace test_caching_pool
