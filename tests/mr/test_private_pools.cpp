// PrivatePools: a captured graph's blocks stay its own, are reused only by its pool in stream
// order, and go back whole once the pool is released and nothing of it is in use; with threads.
#include <carve/mr.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <random>
#include <thread>
#include <vector>

// In a namespace of its own: the area's test files compile as one translation unit.
namespace test_private_pools {

using carve::PrivatePoolId;
using Pools = carve::PrivatePools<std::uint32_t>; // streams are numbers here
using Freed = Pools::Freed;

namespace {
constexpr std::size_t KiB = 1024;
constexpr PrivatePoolId graph{1, 0};
constexpr PrivatePoolId other{0, 7};

void* at(std::uintptr_t a) { return reinterpret_cast<void*>(a); }
} // namespace

TEST_CASE("a capture's blocks stay in its pool, reused by its later requests in stream order") {
  Pools pools;
  pools.open(graph);
  REQUIRE(pools.adopt(graph, at(0x10000), 8 * KiB, 0));
  REQUIRE(pools.adopt(graph, at(0x20000), 64 * KiB, 0));
  CHECK(pools.bytes() == 72 * KiB);
  auto [freed, block] = pools.free(at(0x10000), 0, 8 * KiB);
  CHECK(freed == Freed::kept);
  CHECK(block.bytes == 8 * KiB);
  CHECK(pools.holds(at(0x10000)));
  CHECK(pools.reuse(graph, 1, 8 * KiB) == nullptr); // another stream: not until the release
  CHECK(pools.reuse(other, 0, 8 * KiB) == nullptr); // another pool: never
  CHECK(pools.reuse(graph, 0, 3 * KiB) == nullptr); // under half the block: not pinned by it
  CHECK(pools.reuse(graph, 0, 9 * KiB) == nullptr); // too large
  CHECK(pools.reuse(graph, 0, 5 * KiB) == at(0x10000));
  CHECK(pools.reuse(graph, 0, 5 * KiB) == nullptr);                      // in use again
  CHECK(pools.free(at(0x10000), 0, 8 * KiB).first == Freed::wrong_size); // it was asked for as 5 KiB
  CHECK(pools.free(at(0x10000), 0, 5 * KiB).first == Freed::kept);
  CHECK(pools.free(at(0x30000), 0, KiB).first == Freed::not_private);
  CHECK(pools.bytes() == 72 * KiB);
}

TEST_CASE("a block freed twice to its pool, freed with another size, or adopted twice, changes nothing") {
  Pools pools;
  CHECK_FALSE(pools.adopt(graph, at(0x10000), KiB, 0)); // not open
  pools.open(graph);
  REQUIRE(pools.adopt(graph, at(0x10000), KiB, 0));
  CHECK_FALSE(pools.adopt(graph, at(0x10000), KiB, 0));
  pools.open(other);
  CHECK_FALSE(pools.adopt(other, at(0x10000), KiB, 0)); // one pool per block
  CHECK(pools.free(at(0x10000), 0, 2 * KiB).first == Freed::wrong_size);
  CHECK(pools.free(at(0x10000), 0, KiB).first == Freed::kept);
  CHECK(pools.free(at(0x10000), 0, KiB).first == Freed::twice); // already free in its pool
  CHECK(pools.reuse(graph, 0, KiB) == at(0x10000));             // kept once, so handed out once
  CHECK(pools.reuse(graph, 0, KiB) == nullptr);
  CHECK(pools.bytes() == KiB);
}

TEST_CASE("released: free blocks go back at once, blocks in use as they are freed, each as made") {
  Pools pools;
  pools.open(graph);
  pools.open(graph); // two graphs share the pool
  REQUIRE(pools.adopt(graph, at(0x10000), 4 * KiB, 0));
  REQUIRE(pools.adopt(graph, at(0x20000), 2 * KiB, 1));
  REQUIRE(pools.adopt(graph, at(0x30000), 16 * KiB, 0)); // a static output, still held
  CHECK(pools.free(at(0x10000), 0, 4 * KiB).first == Freed::kept);
  REQUIRE(pools.reuse(graph, 0, 3 * KiB) == at(0x10000));          // served a smaller request ...
  CHECK(pools.free(at(0x10000), 2, 3 * KiB).first == Freed::kept); // ... and freed on stream 2
  CHECK(pools.free(at(0x20000), 1, 2 * KiB).first == Freed::kept);
  CHECK(pools.release(graph).empty()); // one user left
  const auto back = pools.release(graph);
  REQUIRE(back.size() == 2);
  std::size_t total = 0;
  for (const auto& b : back) {
    total += b.bytes;
    CHECK(b.stream == (b.p == at(0x10000) ? 2u : 1u)); // where it was freed last
    CHECK_FALSE(pools.holds(b.p));
  }
  CHECK(total == 6 * KiB); // 4 KiB as made, not the 3 KiB it served last
  CHECK(pools.pools() == 1);
  const auto [freed, block] = pools.free(at(0x30000), 0, 16 * KiB);
  CHECK(freed == Freed::give_back);
  CHECK(block.bytes == 16 * KiB);
  CHECK(pools.pools() == 0);
  CHECK(pools.bytes() == 0);
  CHECK(pools.release(graph).empty()); // no such pool
}

TEST_CASE("threads: graphs of their own capture, replay-free and release over one card") {
  carve::SimulatedCard card(64 << 20);
  Pools pools;
  std::atomic<bool> wrong{false};
  std::vector<std::thread> threads;
  for (std::uint32_t t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      for (std::uint64_t round = 0; round < 50; ++round) {
        const PrivatePoolId id{t, round};
        pools.open(id);
        std::vector<std::pair<void*, std::size_t>> mine;
        for (int i = 0; i < 40; ++i) {
          if (!mine.empty() && rng() % 3 == 0) { // a temporary dies inside the capture
            const auto [p, bytes] = mine.back();
            mine.pop_back();
            wrong = wrong || pools.free(p, t, bytes).first != Freed::kept;
            continue;
          }
          const std::size_t bytes = (rng() % 16 + 1) * KiB;
          void* p = pools.reuse(id, t, bytes);
          if (p == nullptr) {
            auto made = card.try_allocate(bytes, 256);
            if (!made) {
              wrong = true;
              break;
            }
            p = *made;
            wrong = wrong || !pools.adopt(id, p, bytes, t);
          }
          mine.emplace_back(p, bytes);
        }
        for (const auto& b : pools.release(id)) { // the graph is destroyed
          card.deallocate(b.p, b.bytes, 256);
        }
        for (const auto& [p, bytes] : mine) { // its outputs die later
          const auto [freed, block] = pools.free(p, t, bytes);
          wrong = wrong || freed != Freed::give_back;
          card.deallocate(block.p, block.bytes, 256);
        }
      }
    });
  }
  for (auto& th : threads) {
    th.join();
  }
  CHECK_FALSE(wrong.load());
  CHECK(card.used_bytes() == 0);
  CHECK(pools.pools() == 0);
  CHECK(pools.bytes() == 0);
}

} // namespace test_private_pools
