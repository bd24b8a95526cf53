#include "reference_release_aligned.hpp"
#include "support/sanitizers.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <random>
#include <vector>

// In a namespace of its own: the area's test files compile as one translation unit.
namespace test_release_aligned_fit {

using carve::BoundaryNearestFit;
using carve::Errc;
using carve::ExpectedRelease;
using carve::ReleaseAlignedFit;
using carve::ReleaseAlignedPlacements;
using carve::SlotAllocator;
using carve::SlotBitmap;
using carve::SlotRange;
using namespace carve::test;

static_assert(carve::HintedFitPolicyFor<ReleaseAlignedPlacements<1>, 1>);
static_assert(carve::HintedFitPolicyFor<ReleaseAlignedPlacements<130>, 130>);
static_assert(carve::FitPolicyFor<ReleaseAlignedPlacements<64>, 64>);
static_assert(!carve::HintedFitPolicyFor<carve::FirstFit, 64>);
static_assert(!carve::HintedFitPolicyFor<BoundaryNearestFit, 64>);
static_assert(!carve::TracksPlacements<carve::BestFit>);

// allocate(m, hint) exists only for hinted policies, and only with their hint type.
template <class A, class H>
concept HintedAllocate = requires(A a, H h) {
  a.allocate(1u, h);
};
static_assert(HintedAllocate<SlotAllocator<64, ReleaseAlignedFit>, ExpectedRelease>);
static_assert(!HintedAllocate<SlotAllocator<64, carve::FirstFit>, ExpectedRelease>);
static_assert(!HintedAllocate<SlotAllocator<64, ReleaseAlignedFit>, SlotRange>);

namespace {

// A policy whose table says what `ticks` says for every taken slot.
template <std::uint32_t N>
ReleaseAlignedPlacements<N> policy_with(const Slots& s, const ReleaseTicks& ticks) {
  ReleaseAlignedPlacements<N> fit;
  for (std::uint32_t i = 0; i < N; ++i) {
    if (!s[i] && ticks[i]) {
      fit.placed({i, 1}, ExpectedRelease{*ticks[i]});
    } else if (!s[i]) {
      fit.placed({i, 1});
    }
  }
  return fit;
}

ReleaseTicks random_ticks(std::uint32_t n, std::uint32_t base, std::mt19937_64& rng) {
  ReleaseTicks ticks(n);
  for (auto& t : ticks) {
    if (rng() % 5 != 0) { // a fifth unknown (placed without a hint)
      t = base + static_cast<std::uint32_t>(rng() % 12);
    }
  }
  return ticks;
}

template <std::uint32_t N>
void check_every_bitmap(std::mt19937_64& rng) {
  if (N > exhaustive_slots) {
    return;
  }
  CAPTURE(N);
  for (std::uint64_t mask = 0; mask < (1ull << N); ++mask) {
    const std::uint64_t words[1] = {mask};
    const auto b = SlotBitmap<N>::from_words(words);
    const Slots s = to_slots(b);
    // Ticks near zero and near 2^32, so differences cross the wrap.
    const std::uint32_t base = (mask % 2 == 0) ? 100u : 0xffff'fffau;
    const ReleaseTicks ticks = random_ticks(N, base, rng);
    const auto fit = policy_with<N>(s, ticks);
    for (std::uint32_t m = 0; m <= N + 1; ++m) {
      for (std::uint32_t dt = 0; dt < 14; dt += 3) {
        const std::uint32_t hint = base + dt;
        CAPTURE(m);
        CAPTURE(hint);
        REQUIRE(to_std(fit.find(b, m, ExpectedRelease{hint})) == ref_release_aligned(s, ticks, m, hint));
      }
      REQUIRE(to_std(fit.find(b, m)) == to_std(BoundaryNearestFit{}.find(b, m)));
    }
  }
}

template <std::uint32_t N>
void check_random(int trials) {
  CAPTURE(N);
  std::mt19937_64 rng(77 + N);
  for (int t = 0; t < trials; ++t) {
    const Slots s = random_runs(N, std::uint32_t{1} << (t % 8), rng);
    const auto b = to_bitmap<N>(s);
    const ReleaseTicks ticks = random_ticks(N, static_cast<std::uint32_t>(rng()), rng);
    const auto fit = policy_with<N>(s, ticks);
    for (int k = 0; k < 8; ++k) {
      const auto m = static_cast<std::uint32_t>(1 + rng() % (k < 4 ? 16 : N));
      const auto hint =
          ticks[rng() % N].value_or(static_cast<std::uint32_t>(rng())) + static_cast<std::uint32_t>(rng() % 7) - 3;
      CAPTURE(m);
      REQUIRE(to_std(fit.find(b, m, ExpectedRelease{hint})) == ref_release_aligned(s, ticks, m, hint));
    }
  }
}

} // namespace

TEST_CASE("a worked example: beside the neighbour that is released just after") {
  // 16 slots: A = [0, 4) back at 100, B = [8, 12) back at 50; free [4, 8) and [12, 16).
  SlotAllocator<16, ReleaseAlignedFit> slots;
  REQUIRE(slots.allocate(4, ExpectedRelease{100}) == SlotRange{0, 4});
  REQUIRE(slots.allocate(4, ExpectedRelease{100}));
  REQUIRE(slots.allocate(4, ExpectedRelease{50}));
  REQUIRE(slots.deallocate({4, 4}));
  // The second request took [4, 8) (beside A, slack 0) and the third [8, 12); now free [4, 8), [12, 16).
  const auto b = slots.bitmap();
  CHECK_FALSE(b.is_free(3));
  CHECK(b.is_free(4));
  CHECK_FALSE(b.is_free(8));
  CHECK(b.is_free(12));
  // Back at 60: start 4 sits beside A (outlived by 40), 6 and 12 beside B (outlives it by 10),
  // 14 beside the end. No damage at 4.
  CHECK(*slots.policy().find(b, 2, ExpectedRelease{60}) == 4);
  // Back at 40: no candidate is damaged; B (slack 10) is the tightest, at 6 and at 12: lowest wins.
  CHECK(*slots.policy().find(b, 2, ExpectedRelease{40}) == 6);
  // Back at 200: everything is damaged except beside the end of the space.
  CHECK(*slots.policy().find(b, 2, ExpectedRelease{200}) == 14);
  // Exactly 4 slots at 200: [4, 8) is damaged by A (100) and B (150), [12, 16) by B only.
  CHECK(*slots.policy().find(b, 4, ExpectedRelease{200}) == 12);
  // Without a hint the policy is boundary-nearest.
  CHECK(slots.allocate(2)->first == *BoundaryNearestFit{}.find(b, 2));
}

TEST_CASE("slots placed without a hint count as never released") {
  SlotAllocator<16, ReleaseAlignedFit> slots;
  REQUIRE(slots.allocate(4) == SlotRange{0, 4}); // boundary-nearest: low end
  REQUIRE(slots.allocate(4) == SlotRange{12, 4});
  // Free [4, 12): the ends sit beside the two unknown runs; a request back at any time is
  // undamaged on both, the lowest start wins.
  CHECK(*slots.policy().find(slots.bitmap(), 3, ExpectedRelease{1'000'000}) == 4);
}

TEST_CASE("every bitmap of up to 10 slots, every m, against the brute-force model") {
  std::mt19937_64 rng(5);
  [&]<std::uint32_t... Ns>(std::integer_sequence<std::uint32_t, Ns...>) { (check_every_bitmap<Ns + 1>(rng), ...); }
  (std::make_integer_sequence<std::uint32_t, 10>{});
}

TEST_CASE("random bitmaps of many sizes against the brute-force model") {
  check_random<63>(300);
  check_random<64>(300);
  check_random<65>(300);
  check_random<128>(400);
  check_random<130>(300);
  check_random<1000>(60);
}

TEST_CASE("an allocate/release process replayed against the model") {
  constexpr std::uint32_t N = 96;
  SlotAllocator<N, ReleaseAlignedFit> slots;
  Slots free(N, true);
  ReleaseTicks ticks(N);
  std::vector<SlotRange> live;
  std::mt19937_64 rng(11);
  std::uint32_t now = 0xffff'ff00u; // wraps during the run
  for (int step = 0; step < 20'000; ++step) {
    now += static_cast<std::uint32_t>(rng() % 3);
    if (!live.empty() && rng() % 2 == 0) {
      const std::size_t k = rng() % live.size();
      SlotRange r = live[k];
      if (r.count > 1 && rng() % 4 == 0) { // a partial release: the rest stays taken
        r = {r.first, r.count / 2};
        live[k] = {r.first + r.count, live[k].count - r.count};
      } else {
        live[k] = live.back();
        live.pop_back();
      }
      REQUIRE(slots.deallocate(r));
      for (std::uint32_t s = r.first; s < r.end(); ++s) {
        free[s] = true;
      }
      continue;
    }
    const auto m = static_cast<std::uint32_t>(1 + rng() % 12);
    const bool hinted = rng() % 8 != 0;
    const std::uint32_t release = now + static_cast<std::uint32_t>(rng() % 200);
    const auto expected = hinted ? ref_release_aligned(free, ticks, m, release)
                                 : to_std(BoundaryNearestFit{}.find(to_bitmap<N>(free), m));
    const auto r = hinted ? slots.allocate(m, ExpectedRelease{release}) : slots.allocate(m);
    CAPTURE(step);
    if (!expected) {
      REQUIRE(r.error() == Errc::no_space);
      continue;
    }
    REQUIRE(r);
    REQUIRE(r->first == *expected);
    for (std::uint32_t s = r->first; s < r->end(); ++s) {
      REQUIRE(free[s]);
      free[s] = false;
      ticks[s] = hinted ? std::optional<std::uint32_t>(release) : std::nullopt;
    }
    live.push_back(*r);
  }
}

TEST_CASE("a hinted allocation checks its input like any other") {
  SlotAllocator<32, ReleaseAlignedFit> slots;
  REQUIRE(slots.allocate(30, ExpectedRelease{5}));
  const auto before = slots.bitmap();
  CHECK(slots.allocate(0, ExpectedRelease{5}).error() == Errc::invalid_size);
  CHECK(slots.allocate(33, ExpectedRelease{5}).error() == Errc::no_space);
  CHECK(slots.allocate(3, ExpectedRelease{5}).error() == Errc::no_space);
  CHECK(slots.bitmap() == before);
}

TEST_CASE("the policy has a name and works in constant evaluation") {
  CHECK(std::strcmp(carve::policy_name<ReleaseAlignedPlacements<8>>(), "release-aligned") == 0);
  constexpr std::uint32_t start = [] {
    SlotAllocator<16, ReleaseAlignedFit> slots;
    (void)slots.allocate(4, ExpectedRelease{10}); // [0, 4)
    (void)slots.allocate(4, ExpectedRelease{30}); // beside [0, 4) it would outlive it by 20: [12, 16)
    // Free [4, 12): at 4 it outlives [0, 4) by 10; at 10 it is outlived by [12, 16) by 10.
    return slots.allocate(2, ExpectedRelease{20})->first;
  }();
  static_assert(start == 10);
}

} // namespace test_release_aligned_fit
