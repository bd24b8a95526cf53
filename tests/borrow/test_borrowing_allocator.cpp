#include "support/errors.hpp"
#include "support/topology_data.hpp"

#include <carve/borrow.hpp>
#include <carve/mr.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <utility>
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

const PoolOptions options{.granularity = 512, .segment_size = 1 * MiB};

using Pool = CachingPool<SimulatedCard>;
using Borrower = BorrowingAllocator<Pool>;
template <class Strategy>
using BorrowerWith = BorrowingAllocator<Pool, Strategy>;

// A pool over a fresh card of `each` bytes for every GPU.
auto pools(std::size_t each) {
  return [each](int) { return Pool(SimulatedCard(each), options); };
}

// Every card's pool holds nothing, and its card has all its memory back.
template <class B>
bool all_back(B& alloc) {
  bool ok = alloc.live_blocks() == 0;
  for (int c = 0; c < alloc.card_count(); ++c) {
    ok &= alloc.resource(c).stats().bytes_in_use == 0 && alloc.resource(c).consistent();
    alloc.resource(c).trim();
    ok &= alloc.resource(c).upstream().used_bytes() == 0;
  }
  return ok;
}

} // namespace

TEST_CASE("peer access: switched on once per pair before its first borrow; unmappable lenders are skipped") {
  // GPU3 cannot map GPU0 (as if cudaDeviceCanAccessPeer said so); every other pair can.
  std::vector<std::vector<bool>> can(8, std::vector<bool>(8, true));
  can[0][3] = false;
  using Mapped = BorrowingAllocator<Pool, carve::LargestBandwidth, carve::SimulatedPeerAccess>;
  Mapped alloc(dgx1(), pools(16 * MiB), {}, 1024, carve::SimulatedPeerAccess(can));
  const auto local = alloc.borrow_explained(0, 12 * MiB, 256);
  REQUIRE(local);
  CHECK(alloc.peer_access().enable_calls(0, 0) == 0); // a card's own memory needs nothing
  // GPU3 is 40 GB/s away but cannot be mapped: GPU4, the other NV2 peer, lends.
  CHECK(alloc.picker().bandwidth(0, 3) == 0.0);
  const auto a = alloc.borrow_explained(0, 8 * MiB, 256);
  const auto b = alloc.borrow_explained(0, 6 * MiB, 256);
  REQUIRE(a);
  REQUIRE(b);
  CHECK(a->card == 4);
  CHECK(b->card == 4);
  CHECK(alloc.peer_access().enable_calls(0, 4) == 1); // once for the pair, not per borrow
  CHECK(alloc.peer_access().enable_calls(0, 3) == 0);
  // With only GPU3 holding room, GPU0 is refused, and the message says why.
  const auto full = alloc.borrow_explained(0, 8 * MiB, 256);
  const auto c = alloc.borrow_explained(0, 5 * MiB, 256); // GPU4 has 2 MiB left
  REQUIRE(full);
  CHECK(full->card == 1);
  std::vector<BorrowHandle> fill;
  for (int card : {0, 1, 2, 4, 5, 6, 7}) {
    while (auto h = alloc.borrow_explained(card, MiB, 256)) {
      if (h->card != card) {
        REQUIRE(alloc.give_back(*h));
        break;
      }
      fill.push_back(*h);
    }
  }
  const auto refused = alloc.borrow_explained(0, MiB, 256);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().code == Errc::no_space);
  CHECK(refused.error().message.find("GPU3 has room but GPU0 cannot map its memory (no peer access between them)") !=
        std::string::npos);
  CHECK(alloc.card(0).try_allocate(MiB, 256).error() == Errc::no_space); // so a fallback takes it
  for (const auto& h : fill) {
    REQUIRE(alloc.give_back(h));
  }
  for (const auto* h : {&local, &a, &b, &full, &c}) {
    if (*h) {
      REQUIRE(alloc.give_back(**h));
    }
  }
  CHECK(all_back(alloc));
}

TEST_CASE("a full card borrows from its best-linked peer") {
  Borrower alloc(dgx1(), pools(16 * MiB));
  std::vector<carve::BorrowDecision> decisions;
  alloc.on_decision([&](const carve::BorrowDecision& d) { decisions.push_back(d); });

  const auto local = alloc.borrow_explained(0, 12 * MiB, 256);
  REQUIRE(local);
  CHECK(local->card == 0);
  CHECK_FALSE(local->borrowed());
  const auto spill = alloc.borrow_explained(0, 8 * MiB, 256); // 4 MiB left on GPU0
  REQUIRE(spill);
  CHECK(spill->card == 3); // NV2, direct: the widest and closest
  CHECK(spill->requester == 0);
  CHECK(spill->borrowed());
  REQUIRE(decisions.size() == 2);
  CHECK(decisions[1].lender == 3);
  CHECK(decisions[1].bandwidth_gbps == 40.0);
  CHECK(decisions[1].bandwidths[5] == 10.0); // a direct system path: no GPU relays a peer's loads
  CHECK(decisions[1].cards[0].largest_free_block == 4 * MiB);
  CHECK(alloc.history().count(0, 3) == 1);
  // The borrowed memory is real and belongs to GPU3's pool.
  std::memset(spill->address, 0x5a, spill->size);
  CHECK(alloc.resource(3).stats().bytes_in_use == 8 * MiB);
  CHECK(alloc.give_back(*spill));
  CHECK(alloc.resource(3).stats().bytes_in_use == 0);
  CHECK(alloc.give_back(*spill).error() == Errc::not_allocated);
  BorrowHandle resized = *local;
  resized.size -= 1;
  CHECK(alloc.give_back(resized).error() == Errc::invalid_size);
  BorrowHandle elsewhere = *local;
  elsewhere.card = 1;
  CHECK(alloc.give_back(elsewhere).error() == Errc::not_allocated);
  CHECK(alloc.give_back(*local));
  CHECK(all_back(alloc));
}

TEST_CASE("errors name the problem and allocate nothing") {
  Borrower alloc(dgx1(), pools(4 * MiB));
  auto r = alloc.borrow_explained(0, 5 * MiB, 256);
  REQUIRE_FALSE(r);
  CHECK(r.error().code == Errc::no_space);
  CHECK(r.error().message ==
        "no card can hold 5.0 MiB (largest free block per card: GPU0 4.0 MiB, GPU1 4.0 MiB, GPU2 4.0 MiB, GPU3 4.0 "
        "MiB, GPU4 4.0 MiB, GPU5 4.0 MiB, GPU6 4.0 MiB, GPU7 4.0 MiB)");
  CHECK(alloc.borrow_explained(0, 0, 256).error().code == Errc::invalid_size);
  CHECK(alloc.borrow_explained(0, MiB, 3).error().code == Errc::invalid_size);    // not a power of two
  CHECK(alloc.borrow_explained(0, SIZE_MAX, 256).error().code == Errc::no_space); // larger than any card could hold
  CHECK(alloc.borrow_explained(8, MiB, 256).error().code == Errc::out_of_range);
  CHECK(alloc.borrow_explained(-1, MiB, 256).error().code == Errc::out_of_range);
  for (int c = 0; c < 8; ++c) {
    CHECK(alloc.resource(c).stats().bytes_reserved == 0);
  }
  CHECK(alloc.give_back(BorrowHandle{9, 0, nullptr, 1}).error() == Errc::out_of_range);
  CHECK(all_back(alloc));
}

TEST_CASE("card indices are checked: card, peers and resource throw carve::Exception (out_of_range)") {
  Borrower alloc(dgx1(), pools(4 * MiB));
  // card(8) was a handle whose free_bytes() read past the picker's bandwidth table.
  CHECK_THROWS_ERRC(Errc::out_of_range, alloc.card(8));
  CHECK_THROWS_ERRC(Errc::out_of_range, alloc.card(-1));
  CHECK_THROWS_ERRC(Errc::out_of_range, alloc.peers(8));
  CHECK_THROWS_ERRC(Errc::out_of_range, alloc.resource(8)); // std::out_of_range (vector::at) before
  CHECK_THROWS_ERRC(Errc::out_of_range, std::as_const(alloc).resource(-1));
  CHECK(carve::test::thrown_message([&] { (void)alloc.card(8); }) ==
        "carve::BorrowingAllocator::card: no card 8 (the machine has 8)");
  CHECK(alloc.card(7).requester() == 7);
  CHECK(alloc.card(7).free_bytes() == 8 * 4 * MiB); // GPU7 reaches every card of a DGX-1
  CHECK(alloc.peers(7).free_bytes() == 7 * 4 * MiB);
  carve::TopologyBuilder cpu_only;
  cpu_only.add_cpu("CPU0");
  CHECK(carve::test::thrown_message([&] { Borrower none(cpu_only.build(), pools(MiB)); }) ==
        "carve::BorrowingAllocator: the topology has no GPUs");

  // Cards with room that the strategy rules out are named in the message, with the reason.
  BorrowerWith<carve::ThresholdMostFree> strict(dgx1(), pools(4 * MiB), carve::ThresholdMostFree{100.0, true});
  const auto local = strict.borrow_explained(0, 3 * MiB, 256);
  REQUIRE(local);
  const auto declined = strict.borrow_explained(0, 3 * MiB, 256);
  REQUIRE_FALSE(declined);
  CHECK(declined.error().code == Errc::no_space);
  CHECK(declined.error().message.starts_with("no card can lend 3.0 MiB to GPU0: GPU1 has room but the "
                                             "threshold-most-free strategy declines it (20 GB/s); GPU2 has room"));
  CHECK(declined.error().message.ends_with("(largest free block per card: GPU0 1.0 MiB, GPU1 4.0 MiB, GPU2 4.0 MiB, "
                                           "GPU3 4.0 MiB, GPU4 4.0 MiB, GPU5 4.0 MiB, GPU6 4.0 MiB, GPU7 4.0 MiB)"));
  CHECK(strict.card(0).explain_no_pick(3 * MiB) == declined.error().message);
  CHECK(strict.give_back(*local));
  CHECK(all_back(strict));
  CHECK_THROWS_ERRC(carve::Errc::invalid_argument,
                    BorrowingAllocator<SimulatedCard>(dgx1(), std::vector<SimulatedCard>(3, SimulatedCard(MiB))));
}

// A card whose free-memory figure can be stale, as cudaMemGetInfo's is when other processes
// allocate on the same GPU.
struct StaleCard {
  SimulatedCard card;
  bool stale = false; // reports its whole capacity as free
  cuda::std::expected<void*, Errc> try_allocate(std::size_t bytes, std::size_t alignment) noexcept {
    return card.try_allocate(bytes, alignment);
  }
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
  void* taken = *gpu3.try_allocate(7 * MiB, 512); // another process fills GPU3
  BorrowingAllocator<CachingPool<StaleCard>> alloc(
      dgx1(), [&](int gpu) { return CachingPool<StaleCard>(stale[static_cast<std::size_t>(gpu)], options); });
  const auto a = alloc.borrow_explained(0, 8 * MiB, 256);
  REQUIRE(a);
  CHECK(a->card == 0);
  const auto b = alloc.borrow_explained(0, 6 * MiB, 256);
  REQUIRE(b);
  CHECK(b->card == 4); // GPU3 looked best but had nothing; GPU4 is next at 40 GB/s, one hop
  // GPU3 refused a shared 20 MiB segment, then the request's own, then (its cache given back) exactly it.
  CHECK(alloc.resource(3).stats().upstream_failures == 3);
  CHECK(alloc.give_back(*a));
  CHECK(alloc.give_back(*b));
  gpu3.deallocate(taken, 7 * MiB, 512);
}

TEST_CASE("threads allocating and freeing across cards: nothing lost, nothing handed out twice") {
  BorrowerWith<carve::WeightedScore> alloc(dgx1(), pools(24 * MiB));
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
          const auto h = alloc.borrow_explained(card, bytes, 256);
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
          if (!alloc.give_back(h)) {
            ++failures;
          }
          mine[i] = mine.back();
          mine.pop_back();
        }
      }
      for (const auto& [h, pattern] : mine) {
        if (!alloc.give_back(h)) {
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
  CHECK(all_back(alloc));
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
          if (const auto p = pool.try_allocate(bytes, 256)) {
            std::memset(*p, t, bytes);
            mine.emplace_back(*p, bytes);
          }
        } else {
          const auto [p, bytes] = mine.back();
          mine.pop_back();
          if (static_cast<unsigned char*>(p)[bytes - 1] != t || !pool.try_deallocate(p, bytes, 256)) {
            ++failures;
          }
        }
        if (step % 500 == 0) {
          pool.trim(4 * MiB);
        }
      }
      for (const auto& [p, bytes] : mine) {
        if (!pool.try_deallocate(p, bytes, 256)) {
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

TEST_CASE("borrower.card(i) is a memory resource a pool stacks on") {
  Borrower borrower(dgx1(), pools(4 * MiB));
  static_assert(carve::UpstreamResource<decltype(borrower.card(0))>);
  static_assert(carve::OwnsMemory<decltype(borrower.card(0))>);
  // GPU0's working pool takes its segments from GPU0's memory, then from GPU0's best peers.
  CachingPool pool(borrower.card(0), PoolOptions{.granularity = 512, .segment_size = 2 * MiB});
  std::vector<void*> blocks;
  for (int i = 0; i < 6; ++i) {
    const auto p = pool.try_allocate(2 * MiB, 256);
    REQUIRE(p);
    std::memset(*p, i, 2 * MiB);
    blocks.push_back(*p);
  }
  // 12 MiB for GPU0, which has 4: the rest is on its NV2 peers first (GPU3, GPU4).
  CHECK(borrower.resource(0).stats().bytes_in_use == 4 * MiB);
  CHECK(borrower.resource(3).stats().bytes_in_use + borrower.resource(4).stats().bytes_in_use == 8 * MiB);
  CHECK(borrower.history().count(0, 3) + borrower.history().count(0, 4) == 4);
  CHECK(borrower.card(0).owns(blocks[5]));
  CHECK_FALSE(borrower.card(1).owns(blocks[5])); // handed out for GPU0, not GPU1
  for (void* p : blocks) {
    pool.deallocate(p, 2 * MiB, 256);
  }
  CHECK(pool.trim() == 12 * MiB);
  CHECK(all_back(borrower));
}

TEST_CASE("peers(i) never takes card i's own memory") {
  Borrower borrower(dgx1(), pools(4 * MiB));
  auto peers = borrower.peers(0);
  const auto p = peers.try_allocate(MiB, 256);
  REQUIRE(p);
  CHECK(borrower.resource(0).stats().bytes_in_use == 0);
  CHECK(borrower.resource(3).stats().bytes_in_use == MiB); // NV2: the widest link
  CHECK(peers.free_bytes() == 7 * 4 * MiB - MiB);          // every peer GPU0 reaches, not GPU0
  CHECK(borrower.card(0).free_bytes() == 8 * 4 * MiB - MiB);
  peers.deallocate(*p, MiB, 256);
  CHECK(all_back(borrower));
}

TEST_CASE("a card resource refuses bad input and changes nothing") {
  Borrower borrower(dgx1(), pools(4 * MiB));
  auto gpu0 = borrower.card(0);
  CHECK(gpu0.try_allocate(0, 256).error() == Errc::invalid_size);
  CHECK(gpu0.try_allocate(64, 24).error() == Errc::invalid_size);
  CHECK(gpu0.try_allocate(64 * MiB, 256).error() == Errc::no_space); // more than all cards together
  const auto p = gpu0.try_allocate(1000, 256);
  REQUIRE(p);
  CHECK(gpu0.try_deallocate(*p, 999, 256).error() == Errc::invalid_size);
  CHECK(gpu0.try_deallocate(*p, 1000, 512).error() == Errc::invalid_size);
  CHECK(borrower.card(1).try_deallocate(*p, 1000, 256).error() == Errc::not_allocated); // not GPU1's
  int local = 0;
  CHECK(gpu0.try_deallocate(&local, 4, 4).error() == Errc::not_allocated);
  CHECK(borrower.live_blocks() == 1);
  CHECK(gpu0.try_deallocate(*p, 1000, 256));
  CHECK(gpu0.try_deallocate(*p, 1000, 256).error() == Errc::not_allocated); // a double free
  CHECK(all_back(borrower));
}

TEST_CASE("the local pool first, then memory borrowed from peers, as one fallback stack") {
  Borrower borrower(dgx1(), pools(4 * MiB));
  carve::FallbackResource<carve::ResourceRef<Pool>, Borrower::Card> gpu0(carve::ref(borrower.resource(0)),
                                                                         borrower.peers(0));
  std::vector<void*> blocks;
  for (int i = 0; i < 5; ++i) {
    const auto p = gpu0.try_allocate(MiB, 256);
    REQUIRE(p);
    blocks.push_back(*p);
  }
  CHECK(gpu0.primary().get().stats().bytes_in_use == 4 * MiB); // GPU0 full
  CHECK(borrower.live_blocks() == 1);                          // one block borrowed
  for (void* p : blocks) {
    gpu0.deallocate(p, MiB, 256);
  }
  CHECK(all_back(borrower));
}

TEST_CASE("threads allocating through card resources: nothing lost, nothing handed out twice") {
  Borrower borrower(dgx1(), pools(8 * MiB));
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      auto card = borrower.card(t % 2);
      std::mt19937 rng(static_cast<std::uint32_t>(t) + 11);
      std::vector<std::pair<unsigned char*, std::size_t>> mine;
      for (int step = 0; step < 1000; ++step) {
        if (rng() % 3 != 0 || mine.empty()) {
          const std::size_t bytes = 1 + rng() % (512 * 1024);
          if (const auto p = card.try_allocate(bytes, 256)) {
            std::memset(*p, t + 1, bytes);
            mine.emplace_back(static_cast<unsigned char*>(*p), bytes);
          }
        } else {
          const auto [p, bytes] = mine.back();
          mine.pop_back();
          if (p[0] != t + 1 || p[bytes - 1] != t + 1 || !card.try_deallocate(p, bytes, 256)) {
            ++failures;
          }
        }
      }
      for (const auto& [p, bytes] : mine) {
        card.deallocate(p, bytes, 256);
      }
    });
  }
  for (auto& th : threads) {
    th.join();
  }
  CHECK(failures == 0);
  CHECK(all_back(borrower));
}

TEST_CASE("SimulatedPeerAccess::enable_calls checks its cards and throws carve's exception") {
  carve::SimulatedPeerAccess peers({{true, true}, {true, true}});
  CHECK(peers.enable(0, 1).has_value());
  CHECK(peers.enable_calls(0, 1) == 1);
  // Was vector::at: std::out_of_range, which carve never throws.
  CHECK(carve::test::thrown_code([&] { (void)peers.enable_calls(0, 2); }) == Errc::out_of_range);
  CHECK(carve::test::thrown_message([&] { (void)peers.enable_calls(-1, 0); }).find("no card -1") != std::string::npos);
}
