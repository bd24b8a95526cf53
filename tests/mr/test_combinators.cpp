// The combinators against reference models: where each request goes, what each refusal is,
// and that every part ends empty (nothing handed out twice, nothing lost).
#include "mr/budget_resource.hpp"
#include "support/errors.hpp"

#include <carve/mr.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <cstddef>
#include <cstring>
#include <random>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

// In a namespace of its own: the area's test files compile as one translation unit.
namespace test_combinators {

using carve::Errc;
using carve::ResourceRef;
using carve::test::BudgetResource;

namespace {

using Ref = ResourceRef<BudgetResource>;

struct Block {
  void* p;
  std::size_t bytes;
  std::size_t alignment;
};

// A random request: sizes 1..max, alignments 1..256.
struct Requests {
  std::mt19937 rng;
  std::size_t max;
  std::size_t bytes() { return 1 + rng() % max; }
  std::size_t alignment() { return std::size_t{1} << (rng() % 9); }
  bool allocate_next(std::size_t live) { return live == 0 || rng() % 3 != 0; }
  std::size_t pick(std::size_t live) { return rng() % live; }
};

Block take(std::vector<Block>& live, std::size_t i) {
  const Block b = live[i];
  live[i] = live.back();
  live.pop_back();
  return b;
}

} // namespace

static_assert(carve::OwnsMemory<carve::FallbackResource<Ref, Ref>>);
static_assert(carve::UpstreamResource<carve::FallbackResource<Ref, Ref>>);
static_assert(carve::ChecksDeallocation<carve::FallbackResource<Ref, Ref>>);
static_assert(carve::OwnsMemory<carve::Segregator<64, Ref, Ref>>);
static_assert(carve::UpstreamResource<carve::StatsResource<Ref>> && carve::ReportsStats<carve::StatsResource<Ref>>);
static_assert(carve::UpstreamResource<carve::LimitResource<Ref>> && carve::OwnsMemory<carve::LimitResource<Ref>>);
static_assert(carve::Trimmable<carve::FallbackResource<carve::CachingPool<carve::SimulatedCard>, Ref>>);
static_assert(!carve::Trimmable<carve::FallbackResource<Ref, Ref>>);
static_assert(carve::SynchronousResource<carve::Segregator<64, Ref, Ref>>);

TEST_CASE("FallbackResource: the primary while it has room, then the fallback; frees go where they came from") {
  BudgetResource a(8192);
  BudgetResource b(16384);
  carve::FallbackResource<Ref, Ref> stack(carve::ref(a), carve::ref(b));
  std::size_t used_a = 0;
  std::size_t used_b = 0;
  Requests next{std::mt19937(1), 3000};
  std::vector<Block> live;
  for (int step = 0; step < 4000; ++step) {
    if (next.allocate_next(live.size())) {
      const std::size_t bytes = next.bytes();
      const std::size_t alignment = next.alignment();
      const auto p = stack.try_allocate(bytes, alignment);
      // The model: the primary if it holds the request, else the fallback, else no_space.
      if (bytes <= 8192 - used_a) {
        REQUIRE(p);
        CHECK(a.owns(*p));
        used_a += bytes;
      } else if (bytes <= 16384 - used_b) {
        REQUIRE(p);
        CHECK(b.owns(*p));
        used_b += bytes;
      } else {
        REQUIRE_FALSE(p);
        CHECK(p.error() == Errc::no_space);
        continue;
      }
      CHECK(reinterpret_cast<std::uintptr_t>(*p) % alignment == 0);
      CHECK(stack.owns(*p));
      live.push_back({*p, bytes, alignment});
    } else {
      const Block blk = take(live, next.pick(live.size()));
      (a.owns(blk.p) ? used_a : used_b) -= blk.bytes;
      stack.deallocate(blk.p, blk.bytes, blk.alignment);
    }
    REQUIRE(a.used_bytes() == used_a);
    REQUIRE(b.used_bytes() == used_b);
    REQUIRE(stack.free_bytes() == (8192 - used_a) + (16384 - used_b));
  }
  for (const Block& blk : live) {
    stack.deallocate(blk.p, blk.bytes, blk.alignment);
  }
  CHECK(a.live_blocks() == 0);
  CHECK(b.live_blocks() == 0);
  CHECK(stack.capacity() == 8192 + 16384);
}

TEST_CASE("FallbackResource: bad input gets the pinned Errc, and neither part is touched") {
  BudgetResource a(4096);
  BudgetResource b(4096);
  carve::FallbackResource<Ref, Ref> stack(carve::ref(a), carve::ref(b));
  CHECK(stack.try_allocate(0, 8).error() == Errc::invalid_size);
  CHECK(stack.try_allocate(64, 0).error() == Errc::invalid_size);
  CHECK(stack.try_allocate(64, 48).error() == Errc::invalid_size);
  CHECK(stack.try_allocate(1 << 20, 8).error() == Errc::no_space); // more than either could hold
  CHECK(a.allocations() + b.allocations() == 0);
  const auto p = stack.try_allocate(100, 8);
  REQUIRE(p);
  int elsewhere = 0;
  CHECK(stack.try_deallocate(&elsewhere, 4, 4).error() == Errc::not_allocated);
  CHECK(stack.try_deallocate(*p, 99, 8).error() == Errc::invalid_size);
  CHECK(a.live_blocks() == 1);
  CHECK(stack.try_deallocate(*p, 100, 8));
  CHECK(stack.try_deallocate(*p, 100, 8).error() == Errc::not_allocated); // a double free
  CHECK(a.live_blocks() + b.live_blocks() == 0);
}

TEST_CASE("Segregator: small to one part, large to the other, and a full part does not spill") {
  BudgetResource small(2048);
  BudgetResource large(1 << 16);
  carve::Segregator<256, Ref, Ref> stack(carve::ref(small), carve::ref(large));
  std::size_t used_small = 0;
  std::size_t used_large = 0;
  Requests next{std::mt19937(2), 1024};
  std::vector<Block> live;
  for (int step = 0; step < 4000; ++step) {
    if (next.allocate_next(live.size())) {
      const std::size_t bytes = next.bytes();
      const std::size_t alignment = next.alignment();
      const auto p = stack.try_allocate(bytes, alignment);
      std::size_t& used = bytes <= 256 ? used_small : used_large;
      const std::size_t budget = bytes <= 256 ? 2048 : (1 << 16);
      if (bytes > budget - used) {
        REQUIRE_FALSE(p);
        CHECK(p.error() == Errc::no_space); // the other part is not asked
        continue;
      }
      REQUIRE(p);
      CHECK((bytes <= 256 ? small : large).owns(*p));
      used += bytes;
      live.push_back({*p, bytes, alignment});
    } else {
      const Block blk = take(live, next.pick(live.size()));
      (blk.bytes <= 256 ? used_small : used_large) -= blk.bytes;
      CHECK(stack.try_deallocate(blk.p, blk.bytes, blk.alignment));
    }
    REQUIRE(small.used_bytes() == used_small);
    REQUIRE(large.used_bytes() == used_large);
  }
  for (const Block& blk : live) {
    stack.deallocate(blk.p, blk.bytes, blk.alignment);
  }
  CHECK(small.live_blocks() + large.live_blocks() == 0);
  CHECK(stack.try_allocate(0, 1).error() == Errc::invalid_size);
  CHECK(stack.try_allocate(300, 3).error() == Errc::invalid_size);
  CHECK(small.live_blocks() + large.live_blocks() == 0);
}

TEST_CASE("StatsResource counts every call, refused ones too") {
  BudgetResource a(10000);
  carve::StatsResource<Ref> stack(carve::ref(a));
  carve::ResourceStats model;
  Requests next{std::mt19937(3), 2500};
  std::vector<Block> live;
  for (int step = 0; step < 3000; ++step) {
    if (next.allocate_next(live.size())) {
      const std::size_t bytes = next.bytes();
      const std::size_t alignment = step % 97 == 0 ? 3 : next.alignment(); // now and then a bad one
      if (const auto p = stack.try_allocate(bytes, alignment)) {
        ++model.allocations;
        model.bytes_in_use += bytes;
        model.peak_bytes = std::max(model.peak_bytes, model.bytes_in_use);
        live.push_back({*p, bytes, alignment});
      } else {
        ++model.failed;
      }
    } else {
      const Block blk = take(live, next.pick(live.size()));
      if (step % 5 == 0) {
        CHECK(stack.try_deallocate(blk.p, blk.bytes + 1, blk.alignment).error() == Errc::invalid_size);
        ++model.failed;
      }
      stack.deallocate(blk.p, blk.bytes, blk.alignment);
      ++model.deallocations;
      model.bytes_in_use -= blk.bytes;
    }
    const carve::ResourceStats s = stack.stats();
    REQUIRE(s.allocations == model.allocations);
    REQUIRE(s.deallocations == model.deallocations);
    REQUIRE(s.bytes_in_use == model.bytes_in_use);
    REQUIRE(s.peak_bytes == model.peak_bytes);
    REQUIRE(s.failed == model.failed);
  }
  for (const Block& blk : live) {
    stack.deallocate(blk.p, blk.bytes, blk.alignment);
  }
  CHECK(stack.stats().bytes_in_use == 0);
  CHECK(model.failed > 0);
  CHECK(a.live_blocks() == 0);
}

TEST_CASE("LimitResource: no_space past the budget, and the resource never sees the refusal") {
  BudgetResource a(1 << 20);
  carve::LimitResource<Ref> stack(carve::ref(a), 5000);
  CHECK(stack.capacity() == 5000);
  std::size_t used = 0;
  Requests next{std::mt19937(4), 1500};
  std::vector<Block> live;
  for (int step = 0; step < 3000; ++step) {
    if (next.allocate_next(live.size())) {
      const std::size_t bytes = next.bytes();
      const std::size_t before = a.allocations();
      const auto p = stack.try_allocate(bytes, 8);
      const std::size_t footprint = (bytes + 7) / 8 * 8; // what the budget counts: aligned
      if (footprint > 5000 - used) {
        REQUIRE_FALSE(p);
        CHECK(p.error() == Errc::no_space);
        CHECK(a.allocations() == before); // refused before the resource was asked
        continue;
      }
      REQUIRE(p);
      used += footprint;
      live.push_back({*p, bytes, 8});
    } else {
      const Block blk = take(live, next.pick(live.size()));
      stack.deallocate(blk.p, blk.bytes, blk.alignment);
      used -= (blk.bytes + 7) / 8 * 8;
    }
    REQUIRE(stack.used_bytes() == used);
    REQUIRE(stack.free_bytes() == 5000 - used);
  }
  for (const Block& blk : live) {
    stack.deallocate(blk.p, blk.bytes, blk.alignment);
  }
  CHECK(stack.used_bytes() == 0);
  CHECK(stack.try_allocate(0, 8).error() == Errc::invalid_size);
  CHECK(stack.try_allocate(8, 6).error() == Errc::invalid_size);
  const auto p = stack.try_allocate(64, 8);
  REQUIRE(p);
  CHECK(stack.try_deallocate(*p, 65, 8).error() == Errc::invalid_size);
  CHECK(stack.used_bytes() == 64); // a refused free changes nothing
  CHECK(stack.try_deallocate(*p, 64, 8));
  CHECK(stack.used_bytes() == 0);
  CHECK(a.live_blocks() == 0);
  // A resource smaller than the budget bounds it instead.
  BudgetResource tiny(100);
  carve::LimitResource<Ref> loose(carve::ref(tiny), 5000);
  CHECK(loose.capacity() == 100);
  CHECK(loose.free_bytes() == 100);
}

TEST_CASE("budgets and counts are each their own: equal only to themselves, a bad free counted nowhere") {
  BudgetResource a(1 << 20);
  carve::LimitResource<Ref> tenant(carve::ref(a), 4096);
  carve::LimitResource<Ref> other(carve::ref(a), 4096);
  CHECK(tenant == tenant);
  CHECK_FALSE(tenant == other); // a block counted in one must not go back through the other
  const carve::LimitResource<Ref> copy = tenant;
  CHECK_FALSE(copy == tenant);
  carve::StatsResource<Ref> counted(carve::ref(a));
  CHECK_FALSE(counted == carve::StatsResource<Ref>(carve::ref(a)));
  // Over a pool that checks a free before it is made, a refused one never touches the count (it
  // took bytes it never held, and an allocation meanwhile kept the wrapped count as its peak).
  carve::StatsResource<carve::CachingPool<carve::SimulatedCard>> pool(carve::SimulatedCard(8 << 20));
  void* p = pool.allocate(1000, 256);
  int local = 0;
  CHECK(pool.try_deallocate(&local, 1000, 256).error() == Errc::not_allocated);
  CHECK(pool.stats().bytes_in_use == 1000);
  CHECK(pool.stats().failed == 1);
  CHECK(pool.try_deallocate(p, 1000, 256));
  CHECK(pool.stats().bytes_in_use == 0);
  CHECK(pool.stats().peak_bytes == 1000);
}

TEST_CASE("one pool under several stacks through carve::ref") {
  carve::CachingPool pool(carve::SimulatedCard(4 << 20), {.granularity = 256, .segment_size = 64 << 10});
  using PoolRef = ResourceRef<decltype(pool)>;
  carve::StatsResource<PoolRef> counted(carve::ref(pool));
  carve::LimitResource<PoolRef> capped(carve::ref(pool), 8192);
  const auto x = counted.try_allocate(10000, 256);
  const auto y = capped.try_allocate(4096, 256);
  REQUIRE(x);
  REQUIRE(y);
  CHECK(capped.try_allocate(8192, 256).error() == Errc::no_space);
  CHECK(pool.stats().live_blocks == 2);
  CHECK(counted.owns(*y)); // both stacks see the same pool
  CHECK(carve::ref(pool) == carve::ref(pool));
  counted.deallocate(*x, 10000, 256);
  capped.deallocate(*y, 4096, 256);
  CHECK(pool.stats().bytes_in_use == 0);
  CHECK(pool.trim() == 64u << 10);
}

TEST_CASE("parts that cannot move are built in place, one argument or piecewise") {
  using Pool = carve::CachingPool<carve::SimulatedCard>;
  carve::FallbackResource<Pool, carve::StatsResource<Pool>> heap(carve::SimulatedCard(1 << 20),
                                                                 carve::SimulatedCard(4 << 20));
  carve::FallbackResource<Pool, Pool> piecewise(
      std::piecewise_construct,
      std::forward_as_tuple(carve::SimulatedCard(1 << 20), carve::PoolOptions{.granularity = 256}),
      std::forward_as_tuple(carve::SimulatedCard(1 << 20)));
  CHECK(piecewise.primary().options().granularity == 256);
  const auto big = heap.try_allocate(2 << 20, 256); // more than the primary's card
  REQUIRE(big);
  CHECK(heap.fallback().stats().allocations == 1);
  CHECK(heap.fallback().owns(*big));
  heap.deallocate(*big, 2 << 20, 256);
  CHECK(heap.trim() == 2u << 20);
  CHECK(heap.fallback().upstream().stats().segments == 0);
}

TEST_CASE("as_pmr: standard pmr containers allocate from any carve resource") {
  carve::CachingPool pool(carve::SimulatedCard(8 << 20), {.granularity = 256, .segment_size = 256 << 10});
  auto pmr = carve::as_pmr(pool);
  {
    std::pmr::vector<int> v(&pmr);
    for (int i = 0; i < 100000; ++i) {
      v.push_back(i);
    }
    CHECK(v[99999] == 99999);
    CHECK(pool.stats().bytes_in_use >= 100000 * sizeof(int));
    std::pmr::vector<std::pmr::string> words(&pmr);
    words.emplace_back("a string long enough to need its own storage, from the same pool");
    CHECK(words.front().get_allocator().resource() == &pmr);
  }
  CHECK(pool.stats().bytes_in_use == 0);
  CHECK(&pmr.resource() == &pool);
  auto again = carve::as_pmr(pool);
  CHECK(pmr.is_equal(again)); // same resource
  carve::CachingPool other(carve::SimulatedCard(1 << 20));
  auto elsewhere = carve::as_pmr(other);
  CHECK_FALSE(pmr.is_equal(elsewhere));
  std::pmr::memory_resource& base = pmr;
  CHECK_THROWS_ERRC(carve::Errc::no_space, (void)base.allocate(64 << 20, 256)); // no space
  std::size_t odd_alignment = 3; // not a constant: compilers refuse a constant that is no power of two
  CHECK_THROWS_ERRC(Errc::invalid_size, base.allocate(64, odd_alignment)); // an alignment no resource serves
  void* zero = base.allocate(0, 8);                                        // pmr allows 0 bytes
  base.deallocate(zero, 0, 8);
  CHECK(pool.stats().bytes_in_use == 0);
}

TEST_CASE("threads sharing StatsResource and LimitResource: exact counts, the budget never exceeded") {
  BudgetResource a(1 << 20);
  carve::StatsResource<carve::LimitResource<Ref>> stack(std::piecewise_construct,
                                                        std::forward_as_tuple(carve::ref(a), std::size_t{64} << 10));
  constexpr int threads = 4;
  std::atomic<std::uint64_t> failed{0};
  std::atomic<bool> over{false};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      Requests next{std::mt19937(static_cast<std::uint32_t>(t) + 10), 8192};
      std::vector<Block> live;
      for (int step = 0; step < 4000; ++step) {
        if (next.allocate_next(live.size())) {
          const std::size_t bytes = next.bytes();
          if (const auto p = stack.try_allocate(bytes, 16)) {
            std::memset(*p, t, bytes);
            live.push_back({*p, bytes, 16});
          } else {
            ++failed;
          }
        } else {
          const Block blk = take(live, next.pick(live.size()));
          if (static_cast<unsigned char*>(blk.p)[blk.bytes - 1] != t) {
            over = true; // handed out twice
          }
          stack.deallocate(blk.p, blk.bytes, blk.alignment);
        }
        if (a.used_bytes() > (std::size_t{64} << 10)) {
          over = true;
        }
      }
      for (const Block& blk : live) {
        stack.deallocate(blk.p, blk.bytes, blk.alignment);
      }
    });
  }
  for (auto& th : pool) {
    th.join();
  }
  const carve::ResourceStats s = stack.stats();
  CHECK_FALSE(over);
  CHECK(s.allocations == s.deallocations);
  CHECK(s.bytes_in_use == 0);
  CHECK(s.failed == failed);
  CHECK(s.peak_bytes <= (std::size_t{64} << 10));
  CHECK(stack.upstream().used_bytes() == 0);
  CHECK(a.live_blocks() == 0);
}

TEST_CASE("a LimitResource over a CachingPool with its own PoolOptions, built in one expression") {
  using Pool = carve::CachingPool<carve::SimulatedCard>; // cannot move: built in place
  carve::LimitResource<Pool> limited(
      std::piecewise_construct,
      std::forward_as_tuple(carve::SimulatedCard(1 << 20),
                            carve::PoolOptions{.granularity = 4096, .segment_size = 64 << 10}),
      std::size_t{32} << 10);
  CHECK(limited.upstream().options().granularity == 4096);
  CHECK(limited.upstream().options().segment_size == 64 << 10);
  void* p = *limited.try_allocate(16 << 10, 4096);
  CHECK(limited.try_allocate(20 << 10, 256).error() == Errc::no_space); // past the budget, not the pool
  limited.deallocate(p, 16 << 10, 4096);
  CHECK(limited.used_bytes() == 0);
  // The same forms build the other adaptors' parts in place.
  carve::StatsResource<Pool> counted(
      std::piecewise_construct,
      std::forward_as_tuple(carve::SimulatedCard(1 << 20), carve::PoolOptions{.granularity = 1024}));
  CHECK(counted.upstream().options().granularity == 1024);
}

TEST_CASE("LimitResource counts each allocation's aligned footprint, not the bytes asked for") {
  BudgetResource a(1 << 20);
  carve::LimitResource<Ref> limited(carve::ref(a), 1024);
  void* x = *limited.try_allocate(1, 512); // needs 512 bytes of the resource's memory at the least
  void* y = *limited.try_allocate(1, 512);
  CHECK(limited.used_bytes() == 1024);
  CHECK(limited.try_allocate(1, 512).error() == Errc::no_space);            // counted as asked, 3 bytes would pass
  CHECK(limited.try_allocate(SIZE_MAX, 512).error() == Errc::invalid_size); // overflows when rounded
  limited.deallocate(x, 1, 512);
  CHECK(limited.used_bytes() == 512);
  limited.deallocate(y, 1, 512);
  CHECK(limited.used_bytes() == 0);
}

} // namespace test_combinators
