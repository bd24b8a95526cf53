#include "reference.hpp"
#include "support/errors.hpp"
#include "support/sanitizers.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <iterator>
#include <random>
#include <ranges>
#include <type_traits>
#include <vector>

// In a namespace of its own: the area's test files compile as one translation unit.
namespace test_slot_bitmap {

using carve::SlotBitmap;
using carve::SlotRange;
using namespace carve::test;

static_assert(std::is_trivially_copyable_v<SlotBitmap<128>>);
static_assert(sizeof(SlotBitmap<128>) == 16);
static_assert(sizeof(SlotBitmap<1>) == 8);
static_assert(sizeof(SlotBitmap<65>) == 16);
static_assert(std::forward_iterator<carve::FreeRuns<2>::iterator>);
static_assert(std::ranges::forward_range<carve::FreeRuns<2>>);

TEST_CASE("a new bitmap is all free and keeps the bits past the end taken") {
  SlotBitmap<130> b;
  CHECK(b.size() == 130);
  CHECK(b.free_count() == 130);
  CHECK(b.words()[2] == 0b11);
  CHECK(b.is_free(0));
  CHECK(b.is_free(129));
  CHECK_FALSE(b.is_free(130));
  CHECK_FALSE(b.is_free(0xffff'ffff));
  CHECK(SlotBitmap<130>::all_taken().free_count() == 0);
}

TEST_CASE("occupy and release touch exactly the slots of the range") {
  SlotBitmap<200> b;
  b.occupy({60, 70}); // spans three words
  CHECK(b.free_count() == 130);
  for (std::uint32_t s = 0; s < 200; ++s) {
    CHECK(b.is_free(s) == (s < 60 || s >= 130));
  }
  CHECK(b.free_count({50, 20}) == 10);
  CHECK(b.free_count({60, 70}) == 0);
  CHECK(b.free_count({0, 200}) == 130);
  b.release({64, 64});
  CHECK(b.free_count() == 194);
  CHECK(b.free_count({60, 4}) == 0);
  CHECK(b.free_count({128, 2}) == 0);
  b.occupy({199, 1});
  CHECK_FALSE(b.is_free(199));
  b.reset();
  CHECK(b == SlotBitmap<200>{});
}

TEST_CASE("free runs over more slots than their words hold throw instead of reading past them") {
  const carve::bits::word words[2] = {~carve::bits::word{0}, ~carve::bits::word{0}};
  const cuda::std::span<const carve::bits::word> view(words, 2);
  CHECK_THROWS_ERRC(carve::Errc::invalid_argument, carve::FreeRuns<>(view, 129));
  const carve::FreeRuns<> all(view, 128);
  CHECK(all.status());
  CHECK(*all.begin() == SlotRange{0, 128});
}

TEST_CASE("from_words clears bits past the end") {
  const std::uint64_t words[2] = {~0ull, ~0ull};
  const auto b = SlotBitmap<70>::from_words(words);
  CHECK(b.free_count() == 70);
  CHECK(b == SlotBitmap<70>{});
}

TEST_CASE("16 slots 0111_1001_1111_1100 have run starts 1 and 7..10 for m = 4") {
  // 0111_1001_1111_1100, slot 0 first.
  SlotBitmap<16> b = SlotBitmap<16>::all_taken();
  b.release({1, 4});
  b.release({7, 7});
  const auto starts = b.run_starts(4);
  std::vector<std::uint32_t> got;
  for (std::uint32_t s = 0; s < 16; ++s) {
    if (starts.is_free(s)) {
      got.push_back(s);
    }
  }
  CHECK(got == std::vector<std::uint32_t>{1, 7, 8, 9, 10});
}

TEST_CASE("128 slots with 0-1 and 6-123 taken have run starts {2, 3, 124, 125} for m = 3") {
  SlotBitmap<128> b;
  b.occupy({0, 2});
  b.occupy({6, 118});
  const auto starts = b.run_starts(3);
  CHECK(starts.free_count() == 4);
  for (std::uint32_t s : {2u, 3u, 124u, 125u}) {
    CHECK(starts.is_free(s));
  }
}

template <std::uint32_t N>
void check_against_reference(const Slots& s, const std::vector<std::uint32_t>& ms) {
  const auto b = to_bitmap<N>(s);
  REQUIRE(to_slots(b) == s);
  const auto runs = ref_free_runs(s);
  std::uint32_t free = 0;
  std::uint32_t largest = 0;
  for (const SlotRange r : runs) {
    free += r.count;
    largest = std::max(largest, r.count);
  }
  CHECK(b.free_count() == free);
  CHECK(b.largest_free_run() == largest);
  CHECK(std::vector<SlotRange>(b.free_runs().begin(), b.free_runs().end()) == runs);
  for (const std::uint32_t m : ms) {
    const auto starts = b.run_starts(m);
    std::vector<std::uint32_t> got;
    for (std::uint32_t i = 0; i < N; ++i) {
      if (starts.is_free(i)) {
        got.push_back(i);
      }
    }
    const auto want = ref_run_starts(s, m);
    REQUIRE(got == want);
    if (N <= 64) {
      REQUIRE(literal_run_starts(s, m) == want);
    }
    CHECK(to_std(b.lowest_run_start(m)) == ref_first(want));
    CHECK(to_std(b.highest_run_start(m)) == ref_last(want));
  }
}

template <std::uint32_t N>
void check_all_bitmaps() {
  if (N > exhaustive_slots) {
    return;
  }
  CAPTURE(N);
  std::vector<std::uint32_t> ms;
  for (std::uint32_t m = 0; m <= N + 1; ++m) {
    ms.push_back(m);
  }
  for (std::uint64_t mask = 0; mask < (1ull << N); ++mask) {
    const std::uint64_t words[1] = {mask};
    check_against_reference<N>(to_slots(SlotBitmap<N>::from_words(words)), ms);
  }
}

TEST_CASE("every bitmap of up to 12 slots matches the reference") {
  [&]<std::uint32_t... Ns>(std::integer_sequence<std::uint32_t, Ns...>) { (check_all_bitmaps<Ns + 1>(), ...); }
  (std::make_integer_sequence<std::uint32_t, 12>{});
}

template <std::uint32_t N>
void check_random_bitmaps(int trials) {
  CAPTURE(N);
  std::mt19937_64 rng(N);
  for (int t = 0; t < trials; ++t) {
    const std::uint32_t scale = std::uint32_t{1} << (t % 9); // runs of ~1 .. ~256 slots
    const Slots s = random_runs(N, scale, rng);
    std::uint32_t largest = 0;
    for (const SlotRange r : ref_free_runs(s)) {
      largest = std::max(largest, r.count);
    }
    std::vector<std::uint32_t> ms = {1, 2, 3, 7, 31, 63, 64, 65, 100, 128, 129, N - 1, N, N + 1, largest, largest + 1};
    if (largest > 1) {
      ms.push_back(largest - 1);
    }
    std::uniform_int_distribution<std::uint32_t> any_m(1, N);
    for (int k = 0; k < 4; ++k) {
      ms.push_back(any_m(rng));
    }
    check_against_reference<N>(s, ms);
  }
}

TEST_CASE("random bitmaps across word boundaries match the reference") {
  check_random_bitmaps<63>(300);
  check_random_bitmaps<64>(300);
  check_random_bitmaps<65>(300);
  check_random_bitmaps<128>(300);
  check_random_bitmaps<129>(300);
  check_random_bitmaps<500>(200);
  check_random_bitmaps<1024>(100);
  check_random_bitmaps<4100>(30);
}

// free_runs() is a view; asking a temporary for one would dangle, so it does not compile.
template <class Bitmap>
concept HasFreeRuns = requires(Bitmap&& b) {
  static_cast<Bitmap&&>(b).free_runs();
};
static_assert(!HasFreeRuns<SlotBitmap<8>>);
static_assert(HasFreeRuns<const SlotBitmap<8>&>);

} // namespace test_slot_bitmap
