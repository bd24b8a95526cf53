// ConcurrentSlotAllocator: the same answers as SlotAllocator when used by one thread, the same
// errors, and under real threads no slot owned twice, no free lost, and a final state equal to
// what the surviving allocations say.
#include "reference.hpp"
#include "support/errors.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <concepts>
#include <cstddef>
#include <functional>
#include <memory>
#include <random>
#include <thread>
#include <type_traits>
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
    // Over 16 words: the snapshot's cache evicts, and searches from both ends collide in it.
    same_as_sequential<8192, carve::BoundaryNearestFit>(seed, 700, 300);
    same_as_sequential<8192, carve::BestFit>(seed, 300, 200);
    same_as_sequential<10000, carve::FirstFit>(seed, 900, 300);
    same_as_sequential<10000, carve::LastFit>(seed, 900, 300);
    same_as_sequential<10000, SnapshotOnlyFirstFit>(seed, 900, 200);
  }
}

TEST_CASE("bad input returns the pinned error and changes nothing") {
  HostConcurrent<130> slots;
  REQUIRE(slots.allocate(10));
  REQUIRE(slots.allocate(70));
  const auto before = slots.snapshot();
  CHECK(slots.allocate(0).error() == Errc::invalid_size);
  CHECK(slots.allocate(131).error() == Errc::no_space); // more than it could ever hold
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

TEST_CASE("borrowed words are checked: bad ones throw on the host; none are reported, not dereferenced") {
  using Ref = carve::ConcurrentSlotAllocatorRef<150, carve::FirstFit, cuda::thread_scope_system>;
  CHECK_THROWS_ERRC(Errc::invalid_argument, carve::BorrowedSlotWords<150>(nullptr));
  alignas(8) std::byte raw[40]{};
  CHECK_THROWS_ERRC(Errc::invalid_argument,
                    carve::BorrowedSlotWords<150>(reinterpret_cast<carve::bits::word*>(raw + 4)));
  // Before, an allocator over no words (what a __shared__ declaration starts as) dereferenced a
  // null pointer on its first call; now it says so and refuses every call.
  Ref none{carve::BorrowedSlotWords<150>{}};
  CHECK(none.status().error() == Errc::invalid_argument);
  none.reset(); // does nothing
  CHECK(none.allocate(1).error() == Errc::invalid_argument);
  CHECK(none.deallocate({0, 1}).error() == Errc::invalid_argument);
  CHECK(none.free_count() == 0);
  CHECK(none.snapshot() == SlotBitmap<150>::all_taken());
  CHECK(HostConcurrent<150>().status()); // owned words: always there
  alignas(8) std::uint64_t words[3] = {};
  CHECK(Ref{carve::BorrowedSlotWords<150>{words}}.status());
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
        } else if (r.error() != Errc::no_space) { // a race must never read as anything else
          violations.fetch_add(1);
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
      } else if (r.error() != Errc::no_space) {
        violations.fetch_add(1);
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
  // Many small runs on 64 words: boundary-nearest's two scans often see a word change between them.
  storm<4096, carve::BoundaryNearestFit>(6, 20000, 16);
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
  CHECK(slots.allocate_near(1, 0).error() == Errc::no_space); // not reset yet: all taken
  slots.reset();
  CHECK(*slots.allocate_near(10, 2) == SlotRange{128, 10});    // shard 2 starts at slot 128
  CHECK(*slots.allocate_near(60, 2) == SlotRange{192, 60});    // shard 2 has 54 left: shard 3
  CHECK(*slots.allocate_near(54, 6) == SlotRange{138, 54});    // home 6 % 4 = 2
  CHECK(*slots.allocate_near(64, 3) == SlotRange{0, 64});      // 3 has 4 left, then wrap to shard 0
  CHECK(slots.allocate_near(65, 0).error() == Errc::no_space); // larger than a shard: a fallback's
  CHECK(slots.allocate_near(0, 0).error() == Errc::invalid_size);
  CHECK(slots.free_count() == 256 - 188);
  CHECK(slots.deallocate({60, 10}).error() == Errc::not_allocated); // spans shards 0 and 1
  CHECK(slots.deallocate({250, 10}).error() == Errc::out_of_range);
  CHECK(slots.deallocate({64, 1}).error() == Errc::not_allocated); // free
  CHECK(slots.deallocate({128, 10}));
  CHECK(slots.deallocate({138, 54}));
  CHECK(slots.shard(2).free_count() == 64);
  CHECK(slots.allocate_near(65, 0).error() == Errc::no_space);
  CHECK(*slots.with_home(2).allocate(10) == SlotRange{128, 10});     // the handle's own home
  CHECK(*Sharded(words.data(), 7).allocate(1) == SlotRange{252, 1}); // home 7 % 4 = 3, after its 60
  CHECK_THROWS_ERRC(Errc::out_of_range, (void)slots.shard(4));       // an index past the shards
}

// The sharded allocator named its home shard as allocate's second argument, which every other
// slot allocator reads as a hint for a hinted policy: generic code passing a hint compiled and
// used it as a shard number. The home has a name of its own now.
template <class S>
concept TakesSecondAllocateArgument = requires(S& s, std::uint32_t m, std::uint32_t x) {
  s.allocate(m, x);
};
using ShardedTrap = carve::ShardedSlotAllocator<64, 4, carve::FirstFit>;
static_assert(!TakesSecondAllocateArgument<ShardedTrap>);
static_assert(!TakesSecondAllocateArgument<const ShardedTrap>);
static_assert(requires(const ShardedTrap& s) {
  { s.allocate_near(1u, 2u) } -> std::same_as<cuda::std::expected<SlotRange, Errc>>;
});

TEST_CASE("a sharded allocator refuses bad words: it throws on the host, builds nothing") {
  using Sharded = carve::ShardedSlotAllocator<64, 4, carve::FirstFit, cuda::thread_scope_system>;
  CHECK_THROWS_ERRC(Errc::invalid_argument, Sharded(nullptr));
  CHECK_THROWS_ERRC(Errc::invalid_argument, Sharded(nullptr, 3));
  alignas(8) std::byte raw[8 * (Sharded::word_count + 1)]{};
  CHECK_THROWS_ERRC(Errc::invalid_argument, Sharded(reinterpret_cast<carve::bits::word*>(raw + 4)));
  std::vector<std::uint64_t> words(Sharded::word_count, 0);
  const Sharded good(words.data(), 1);
  CHECK(good.status());
  CHECK(good.with_home(3).status());
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
                       slots.allocate_near(static_cast<std::uint32_t>(1 + rng() % 40), static_cast<std::uint32_t>(t))) {
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

// ---------------------------------------------------------------------------------------------
// "No space" on bitmaps larger than the snapshot's 16 cached words (1024 slots).

TEST_CASE("the fingerprint's arithmetic modulo 2^61 - 1") {
  namespace fp = carve::fingerprint_detail;
  __extension__ typedef unsigned __int128 u128;
  const auto mulmod = [](std::uint64_t a, std::uint64_t b) {
    return static_cast<std::uint64_t>(static_cast<u128>(a) * b % fp::prime);
  };
  std::mt19937_64 rng(5);
  std::vector<std::uint64_t> values = {0,
                                       1,
                                       2,
                                       7,
                                       8,
                                       0xffff'ffffu,
                                       0x1'0000'0000u,
                                       fp::prime - 1,
                                       fp::prime - 2,
                                       (std::uint64_t{1} << 60),
                                       (std::uint64_t{1} << 32) - 1};
  for (int i = 0; i < 200; ++i) {
    values.push_back(rng() % fp::prime);
  }
  for (const std::uint64_t a : values) {
    for (const std::uint64_t b : values) {
      REQUIRE(fp::multiply(a, b) == mulmod(a, b));
    }
  }
  for (const std::uint64_t x : {std::uint64_t{0}, fp::prime - 1, fp::prime, fp::prime + 1, ~std::uint64_t{0}}) {
    CHECK(fp::reduce(x) == x % fp::prime);
  }
  static_assert(fp::multiply(fp::prime - 1, fp::prime - 1) == 1); // (-1)^2

  // Equal reads agree at every point; reads differing in any one word (or in two) disagree.
  std::vector<std::uint64_t> words(300);
  for (auto& w : words) {
    w = rng();
  }
  const auto print = [](const std::vector<std::uint64_t>& w, std::uint64_t x) {
    return carve::word_fingerprint(cuda::std::span<const std::uint64_t>(w.data(), w.size()), x);
  };
  for (int t = 0; t < 20; ++t) {
    const std::uint64_t x = carve::fingerprint_point();
    REQUIRE(x < fp::prime);
    const std::uint64_t h = print(words, x);
    CHECK(print(words, x) == h);
    for (std::size_t k = 0; k < words.size(); ++k) {
      auto changed = words;
      changed[k] ^= std::uint64_t{1} << (rng() % 64);
      CHECK(print(changed, x) != h);
      changed[(k + 1 + rng() % 299) % 300] ^= rng() | 1;
      CHECK(print(changed, x) != h);
    }
  }
  // Points come from the clock: not all the same.
  std::vector<std::uint64_t> points;
  for (int i = 0; i < 50; ++i) {
    points.push_back(carve::fingerprint_point());
  }
  std::sort(points.begin(), points.end());
  CHECK(std::unique(points.begin(), points.end()) - points.begin() > 1);
}

TEST_CASE("a snapshot vouches for what it read only while it still holds every word") {
  using Whole = carve::LazySnapshot<1024, cuda::thread_scope_system>;
  static_assert(Whole::holds_all() && Whole::cached_words_max == 16);
  static_assert(!carve::LazySnapshot<1025, cuda::thread_scope_system>::holds_all());
  // Its size is the stack frame every allocating kernel pays, whatever N: 16 words and tags.
  static_assert(sizeof(carve::LazySnapshot<70000, cuda::thread_scope_system>) <= 192);
  static_assert(sizeof(carve::LazySnapshot<0xffff'ffffu, cuda::thread_scope_system>) <= 208);
  std::vector<std::uint64_t> small(carve::bits::word_count(1024), ~std::uint64_t{0});
  const Whole whole(carve::AtomicWords<1024, cuda::thread_scope_system>(small.data()));
  for (std::size_t k = 0; k < small.size(); ++k) {
    (void)whole[k];
  }
  CHECK(whole.unchanged());
  small[3] = 0;
  CHECK(!whole.unchanged());

  std::vector<std::uint64_t> large(carve::bits::word_count(10000), 0);
  using Large = carve::LazySnapshot<10000, cuda::thread_scope_system>;
  static_assert(!Large::holds_all());
  const Large few(carve::AtomicWords<10000, cuda::thread_scope_system>(large.data()));
  for (std::size_t k = 100; k < 116; ++k) { // 16 words on 16 different lines: all still held
    (void)few[k];
  }
  CHECK(few.unchanged());
  large[107] = 1;
  CHECK(!few.unchanged()); // word 107, remembered on its line, is compared again
  large[107] = 0;
  const Large all(carve::AtomicWords<10000, cuda::thread_scope_system>(large.data()));
  for (std::size_t k = 0; k < large.size(); ++k) {
    (void)all[k];
  }
  CHECK(!all.unchanged()); // word 0 was evicted by word 16: it can no longer be checked
}

TEST_CASE("a snapshot takes a word a claim's atomic returned, and forgets everything on demand") {
  std::vector<std::uint64_t> live(carve::bits::word_count(10000), 0);
  using Large = carve::LazySnapshot<10000, cuda::thread_scope_system>;
  Large seen(carve::AtomicWords<10000, cuda::thread_scope_system>(live.data()));
  (void)seen[3];
  seen.saw(3, 0xf0); // word 3 as an atomic found it: later reads answer that, and unchanged() compares it
  CHECK(seen[3] == 0xf0);
  CHECK(!seen.unchanged());
  live[3] = 0xf0;
  CHECK(seen.unchanged());
  CHECK(!seen.evicted());
  seen.saw(19, 1); // word 19 shares word 3's line: word 3 is dropped, so nothing read can be vouched for
  CHECK(seen.evicted());
  CHECK(seen[19] == 1);
  seen.forget(); // a fresh search: nothing kept, nothing evicted, every word loaded again
  CHECK(!seen.evicted());
  CHECK(seen[19] == 0);
  CHECK(seen.unchanged());
}

TEST_CASE("reset writes every word, the tail bits taken") {
  const auto check_reset = [](auto n_tag) {
    constexpr std::uint32_t n = decltype(n_tag)::value;
    std::vector<std::uint64_t> words(carve::bits::word_count(n), 0x1234);
    carve::ConcurrentSlotAllocatorRef<n, carve::FirstFit, cuda::thread_scope_system> slots{
        carve::BorrowedSlotWords<n>{words.data()}};
    slots.reset();
    const SlotBitmap<n> all_free;
    CHECK(std::equal(words.begin(), words.end(), all_free.words().begin()));
  };
  check_reset(std::integral_constant<std::uint32_t, 1>{});
  check_reset(std::integral_constant<std::uint32_t, 64>{});
  check_reset(std::integral_constant<std::uint32_t, 130>{});
  check_reset(std::integral_constant<std::uint32_t, 4096>{});
  check_reset(std::integral_constant<std::uint32_t, 10000>{});
}

namespace {

constexpr std::uint32_t big = 10000; // 157 words: a failed search keeps only words 141..156

// Words with every slot taken except `free_runs`.
std::vector<std::uint64_t> taken_except(std::initializer_list<SlotRange> free_runs) {
  SlotBitmap<big> b = SlotBitmap<big>::all_taken();
  for (const SlotRange r : free_runs) {
    b.release(r);
  }
  return {b.words().begin(), b.words().end()};
}

template <class Fit>
using BigRef = carve::ConcurrentSlotAllocatorRef<big, Fit, cuda::thread_scope_system>;

// How a test's "other thread" takes exactly the run it means to: a policy that proposes *start
// when that run is free (reading only its words), else nothing.
struct Told {
  const std::uint32_t* start;
  template <carve::WordSource Words>
  cuda::std::optional<std::uint32_t> find_in(const Words& words, std::uint32_t, std::uint32_t m) const {
    for (std::uint32_t s = *start; s < *start + m; ++s) {
      if ((words[s / 64] >> (s % 64) & 1) == 0) {
        return cuda::std::nullopt;
      }
    }
    return *start;
  }
  template <std::uint32_t N>
  cuda::std::optional<std::uint32_t> find(const SlotBitmap<N>& b, std::uint32_t m) const {
    return find_in(b.words(), N, m);
  }
};

} // namespace

TEST_CASE("one thread, more than 1024 slots: the only run past word 64 is found, no_space only when none fits") {
  const auto every_policy = [](auto&& body) {
    body(carve::FirstFit{});
    body(carve::LastFit{});
    body(carve::BoundaryNearestFit{});
    body(carve::BestFit{});
    body(SnapshotOnlyFirstFit{});
  };
  for (const SlotRange run : {SlotRange{65 * 64, 64}, SlotRange{70 * 64 + 3, 100}, SlotRange{90 * 64 + 60, 10},
                              SlotRange{130 * 64, 64}, SlotRange{big - 17, 17}}) {
    CAPTURE(run.first);
    every_policy([&](auto fit) {
      using Fit = decltype(fit);
      CAPTURE(carve::policy_name<Fit>());
      auto words = taken_except({run});
      const auto before = SlotBitmap<big>::from_words(
          cuda::std::span<const std::uint64_t, SlotBitmap<big>::word_count>(words.data(), SlotBitmap<big>::word_count));
      BigRef<Fit> slots{carve::BorrowedSlotWords<big>{words.data()}};
      CHECK(slots.allocate(run.count + 1).error() == Errc::no_space);
      const auto got = slots.allocate(run.count);
      REQUIRE(got);
      CHECK(*got == run);
      CHECK(slots.allocate(1).error() == Errc::no_space);
      REQUIRE(slots.deallocate(run));
      const auto one = slots.allocate(1);
      REQUIRE(one);
      CHECK(one->first == *fit.find(before, 1)); // where the policy puts it on the same bitmap
      CHECK(one->first >= run.first);
      CHECK(one->end() <= run.end());
    });
  }
  every_policy([](auto fit) {
    auto words = taken_except({});
    BigRef<decltype(fit)> slots{carve::BorrowedSlotWords<big>{words.data()}};
    CHECK(slots.allocate(1).error() == Errc::no_space);
  });
}

namespace {

// A policy that lets a test act as another thread at chosen moments of a search:
// script->after_read(search, k) runs right after the search reads word k (searches count from 1).
struct Script {
  std::function<void(int, std::uint32_t)> after_read;
  std::function<void(int)> before_search = [](int) {}; // as search n starts
  int searches = 0;
};

template <class Inner>
struct Interrupted {
  Script* script;

  template <class Words>
  struct Watched {
    const Words& words;
    Script* script;
    std::size_t size() const { return words.size(); }
    std::uint64_t operator[](std::size_t k) const {
      const std::uint64_t w = words[k];
      script->after_read(script->searches, static_cast<std::uint32_t>(k));
      return w;
    }
  };

  template <carve::WordSource Words>
  cuda::std::optional<std::uint32_t> find_in(const Words& words, std::uint32_t slots, std::uint32_t m) const {
    script->before_search(++script->searches);
    return Inner{}.find_in(Watched<Words>{words, script}, slots, m);
  }
  template <std::uint32_t N>
  cuda::std::optional<std::uint32_t> find(const SlotBitmap<N>& b, std::uint32_t m) const {
    return Inner{}.find(b, m);
  }
};
static_assert(carve::WordSearchingFitPolicy<Interrupted<carve::FirstFit>>);

} // namespace

TEST_CASE("a search overtaken by another thread does not report no_space while a run stays free") {
  // Two runs past word 64 that the search reads early, and another thread holding one of them.
  // It frees `low` after the search has read it and takes `high` before the search gets there:
  // the search sees neither free, yet one of them was free at every moment. Word 5's value was
  // evicted from the snapshot long before the search ended, so only a re-read of every word can
  // tell that the picture changed.
  const SlotRange low{70 * 64, 32};
  const SlotRange high{85 * 64 + 8, 32};
  const auto run_case = [&](auto inner) {
    using Inner = decltype(inner);
    CAPTURE(carve::policy_name<Inner>());
    auto words = taken_except({high});
    BigRef<carve::LastFit> other{carve::BorrowedSlotWords<big>{words.data()}};
    Script script;
    script.after_read = [&](int search, std::uint32_t k) {
      if (search == 1 && k == low.first / 64) {
        REQUIRE(other.deallocate(low));
        REQUIRE(*other.allocate(32) == high); // the highest run: the one the search has not reached
      }
    };
    BigRef<Interrupted<Inner>> slots{carve::BorrowedSlotWords<big>{words.data()}, Interrupted<Inner>{&script}};
    const auto got = slots.allocate(32);
    REQUIRE(got);
    CHECK(*got == low);
    CHECK(script.searches >= 2);
  };
  run_case(carve::FirstFit{});
  run_case(carve::BoundaryNearestFit{});
  run_case(carve::BestFit{});
}

TEST_CASE("after a lost claim the search goes on from what the claim's atomic returned, not from fresh words") {
  // 128 slots, all free. Search 1 reads word 0 and proposes [0, 4); before the claim, another
  // thread takes slot 0, so the claim loses, and its fetch_and returns word 0 with slot 0 taken.
  // As search 2 starts, the other thread frees slot 0 again. Fresh words would show [0, 4) free;
  // the kept snapshot shows word 0 as the claim found it, so search 2 proposes [1, 5) and wins.
  std::vector<std::uint64_t> words(2, ~std::uint64_t{0});
  carve::ConcurrentSlotAllocatorRef<128, carve::FirstFit, cuda::thread_scope_system> other{
      carve::BorrowedSlotWords<128>{words.data()}};
  Script script;
  script.after_read = [&](int search, std::uint32_t k) {
    if (search == 1 && k == 0) {
      REQUIRE(*other.allocate(1) == SlotRange{0, 1});
    }
  };
  script.before_search = [&](int search) {
    if (search == 2) {
      REQUIRE(other.deallocate({0, 1}));
    }
  };
  carve::ConcurrentSlotAllocatorRef<128, Interrupted<carve::FirstFit>, cuda::thread_scope_system> slots{
      carve::BorrowedSlotWords<128>{words.data()}, Interrupted<carve::FirstFit>{&script}};
  const auto got = slots.allocate(4);
  REQUIRE(got);
  CHECK(*got == SlotRange{1, 4});
  CHECK(script.searches == 2);
  CHECK(words[0] == (~std::uint64_t{0} & ~std::uint64_t{0b11110})); // slots 1..4 taken, slot 0 free again
}

TEST_CASE("the confirming search is itself overtaken: it looks again rather than report no_space") {
  // Runs a < b < c < d past word 64. At first only c is free; the other thread holds a, b, d.
  // Search 1: after reading a, the other thread frees a and takes c; the search sees nothing.
  // Search 2 (between two fingerprints): before it reads a, the other thread takes a back and
  // frees d; after it has read b and before it reaches d, it takes d and frees b. Nothing seen
  // again, but the words differ between the fingerprints (a, b, c changed), so a third search
  // runs, undisturbed, and finds b.
  const SlotRange a{66 * 64, 40};
  const SlotRange b{72 * 64, 40};
  const SlotRange c{80 * 64, 40};
  const SlotRange d{88 * 64, 40};
  auto words = taken_except({c});
  std::uint32_t target = 0;
  carve::ConcurrentSlotAllocatorRef<big, Told, cuda::thread_scope_system> other{
      carve::BorrowedSlotWords<big>{words.data()}, Told{&target}};
  const auto take = [&](SlotRange r) {
    target = r.first;
    REQUIRE(*other.allocate(r.count) == r);
  };
  Script script;
  script.after_read = [&](int search, std::uint32_t k) {
    if (search == 1 && k == a.first / 64) {
      REQUIRE(other.deallocate(a));
      take(c);
    }
    if (search == 2 && k == a.first / 64 - 1) {
      take(a);
      REQUIRE(other.deallocate(d));
    }
    if (search == 2 && k == b.first / 64) {
      take(d);
      REQUIRE(other.deallocate(b));
    }
  };
  // `a`, `b` and `d` start taken (held by the other thread): only c is free in `words`.
  BigRef<Interrupted<carve::FirstFit>> slots{carve::BorrowedSlotWords<big>{words.data()},
                                             Interrupted<carve::FirstFit>{&script}};
  const auto got = slots.allocate(40);
  REQUIRE(got);
  CHECK(*got == b);
  CHECK(script.searches == 3);
}

TEST_CASE("a run taken between boundary-nearest's two scans is a race, not the policy's mistake") {
  // Word 70 alone has free slots: runs a and b of 32. Boundary-nearest's low scan finds a (reading
  // words 0..70); its high scan reads down from word 156, and on the way (at word 100) another
  // thread takes a. Word 70's copy was evicted by then (words 86, 102, ... share its line), so the
  // high scan reads it again and finds b; the rule picks the low candidate, a, which the check
  // finds taken in the copy of word 70 it now keeps. A race: the allocator looks again, finds b.
  const SlotRange a{70 * 64, 32};
  const SlotRange b{70 * 64 + 32, 32};
  auto words = taken_except({a, b});
  std::uint32_t target = a.first;
  carve::ConcurrentSlotAllocatorRef<big, Told, cuda::thread_scope_system> other{
      carve::BorrowedSlotWords<big>{words.data()}, Told{&target}};
  Script script;
  script.after_read = [&](int search, std::uint32_t k) {
    if (search == 1 && k == 100) {
      REQUIRE(*other.allocate(a.count) == a);
    }
  };
  BigRef<Interrupted<carve::BoundaryNearestFit>> slots{carve::BorrowedSlotWords<big>{words.data()},
                                                       Interrupted<carve::BoundaryNearestFit>{&script}};
  const auto got = slots.allocate(32);
  REQUIRE(got);
  CHECK(*got == b);
  CHECK(script.searches == 2);
  CHECK(slots.allocate(1).error() == Errc::no_space);
}

// Reads every word (as a SlotBitmap), then proposes slot 0 and slot 64 by turns: both taken.
struct Alternating {
  int* calls;
  template <std::uint32_t N>
  cuda::std::optional<std::uint32_t> find(const SlotBitmap<N>&, std::uint32_t) const {
    return (*calls)++ % 2 == 0 ? 0u : 64u;
  }
};

TEST_CASE("past 1024 slots a policy that proposes taken runs by turns is told, not retried for ever") {
  auto words = taken_except({SlotRange{70 * 64, 8}});
  int calls = 0;
  BigRef<Alternating> broken{carve::BorrowedSlotWords<big>{words.data()}, Alternating{&calls}};
  CHECK(broken.allocate(4).error() == Errc::invalid_placement);
  CHECK(calls == 10); // eight refusals taken for races, then two searches between fingerprints
}

// Proposes slot 64 without reading a word: a guess, which a check cannot tell from a race.
struct GuessesSlot64 {
  int* calls;
  template <carve::WordSource Words>
  cuda::std::optional<std::uint32_t> find_in(const Words&, std::uint32_t, std::uint32_t) const {
    ++*calls;
    return 64u;
  }
  template <std::uint32_t N>
  cuda::std::optional<std::uint32_t> find(const SlotBitmap<N>&, std::uint32_t) const {
    ++*calls;
    return 64u;
  }
};
static_assert(carve::WordSearchingFitPolicy<GuessesSlot64>);

TEST_CASE("up to 1024 slots a policy that proposes a taken run in a word it never read is told") {
  // The snapshot holds every word of 128 slots, but word 1 was never read by the search, so its
  // taken run looks like a race eight times; then two searches between fingerprints of unchanged
  // words, each proposing the run while it stays taken, show that the mistake is the policy's.
  std::vector<std::uint64_t> words = {~std::uint64_t{0}, 0}; // slots 64..127 taken
  const std::vector<std::uint64_t> before = words;
  int calls = 0;
  carve::ConcurrentSlotAllocatorRef<128, GuessesSlot64, cuda::thread_scope_system> broken{
      carve::BorrowedSlotWords<128>{words.data()}, GuessesSlot64{&calls}};
  CHECK(broken.allocate(4).error() == Errc::invalid_placement);
  CHECK(calls == 10);
  CHECK(words == before);
  words[1] = ~std::uint64_t{0}; // once the run is free, the guess is served
  CHECK(*broken.allocate(4) == SlotRange{64, 4});
}

TEST_CASE("past 1024 slots a policy that proposes a taken run is still told, not retried for ever") {
  // AlwaysZero reads every word (as a SlotBitmap) and proposes slot 0, which is taken: word 0's
  // copy was evicted by the words after it, so only an unchanged bitmap around a repeated search
  // shows that the mistake is the policy's.
  auto words = taken_except({SlotRange{70 * 64, 8}});
  const std::vector<std::uint64_t> before = words;
  BigRef<AlwaysZero> broken{carve::BorrowedSlotWords<big>{words.data()}};
  CHECK(broken.allocate(4).error() == Errc::invalid_placement);
  CHECK(words == before);
}

TEST_CASE("threads, more than 1024 slots: a free run that moves under a search is never missed") {
  // The only free slots are one run of 24 that a mover thread keeps moving between two places
  // past word 64 (words 2 and 90: both evicted from a failed search's snapshot): it frees the
  // low one, then takes the high one, so at every moment one is free, and a search passing
  // between the two moments sees neither. A searching thread allocates and frees all the while;
  // it must never be told no_space. After each move the mover waits until a search that began
  // after the move has finished, so no search spans two moves (a word that changes and changes
  // back between two reads looks unchanged to any check by value).
  constexpr std::uint32_t m = 24;
  const SlotRange low{2 * 64 + 20, m};
  const SlotRange high{90 * 64 + 30, m};
  auto words = taken_except({high});
  std::uint32_t target = 0;
  carve::ConcurrentSlotAllocatorRef<big, Told, cuda::thread_scope_system> mover{
      carve::BorrowedSlotWords<big>{words.data()}, Told{&target}};
  BigRef<carve::FirstFit> searcher{carve::BorrowedSlotWords<big>{words.data()}};

  std::atomic<std::uint64_t> started{0};
  std::atomic<std::uint64_t> finished{0};
  std::atomic<bool> done{false};
  std::atomic<int> no_space{0};
  std::atomic<int> other_errors{0};
  std::atomic<int> found{0};
  std::thread search([&] {
    while (!done.load()) {
      started.fetch_add(1);
      const auto r = searcher.allocate(m);
      finished.fetch_add(1);
      if (r) {
        found.fetch_add(1);
        if (!searcher.deallocate(*r)) {
          other_errors.fetch_add(1);
        }
      } else {
        (r.error() == Errc::no_space ? no_space : other_errors).fetch_add(1);
      }
      std::this_thread::yield(); // the mover may be waiting for this core
    }
  });
  const auto take = [&](SlotRange r) {
    target = r.first;
    for (;;) {
      const auto got = mover.allocate(m);
      // While the searcher holds the run, Told proposes it all the same: a policy that proposes a
      // taken run is told so (invalid_placement) once two searches between fingerprints saw the
      // words unchanged, which a searcher descheduled while holding the run allows.
      if (got || (got.error() != Errc::no_space && got.error() != Errc::invalid_placement)) {
        return got && *got == r;
      }
      std::this_thread::yield(); // the searcher holds it for a moment
    }
  };
  bool low_free = false;
  bool mover_ok = true;
  for (int move = 0; move < 4000 && mover_ok; ++move) {
    if (low_free) { // back up: free the high run, take the low one (cannot hide a run)
      mover_ok = mover.deallocate(high) && take(low);
    } else { // free the low run behind the search, take the high run ahead of it
      mover_ok = mover.deallocate(low) && take(high);
    }
    low_free = !low_free;
    const std::uint64_t after = started.load();
    while (finished.load() <= after) {
      std::this_thread::yield();
    }
  }
  done.store(true);
  search.join();
  CHECK(mover_ok);
  CHECK(no_space.load() == 0);
  CHECK(other_errors.load() == 0);
  CHECK(found.load() > 0);
}

// ---------------------------------------------------------------------------------------------
// Hinted allocation: ReleaseAlignedFit's memory shared among threads.

namespace {

using carve::ExpectedRelease;

// One thread, hinted and plain requests, frees, a reset: every answer and every bitmap exactly
// SlotAllocator's (whose policy never hears of frees, so this also shows that forgetting the
// ticks of freed slots changes no choice).
template <std::uint32_t N>
void hinted_same_as_sequential(std::uint64_t seed, std::uint32_t max_m, int steps) {
  CAPTURE(N);
  std::mt19937_64 rng(seed);
  auto concurrent = std::make_unique<HostConcurrent<N, carve::ReleaseAlignedFit>>();
  auto sequential = std::make_unique<SlotAllocator<N, carve::ReleaseAlignedFit>>();
  std::vector<SlotRange> live;
  std::uint32_t now = 0xffff'ff00u; // the ticks wrap during the run
  int hinted_placements = 0;
  for (int step = 0; step < steps; ++step) {
    now += static_cast<std::uint32_t>(rng() % 4);
    if (step == steps / 2) {
      concurrent->reset();
      sequential->reset();
      live.clear();
    }
    if (!live.empty() && rng() % 100 < 45) {
      const std::size_t k = rng() % live.size();
      REQUIRE(concurrent->deallocate(live[k]));
      REQUIRE(sequential->deallocate(live[k]));
      live[k] = live.back();
      live.pop_back();
      continue;
    }
    const auto m = static_cast<std::uint32_t>(1 + rng() % max_m);
    const bool hinted = rng() % 8 != 0;
    const ExpectedRelease hint{static_cast<std::uint32_t>(now + rng() % 200)};
    const auto got = hinted ? concurrent->allocate(m, hint) : concurrent->allocate(m);
    const auto want = hinted ? sequential->allocate(m, hint) : sequential->allocate(m);
    REQUIRE(got.has_value() == want.has_value());
    if (want) {
      REQUIRE(*got == *want);
      live.push_back(*got);
      hinted_placements += hinted ? 1 : 0;
      // The owner's stamps are in place once allocate returns.
      REQUIRE(concurrent->policy().known(got->first) == hinted);
      if (hinted) {
        REQUIRE(concurrent->policy().tick(static_cast<std::uint32_t>(got->end() - 1)) == hint.tick);
      }
    } else {
      REQUIRE(got.error() == want.error());
    }
    REQUIRE(concurrent->snapshot() == sequential->bitmap());
  }
  CHECK(hinted_placements > steps / 4);
  // Bad input, hinted: the same errors, nothing changed.
  const SlotBitmap<N> before = concurrent->snapshot();
  CHECK(concurrent->allocate(0, ExpectedRelease{1}).error() == Errc::invalid_size);
  CHECK(concurrent->allocate(N + 1, ExpectedRelease{1}).error() == Errc::no_space);
  CHECK(concurrent->snapshot() == before);
}

} // namespace

TEST_CASE("one thread with hints gets exactly SlotAllocator<N, ReleaseAlignedFit>'s placements") {
  for (std::uint64_t seed = 1; seed <= 2; ++seed) {
    hinted_same_as_sequential<128>(seed, 16, 3000);
    hinted_same_as_sequential<200>(seed, 40, 2000);
    hinted_same_as_sequential<3000>(seed, 300, 600); // past the snapshot's 16 words: evictions
  }
}

TEST_CASE("a free forgets its slots' ticks, a plain placement stamps them never-released, reset forgets all") {
  HostConcurrent<128, carve::ReleaseAlignedFit> slots;
  const auto a = slots.allocate(8, ExpectedRelease{50});
  REQUIRE(a);
  CHECK(slots.policy().known(a->first));
  REQUIRE(slots.deallocate({a->first, 3}));
  CHECK_FALSE(slots.policy().known(a->first));
  CHECK(slots.policy().known(a->first + 3));
  CHECK(slots.deallocate(*a).error() == Errc::not_allocated); // partly free: refused, stamps kept
  CHECK(slots.policy().known(a->first + 3));
  const auto b = slots.allocate(4);
  REQUIRE(b);
  CHECK_FALSE(slots.policy().known(b->first));
  slots.reset();
  for (std::uint32_t s = 0; s < 128; ++s) {
    REQUIRE_FALSE(slots.policy().known(s));
  }
}

TEST_CASE("threads allocating with hints never share a slot, and each finds its own stamps on its slots") {
  constexpr std::uint32_t N = 256;
  constexpr int threads = 4;
  constexpr int steps = 20000;
  HostConcurrent<N, carve::ReleaseAlignedFit> slots;
  std::vector<int> owner(N, 0);
  std::atomic<int> violations{0};
  std::atomic<int> stamp_errors{0};
  std::atomic<int> hinted{0};
  std::vector<std::vector<SlotRange>> kept(threads);
  std::barrier start(threads);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      const int id = t + 1;
      std::mt19937_64 rng(static_cast<std::uint64_t>(id) * 104729);
      struct Held {
        SlotRange range;
        std::uint32_t tick;
        bool hinted;
      };
      std::vector<Held> mine;
      std::uint32_t now = 0;
      start.arrive_and_wait();
      for (int step = 0; step < steps; ++step) {
        now += 1;
        if (!mine.empty() && rng() % 2 == 0) {
          const std::size_t k = rng() % mine.size();
          const Held h = mine[k];
          for (std::uint32_t s = h.range.first; s < h.range.end(); ++s) {
            // Only the owner writes a slot's record: it still holds what this thread stamped.
            if (slots.policy().known(s) != h.hinted || (h.hinted && slots.policy().tick(s) != h.tick)) {
              stamp_errors.fetch_add(1);
            }
            violations.fetch_add(owner[s] != id ? 1 : 0);
            owner[s] = 0;
          }
          violations.fetch_add(slots.deallocate(h.range) ? 0 : 1);
          mine[k] = mine.back();
          mine.pop_back();
          continue;
        }
        const auto m = static_cast<std::uint32_t>(1 + rng() % 12);
        const bool with_hint = rng() % 4 != 0;
        const std::uint32_t tick = now + static_cast<std::uint32_t>(rng() % 64);
        const auto r = with_hint ? slots.allocate(m, ExpectedRelease{tick}) : slots.allocate(m);
        if (!r) {
          continue;
        }
        hinted.fetch_add(with_hint ? 1 : 0);
        for (std::uint32_t s = r->first; s < r->end(); ++s) {
          violations.fetch_add(owner[s] != 0 ? 1 : 0);
          owner[s] = id;
        }
        mine.push_back({*r, tick, with_hint});
      }
      for (const Held& h : mine) {
        kept[static_cast<std::size_t>(t)].push_back(h.range);
      }
    });
  }
  for (auto& th : pool) {
    th.join();
  }
  CHECK(violations.load() == 0);
  CHECK(stamp_errors.load() == 0);
  CHECK(hinted.load() > threads * steps / 8);
  SlotBitmap<N> expected;
  for (const auto& mine : kept) {
    for (const SlotRange r : mine) {
      expected.occupy(r);
    }
  }
  CHECK(slots.snapshot() == expected);
  for (std::uint32_t s = 0; s < N; ++s) { // freed slots are unknown again
    if (expected.free_count({s, 1}) == 1) {
      REQUIRE_FALSE(slots.policy().known(s));
    }
  }
}
