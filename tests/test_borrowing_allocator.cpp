#include "topology_data.hpp"

#include <carve/carve.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

using carve::BorrowHandle;
using carve::BorrowingAllocator;
using carve::CachingPool;
using carve::Errc;
using carve::PoolOptions;
using carve::SimulatedCard;
using carve::Topology;

using carve::test::dgx1;

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

std::vector<SimulatedCard> distinct_cards(std::size_t each) {
  std::vector<SimulatedCard> c;
  for (int i = 0; i < 8; ++i) {
    c.emplace_back(each);
  }
  return c;
}

const PoolOptions options{.granularity = 512, .segment_size = 1 * MiB};

} // namespace

TEST_CASE("a full card borrows from its best-linked peer") {
  BorrowingAllocator alloc(dgx1(), distinct_cards(16 * MiB), carve::LargestBandwidth{}, options);
  std::vector<carve::BorrowDecision> decisions;
  alloc.on_decision([&](const carve::BorrowDecision& d) { decisions.push_back(d); });

  const auto local = alloc.allocate(12 * MiB, 0);
  REQUIRE(local);
  CHECK(local->card == 0);
  CHECK_FALSE(local->borrowed());
  const auto spill = alloc.allocate(8 * MiB, 0); // 4 MiB left on GPU0
  REQUIRE(spill);
  CHECK(spill->card == 3); // NV2, direct: the widest and closest
  CHECK(spill->requester == 0);
  CHECK(spill->borrowed());
  REQUIRE(decisions.size() == 2);
  CHECK(decisions[1].lender == 3);
  CHECK(decisions[1].bandwidth_gbps == 40.0);
  CHECK(decisions[1].bandwidths[5] == 20.0);
  CHECK(decisions[1].cards[0].largest_free_block == 4 * MiB);
  CHECK(alloc.history().count(0, 3) == 1);
  // The borrowed memory is real and belongs to GPU3's pool.
  std::memset(spill->address, 0x5a, spill->size);
  CHECK(alloc.pool(3).stats().bytes_in_use == 8 * MiB);
  CHECK(alloc.deallocate(*spill));
  CHECK(alloc.pool(3).stats().bytes_in_use == 0);
  CHECK(alloc.deallocate(*spill).error() == Errc::not_allocated);
  CHECK(alloc.deallocate(*local));
}

TEST_CASE("errors name the problem and allocate nothing") {
  BorrowingAllocator alloc(dgx1(), distinct_cards(4 * MiB), carve::LargestBandwidth{}, options);
  auto r = alloc.allocate(5 * MiB, 0);
  REQUIRE_FALSE(r);
  CHECK(r.error().code == Errc::no_space);
  CHECK(r.error().message ==
        "no card can hold 5.0 MiB (largest free block per card: GPU0 4.0 MiB, GPU1 4.0 MiB, GPU2 4.0 MiB, GPU3 4.0 "
        "MiB, GPU4 4.0 MiB, GPU5 4.0 MiB, GPU6 4.0 MiB, GPU7 4.0 MiB)");
  CHECK(alloc.allocate(0, 0).error().code == Errc::invalid_size);
  CHECK(alloc.allocate(SIZE_MAX, 0).error().code == Errc::invalid_size);
  CHECK(alloc.allocate(MiB, 8).error().code == Errc::out_of_range);
  CHECK(alloc.allocate(MiB, -1).error().code == Errc::out_of_range);
  for (int c = 0; c < 8; ++c) {
    CHECK(alloc.pool(c).stats().bytes_reserved == 0);
  }
  CHECK(alloc.deallocate(BorrowHandle{9, 0, nullptr, 1}).error() == Errc::out_of_range);

  // Cards with room that the strategy rules out are named in the message, with the reason.
  BorrowingAllocator strict(dgx1(), distinct_cards(4 * MiB), carve::ThresholdMostFree{100.0, true}, options);
  const auto local = strict.allocate(3 * MiB, 0);
  REQUIRE(local);
  const auto declined = strict.allocate(3 * MiB, 0);
  REQUIRE_FALSE(declined);
  CHECK(declined.error().code == Errc::no_space);
  CHECK(declined.error().message.starts_with("no card can lend 3.0 MiB to GPU0: GPU1 has room but the "
                                             "threshold-most-free strategy declines it (20 GB/s); GPU2 has room"));
  CHECK(declined.error().message.ends_with("(largest free block per card: GPU0 1.0 MiB, GPU1 4.0 MiB, GPU2 4.0 MiB, "
                                           "GPU3 4.0 MiB, GPU4 4.0 MiB, GPU5 4.0 MiB, GPU6 4.0 MiB, GPU7 4.0 MiB)"));
  CHECK(strict.deallocate(*local));
  CHECK_THROWS_AS(BorrowingAllocator(dgx1(), std::vector<SimulatedCard>(3, SimulatedCard(MiB))), std::invalid_argument);
}

// A card whose free-memory figure can be stale, as cudaMemGetInfo's is when other processes
// allocate on the same GPU.
struct StaleCard {
  SimulatedCard card;
  bool stale = false; // reports its whole capacity as free
  void* try_allocate(std::size_t bytes, std::size_t alignment) noexcept { return card.try_allocate(bytes, alignment); }
  void deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept { card.deallocate(p, bytes, alignment); }
  std::size_t free_bytes() const { return stale ? card.capacity() : card.free_bytes(); }
  std::size_t capacity() const { return card.capacity(); }
};
static_assert(carve::UpstreamResource<StaleCard>);

TEST_CASE("a card that turns out full after the pick is struck off and the pick repeated") {
  std::vector<StaleCard> stale;
  for (int i = 0; i < 8; ++i) {
    stale.push_back(StaleCard{SimulatedCard(8 * MiB), i == 3});
  }
  SimulatedCard gpu3 = stale[3].card;
  void* taken = gpu3.try_allocate(7 * MiB, 512); // another process fills GPU3
  BorrowingAllocator alloc(dgx1(), stale, carve::LargestBandwidth{}, options);
  const auto a = alloc.allocate(8 * MiB, 0);
  REQUIRE(a);
  CHECK(a->card == 0);
  const auto b = alloc.allocate(4 * MiB, 0);
  REQUIRE(b);
  CHECK(b->card == 4); // GPU3 looked best but had nothing; GPU4 is next at 40 GB/s, one hop
  CHECK(alloc.pool(3).stats().upstream_failures == 2);
  CHECK(alloc.deallocate(*a));
  CHECK(alloc.deallocate(*b));
  gpu3.deallocate(taken, 7 * MiB, 512);
}

TEST_CASE("threads allocating and freeing across cards: nothing lost, nothing handed out twice") {
  BorrowingAllocator alloc(dgx1(), distinct_cards(24 * MiB), carve::WeightedScore{}, options);
  constexpr int threads = 8;
  std::atomic<int> failures{0};
  std::atomic<int> borrowed{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      std::mt19937 rng(static_cast<std::uint32_t>(t) + 1);
      std::vector<std::pair<BorrowHandle, unsigned char>> mine;
      for (int step = 0; step < 1500; ++step) {
        if (rng() % 3 != 0 || mine.empty()) {
          const std::size_t bytes = 1 + rng() % (2 * MiB);
          const int card = t % 2 == 0 ? 0 : static_cast<int>(rng() % 8); // half the threads crowd GPU0
          const auto h = alloc.allocate(bytes, card);
          if (!h) {
            CHECK(h.error().code == Errc::no_space);
            continue;
          }
          const auto pattern = static_cast<unsigned char>(t * 16 + step % 16);
          std::memset(h->address, pattern, h->size);
          borrowed += h->borrowed() ? 1 : 0;
          mine.emplace_back(*h, pattern);
        } else {
          const std::size_t i = rng() % mine.size();
          const auto& [h, pattern] = mine[i];
          const auto* bytes = static_cast<const unsigned char*>(h.address);
          if (bytes[0] != pattern || bytes[h.size - 1] != pattern) {
            ++failures; // someone else was handed the same memory
          }
          if (!alloc.deallocate(h)) {
            ++failures;
          }
          mine[i] = mine.back();
          mine.pop_back();
        }
      }
      for (const auto& [h, pattern] : mine) {
        if (!alloc.deallocate(h)) {
          ++failures;
        }
      }
    });
  }
  for (auto& th : pool) {
    th.join();
  }
  CHECK(failures == 0);
  CHECK(borrowed > 0);
  for (int c = 0; c < 8; ++c) {
    CHECK(alloc.pool(c).stats().bytes_in_use == 0);
    CHECK(alloc.pool(c).consistent());
    alloc.pool(c).trim();
    CHECK(alloc.pool(c).upstream().used_bytes() == 0);
  }
}

TEST_CASE("one pool, many threads") {
  CachingPool pool(SimulatedCard(64 * MiB),
                   PoolOptions{.granularity = 256, .segment_size = 512 * 1024, .idle_threshold = 8 * MiB});
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(static_cast<std::uint32_t>(t) * 7 + 3);
      std::vector<std::pair<void*, std::size_t>> mine;
      for (int step = 0; step < 3000; ++step) {
        if (rng() % 2 == 0 || mine.empty()) {
          const std::size_t bytes = 1 + rng() % (256 * 1024);
          if (const auto p = pool.try_allocate(bytes)) {
            std::memset(*p, t, bytes);
            mine.emplace_back(*p, bytes);
          }
        } else {
          const auto [p, bytes] = mine.back();
          mine.pop_back();
          if (static_cast<unsigned char*>(p)[bytes - 1] != t || !pool.try_deallocate(p, bytes)) {
            ++failures;
          }
        }
        if (step % 500 == 0) {
          pool.trim(4 * MiB);
        }
      }
      for (const auto& [p, bytes] : mine) {
        if (!pool.try_deallocate(p, bytes)) {
          ++failures;
        }
      }
    });
  }
  for (auto& th : threads) {
    th.join();
  }
  CHECK(failures == 0);
  CHECK(pool.consistent());
  CHECK(pool.stats().bytes_in_use == 0);
}
