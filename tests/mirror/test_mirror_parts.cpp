// PagedMirror's parts on their own: DynamicSlotAllocator against the reference allocator, the
// word walk, page bits, the page table and segment cutting, placement policies, the dispatcher.
#include "slot/reference.hpp"
#include "support/errors.hpp"

#include <carve/mirror.hpp>

#include <doctest/doctest.h>

#include <random>
#include <set>
#include <vector>

using carve::DynamicSlotAllocator;
using carve::Errc;
using carve::SlotRange;
using namespace carve::test;

namespace {

// Random allocate/free against the brute-force model: same answers, same state, every step.
template <class Fit>
void replay(std::uint32_t n, std::uint64_t seed) {
  DynamicSlotAllocator<Fit> slots(n);
  Slots model(n, true);
  std::vector<SlotRange> held;
  std::mt19937_64 rng(seed);
  for (int step = 0; step < 3000; ++step) {
    if (held.empty() || rng() % 3 != 0) {
      const std::uint32_t m = std::uniform_int_distribution<std::uint32_t>(0, std::min<std::uint32_t>(n + 1, 300))(rng);
      const auto expected = m == 0 || m > n ? std::nullopt : ref_find<Fit>(model, m);
      const auto got = slots.allocate(m);
      if (m == 0 || m > n) {
        REQUIRE_FALSE(got);
        CHECK(got.error() == Errc::invalid_size);
        continue;
      }
      REQUIRE(got.has_value() == expected.has_value());
      if (got) {
        REQUIRE(got->first == *expected);
        for (std::uint32_t s = got->first; s < got->end(); ++s) {
          model[s] = false;
        }
        held.push_back(*got);
      } else {
        CHECK(got.error() == Errc::no_space);
      }
    } else {
      const std::size_t i = rng() % held.size();
      REQUIRE(slots.deallocate(held[i]));
      CHECK(slots.deallocate(held[i]).error() == Errc::not_allocated);
      for (std::uint32_t s = held[i].first; s < held[i].end(); ++s) {
        model[s] = true;
      }
      held.erase(held.begin() + static_cast<std::ptrdiff_t>(i));
    }
    std::uint32_t free = 0;
    for (std::uint32_t s = 0; s < n; ++s) {
      free += model[s] ? 1u : 0u;
    }
    REQUIRE(slots.free_count() == free);
    if (step % 97 == 0) {
      for (std::uint32_t s = 0; s < n; ++s) {
        REQUIRE(slots.is_free(s) == model[s]);
      }
      std::uint32_t largest = 0;
      for (const SlotRange r : ref_free_runs(model)) {
        largest = std::max(largest, r.count);
      }
      CHECK(slots.largest_free_run() == largest);
    }
  }
}

// A fit policy that always proposes slot 0, free or not.
struct Liar {
  template <carve::WordSource W>
  cuda::std::optional<std::uint32_t> find_in(const W&, std::uint32_t, std::uint32_t) const {
    return 0u;
  }
  template <std::uint32_t N>
  cuda::std::optional<std::uint32_t> find(const carve::SlotBitmap<N>&, std::uint32_t) const {
    return 0u;
  }
};

} // namespace

TEST_CASE("DynamicSlotAllocator gives SlotAllocator's answers for sizes chosen at run time") {
  std::uint64_t seed = 11;
  for (const std::uint32_t n : {1u, 63u, 64u, 65u, 130u, 1000u, 5000u}) {
    CAPTURE(n);
    replay<carve::FirstFit>(n, seed++);
    replay<carve::LastFit>(n, seed++);
    replay<carve::BestFit>(n, seed++);
    replay<carve::BoundaryNearestFit>(n, seed++);
  }
}

TEST_CASE("DynamicSlotAllocator: bad input is an error value and changes nothing") {
  CHECK_THROWS_ERRC(carve::Errc::invalid_argument, DynamicSlotAllocator<>(0));
  DynamicSlotAllocator<> slots(100);
  const auto a = slots.allocate(10);
  REQUIRE(a);
  CHECK(slots.deallocate({95, 10}).error() == Errc::out_of_range);
  CHECK(slots.deallocate({0xffffffffu, 2}).error() == Errc::out_of_range); // wraps
  CHECK(slots.deallocate({a->first, 0}).error() == Errc::invalid_size);
  CHECK(slots.deallocate({a->first, a->count + 1}).error() == Errc::not_allocated); // partly free
  CHECK(slots.free_count() == 90);
  CHECK(slots.allocate(91).error() == Errc::no_space);
  CHECK(slots.allocate(101).error() == Errc::invalid_size);
  DynamicSlotAllocator<Liar> lied_to(10);
  CHECK(lied_to.allocate(2));
  CHECK(lied_to.allocate(2).error() == Errc::invalid_placement);
  CHECK(lied_to.free_count() == 8);
}

TEST_CASE("word_masks walks a range word by word, as for_each_word_mask does") {
  for (const SlotRange r : {SlotRange{0, 0}, SlotRange{0, 1}, SlotRange{3, 61}, SlotRange{3, 62}, SlotRange{63, 2},
                            SlotRange{64, 64}, SlotRange{10, 300}}) {
    std::vector<std::pair<std::uint32_t, carve::bits::word>> walk;
    for (const carve::WordMask w : carve::word_masks(r)) {
      walk.emplace_back(w.word, w.mask);
    }
    std::vector<std::pair<std::uint32_t, carve::bits::word>> expected;
    carve::for_each_word_mask(r, [&](std::uint32_t k, carve::bits::word m) { expected.emplace_back(k, m); });
    CHECK(walk == expected);
  }
}

TEST_CASE("AtomicPageBits: set, clear, take and count across word boundaries") {
  carve::AtomicPageBits bits(200);
  bits.set({60, 10});
  bits.set({150, 50});
  CHECK(bits.count({0, 200}) == 60);
  CHECK(bits.test(69));
  CHECK_FALSE(bits.test(70));
  CHECK(bits.take(1, carve::bits::low_mask(3)) == 0b111); // pages 64-66
  CHECK(bits.count({60, 10}) == 7);
  bits.clear({150, 25});
  CHECK(bits.count({0, 200}) == 32);
  CHECK(bits.take(3) == carve::bits::low_mask(200 - 192)); // pages 192-199
  CHECK(bits.count({0, 200}) == 24);
}

TEST_CASE("the page table maps host pages and segments coalesce only what is contiguous on both sides") {
  carve::PageTable table(16);
  CHECK_FALSE(table.find(3));
  // host 0-3 -> device 1 pages 10-13; host 4-5 -> device 0 pages 0-1; host 6 -> device 0 page 5;
  // host 7 -> device 0 page 6
  for (std::uint32_t p = 0; p < 4; ++p) {
    table.map(p, {1, 10 + p});
  }
  table.map(4, {0, 0});
  table.map(5, {0, 1});
  table.map(6, {0, 5});
  table.map(7, {0, 6});
  CHECK(*table.find(2) == carve::PageLocation{1, 12});
  std::vector<carve::DeviceSegment> segs;
  carve::for_each_device_segment(table, {1, 7}, [&](const carve::DeviceSegment& s) { segs.push_back(s); });
  const std::vector<carve::DeviceSegment> expected{{1, 1, 11, 3}, {0, 4, 0, 2}, {0, 6, 5, 2}};
  CHECK(segs == expected);
  table.unmap({0, 8});
  CHECK_FALSE(table.find(0));
}

TEST_CASE("placement policies on device states") {
  const std::vector<carve::DevicePageState> states{{5, 10, true}, {0, 10, true}, {20, 20, false}, {7, 7, true}};
  const carve::PlacementRequest r{.pages = 10, .page_size = 4096, .priority = 0, .near = std::nullopt};
  const auto fill = carve::FillPlacement{}.place(r, states);
  REQUIRE(fill);
  CHECK(*fill == carve::PlacementPlan{{0, 5}, {3, 5}});
  carve::StripePlacement stripe{.stripe_pages = 2, .next_device = 3};
  const auto s = stripe.place(r, states);
  REQUIRE(s);
  CHECK(*s == carve::PlacementPlan{{3, 2}, {0, 2}, {3, 2}, {0, 2}, {3, 2}}); // 1 is full, 2 unavailable
  CHECK(stripe.next_device == 0);
  CHECK(carve::FillPlacement{}.place({.pages = 13, .page_size = 4096, .priority = 0, .near = {}}, states).error() ==
        Errc::no_space);
  CHECK(stripe.place({.pages = 13, .page_size = 4096, .priority = 0, .near = {}}, states).error() == Errc::no_space);
}

TEST_CASE("PriorityDispatcher: priority order, strict or backfilling, partitions of units") {
  std::vector<carve::DeviceInfo> devices(2);
  devices[0].compute_units = 8;
  devices[1].compute_units = 4;
  carve::PriorityDispatcher strict(devices);
  const auto a = *strict.submit({.priority = 1, .compute_units = 6});
  const auto b = *strict.submit({.priority = 2, .compute_units = 6});
  const auto c = *strict.submit({.priority = 1, .compute_units = 2});
  CHECK(strict.submit({.priority = 0, .compute_units = 9}).error() == Errc::invalid_size);
  auto g = strict.dispatch();
  REQUIRE(g.size() == 1); // b (priority 2) on device 0; a cannot fit anywhere now, c waits behind it
  CHECK(g[0].ticket == b);
  CHECK(g[0].device == 0);
  CHECK(g[0].units == SlotRange{0, 6});
  CHECK(strict.queued() == 2);
  REQUIRE(strict.release(g[0]));
  CHECK(strict.release(g[0]).error() == Errc::not_allocated);
  g = strict.dispatch();
  REQUIRE(g.size() == 2);
  CHECK(g[0].ticket == a);
  CHECK(g[1].ticket == c); // equal priority: submission order
  CHECK(g[1].device == 1); // device 1 has 4 free, device 0 only 2: least loaded

  carve::PriorityDispatcher backfill(devices, carve::DispatchOrder::backfill);
  const auto big = *backfill.submit({.priority = 5, .compute_units = 0}); // a whole device
  const auto small = *backfill.submit({.priority = 1, .compute_units = 3});
  // The head is refused (say its memory does not fit): backfilling serves the next one anyway.
  g = backfill.dispatch([&](const carve::ComputeGrant& grant) { return grant.ticket != big; });
  REQUIRE(g.size() == 1);
  CHECK(g[0].ticket == small);
  CHECK(g[0].device == 0);
  g = backfill.dispatch();
  REQUIRE(g.size() == 1);
  CHECK(g[0].ticket == big);
  CHECK(g[0].device == 1); // the only device still wholly free
  CHECK(g[0].units == SlotRange{0, 4});
  CHECK(backfill.cancel(small).error() == Errc::not_allocated);
  const auto waiting = *backfill.submit({.priority = 0, .compute_units = 8});
  CHECK(backfill.dispatch().empty());
  CHECK(backfill.cancel(waiting));
  CHECK(backfill.queued() == 0);
}
