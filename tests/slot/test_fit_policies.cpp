#include "reference.hpp"
#include "support/sanitizers.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

using carve::BestFit;
using carve::BoundaryNearestFit;
using carve::FirstFit;
using carve::LastFit;
using carve::SlotBitmap;
using namespace carve::test;

namespace {

template <std::uint32_t N, class... Fits>
void check_policies(const SlotBitmap<N>& b, const Slots& s, std::uint32_t m) {
  (
      [&] {
        CAPTURE(carve::policy_name<Fits>());
        CAPTURE(m);
        REQUIRE(to_std(Fits{}.find(b, m)) == ref_find<Fits>(s, m));
      }(),
      ...);
}

template <std::uint32_t N>
void check_all(const SlotBitmap<N>& b, const Slots& s, std::uint32_t m) {
  check_policies<N, FirstFit, LastFit, BestFit, BoundaryNearestFit>(b, s, m);
}

template <std::uint32_t N>
void check_every_bitmap() {
  if (N > exhaustive_slots) {
    return;
  }
  CAPTURE(N);
  for (std::uint64_t mask = 0; mask < (1ull << N); ++mask) {
    const std::uint64_t words[1] = {mask};
    const auto b = SlotBitmap<N>::from_words(words);
    const Slots s = to_slots(b);
    for (std::uint32_t m = 0; m <= N + 1; ++m) {
      check_all(b, s, m);
    }
  }
}

// All patterns of the 12 slots around `boundary` (exhaustive_slots), on several backgrounds, for
// the sizes where word-crossing logic can go wrong.
template <std::uint32_t N>
void check_window(std::uint32_t boundary, std::mt19937_64& rng) {
  CAPTURE(N);
  CAPTURE(boundary);
  const std::uint32_t lo = boundary - exhaustive_slots / 2;
  std::vector<std::uint32_t> ms = {1, 2, 5, 6, 7, 12, 13, 63, 64, 65, 70, 71, N - 1, N};
  for (int background = 0; background < 3; ++background) {
    Slots base(N, background == 0);
    if (background == 2) {
      base = random_runs(N, 8, rng);
    }
    for (std::uint32_t pattern = 0; pattern < (1u << exhaustive_slots); ++pattern) {
      Slots s = base;
      for (std::uint32_t k = 0; k < exhaustive_slots && lo + k < N; ++k) {
        s[lo + k] = (pattern >> k & 1) != 0;
      }
      const auto b = to_bitmap<N>(s);
      for (const std::uint32_t m : ms) {
        check_all(b, s, m);
      }
    }
  }
}

template <std::uint32_t N>
void check_random(int trials) {
  CAPTURE(N);
  std::mt19937_64 rng(1000 + N);
  std::uniform_int_distribution<std::uint32_t> any_m(1, N);
  for (int t = 0; t < trials; ++t) {
    const Slots s = random_runs(N, std::uint32_t{1} << (t % 10), rng);
    const auto b = to_bitmap<N>(s);
    for (std::uint32_t m : {1u, 2u, 4u, 16u, 64u, 65u, 200u}) {
      check_all(b, s, m);
    }
    for (int k = 0; k < 6; ++k) {
      check_all(b, s, any_m(rng));
    }
  }
}

} // namespace

static_assert(carve::FitPolicy<FirstFit>);
static_assert(carve::FitPolicy<LastFit>);
static_assert(carve::FitPolicy<BestFit>);
static_assert(carve::FitPolicy<BoundaryNearestFit>);

struct NotAPolicy {
  int find(int) const { return 0; }
};
struct WrongReturnType {
  template <std::uint32_t N>
  std::uint32_t find(const SlotBitmap<N>&, std::uint32_t) const {
    return 0;
  }
};
static_assert(!carve::FitPolicy<NotAPolicy>);
static_assert(!carve::FitPolicy<WrongReturnType>);
static_assert(!carve::FitPolicy<int>);

TEST_CASE("policies have names for reports") {
  CHECK(std::strcmp(carve::policy_name<BoundaryNearestFit>(), "boundary-nearest") == 0);
  CHECK(std::strcmp(carve::policy_name<FirstFit>(), "first-fit") == 0);
  CHECK(std::strcmp(carve::policy_name<carve::LastFit>(), "last-fit") == 0);
  // First and last fit are one policy with the end as its parameter; the old names still name them.
  static_assert(std::is_same_v<FirstFit, carve::EndFit<carve::SlotEnd::first>>);
  static_assert(std::is_same_v<carve::LastFit, carve::EndFit<carve::SlotEnd::last>>);
  CHECK(std::strcmp(carve::policy_name<NotAPolicy>(), "custom") == 0);
}

TEST_CASE("every policy's pick in two small bitmaps, worked out by hand") {
  SUBCASE("16 slots 0111_1001_1111_1100, m = 4: run starts 1 and 7..10, choose 1") {
    SlotBitmap<16> b = SlotBitmap<16>::all_taken();
    b.release({1, 4});
    b.release({7, 7});
    CHECK(*BoundaryNearestFit{}.find(b, 4) == 1);
    CHECK(*FirstFit{}.find(b, 4) == 1);
    CHECK(*LastFit{}.find(b, 4) == 10);
    CHECK(*BestFit{}.find(b, 4) == 1);
  }
  SUBCASE("128 slots with 0-1 and 6-123 taken, m = 3: first fit 2, boundary-nearest 125") {
    SlotBitmap<128> b;
    b.occupy({0, 2});
    b.occupy({6, 118});
    CHECK(*FirstFit{}.find(b, 3) == 2);
    CHECK(*BoundaryNearestFit{}.find(b, 3) == 125);
    CHECK(*LastFit{}.find(b, 3) == 125);
    CHECK(*BestFit{}.find(b, 3) == 2);
  }
}

TEST_CASE("boundary-nearest breaks a tie toward the low end") {
  // Free runs of 3 at 1..3 and 12..14 in 16 slots: i = 1 is 1 from the low end, j = 12 is
  // 16 - 12 - 3 = 1 from the high end, so the tie goes low.
  SlotBitmap<16> b = SlotBitmap<16>::all_taken();
  b.release({1, 3});
  b.release({12, 3});
  CHECK(*BoundaryNearestFit{}.find(b, 3) == 1);
  b.occupy({1, 1}); // now 2..3 only holds 2; the high run is the only fit
  CHECK(*BoundaryNearestFit{}.find(b, 3) == 12);
}

TEST_CASE("best fit prefers the tightest run, then the lowest") {
  SlotBitmap<64> b = SlotBitmap<64>::all_taken();
  b.release({0, 9});
  b.release({20, 5});
  b.release({40, 5});
  b.release({50, 14});
  CHECK(*BestFit{}.find(b, 5) == 20);
  CHECK(*BestFit{}.find(b, 6) == 0);
  CHECK(*BestFit{}.find(b, 10) == 50);
  CHECK_FALSE(BestFit{}.find(b, 15).has_value());
}

TEST_CASE("every bitmap of up to 12 slots, every m, every policy") {
  [&]<std::uint32_t... Ns>(std::integer_sequence<std::uint32_t, Ns...>) { (check_every_bitmap<Ns + 1>(), ...); }
  (std::make_integer_sequence<std::uint32_t, 12>{});
}

TEST_CASE("every pattern around a word boundary") {
  std::mt19937_64 rng(3);
  check_window<70>(64, rng);
  check_window<130>(64, rng);
  check_window<130>(124, rng); // the partial last word
  check_window<192>(128, rng);
}

TEST_CASE("random bitmaps of many sizes") {
  check_random<1>(50);
  check_random<63>(300);
  check_random<64>(300);
  check_random<65>(300);
  check_random<128>(400);
  check_random<129>(300);
  check_random<1000>(100);
  check_random<4096>(30);
  check_random<65536>(4);
}
