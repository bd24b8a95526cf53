// SlotArena over every slot allocator: bytes become whole slots at base + first * slot_bytes,
// placed by the allocator's policy; errors change nothing; threads never share a slot.
#include "support/errors.hpp"

#include <carve/mr.hpp>
#include <carve/slot.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <thread>
#include <type_traits>
#include <vector>

// In a namespace of its own: the area's test files compile as one translation unit.
namespace test_slot_arena {

using carve::Errc;
using carve::SlotArena;
using carve::SlotRange;

namespace {

constexpr std::size_t slot = 256;

struct alignas(4096) Heap {
  std::byte bytes[128 * slot];
};

std::size_t first_slot(const void* base, const void* p) {
  return static_cast<std::size_t>(static_cast<const std::byte*>(p) - static_cast<const std::byte*>(base)) / slot;
}

} // namespace

static_assert(carve::SlotSource<carve::SlotAllocator<128>>);
static_assert(carve::SlotSource<carve::ConcurrentSlotAllocator<128>>);
static_assert(carve::SlotSource<carve::ShardedSlotAllocator<32, 4>>);
static_assert(carve::SlotSource<carve::DynamicSlotAllocator<carve::FirstFit>>);
static_assert(carve::MemoryResource<SlotArena<carve::ConcurrentSlotAllocator<128>>>);
static_assert(carve::UpstreamResource<SlotArena<carve::SlotAllocator<128>>>);

TEST_CASE("bytes become whole slots where the policy puts them") {
  Heap heap;
  SlotArena<carve::SlotAllocator<128, carve::BoundaryNearestFit>> arena(heap.bytes, sizeof heap.bytes, slot);
  CHECK(arena.capacity() == 128 * slot);
  CHECK(arena.slot_alignment() == slot);
  // The worked example: slots 0-1 and 6-123 taken, 3 slots asked: boundary-nearest takes 125.
  REQUIRE(arena.slots().allocate(128));
  REQUIRE(arena.slots().deallocate(SlotRange{2, 4}));
  REQUIRE(arena.slots().deallocate(SlotRange{124, 4}));
  const auto p = arena.try_allocate(2 * slot + 1, 16); // three slots
  REQUIRE(p);
  CHECK(first_slot(heap.bytes, *p) == 125);
  CHECK(arena.owns(*p));
  CHECK_FALSE(arena.owns(heap.bytes + sizeof heap.bytes));
  CHECK(arena.free_bytes() == 5 * slot);
  const auto low = arena.try_allocate(4 * slot, 64); // only slots 2..5 hold four
  REQUIRE(low);
  CHECK(first_slot(heap.bytes, *low) == 2);
  arena.deallocate(*p, 2 * slot + 1, 16);
  arena.deallocate(*low, 4 * slot, 64);
  arena.reset();
  CHECK(arena.free_bytes() == arena.capacity());
}

TEST_CASE("a slot arena refuses bad input and changes nothing") {
  Heap heap;
  SlotArena<carve::SlotAllocator<128>> arena(heap.bytes, sizeof heap.bytes, slot);
  CHECK(arena.try_allocate(0, 8).error() == Errc::invalid_size);
  CHECK(arena.try_allocate(8, 12).error() == Errc::invalid_size);
  CHECK(arena.try_allocate(128 * slot + 1, 8).error() == Errc::no_space); // more than the arena: a fallback's
  CHECK(arena.try_allocate(8, 2 * slot).error() == Errc::no_space);       // finer than any slot start
  CHECK(arena.free_bytes() == arena.capacity());
  const auto p = arena.try_allocate(1000, 8);
  REQUIRE(p);
  auto* b = static_cast<std::byte*>(*p);
  int outside = 0;
  CHECK(arena.try_deallocate(&outside, 4, 4).error() == Errc::not_allocated);
  CHECK(arena.try_deallocate(b + 8, 992, 8).error() == Errc::not_allocated); // not a slot start
  CHECK(arena.try_deallocate(b, 0, 8).error() == Errc::invalid_size);
  CHECK(arena.try_deallocate(b, 129 * slot, 8).error() == Errc::out_of_range);
  CHECK(arena.try_deallocate(b, 8 * slot, 8).error() == Errc::not_allocated); // runs into free slots
  CHECK(arena.free_bytes() == arena.capacity() - 4 * slot);
  CHECK(arena.try_deallocate(b, 1000, 8));
  CHECK(arena.try_deallocate(b, 1000, 8).error() == Errc::not_allocated); // a double free
  CHECK(arena.free_bytes() == arena.capacity());
}

TEST_CASE("a slot arena is told its buffer's length and refuses bad input: it throws and builds nothing") {
  using Arena = SlotArena<carve::SlotAllocator<128>>;
  Heap heap;
  // Before, the arena never knew its buffer's length: 128 slots of 256 bytes over a 1 KiB buffer
  // handed out the 31 KiB past its end. The length is part of every construction now.
  static_assert(!std::is_constructible_v<Arena, void*, std::size_t>);
  static_assert(std::is_constructible_v<Arena, void*, std::size_t, std::size_t>);
  CHECK_THROWS_ERRC(Errc::invalid_argument, Arena(heap.bytes, 1024, slot));                  // too short
  CHECK_THROWS_ERRC(Errc::invalid_argument, Arena(heap.bytes, sizeof heap.bytes - 1, slot)); // one byte short
  CHECK_THROWS_ERRC(Errc::invalid_argument, Arena(heap.bytes, 0, slot));
  CHECK_THROWS_ERRC(Errc::invalid_argument, Arena(heap.bytes, sizeof heap.bytes, 0)); // 0-byte slots
  CHECK_THROWS_ERRC(Errc::invalid_argument, Arena(nullptr, sizeof heap.bytes, slot));
  CHECK_THROWS_ERRC(Errc::invalid_argument,
                    Arena(reinterpret_cast<void*>(std::uintptr_t{0} - 4096), SIZE_MAX, slot)); // wraps
  CHECK_THROWS_ERRC(Errc::invalid_argument, Arena(heap.bytes, SIZE_MAX, SIZE_MAX / 64));       // overflows
  CHECK_THROWS_WITH_AS(Arena(heap.bytes, 1024, slot), doctest::Contains("shorter than its slots need"),
                       carve::Exception);

  // Exactly enough, and more than enough (the rest is left unused).
  const Arena exact(heap.bytes, sizeof heap.bytes, slot);
  CHECK(exact.status());
  CHECK(exact.capacity() == sizeof heap.bytes);
  std::vector<std::byte> more(sizeof heap.bytes + 1000);
  const Arena roomy(more.data(), more.size(), slot);
  CHECK(roomy.capacity() == 128 * slot);

  // reset with bad input throws and leaves the arena as it was.
  Arena arena(heap.bytes, sizeof heap.bytes, slot);
  const auto p = arena.try_allocate(slot, 8);
  REQUIRE(p);
  CHECK_THROWS_ERRC(Errc::invalid_argument, arena.reset(heap.bytes, 100, slot));
  CHECK(arena.status());
  CHECK(arena.base() == heap.bytes);
  CHECK(arena.free_bytes() == arena.capacity() - slot);
  arena.deallocate(*p, slot, 8);

  // What a __shared__ declaration starts as: over nothing, and it says so by answering no_space
  // (not a silent success), with nothing wrong to report.
  const Arena nothing;
  CHECK(nothing.status());
  CHECK(nothing.capacity() == 0);
  CHECK_FALSE(nothing.owns(heap.bytes));
  Arena empty;
  CHECK(empty.try_allocate(8, 8).error() == Errc::no_space);
}

TEST_CASE("a slot arena against a model of its slots") {
  Heap heap;
  SlotArena<carve::SlotAllocator<128, carve::FirstFit>> arena(heap.bytes, sizeof heap.bytes, slot);
  std::vector<bool> taken(128, false);
  std::vector<std::pair<void*, std::size_t>> live;
  std::mt19937 rng(5);
  for (int step = 0; step < 5000; ++step) {
    if (live.empty() || rng() % 3 != 0) {
      const std::size_t bytes = 1 + rng() % (12 * slot);
      const std::size_t m = (bytes + slot - 1) / slot;
      // The model: first fit over the taken flags.
      std::size_t expect = 128;
      for (std::size_t s = 0; s + m <= 128 && expect == 128; ++s) {
        bool free = true;
        for (std::size_t k = 0; k < m; ++k) {
          free &= !taken[s + k];
        }
        expect = free ? s : 128;
      }
      const auto p = arena.try_allocate(bytes, 32);
      if (expect == 128) {
        REQUIRE_FALSE(p);
        CHECK(p.error() == Errc::no_space);
        continue;
      }
      REQUIRE(p);
      REQUIRE(first_slot(heap.bytes, *p) == expect);
      for (std::size_t k = 0; k < m; ++k) {
        taken[expect + k] = true;
      }
      std::memset(*p, static_cast<int>(expect), bytes);
      live.emplace_back(*p, bytes);
    } else {
      const std::size_t i = rng() % live.size();
      const auto [p, bytes] = live[i];
      live[i] = live.back();
      live.pop_back();
      const std::size_t first = first_slot(heap.bytes, p);
      CHECK(static_cast<unsigned char*>(p)[bytes - 1] == static_cast<unsigned char>(first));
      for (std::size_t k = 0; k < (bytes + slot - 1) / slot; ++k) {
        taken[first + k] = false;
      }
      arena.deallocate(p, bytes, 32);
    }
  }
  for (const auto& [p, bytes] : live) {
    arena.deallocate(p, bytes, 32);
  }
  CHECK(arena.free_bytes() == arena.capacity());
}

TEST_CASE("threads share a lock-free slot arena without sharing a slot") {
  Heap heap;
  SlotArena<carve::ConcurrentSlotAllocator<128, carve::BoundaryNearestFit, cuda::thread_scope_system>> arena(
      heap.bytes, sizeof heap.bytes, slot);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(static_cast<std::uint32_t>(t) + 20);
      std::vector<std::pair<unsigned char*, std::size_t>> mine;
      for (int step = 0; step < 5000; ++step) {
        if (mine.empty() || rng() % 2 == 0) {
          const std::size_t bytes = 1 + rng() % (6 * slot);
          if (const auto p = arena.try_allocate(bytes, 64)) {
            std::memset(*p, t + 1, bytes);
            mine.emplace_back(static_cast<unsigned char*>(*p), bytes);
          }
        } else {
          const auto [p, bytes] = mine.back();
          mine.pop_back();
          if (p[0] != t + 1 || p[bytes - 1] != t + 1 || !arena.try_deallocate(p, bytes, 64)) {
            ++failures;
          }
        }
      }
      for (const auto& [p, bytes] : mine) {
        arena.deallocate(p, bytes, 64);
      }
    });
  }
  for (auto& th : threads) {
    th.join();
  }
  CHECK(failures == 0);
  CHECK(arena.free_bytes() == arena.capacity());
}

TEST_CASE("sharded and run-time-sized slots serve arenas too") {
  std::vector<carve::bits::word> words(carve::ShardedSlotAllocator<32, 4>::word_count);
  carve::ShardedSlotAllocator<32, 4> shards(words.data(), /*home*/ 2);
  shards.reset();
  Heap heap;
  SlotArena<carve::ShardedSlotAllocator<32, 4>> sharded(heap.bytes, sizeof heap.bytes, slot, shards);
  const auto p = sharded.try_allocate(3 * slot, 8);
  REQUIRE(p);
  CHECK(first_slot(heap.bytes, *p) / 32 == 2);                         // from the home shard
  CHECK(sharded.try_allocate(33 * slot, 8).error() == Errc::no_space); // a run never spans shards
  sharded.deallocate(*p, 3 * slot, 8);

  std::vector<std::byte> big(100000 * 64);
  SlotArena<carve::DynamicSlotAllocator<carve::FirstFit>> pages(big.data(), big.size(), 64,
                                                                carve::DynamicSlotAllocator<carve::FirstFit>(100000));
  CHECK(pages.capacity() == 100000 * 64);
  const auto q = pages.try_allocate(1 << 20, 8);
  REQUIRE(q);
  CHECK(*q == big.data());
  pages.deallocate(*q, 1 << 20, 8);
  CHECK(pages.free_bytes() == pages.capacity());
}

TEST_CASE("arenas compare equal only where a block of one may be freed through the other") {
  static_assert(carve::SharesSlots<carve::ConcurrentSlotAllocatorRef<128>> &&
                carve::SharesSlots<carve::ShardedSlotAllocator<32, 4>>);
  static_assert(!carve::SharesSlots<carve::SlotAllocator<128>> && !carve::SharesSlots<carve::DynamicSlotAllocator<>> &&
                !carve::SharesSlots<carve::ConcurrentSlotAllocator<128>>);
  Heap heap;
  // A copy of an arena over a SlotAllocator holds free slots of its own: another arena.
  SlotArena<carve::SlotAllocator<128>> own(heap.bytes, sizeof heap.bytes, slot);
  const SlotArena<carve::SlotAllocator<128>> copy = own;
  CHECK(own == own);
  CHECK_FALSE(own == copy);
  // Copies of an arena over a handle share its slots: a block from one frees through the other.
  std::vector<carve::bits::word> words(carve::BorrowedSlotWords<128>::word_count);
  carve::ConcurrentSlotAllocatorRef<128> ref(carve::BorrowedSlotWords<128>(words.data()));
  ref.reset();
  SlotArena<carve::ConcurrentSlotAllocatorRef<128>> shared(heap.bytes, sizeof heap.bytes, slot, ref);
  SlotArena<carve::ConcurrentSlotAllocatorRef<128>> handle = shared;
  CHECK(shared == handle);
  void* p = handle.allocate(slot, 8);
  CHECK(shared.try_deallocate(p, slot, 8));
}

TEST_CASE("a segregator sends small requests to a slot arena and the rest to a pool, through pmr too") {
  Heap heap;
  using Arena = SlotArena<carve::SlotAllocator<128>>;
  using Pool = carve::StatsResource<carve::CachingPool<carve::SimulatedCard>>;
  carve::Segregator<4096, Arena, Pool> heap_stack(Arena(heap.bytes, sizeof heap.bytes, slot),
                                                  carve::SimulatedCard(16 << 20));
  const auto small = heap_stack.try_allocate(100, 8);
  const auto large = heap_stack.try_allocate(100000, 8);
  REQUIRE(small);
  REQUIRE(large);
  CHECK(heap_stack.small().owns(*small));
  CHECK(heap_stack.large().stats().allocations == 1);
  heap_stack.deallocate(*small, 100, 8);
  heap_stack.deallocate(*large, 100000, 8);
  {
    auto pmr = carve::as_pmr(heap_stack);
    std::pmr::vector<double> v(&pmr);
    for (int i = 0; i < 5000; ++i) {
      v.push_back(i);
    }
    CHECK(heap_stack.large().stats().bytes_in_use >= 5000 * sizeof(double));
  }
  CHECK(heap_stack.small().free_bytes() == heap_stack.small().capacity());
  CHECK(heap_stack.large().stats().bytes_in_use == 0);
}

TEST_CASE("the block-scratch stack on host threads: local arena first, then a shared global arena") {
  // compose_block_scratch.cu's stack, run by host threads standing in for one block's threads.
  using Local = SlotArena<carve::ConcurrentSlotAllocator<64, carve::BoundaryNearestFit, cuda::thread_scope_block>>;
  using Global = SlotArena<carve::ConcurrentSlotAllocatorRef<1024>>;
  using Scratch = carve::FallbackResource<Local, Global>;
  alignas(128) static std::byte local_memory[64 * 128];
  alignas(128) static std::byte global_memory[1024 * 128];
  std::vector<carve::bits::word> words(carve::bits::word_count(1024));
  Global global(global_memory, sizeof global_memory, 128,
                carve::ConcurrentSlotAllocatorRef<1024>(carve::BorrowedSlotWords<1024>(words.data())));
  global.reset();         // all slots free
  static Scratch scratch; // as a __shared__ variable is: default-constructed, then set up by one thread
  scratch.primary().reset(local_memory, sizeof local_memory, 128);
  scratch.fallback() = global;

  std::atomic<int> failures{0};
  std::atomic<int> from_global{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (unsigned item = static_cast<unsigned>(t); item < 4000; item += 4) {
        const std::size_t bytes = (1 + item * 37 % 200) * sizeof(unsigned);
        auto p = scratch.try_allocate(bytes, alignof(unsigned));
        while (!p) {
          p = scratch.try_allocate(bytes, alignof(unsigned));
        }
        auto* values = static_cast<unsigned*>(*p);
        const std::size_t n = bytes / sizeof(unsigned);
        for (std::size_t i = 0; i < n; ++i) {
          values[i] = item;
        }
        for (std::size_t i = 0; i < n; ++i) {
          failures += values[i] != item ? 1 : 0;
        }
        from_global += scratch.fallback().owns(*p) ? 1 : 0;
        scratch.deallocate(*p, bytes, alignof(unsigned));
      }
    });
  }
  for (auto& th : threads) {
    th.join();
  }
  CHECK(failures == 0);
  MESSAGE(from_global.load() << " of 4000 items spilled to the global arena");
  CHECK(scratch.primary().free_bytes() == scratch.primary().capacity());
  CHECK(global.free_bytes() == global.capacity()); // the handle sees the same words
}
TEST_CASE("a slot arena over slots that report bad construction refuses them") {
  // A sharded allocator over no words reports it through status(); an arena over it is bad input.
  using Sharded = carve::ShardedSlotAllocator<32, 4>;
  Heap heap;
  CHECK_THROWS_ERRC(Errc::invalid_argument, SlotArena<Sharded>(heap.bytes, sizeof heap.bytes, slot,
                                                               Sharded(static_cast<carve::bits::word*>(nullptr))));
}

} // namespace test_slot_arena
