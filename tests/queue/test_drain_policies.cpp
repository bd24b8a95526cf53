// Each drain policy's order on scripted inputs (one consumer, so the order is exact), the
// starvation strict priority allows and aging removes, byte shares under deficit round-robin,
// and the parameters each policy refuses.
#include "queue_helpers.hpp"
#include "support/errors.hpp"

#include <doctest/doctest.h>

#include <limits>
#include <map>
#include <string>
#include <vector>

// In a namespace of its own: the area's test files compile as one translation unit.
namespace test_drain_policies {

using carve::Errc;
using carve::test::Request;
using carve::test::RequestSize;
using carve::test::ScriptedClock;
using carve::test::thresholds;

namespace {

template <class Drain>
using Queue = carve::SizeTieredQueue<Request, RequestSize, carve::RingLanes<>, Drain, ScriptedClock>;

// Sizes 100 / 300 / 600 land in tiers 0 / 1 / 2 of {128, 512}.
constexpr std::uint64_t small = 100, medium = 300, large = 600;

template <class Drain>
void push_all(Queue<Drain>& q, const std::vector<std::pair<std::uint64_t, std::uint64_t>>& requests) {
  for (const auto& [size, id] : requests) {
    ScriptedClock::advance();
    REQUIRE(q.try_push(Request::make(size, id)));
  }
}

template <class Drain>
std::vector<std::uint64_t> drain_all(Queue<Drain>& q) {
  std::vector<std::uint64_t> order;
  while (auto r = q.try_pop()) {
    CHECK(*r->payload == r->id);
    order.push_back(r->id);
  }
  return order;
}

using Order = std::vector<std::uint64_t>;

// Three small (1-3), one medium (11), two large (21, 22), pushed large first.
const std::vector<std::pair<std::uint64_t, std::uint64_t>> mix = {{large, 21}, {large, 22}, {medium, 11},
                                                                  {small, 1},  {small, 2},  {small, 3}};

// A view over `tiers` tiers of which the bits of `empty` are known empty.
struct MaskView {
  std::uint32_t tiers;
  std::uint32_t empty;
  std::uint32_t tier_count() const noexcept { return tiers; }
  bool known_empty(std::uint32_t t) const noexcept { return ((empty >> t) & 1U) != 0; }
};
} // namespace

TEST_CASE("next_untried walks on from a tier, wrapping, and skips tiers found empty") {
  using carve::detail::next_untried;
  CHECK(next_untried(MaskView{3, 0b000}, 2) == 2U);
  CHECK(next_untried(MaskView{3, 0b100}, 2) == 0U); // wraps past the last tier
  CHECK(next_untried(MaskView{3, 0b101}, 2) == 1U);
  CHECK(next_untried(MaskView{3, 0b011}, 0) == 2U);
  CHECK(next_untried(MaskView{3, 0b110}, 1) == 0U);
  CHECK(next_untried(MaskView{3, 0b000}, 7) == 1U); // a start past the tiers counts modulo their number
  CHECK_FALSE(next_untried(MaskView{3, 0b111}, 1).has_value());
  CHECK_FALSE(next_untried(MaskView{0, 0}, 0).has_value());
  for (std::uint32_t n = 1; n <= carve::max_tiers; ++n) {
    for (std::uint32_t from = 0; from < n; ++from) {
      CHECK(next_untried(MaskView{n, ~(1U << ((from + n - 1) % n))}, from) == (from + n - 1) % n);
    }
  }
}

TEST_CASE("round-robin: one per non-empty tier in turn, skipping empty tiers") {
  ScriptedClock::set(0);
  Queue<carve::RoundRobin> q(thresholds({128, 512}), 16);
  push_all(q, mix);
  CHECK(drain_all(q) == Order{1, 11, 21, 2, 22, 3});

  // The turn continues after the last tier served, also across pushes in between.
  push_all(q, {{small, 1}, {large, 21}});
  CHECK(q.try_pop()->id == 21); // tier 0 was served last above, then tier 1 is empty
  push_all(q, {{medium, 11}, {large, 22}});
  CHECK(drain_all(q) == Order{1, 11, 22});
}

TEST_CASE("weighted round-robin: up to w[t] in a row per tier") {
  ScriptedClock::set(0);
  Queue<carve::WeightedRoundRobin> q(thresholds({128, 512}), 16, carve::WeightedRoundRobin({2, 1, 1}));
  REQUIRE(q.status());
  push_all(q, mix);
  push_all(q, {{small, 4}, {small, 5}, {medium, 12}});
  CHECK(drain_all(q) == Order{1, 2, 11, 21, 3, 4, 12, 22, 5});

  Queue<carve::WeightedRoundRobin> heavy(thresholds({128}), 16, carve::WeightedRoundRobin({1, 3}));
  push_all(heavy, {{small, 1}, {small, 2}, {medium, 11}, {medium, 12}, {medium, 13}, {medium, 14}});
  CHECK(drain_all(heavy) == Order{1, 11, 12, 13, 2, 14});
}

TEST_CASE("deficit round-robin: credit per visit, charged by size afterwards") {
  ScriptedClock::set(0);
  Queue<carve::DeficitRoundRobin> q(thresholds({128, 512}), 16, carve::DeficitRoundRobin({300, 300, 300}));
  REQUIRE(q.status());
  push_all(q, {{small, 1}, {small, 2}, {small, 3}, {small, 4}, {small, 5}, {small, 6}});
  push_all(q, {{medium, 11}, {medium, 12}, {large, 21}, {large, 22}});
  // Tier 0 spends 300 on three requests of 100; tier 1 one of 300; tier 2 overdraws by 300 with
  // one of 600 and must sit out its next visit.
  CHECK(drain_all(q) == Order{1, 2, 3, 11, 21, 4, 5, 6, 12, 22});
}

TEST_CASE("deficit round-robin shares bytes by quantum whatever the request sizes") {
  ScriptedClock::set(0);
  // Tier 0: requests of 100 bytes; tier 1: 500. Equal quanta: equal bytes, so five times as
  // many small requests are served as large ones.
  Queue<carve::DeficitRoundRobin> q(thresholds({128}), 4096, carve::DeficitRoundRobin({1000, 1000}));
  for (std::uint64_t i = 0; i < 2000; ++i) {
    REQUIRE(q.try_push(Request::make(100, i)));
    if (i % 2 == 0) {
      REQUIRE(q.try_push(Request::make(500, 100000 + i)));
    }
  }
  std::uint64_t bytes[2] = {0, 0};
  for (int i = 0; i < 1200; ++i) {
    const auto r = q.try_pop();
    REQUIRE(r);
    bytes[r->size == 100 ? 0 : 1] += r->size;
  }
  // Both tiers stay busy throughout; their byte counts differ by at most a quantum plus a request.
  CHECK(bytes[0] > 0);
  CHECK(bytes[1] > 0);
  const auto diff = bytes[0] > bytes[1] ? bytes[0] - bytes[1] : bytes[1] - bytes[0];
  CHECK(diff <= 1000 + 500);

  // Unequal quanta: 3:1.
  Queue<carve::DeficitRoundRobin> skewed(thresholds({128}), 4096, carve::DeficitRoundRobin({3000, 1000}));
  for (std::uint64_t i = 0; i < 3000; ++i) {
    REQUIRE(skewed.try_push(Request::make(100, i)));
    REQUIRE(skewed.try_push(Request::make(500, 100000 + i)));
  }
  bytes[0] = bytes[1] = 0;
  for (int i = 0; i < 2000; ++i) {
    const auto r = skewed.try_pop();
    REQUIRE(r);
    bytes[r->size == 100 ? 0 : 1] += r->size;
  }
  const double ratio = static_cast<double>(bytes[0]) / static_cast<double>(bytes[1]);
  CHECK(ratio == doctest::Approx(3.0).epsilon(0.05));
}

TEST_CASE("deficit round-robin, small first: quanta by work, tier 0 with headroom, nobody starves") {
  const double work[] = {36, 88, 35};
  const auto drr = carve::DeficitRoundRobin::small_first(work, 100);
  REQUIRE(drr.quanta().size() == 3);
  CHECK(drr.quanta()[0] == 411); // 4 x 100 x 36 / 35, rounded
  CHECK(drr.quanta()[1] == 251); // 100 x 88 / 35
  CHECK(drr.quanta()[2] == 100);

  // Tiers 1 and 2 backlogged, and a small request arriving at every pop that serves one (a
  // flood strict priority would serve alone): the small ones still wait for at most one turn
  // of each other tier, and those tiers keep sharing in proportion to their quanta.
  Queue<carve::DeficitRoundRobin> q(thresholds({128, 512}), 4096, drr);
  for (std::uint64_t i = 0; i < 600; ++i) {
    REQUIRE(q.try_push(Request::make(medium, 1000 + i)));
    REQUIRE(q.try_push(Request::make(large, 2000 + i)));
  }
  std::uint64_t served[3] = {0, 0, 0};
  std::uint64_t most_waited = 0; // pops between a small request's push and its pop, at most
  for (std::uint64_t round = 0; round < 300; ++round) {
    REQUIRE(q.try_push(Request::make(small, round)));
    for (std::uint64_t pops = 1;; ++pops) {
      const auto r = q.try_pop();
      REQUIRE(r);
      ++served[q.tier_of(*r)];
      if (r->id == round) {
        most_waited = std::max(most_waited, pops);
        break;
      }
    }
  }
  CHECK(served[0] == 300);
  CHECK(served[1] + served[2] > 50);
  const double share = static_cast<double>(served[1] * medium) / static_cast<double>(served[2] * large);
  CHECK(share == doctest::Approx(2.51).epsilon(0.2));
  CHECK(most_waited <= 3); // itself, and one turn of each other tier (one request each here)

  // Bad work lists give quanta that the queue refuses.
  const double none[] = {1, 0, 5};
  CHECK_THROWS_AS(
      Queue<carve::DeficitRoundRobin>(thresholds({128, 512}), 8, carve::DeficitRoundRobin::small_first(none, 100)),
      carve::Exception);
  const double two[] = {1, 2};
  CHECK_THROWS_AS(
      Queue<carve::DeficitRoundRobin>(thresholds({128, 512}), 8, carve::DeficitRoundRobin::small_first(two, 100)),
      carve::Exception);
}

TEST_CASE("strict priority without aging starves the large tier") {
  ScriptedClock::set(0);
  Queue<carve::StrictPriority> q(thresholds({128, 512}), 64);
  push_all(q, {{large, 21}, {medium, 11}});
  for (std::uint64_t i = 0; i < 10000; ++i) {
    push_all(q, {{small, i}});
    const auto r = q.try_pop();
    REQUIRE(r);
    REQUIRE(r->size == small); // a small request always arrived in time to go first
  }
  CHECK(q.size(1) == 1);
  CHECK(q.size(2) == 1);
  CHECK(drain_all(q) == Order{11, 21});
}

TEST_CASE("strict priority with aging serves a request once it is older than the bound") {
  ScriptedClock::set(0);
  Queue<carve::StrictPriority> q(thresholds({128, 512}), 64, carve::StrictPriority::with_aging(100));
  CHECK(q.drain().aging());
  push_all(q, {{large, 21}});  // stamped 1
  push_all(q, {{medium, 11}}); // stamped 2
  std::vector<std::uint64_t> served_at;
  for (std::uint64_t i = 0; i < 1000; ++i) {
    push_all(q, {{small, 1000 + i}});
    const auto r = q.try_pop();
    REQUIRE(r);
    if (r->size != small) {
      served_at.push_back(r->id);
      served_at.push_back(ScriptedClock::now());
    }
  }
  // Large (older) first once past the bound, then medium one step later; never starved.
  REQUIRE(served_at.size() == 4);
  CHECK(served_at[0] == 21);
  CHECK(served_at[1] == 102); // age 101 > 100
  CHECK(served_at[2] == 11);
  CHECK(served_at[3] == 103);
  // Everything else went out in strict order: the small tier is FIFO.
  CHECK(q.size() == 2);
}

TEST_CASE("priority tag: one queue ordered by (tag, arrival)") {
  ScriptedClock::set(0);
  SUBCASE("default tags: smallest tier first") {
    Queue<carve::PriorityTag> q(thresholds({128, 512}), 16);
    push_all(q, mix);
    CHECK(drain_all(q) == Order{1, 2, 3, 11, 21, 22});
  }
  SUBCASE("equal tags: arrival order across tiers") {
    Queue<carve::PriorityTag> q(thresholds({128, 512}), 16, carve::PriorityTag({0, 0, 0}));
    push_all(q, {{large, 21}, {small, 1}, {medium, 11}, {small, 2}, {large, 22}, {medium, 12}});
    CHECK(drain_all(q) == Order{21, 1, 11, 2, 22, 12});
  }
  SUBCASE("regrouped tags: medium first, then small and large by arrival") {
    Queue<carve::PriorityTag> q(thresholds({128, 512}), 16, carve::PriorityTag({1, 0, 1}));
    push_all(q, {{large, 21}, {small, 1}, {medium, 11}, {small, 2}, {large, 22}, {medium, 12}});
    CHECK(drain_all(q) == Order{11, 12, 21, 1, 2, 22});
  }
  SUBCASE("one capacity for the whole queue") {
    Queue<carve::PriorityTag> q(thresholds({128, 512}), 4);
    push_all(q, {{small, 1}, {small, 2}, {large, 21}, {medium, 11}});
    CHECK(q.try_push(Request::make(large, 22)).error() == Errc::full);
    CHECK(q.try_push(Request::make(small, 3)).error() == Errc::full);
    CHECK(q.capacity(0) == 4);
    CHECK(q.try_pop()->id == 1);
    CHECK(q.try_push(Request::make(large, 22)));
    CHECK(q.stats().tier[2].rejected == 1);
  }
}

TEST_CASE("the default clock saturates a bound past 2^64 ticks rather than overflow") {
  CHECK(carve::QueueClock::ticks_from_ns(std::numeric_limits<std::uint64_t>::max()) > 0);
  CHECK(carve::QueueClock::ticks_from_ns(0) == 0);
}

TEST_CASE("a request put back is the head its policy sees: tags order it, aging reaches it") {
  ScriptedClock::set(0);
  SUBCASE("priority tag: the small request put back goes before the larger ones") {
    Queue<carve::PriorityTag> q(thresholds({128, 512}), 16);
    push_all(q, {{small, 1}, {medium, 11}, {medium, 12}, {large, 21}});
    auto first = q.try_pop();
    REQUIRE(first);
    REQUIRE(first->id == 1);
    REQUIRE(q.try_push_front(std::move(*first))); // not placeable yet
    CHECK(drain_all(q) == Order{1, 11, 12, 21});
  }
  SUBCASE("strict priority with aging: a large request put back is served once older than the bound") {
    Queue<carve::StrictPriority> q(thresholds({128, 512}), 64, carve::StrictPriority::with_aging(100));
    push_all(q, {{large, 21}});
    auto large_one = q.try_pop();
    REQUIRE(large_one);
    REQUIRE(q.try_push_front(std::move(*large_one))); // stamped now: 1
    std::uint64_t served_at = 0;
    for (std::uint64_t i = 0; i < 1000 && served_at == 0; ++i) {
      push_all(q, {{small, 1000 + i}}); // a steady stream of small requests
      const auto r = q.try_pop();
      REQUIRE(r);
      served_at = r->id == 21 ? ScriptedClock::now() : 0;
    }
    CHECK(served_at == 102); // age 101 > 100, as for a request never put back
  }
}

TEST_CASE("policies refuse parameters that do not fit the tiers") {
  using carve::DeficitRoundRobin;
  using carve::PriorityTag;
  using carve::WeightedRoundRobin;
  const auto t = thresholds({128, 512});
  CHECK_THROWS_ERRC(Errc::invalid_argument, Queue<WeightedRoundRobin>(t, 8, WeightedRoundRobin({1, 1})));
  CHECK_THROWS_ERRC(Errc::invalid_argument, Queue<WeightedRoundRobin>(t, 8, WeightedRoundRobin({1, 0, 1})));
  CHECK_THROWS_ERRC(Errc::invalid_argument, Queue<DeficitRoundRobin>(t, 8, DeficitRoundRobin({1, 1, 1, 1})));
  CHECK_THROWS_ERRC(Errc::invalid_argument, Queue<DeficitRoundRobin>(t, 8, DeficitRoundRobin({0, 1, 1})));
  CHECK_THROWS_ERRC(Errc::invalid_argument, Queue<PriorityTag>(t, 8, PriorityTag({0, 1})));
  const std::size_t per_tier[] = {4, 4, 4};
  CHECK_THROWS_ERRC(Errc::invalid_argument, Queue<PriorityTag>(t, per_tier)); // shared capacity only

  // The exception says what is wrong.
  CHECK_THROWS_WITH_AS(Queue<WeightedRoundRobin>(t, 8, WeightedRoundRobin({1, 1})),
                       doctest::Contains("drain policy 'weighted round-robin', 3 tiers"), carve::Exception);
}

namespace {
// A policy of one's own: the largest requests first.
struct LargestFirst {
  static constexpr const char* name = "largest first";
  template <class Clock>
  cuda::std::expected<void, Errc> prepare(std::uint32_t) {
    return {};
  }
  template <class View>
  cuda::std::optional<std::uint32_t> pick(const View& view) const {
    for (std::uint32_t t = view.tier_count(); t-- > 0;) {
      if (!view.known_empty(t)) {
        return t;
      }
    }
    return cuda::std::nullopt;
  }
  template <class View>
  void served(const View&, std::uint32_t, std::uint64_t) const {}
};
static_assert(carve::DrainPolicy<LargestFirst>);

struct NotAPolicy {
  int pick() const { return 0; }
};
static_assert(!carve::DrainPolicy<NotAPolicy>);
} // namespace

TEST_CASE("a user policy plugs in through the concept") {
  ScriptedClock::set(0);
  Queue<LargestFirst> q(thresholds({128, 512}), 8);
  push_all(q, mix);
  CHECK(drain_all(q) == Order{21, 22, 11, 1, 2, 3});
  CHECK(std::string(carve::drain_name<LargestFirst>()) == "largest first");
  CHECK(std::string(carve::drain_name<carve::RoundRobin>()) == "round-robin");
}

} // namespace test_drain_policies
