// TierThresholds: which tier a size belongs to, at and around every threshold, and the lists
// the constructor refuses.
#include "queue_helpers.hpp"
#include "support/errors.hpp"

#include <doctest/doctest.h>

#include <limits>
#include <random>
#include <vector>

// In a namespace of its own: the area's test files compile as one translation unit.
namespace test_tier_thresholds {

using carve::Errc;
using carve::TierThresholds;

namespace {

// The definition, spelled out: the number of thresholds strictly below the size.
std::uint32_t ref_tier(const std::vector<std::uint64_t>& t, std::uint64_t size) {
  std::uint32_t tier = 0;
  for (const std::uint64_t x : t) {
    tier += size > x ? 1 : 0;
  }
  return tier;
}

void check_around_every_threshold(const std::vector<std::uint64_t>& list) {
  const TierThresholds thresholds(cuda::std::span<const std::uint64_t>(list.data(), list.size()));
  const TierThresholds* t = &thresholds;
  REQUIRE(t->tier_count() == list.size() + 1);
  constexpr std::uint64_t top = std::numeric_limits<std::uint64_t>::max();
  for (std::size_t i = 0; i < list.size(); ++i) {
    CAPTURE(list[i]);
    for (const std::int64_t d : {-2, -1, 0, 1, 2}) {
      if ((d < 0 && list[i] < static_cast<std::uint64_t>(-d)) ||
          (d > 0 && top - list[i] < static_cast<std::uint64_t>(d))) {
        continue;
      }
      const std::uint64_t size = list[i] + static_cast<std::uint64_t>(d);
      CAPTURE(size);
      CHECK(t->tier_of(size) == ref_tier(list, size));
    }
    // The threshold is the largest size of its tier.
    CHECK(t->tier_of(list[i]) == i);
    if (list[i] != top) {
      CHECK(t->tier_of(list[i] + 1) == i + 1);
    }
    CHECK(t->largest(static_cast<std::uint32_t>(i)) == list[i]);
    CHECK(t->smallest(static_cast<std::uint32_t>(i + 1)) == list[i] + 1);
  }
  CHECK(t->tier_of(0) == ref_tier(list, 0));
  CHECK(t->tier_of(top) == ref_tier(list, top));
  CHECK(t->smallest(0) == 0);
  CHECK(t->largest(t->tier_count() - 1) == top);
}

} // namespace

TEST_CASE("thresholds of 128 and 512 vectors: at most 128, 129..512, more") {
  const TierThresholds thresholds{128, 512};
  const TierThresholds* t = &thresholds;
  CHECK(t->tier_count() == 3);
  CHECK(t->tier_of(0) == 0);
  CHECK(t->tier_of(1) == 0);
  CHECK(t->tier_of(127) == 0);
  CHECK(t->tier_of(128) == 0);
  CHECK(t->tier_of(129) == 1);
  CHECK(t->tier_of(511) == 1);
  CHECK(t->tier_of(512) == 1);
  CHECK(t->tier_of(513) == 2);
  CHECK(t->tier_of(1024) == 2);
  // Bytes instead of vectors: 128 x 128 floats.
  const TierThresholds bytes{128 * 128 * 4, 512 * 128 * 4};
  CHECK(bytes.tier_of(64 * 128 * 4) == 0);
}

TEST_CASE("tier selection at and around every threshold") {
  constexpr std::uint64_t top = std::numeric_limits<std::uint64_t>::max();
  check_around_every_threshold({128, 512});
  check_around_every_threshold({0});
  check_around_every_threshold({0, 1, 2, 3});
  check_around_every_threshold({top - 1});
  check_around_every_threshold({1, top - 1});
  check_around_every_threshold({top});
  std::vector<std::uint64_t> fifteen;
  for (std::uint64_t i = 0; i < carve::max_tiers - 1; ++i) {
    fifteen.push_back(10 + i * 1000);
  }
  check_around_every_threshold(fifteen);
  std::mt19937_64 rng(7);
  for (int round = 0; round < 200; ++round) {
    std::vector<std::uint64_t> list;
    std::uint64_t x = rng() % 50;
    const auto n = 1 + rng() % (carve::max_tiers - 1);
    for (std::uint64_t i = 0; i < n; ++i) {
      list.push_back(x);
      x += 1 + rng() % (round % 2 == 0 ? 3 : 1u << 20);
    }
    check_around_every_threshold(list);
  }
}

TEST_CASE("the constructor refuses empty, unsorted, repeated and too many thresholds") {
  using Span = cuda::std::span<const std::uint64_t>;
  CHECK_THROWS_ERRC(Errc::invalid_thresholds, TierThresholds(Span()));
  CHECK_THROWS_ERRC(Errc::invalid_thresholds, TierThresholds{512, 128});
  CHECK_THROWS_ERRC(Errc::invalid_thresholds, TierThresholds{128, 128});
  CHECK_THROWS_ERRC(Errc::invalid_thresholds, TierThresholds{1, 5, 3});
  CHECK_THROWS_ERRC(Errc::invalid_thresholds, TierThresholds{1, 2, 3, 3, 4});
  CHECK_THROWS_WITH_AS((TierThresholds{512, 128}),
                       "thresholds must be strictly increasing: threshold 1 (128) is below threshold 0 (512)",
                       carve::Exception);
  std::vector<std::uint64_t> sixteen;
  for (std::uint64_t i = 0; i < carve::max_tiers; ++i) {
    sixteen.push_back(i);
  }
  CHECK_THROWS_ERRC(Errc::invalid_thresholds, TierThresholds(Span(sixteen.data(), sixteen.size())));
  CHECK(TierThresholds(Span(sixteen.data(), sixteen.size() - 1)).status());

  const std::uint64_t dup[] = {128, 128};
  CHECK(TierThresholds::describe_threshold_error(dup) ==
        "thresholds must be strictly increasing: threshold 1 (128) repeats threshold 0 (128)");
  const std::uint64_t down[] = {512, 128};
  CHECK(TierThresholds::describe_threshold_error(down) ==
        "thresholds must be strictly increasing: threshold 1 (128) is below threshold 0 (512)");
  CHECK(TierThresholds::describe_threshold_error({}) == "no thresholds given: at least one is needed for two tiers");
  CHECK(TierThresholds::describe_threshold_error(cuda::std::span<const std::uint64_t>(
            sixteen.data(), sixteen.size())) == "16 thresholds given: at most 15 (max_tiers - 1) are supported");
  const std::uint64_t good[] = {128, 512};
  CHECK(TierThresholds::describe_threshold_error(good).empty());
}

TEST_CASE("thresholds work in constant evaluation") {
  constexpr TierThresholds t{128, 512};
  static_assert(t.status() && t.tier_of(128) == 0 && t.tier_of(129) == 1 && t.tier_of(100000) == 2);
  CHECK(t.tier_count() == 3);
}

} // namespace test_tier_thresholds
