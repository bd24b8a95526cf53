// The dispatcher on scenarios small enough to work out by hand.
#include "support/errors.hpp"
#include <carve/sim.hpp>
#include <carve/slot.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

// In a namespace of its own: the area's test files compile as one translation unit.
namespace test_sim_dispatcher {

using namespace carve;
using namespace carve::sim;

namespace {

std::vector<Workgroup> queue_of(std::initializer_list<std::pair<std::uint32_t, std::uint32_t>> size_duration) {
  std::vector<Workgroup> w;
  for (const auto& [size, duration] : size_duration) {
    w.push_back(Workgroup{0, size, duration, duration});
  }
  return w;
}

template <class Fit>
RunResult run8(const std::vector<Workgroup>& w, DispatchOptions o = {}) {
  return simulate(w, o, ContiguousCu<8, Fit>{});
}

// Lowest slot that is not the lowest fit: a policy a user could write.
struct SecondFit {
  template <std::uint32_t N>
  cuda::std::optional<std::uint32_t> find(const SlotBitmap<N>& b, std::uint32_t m) const {
    const auto first = b.lowest_run_start(m);
    if (first && *first + 1 + m <= N && b.free_count({*first + 1, m}) == m) {
      return *first + 1;
    }
    return first;
  }
};
static_assert(FitPolicy<SecondFit>);

// A hinted user policy whose hint comes straight from the simulator's request.
struct LongRunsHigh {
  struct hint_type {
    std::uint32_t expected;
    explicit hint_type(const Request& r) : expected(r.expected) {}
  };
  template <std::uint32_t N>
  cuda::std::optional<std::uint32_t> find(const SlotBitmap<N>& b, std::uint32_t m) const {
    return b.lowest_run_start(m);
  }
  template <std::uint32_t N>
  cuda::std::optional<std::uint32_t> find(const SlotBitmap<N>& b, std::uint32_t m, const hint_type& h) const {
    return h.expected >= 10 ? b.highest_run_start(m) : b.lowest_run_start(m);
  }
};
static_assert(HintedFitPolicyFor<LongRunsHigh, 8>);

} // namespace

TEST_CASE("head-of-line blocking: a small workgroup waits behind a head that does not fit") {
  // 8 slots. W0 = 4 slots for 10 cycles, W1 = 2 for 3, W2 = 6 for 2, W3 = 1 for 1.
  // t0 W0 -> [0,4); t1 W1 -> [4,6); t2 W2 needs 6, only [6,8) is free: blocked, and W3 (which
  // would fit in [6,8)) waits behind it. t4 W1 leaves: [4,8) is still too small. t10 W0 leaves:
  // W2 -> [0,6) until 12; t11 W3 -> [6,7) until 12. Makespan 12.
  const auto w = queue_of({{4, 10}, {2, 3}, {6, 2}, {1, 1}});
  const RunResult r = run8<FirstFit>(w);
  CHECK(r.makespan == 12);
  CHECK(r.placements[0].cycle == 0);
  CHECK(r.placements[1].cycle == 1);
  CHECK(r.placements[2].cycle == 10);
  CHECK(r.placements[2].range == SlotRange{0, 6});
  CHECK(r.placements[3].cycle == 11);
  CHECK(r.placements[3].range == SlotRange{6, 1});
  CHECK(r.last_dispatch == 11);
  CHECK(r.blocked_cycles == 8);               // W2 at the head from 2 to 10
  CHECK(r.fragmentation_blocked_cycles == 0); // never 6 free slots in total before 10
  // Decisions: one per cycle 0, 1, 11; W2 tried at 2, 4 and 10.
  CHECK(r.decisions == 6);

  SUBCASE("a look-ahead window backfills past the head") {
    DispatchOptions o;
    o.window = 2;
    const RunResult b = run8<FirstFit>(w, o);
    CHECK(b.placements[3].cycle == 2); // W3 jumps the queue into [6,7)
    CHECK(b.placements[3].range == SlotRange{6, 1});
    CHECK(b.placements[2].cycle == 10);
    CHECK(b.makespan == 12);
  }
  SUBCASE("the bound blocks the same way: there are never 6 free slots before cycle 10") {
    const RunResult b = simulate(w, DispatchOptions{}, PooledCu<8>{});
    CHECK(b.makespan == 12);
    CHECK(b.placements[2].cycle == 10);
  }
}

TEST_CASE("fragmentation: first fit and boundary-nearest wait, release-aligned and the bound do not") {
  // 8 slots. W0 = 2 slots for 5, W1 and W2 = 2 for 20, then W3 and W4 = 4 for 1.
  // First fit: W0 [0,2) to 5, W1 [2,4) to 21, W2 [4,6) to 22; W3 needs 4 at cycle 3. At 5 W0
  // leaves [0,2) + [6,8): 4 free slots, no run of 4, so W3 waits for W1 until 21 and W4 runs
  // 22..23. Boundary-nearest puts W1 at [6,8) and W2 at [2,4): the same holes, makespan 23.
  // Release-aligned puts W2 (back at 22) beside W1 (back at 21) rather than beside W0 (back at
  // 5), so when W0 leaves [0,4) is free: W3 runs 5..6, W4 6..7, makespan 22 (W2's end).
  const auto w = queue_of({{2, 5}, {2, 20}, {2, 20}, {4, 1}, {4, 1}});

  const RunResult ff = run8<FirstFit>(w);
  CHECK(ff.makespan == 23);
  CHECK(ff.placements[3].cycle == 21);
  CHECK(ff.blocked_cycles == 18);               // W3 at the head from 3 to 21
  CHECK(ff.fragmentation_blocked_cycles == 16); // from 5, with 4 slots free
  CHECK(ff.fragmentation_blocked_groups == 1);

  const RunResult bn = run8<BoundaryNearestFit>(w);
  CHECK(bn.makespan == 23);
  CHECK(bn.placements[1].range == SlotRange{6, 2});
  CHECK(bn.placements[2].range == SlotRange{2, 2});
  CHECK(bn.placements[3].range == SlotRange{4, 4});

  const RunResult ra = run8<ReleaseAlignedFit>(w);
  CHECK(ra.makespan == 22);
  CHECK(ra.placements[1].range == SlotRange{6, 2});
  CHECK(ra.placements[2].range == SlotRange{4, 2});
  CHECK(ra.placements[3].cycle == 5);
  CHECK(ra.placements[3].range == SlotRange{0, 4});
  CHECK(ra.placements[4].cycle == 6);
  CHECK(ra.fragmentation_blocked_cycles == 0);

  const RunResult bound = simulate(w, DispatchOptions{}, PooledCu<8>{});
  CHECK(bound.makespan == 22);
}

TEST_CASE("dispatch width: one workgroup per cycle, or as many as fit") {
  const auto w = queue_of({{2, 5}, {2, 5}, {2, 5}, {2, 5}});
  CHECK(run8<FirstFit>(w).makespan == 8); // dispatched at 0, 1, 2, 3
  DispatchOptions wide;
  wide.width = 0;
  const RunResult r = run8<FirstFit>(w, wide);
  CHECK(r.makespan == 5);
  for (const Placement& p : r.placements) {
    CHECK(p.cycle == 0);
  }
}

TEST_CASE("arrivals: the dispatcher idles until work arrives") {
  std::vector<Workgroup> w = {{100, 3, 7, 7}, {0, 8, 4, 4}, {100, 8, 1, 1}};
  const RunResult r = run8<FirstFit>(w);
  CHECK(r.placements[1].cycle == 0);   // arrives first
  CHECK(r.placements[0].cycle == 100); // then in arrival order, file order among equals
  CHECK(r.placements[2].cycle == 107); // 8 slots: waits for [0,3) to come back
  CHECK(r.makespan == 108);
  CHECK(r.waiting_cycles == 7); // W2 queued from 100 to 107
}

TEST_CASE("compute-unit choice") {
  // Two units of 8 slots; W0 = 4 slots, W1 = 2 slots, both long.
  const auto w = queue_of({{4, 50}, {2, 50}});
  DispatchOptions o;
  o.cus = 2;
  SUBCASE("first: both on unit 0") {
    const RunResult r = simulate(w, o, ContiguousCu<8, BoundaryNearestFit>{});
    CHECK(r.placements[0].cu == 0);
    CHECK(r.placements[1].cu == 0);
    CHECK(r.placements[1].range == SlotRange{6, 2});
  }
  SUBCASE("least-loaded: the second goes to the empty unit") {
    o.choice = CuChoice::least_loaded;
    const RunResult r = simulate(w, o, ContiguousCu<8, BoundaryNearestFit>{});
    CHECK(r.placements[1].cu == 1);
  }
  SUBCASE("nearest-boundary: both units offer a start at an end; the emptier wins") {
    o.choice = CuChoice::nearest_boundary;
    const RunResult r = simulate(w, o, ContiguousCu<8, BoundaryNearestFit>{});
    CHECK(r.placements[1].cu == 1);
    CHECK(r.placements[1].range == SlotRange{0, 2});
  }
  SUBCASE("nearest-boundary: a start at an end beats a start in the middle") {
    o.choice = CuChoice::nearest_boundary;
    const RunResult r = simulate(w, o, ContiguousCu<8, SecondFit>{});
    CHECK(r.placements[0].range == SlotRange{1, 4}); // distance 1 on both units: unit 0
    CHECK(r.placements[0].cu == 0);
    // Unit 0 offers [6, 8) (distance 0), the empty unit 1 offers [1, 3) (distance 1).
    CHECK(r.placements[1].cu == 0);
    CHECK(r.placements[1].range == SlotRange{6, 2});
  }
}

TEST_CASE("user-defined policies run through the policy concept, hinted ones with their hint") {
  const auto w = queue_of({{2, 50}, {2, 5}, {2, 50}});
  const RunResult plain = run8<SecondFit>(w);
  CHECK(plain.placements[0].range == SlotRange{1, 2});
  const RunResult hinted = run8<LongRunsHigh>(w);
  CHECK(hinted.placements[0].range == SlotRange{6, 2}); // expected 50: high
  CHECK(hinted.placements[1].range == SlotRange{0, 2}); // expected 5: low
  CHECK(hinted.placements[2].range == SlotRange{4, 2});
}

TEST_CASE("time series, wear and idle memory") {
  const auto w = queue_of({{4, 10}, {2, 3}, {6, 2}, {1, 1}});
  DispatchOptions o;
  o.sample_every = 2;
  const RunResult r = run8<FirstFit>(w, o);
  // Samples at 0, 2, ..., 10 (the last sample before the makespan of 12). W1 is back at 4,
  // W0 at 10.
  REQUIRE(r.series.remaining.size() == 6);
  CHECK(r.series.remaining == std::vector<std::uint32_t>{4, 4, 3, 3, 3, 2});
  CHECK(r.series.free_slots == std::vector<float>{4, 2, 4, 4, 4, 2});
  CHECK(r.series.waiting == std::vector<std::uint8_t>{1, 1, 1, 1, 1, 1});
  // Waiting from 0 to 11: free slots 4 (t0), 2 (t1..4), 4 (t4..10), 2 (t10..11).
  CHECK(r.waiting_cycles == 11);
  CHECK(r.idle_slots == doctest::Approx((4.0 + 2 * 3 + 4 * 6 + 2) / 11));
  // Wear: [0,4) once, [4,6) once, [0,6) once, [6,7) once.
  CHECK(r.wear == std::vector<std::uint64_t>{2, 2, 2, 2, 2, 2, 1, 0});
  CHECK(r.wear_max_over_mean == doctest::Approx(2.0 / (13.0 / 8)));
  CHECK(r.wear_low_half == doctest::Approx(8.0 / 13));
}

TEST_CASE("a workgroup that can never fit is refused before the run") {
  const auto w = queue_of({{9, 1}});
  CHECK_THROWS_ERRC(carve::Errc::invalid_argument, run8<FirstFit>(w));
  CHECK_THROWS_ERRC(carve::Errc::invalid_argument, run8<FirstFit>(queue_of({{1, 0}})));
  DispatchOptions no_cus;
  no_cus.cus = 0;
  CHECK_THROWS_ERRC(carve::Errc::invalid_argument, run8<FirstFit>(queue_of({{1, 1}}), no_cus));
}

TEST_CASE("the cost replay repeats the run's allocator calls") {
  DispatchOptions o;
  o.record_ops = true;
  const auto w = queue_of({{4, 10}, {2, 3}, {6, 2}, {1, 1}});
  const RunResult r = run8<BoundaryNearestFit>(w, o);
  // 6 allocate calls (3 of them failing) and 4 releases.
  CHECK(r.ops.size() == 10);
  const double ns = replay_ns_per_decision<8, BoundaryNearestFit>(r.ops, 1, r.decisions);
  CHECK(ns > 0.0);
  CHECK(std::isfinite(ns));
}

TEST_CASE("first fit and last fit are mirror images: the same makespan on every workload") {
  WorkloadSpec spec;
  spec.count = 300;
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    const auto w = generate(spec, seed);
    const RunResult first = simulate(w, DispatchOptions{}, ContiguousCu<128, FirstFit>{});
    const RunResult last = simulate(w, DispatchOptions{}, ContiguousCu<128, LastFit>{});
    CHECK(first.makespan == last.makespan);
    for (std::size_t g = 0; g < w.size(); ++g) {
      REQUIRE(last.placements[g].range.first == 128 - first.placements[g].range.end());
    }
    CHECK(first.wear_low_half == doctest::Approx(1 - last.wear_low_half));
  }
}

} // namespace test_sim_dispatcher
