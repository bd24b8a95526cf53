// PagedMirror's parts on their own: DynamicSlotAllocator against the reference allocator, the
// word walk, page bits, the page table and segment cutting, placement policies, the dispatcher.
#include "slot/reference.hpp"
#include "support/errors.hpp"
#include "support/topology_data.hpp"

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
        CHECK(got.error() == (m == 0 ? Errc::invalid_size : Errc::no_space));
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
  CHECK(slots.allocate(101).error() == Errc::no_space);
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

TEST_CASE("PickerPlacement: a refused request leaves nothing in the history that steers later ones") {
  // GPU0 cannot map GPU5's memory; GPU3 and GPU4 are equally near it, one page free on each.
  const auto make = [] {
    carve::BandwidthWeightedPicker<carve::WeightedScore> picker(carve::test::dgx1(), {},
                                                                [](int r, int l) { return !(r == 0 && l == 5); });
    return carve::PickerPlacement<carve::WeightedScore>(picker, 0, 64);
  };
  constexpr std::size_t page = 2 << 20;
  std::vector<carve::DevicePageState> devices(8, carve::DevicePageState{0, 100, true});
  devices[3].free_pages = 1;
  devices[4].free_pages = 1;
  devices[5].free_pages = 10;
  auto fresh = make();
  const auto first = fresh.place({.pages = 1, .page_size = page}, devices);
  REQUIRE(first);
  auto refused = make();
  auto only_gpu3 = devices;
  only_gpu3[4].free_pages = 0;
  CHECK(refused.place({.pages = 5, .page_size = page}, only_gpu3).error() == Errc::no_space);
  const auto after = refused.place({.pages = 1, .page_size = page}, devices);
  REQUIRE(after);
  CHECK((*after)[0].device == (*first)[0].device); // as if the refused request had never come
}

TEST_CASE("PriorityDispatcher: priority order, strict or backfilling, partitions of units") {
  std::vector<carve::DeviceInfo> devices(2);
  devices[0].compute_units = 8;
  devices[1].compute_units = 4;
  carve::PriorityDispatcher strict(devices);
  const auto a = *strict.submit({.priority = 1, .compute_units = 6});
  const auto b = *strict.submit({.priority = 2, .compute_units = 6});
  const auto c = *strict.submit({.priority = 1, .compute_units = 2});
  CHECK(strict.submit({.priority = 0, .compute_units = 9}).error() == Errc::no_space);
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

// The driver's partition rules (CUDA driver API, "Green Contexts"), as the twin applies them.
static_assert(carve::green_context_granule(5, 2) == 0); // no green contexts before 6.0
static_assert(carve::green_context_granule(6, 1) == 2);
static_assert(carve::green_context_granule(7, 5) == 2);
static_assert(carve::green_context_granule(8, 0) == 4); // at least 4, a multiple of 2
static_assert(carve::green_context_granule(8, 9) == 4);
static_assert(carve::green_context_granule(9, 0) == 8);
static_assert(carve::green_context_granule(10, 0) == 8);
static_assert(carve::SmPartitioner<carve::AdvisorySmLedger> && carve::SmPartitioner<carve::SimulatedGreenContexts>);

namespace {

using GreenDispatcher = carve::PriorityDispatcher<carve::SimulatedGreenContexts>;

std::vector<carve::DeviceInfo> gpus_with_units(std::initializer_list<std::uint32_t> units) {
  std::vector<carve::DeviceInfo> devices;
  for (const std::uint32_t u : units) {
    devices.push_back({.name = "", .capacity = 0, .compute_units = u, .available = true});
  }
  return devices;
}

// Every held grant's SMs against the twin: each group of a grant belongs to one live green
// context, a different one per grant, and free + held SMs = the ledger.
void check_disjoint(GreenDispatcher& d, const std::vector<carve::ComputeGrant>& held, std::uint32_t device) {
  std::set<std::uint32_t> contexts;
  std::uint32_t held_units = 0;
  const std::uint32_t granule = d.granule(device);
  for (const carve::ComputeGrant& g : held) {
    if (g.device != device) {
      continue;
    }
    REQUIRE(g.units.first % granule == 0);
    REQUIRE(g.units.count % granule == 0);
    const std::uint32_t owner = d.partitioner().owner(device, g.units.first / granule);
    REQUIRE(owner != 0);
    CHECK(contexts.insert(owner).second); // no two grants share a green context
    for (std::uint32_t group = g.units.first / granule; group < g.units.end() / granule; ++group) {
      CHECK(d.partitioner().owner(device, group) == owner);
    }
    held_units += g.units.count;
  }
  CHECK(held_units + d.free_units(device) == d.total_units(device));
}

} // namespace

TEST_CASE("green contexts (twin): the split per architecture, rounding to whole groups, enforced or advisory") {
  // An H100 (132 SMs, 9.0), an A100 (108, 8.0), a V100 under a driver without green contexts, a
  // Maxwell card (5.2): the last two are advisory.
  carve::SimulatedGreenContexts gpus(
      {{.sm_count = 132, .cc_major = 9, .cc_minor = 0},
       {.sm_count = 108, .cc_major = 8, .cc_minor = 0},
       {.sm_count = 80, .cc_major = 7, .cc_minor = 0, .driver_has_green_contexts = false},
       {.sm_count = 24, .cc_major = 5, .cc_minor = 2}});
  const auto devices = gpus_with_units({132, 108, 80, 24});
  GreenDispatcher d(devices, carve::DispatchOrder::strict_priority, std::move(gpus));
  CHECK(d.granule(0) == 8);
  CHECK(d.total_units(0) == 128); // 16 groups of 8: the 4 SMs of the remainder are never granted
  CHECK(d.granule(1) == 4);
  CHECK(d.total_units(1) == 108);
  CHECK(d.enforced(0));
  CHECK(d.enforced(1));
  CHECK_FALSE(d.enforced(2));
  CHECK(d.granule(2) == 1);
  CHECK_FALSE(d.enforced(3));
  CHECK(d.total_units(3) == 24);
  CHECK_FALSE(d.enforced(9));

  CHECK(d.submit({.priority = 0, .compute_units = 133}).error() == Errc::no_space);
  const auto thirty = *d.submit({.priority = 3, .compute_units = 30}); // 32 on the H100: 4 groups
  const auto six = *d.submit({.priority = 2, .compute_units = 6});     // 8 on the A100: 2 groups
  const auto whole = *d.submit({.priority = 1, .compute_units = 0});   // a whole device
  const auto other = *d.submit({.priority = 0, .compute_units = 0});   // another one
  const auto g = d.dispatch();
  REQUIRE(g.size() == 4);
  CHECK(g[0].ticket == thirty);
  CHECK(g[0].device == 0); // least loaded: 128 SMs to hand out
  CHECK(g[0].units.count == 32);
  CHECK(g[0].enforced);
  CHECK(g[1].ticket == six);
  CHECK(g[1].device == 1); // least loaded now: 108 free against 96
  CHECK(g[1].units.count == 8);
  CHECK(g[1].enforced);
  CHECK(g[2].ticket == whole);
  CHECK(g[2].device == 2); // of the wholly free devices, the larger
  CHECK(g[2].units == SlotRange{0, 80});
  CHECK_FALSE(g[2].enforced);
  CHECK(g[3].ticket == other);
  CHECK(g[3].device == 3);
  CHECK(g[3].units == SlotRange{0, 24});
  CHECK_FALSE(g[3].enforced);
  CHECK(d.partitioner().live() == 4); // advisory grants have a stream of their own too
  for (std::uint32_t dev = 0; dev < 4; ++dev) {
    check_disjoint(d, g, dev);
  }
  CHECK_FALSE(d.last_error());

  // The advisory ledger enforces nothing, anywhere, and grants exact unit counts.
  carve::PriorityDispatcher ledger(devices);
  const auto t = *ledger.submit({.priority = 0, .compute_units = 10});
  const auto lg = ledger.dispatch();
  REQUIRE(lg.size() == 1);
  CHECK(lg[0].ticket == t);
  CHECK(lg[0].units.count == 10);
  CHECK_FALSE(lg[0].enforced);
  CHECK_FALSE(ledger.enforced(0));
  CHECK(ledger.stream(lg[0]).has_value());
}

TEST_CASE("green contexts (twin): SMs return only after the grant's work has completed") {
  const auto devices = gpus_with_units({64});
  GreenDispatcher d(devices, carve::DispatchOrder::strict_priority,
                    carve::SimulatedGreenContexts({{.sm_count = 64, .cc_major = 9, .cc_minor = 0}}));
  auto& gpu = d.partitioner();
  (void)*d.submit({.priority = 1, .compute_units = 40}); // 5 groups
  const auto g = d.dispatch();
  REQUIRE(g.size() == 1);
  const carve::SimulatedStream s = *d.stream(g[0]);
  for (int kernel = 0; kernel < 3; ++kernel) {
    REQUIRE(gpu.enqueue(s));
  }
  // A high-priority request that needs SMs the running work holds waits; a later, smaller one
  // with lower priority does not overtake it (strict order) though it would fit now.
  const auto urgent = *d.submit({.priority = 9, .compute_units = 48});
  const auto batch = *d.submit({.priority = 0, .compute_units = 8});
  REQUIRE(d.release(g[0]));
  CHECK(d.release(g[0]).error() == Errc::not_allocated);
  CHECK(d.stream(g[0]).error() == Errc::not_allocated); // released: no more work for it
  CHECK(d.dispatch().empty());
  CHECK(d.free_units(0) == 24);
  CHECK(d.held() == 1);
  gpu.complete(s, 2); // two of the three kernels have run
  CHECK(d.reclaim().empty());
  CHECK(d.dispatch().empty());
  CHECK(gpu.owner(0, 0) != 0);
  gpu.complete(s);                // all of it
  const auto next = d.dispatch(); // reclaims first, then serves in priority order
  REQUIRE(next.size() == 2);
  CHECK(next[0].ticket == urgent);
  CHECK(next[0].units.count == 48);
  CHECK(next[1].ticket == batch);
  check_disjoint(d, next, 0);
  CHECK(gpu.live() == 2);
  // A grant released with nothing queued returns at the next reclaim.
  REQUIRE(d.release(next[0]));
  REQUIRE(d.reclaim().size() == 1);
  CHECK(d.free_units(0) == 56);
  CHECK(gpu.enqueue(s).error().code == Errc::out_of_range); // the old stream is gone

  // run(): the work and the hand-back in one step.
  carve::SimulatedStream batch_stream{};
  REQUIRE(d.run(next[1], [&](carve::SimulatedStream bs) {
    batch_stream = bs;
    CHECK(gpu.enqueue(bs));
  }));
  CHECK(d.reclaim().empty());
  gpu.complete(batch_stream);
  const auto back = d.reclaim();
  REQUIRE(back.size() == 1);
  CHECK(back[0].ticket == batch);
  CHECK(d.free_units(0) == 64);
  CHECK(gpu.live() == 0);
}

TEST_CASE("green contexts (twin): overlapping partitions are refused, and a refused one leaves the request queued") {
  const auto devices = gpus_with_units({32});
  GreenDispatcher d(devices, carve::DispatchOrder::strict_priority,
                    carve::SimulatedGreenContexts({{.sm_count = 32, .cc_major = 8, .cc_minor = 6}}));
  auto& gpu = d.partitioner();
  // Someone else holds groups 2..3 (SMs 8..15) behind the dispatcher's back.
  const auto foreign = gpu.create(0, SlotRange{2, 2});
  REQUIRE(foreign);
  CHECK(gpu.create(0, SlotRange{3, 1}).error().code == Errc::invalid_argument);
  CHECK(gpu.create(0, SlotRange{7, 2}).error().code == Errc::out_of_range);
  CHECK(gpu.create(1, SlotRange{0, 1}).error().code == Errc::out_of_range);
  const auto t = *d.submit({.priority = 0, .compute_units = 32});
  CHECK(d.dispatch().empty()); // the ledger thinks all 8 groups are free; the twin refuses
  REQUIRE(d.last_error());
  CHECK(d.last_error()->code == Errc::invalid_argument);
  CHECK(d.queued() == 1);
  CHECK(d.free_units(0) == 32); // nothing kept of the failed attempt
  gpu.destroy(*foreign);
  const auto g = d.dispatch();
  REQUIRE(g.size() == 1);
  CHECK(g[0].ticket == t);
  CHECK(g[0].units == SlotRange{0, 32});
}
