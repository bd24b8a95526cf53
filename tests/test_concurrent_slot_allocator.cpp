// ConcurrentSlotAllocator: the same answers as SlotAllocator when used by one thread, the same
// errors, and under real threads no slot owned twice, no free lost, and a final state equal to
// what the surviving allocations say.
#include "reference.hpp"

#include <carve/carve.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <barrier>
#include <random>
#include <thread>
#include <vector>

using carve::ConcurrentSlotAllocator;
using carve::Errc;
using carve::SlotAllocator;
using carve::SlotBitmap;
using carve::SlotRange;

namespace {

template <std::uint32_t N, class Fit = carve::BoundaryNearestFit>
using HostConcurrent = ConcurrentSlotAllocator<N, Fit, cuda::thread_scope_system>;

// Constant initialisation: usable as a __device__ or static global without a constructor run.
constinit HostConcurrent<200> global_slots;

// A user policy with only find(SlotBitmap): the allocator shows it a full snapshot.
struct SnapshotOnlyFirstFit {
  template <std::uint32_t N>
  constexpr cuda::std::optional<std::uint32_t> find(const SlotBitmap<N>& b, std::uint32_t m) const noexcept {
    return b.lowest_run_start(m);
  }
};
static_assert(carve::FitPolicy<SnapshotOnlyFirstFit> && !carve::WordSearchingFitPolicy<SnapshotOnlyFirstFit>);

struct AlwaysZero {
  template <std::uint32_t N>
  constexpr cuda::std::optional<std::uint32_t> find(const SlotBitmap<N>&, std::uint32_t) const noexcept {
    return 0;
  }
};

// One thread: every step must match SlotAllocator exactly.
template <std::uint32_t N, class Fit>
void same_as_sequential(std::uint64_t seed, std::uint32_t max_m, int steps) {
  CAPTURE(N);
  CAPTURE(carve::policy_name<Fit>());
  std::mt19937_64 rng(seed);
  HostConcurrent<N, Fit> concurrent;
  SlotAllocator<N, Fit> sequential;
  std::vector<SlotRange> live;
  for (int step = 0; step < steps; ++step) {
    if (!live.empty() && rng() % 100 < 45) {
      const std::size_t k = rng() % live.size();
      REQUIRE(concurrent.deallocate(live[k]));
      REQUIRE(sequential.deallocate(live[k]));
      live[k] = live.back();
      live.pop_back();
    } else {
      const auto m = static_cast<std::uint32_t>(1 + rng() % max_m);
      const auto got = concurrent.allocate(m);
      const auto want = sequential.allocate(m);
      REQUIRE(got.has_value() == want.has_value());
      if (want) {
        REQUIRE(*got == *want);
        live.push_back(*got);
      } else {
        REQUIRE(got.error() == want.error());
      }
    }
    REQUIRE(concurrent.snapshot() == sequential.bitmap());
  }
}

} // namespace

TEST_CASE("one thread gets exactly SlotAllocator's answers") {
  for (std::uint64_t seed = 1; seed <= 2; ++seed) {
    same_as_sequential<128, carve::BoundaryNearestFit>(seed, 16, 2000);
    same_as_sequential<128, carve::FirstFit>(seed, 16, 2000);
    same_as_sequential<130, carve::LastFit>(seed, 70, 1000);
    same_as_sequential<300, carve::BestFit>(seed, 40, 1000);
    same_as_sequential<1000, carve::BoundaryNearestFit>(seed, 200, 600);
    same_as_sequential<1000, SnapshotOnlyFirstFit>(seed, 200, 600);
    // Over 64 words: the snapshot's cache evicts, and searches from both ends collide in it.
    same_as_sequential<8192, carve::BoundaryNearestFit>(seed, 700, 300);
    same_as_sequential<8192, carve::BestFit>(seed, 300, 200);
  }
}

TEST_CASE("bad input returns the pinned error and changes nothing") {
  HostConcurrent<130> slots;
  REQUIRE(slots.allocate(10));
  REQUIRE(slots.allocate(70));
  const auto before = slots.snapshot();
  CHECK(slots.allocate(0).error() == Errc::invalid_size);
  CHECK(slots.allocate(131).error() == Errc::invalid_size);
  CHECK(slots.allocate(51).error() == Errc::no_space);
  CHECK(slots.deallocate({0, 0}).error() == Errc::invalid_size);
  CHECK(slots.deallocate({130, 1}).error() == Errc::out_of_range);
  CHECK(slots.deallocate({0xffff'fff0, 0x20}).error() == Errc::out_of_range);
  CHECK(slots.deallocate({30, 5}).error() == Errc::not_allocated);
  CHECK(slots.deallocate({5, 10}).error() == Errc::not_allocated); // half taken, half free
  CHECK(slots.snapshot() == before);

  ConcurrentSlotAllocator<32, AlwaysZero, cuda::thread_scope_system> broken;
  REQUIRE(broken.allocate(4));
  CHECK(broken.allocate(4).error() == Errc::invalid_placement);
  CHECK(broken.free_count() == 28);
}

TEST_CASE("a global allocator starts all free") {
  CHECK(global_slots.free_count() == 200);
  const auto r = global_slots.allocate(7);
  REQUIRE(r);
  CHECK(global_slots.deallocate(*r));
}

TEST_CASE("an allocator over borrowed words") {
  alignas(8) std::uint64_t words[3] = {0, 0, 0}; // garbage until reset
  carve::ConcurrentSlotAllocatorRef<150, carve::FirstFit, cuda::thread_scope_system> slots{
      carve::BorrowedSlotWords<150>{words}};
  CHECK(slots.allocate(1).error() == Errc::no_space);
  slots.reset();
  CHECK(words[2] == (1ull << 22) - 1);
  CHECK(*slots.allocate(100) == SlotRange{0, 100});
  // A second handle on the same words sees the same state.
  auto other = slots;
  CHECK(*other.allocate(50) == SlotRange{100, 50});
  CHECK(slots.allocate(1).error() == Errc::no_space);
  CHECK(slots.deallocate({0, 100}));
  CHECK(other.free_count() == 100);
}

namespace {

// `threads` workers allocate and free at random, stamping each slot they hold with their id
// (plain, non-atomic writes: the allocator's acquire/release must order them, and TSan checks
// it), while a noise thread keeps taking and returning single slots. Each worker ends holding
// some allocations; the final bitmap must be exactly those taken.
template <std::uint32_t N, class Fit>
void storm(int threads, int steps, std::uint32_t max_m) {
  CAPTURE(N);
  CAPTURE(carve::policy_name<Fit>());
  HostConcurrent<N, Fit> slots;
  std::vector<int> owner(N, 0);
  std::atomic<int> violations{0};
  std::atomic<bool> done{false};
  std::vector<std::vector<SlotRange>> kept(static_cast<std::size_t>(threads));

  const auto take = [&](SlotRange r, int id) {
    for (std::uint32_t s = r.first; s < r.end(); ++s) {
      if (owner[s] != 0) {
        violations.fetch_add(1);
      }
      owner[s] = id;
    }
  };
  const auto give = [&](SlotRange r, int id) {
    for (std::uint32_t s = r.first; s < r.end(); ++s) {
      if (owner[s] != id) {
        violations.fetch_add(1);
      }
      owner[s] = 0;
    }
    if (!slots.deallocate(r)) {
      violations.fetch_add(1);
    }
  };

  std::barrier start(threads + 1);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      const int id = t + 1;
      std::mt19937_64 rng(static_cast<std::uint64_t>(id) * 7919);
      std::vector<SlotRange> mine;
      start.arrive_and_wait();
      for (int step = 0; step < steps; ++step) {
        if (!mine.empty() && rng() % 2 == 0) {
          const std::size_t k = rng() % mine.size();
          give(mine[k], id);
          mine[k] = mine.back();
          mine.pop_back();
        } else if (const auto r = slots.allocate(static_cast<std::uint32_t>(1 + rng() % max_m))) {
          take(*r, id);
          mine.push_back(*r);
        }
      }
      kept[static_cast<std::size_t>(t)] = mine;
    });
  }
  std::thread noise([&] {
    const int id = threads + 1;
    start.arrive_and_wait();
    while (!done.load()) {
      if (const auto r = slots.allocate(1)) {
        take(*r, id);
        give(*r, id);
      }
    }
  });
  for (auto& th : pool) {
    th.join();
  }
  done.store(true);
  noise.join();

  CHECK(violations.load() == 0);
  SlotBitmap<N> expected;
  for (const auto& mine : kept) {
    for (const SlotRange r : mine) {
      expected.occupy(r);
    }
  }
  CHECK(slots.snapshot() == expected);
}

} // namespace

TEST_CASE("threads allocating and freeing never share a slot and lose nothing") {
  storm<128, carve::BoundaryNearestFit>(4, 20000, 8);
  storm<128, carve::FirstFit>(4, 20000, 8);
  storm<256, carve::LastFit>(3, 10000, 100); // runs across words: claims roll back partially
  storm<512, carve::BestFit>(3, 1500, 40);
  storm<64, carve::FirstFit>(4, 20000, 3);              // one word: the hottest contention
  storm<8192, carve::BoundaryNearestFit>(3, 1500, 200); // more words than the snapshot keeps
}

TEST_CASE("two threads freeing the same range at once: one succeeds, one is told") {
  HostConcurrent<256> slots;
  for (int round = 0; round < 300; ++round) {
    const auto r = slots.allocate(70);
    REQUIRE(r);
    std::atomic<int> ok{0};
    std::atomic<int> refused{0};
    std::barrier both(2);
    const auto free_it = [&] {
      both.arrive_and_wait();
      const auto result = slots.deallocate(*r);
      (result ? ok : refused).fetch_add(1);
      if (!result) {
        CHECK(result.error() == Errc::not_allocated);
      }
    };
    std::thread a(free_it);
    std::thread b(free_it);
    a.join();
    b.join();
    REQUIRE(ok.load() == 1);
    REQUIRE(refused.load() == 1);
    REQUIRE(slots.free_count() == 256);
  }
}

TEST_CASE("a sharded allocator serves the home shard first and falls back in order") {
  using Sharded = carve::ShardedSlotAllocator<64, 4, carve::FirstFit, cuda::thread_scope_system>;
  static_assert(Sharded::size() == 256 && Sharded::word_count == 4);
  std::vector<std::uint64_t> words(Sharded::word_count, 0);
  const Sharded slots(words.data());
  CHECK(slots.allocate(1, 0).error() == Errc::no_space); // not reset yet: all taken
  slots.reset();
  CHECK(*slots.allocate(10, 2) == SlotRange{128, 10});        // shard 2 starts at slot 128
  CHECK(*slots.allocate(60, 2) == SlotRange{192, 60});        // shard 2 has 54 left: shard 3
  CHECK(*slots.allocate(54, 6) == SlotRange{138, 54});        // home 6 % 4 = 2
  CHECK(*slots.allocate(64, 3) == SlotRange{0, 64});          // 3 has 4 left, then wrap to shard 0
  CHECK(slots.allocate(65, 0).error() == Errc::invalid_size); // larger than a shard
  CHECK(slots.allocate(0, 0).error() == Errc::invalid_size);
  CHECK(slots.free_count() == 256 - 188);
  CHECK(slots.deallocate({60, 10}).error() == Errc::not_allocated); // spans shards 0 and 1
  CHECK(slots.deallocate({250, 10}).error() == Errc::out_of_range);
  CHECK(slots.deallocate({64, 1}).error() == Errc::not_allocated); // free
  CHECK(slots.deallocate({128, 10}));
  CHECK(slots.deallocate({138, 54}));
  CHECK(slots.shard(2).free_count() == 64);
  CHECK(slots.allocate(65, 0).error() == Errc::invalid_size);
}

TEST_CASE("threads with their own home shards never share a slot") {
  constexpr int threads = 4;
  using Sharded = carve::ShardedSlotAllocator<130, threads, carve::BoundaryNearestFit, cuda::thread_scope_system>;
  std::vector<std::uint64_t> words(Sharded::word_count);
  const Sharded slots(words.data());
  slots.reset();
  std::vector<int> owner(Sharded::size(), 0);
  std::atomic<int> violations{0};
  std::vector<std::thread> pool;
  std::barrier start(threads);
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      std::mt19937_64 rng(static_cast<std::uint64_t>(t) + 11);
      std::vector<SlotRange> mine;
      start.arrive_and_wait();
      for (int step = 0; step < 20000; ++step) {
        if (!mine.empty() && rng() % 2 == 0) {
          const SlotRange r = mine.back();
          mine.pop_back();
          for (std::uint32_t s = r.first; s < r.end(); ++s) {
            violations += owner[s] != t + 1 ? 1 : 0;
            owner[s] = 0;
          }
          violations += slots.deallocate(r) ? 0 : 1;
        } else if (const auto r =
                       slots.allocate(static_cast<std::uint32_t>(1 + rng() % 40), static_cast<std::uint32_t>(t))) {
          for (std::uint32_t s = r->first; s < r->end(); ++s) {
            violations += owner[s] != 0 ? 1 : 0;
            owner[s] = t + 1;
          }
          mine.push_back(*r);
        }
      }
      for (const SlotRange r : mine) {
        for (std::uint32_t s = r.first; s < r.end(); ++s) {
          owner[s] = 0;
        }
        violations += slots.deallocate(r) ? 0 : 1;
      }
    });
  }
  for (auto& th : pool) {
    th.join();
  }
  CHECK(violations.load() == 0);
  CHECK(slots.free_count() == Sharded::size());
}
