// SizeTieredQueue and its lanes on one thread: the calls, their errors, capacity per tier,
// close() semantics, bulk pops, sizes, statistics, lifetimes of move-only requests; the
// MpmcRing alone over many laps of odd capacities.
#include "queue_helpers.hpp"
#include "support/errors.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <deque>
#include <iterator>
#include <random>
#include <thread>
#include <vector>

// In a namespace of its own: the area's test files compile as one translation unit.
namespace test_size_tiered_queue {

using carve::Errc;
using carve::MpmcRing;
using carve::test::Counted;
using carve::test::CountedSize;
using carve::test::Request;
using carve::test::RequestSize;
using carve::test::ScriptedClock;
using carve::test::thresholds;

namespace {

template <class Lanes>
using Queue = carve::SizeTieredQueue<Request, RequestSize, Lanes, carve::RoundRobin, ScriptedClock>;

constexpr carve::QueueOptions every_wait{.wait_sample = 1};

#if defined(CARVE_HAS_MOODYCAMEL_LANE)
#define CARVE_TEST_LANES carve::RingLanes<>, carve::MoodycamelLanes
#else
#define CARVE_TEST_LANES carve::RingLanes<>
#endif

} // namespace

TEST_CASE_TEMPLATE("push and pop through every lane type", Lanes, CARVE_TEST_LANES) {
  Queue<Lanes> q(thresholds({128, 512}), 4, every_wait);
  REQUIRE(q.status());
  CHECK(q.tier_count() == 3);
  CHECK(q.empty());
  CHECK(q.try_pop().error() == Errc::empty);

  for (std::uint64_t i = 0; i < 4; ++i) {
    REQUIRE(q.try_push(Request::make(10, i)));
  }
  CHECK(q.size(0) == 4);
  CHECK(q.size() == 4);
  CHECK(q.empty(1));

  // Tier 0 is full; the request stays with the caller; other tiers still take requests.
  auto refused = Request::make(10, 99);
  CHECK(q.try_push(std::move(refused)).error() == Errc::full);
  REQUIRE(refused.payload != nullptr);
  CHECK(*refused.payload == 99);
  CHECK(q.try_push(Request::make(200, 50)));

  // FIFO within the tier.
  for (std::uint64_t i = 0; i < 2; ++i) {
    const auto r = q.try_pop();
    REQUIRE(r);
    CHECK(*r->payload == r->id);
  }
  CHECK(q.try_push(std::move(refused)));
  std::vector<std::uint64_t> ids;
  while (auto r = q.try_pop()) {
    ids.push_back(r->id);
  }
  CHECK(ids.size() == 4);
  CHECK(q.empty());

  const auto s = q.stats();
  CHECK(s.tiers == 3);
  CHECK(s.tier[0].enqueued == 5);
  CHECK(s.tier[0].dequeued == 5);
  CHECK(s.tier[0].rejected == 1);
  CHECK(s.tier[1].enqueued == 1);
  CHECK(s.tier[0].capacity == 4);
  CHECK(s.tier[0].wait.count() == 5);
}

TEST_CASE("capacity per tier") {
  const std::size_t caps[] = {1, 2, 3};
  Queue<carve::RingLanes<>> q(thresholds({128, 512}), caps);
  REQUIRE(q.status());
  CHECK(q.capacity(0) == 1);
  CHECK(q.capacity(2) == 3);
  CHECK(q.capacity(3) == 0);
  CHECK(q.try_push(Request::make(1, 0)));
  CHECK(q.try_push(Request::make(1, 1)).error() == Errc::full);
  CHECK(q.try_push(Request::make(300, 2)));
  CHECK(q.try_push(Request::make(300, 3)));
  CHECK(q.try_push(Request::make(300, 4)).error() == Errc::full);
  for (std::uint64_t i = 0; i < 3; ++i) {
    CHECK(q.try_push(Request::make(1000, 10 + i)));
  }
  CHECK(q.try_push(Request::make(1000, 13)).error() == Errc::full);
  CHECK(q.size() == 6);

  using Q = Queue<carve::RingLanes<>>;
  const std::size_t wrong_count[] = {1, 2};
  CHECK_THROWS_ERRC(Errc::invalid_argument, Q(thresholds({128, 512}), wrong_count));
  const std::size_t zero[] = {1, 0, 1};
  CHECK_THROWS_ERRC(Errc::invalid_argument, Q(thresholds({128, 512}), zero));
  CHECK_THROWS_ERRC(Errc::invalid_argument, Q(thresholds({128, 512}), 0));
}

TEST_CASE("a queue given bad input is not built: the constructor says what is wrong") {
  using Q = Queue<carve::RingLanes<>>;
  CHECK_THROWS_WITH_AS(Q({512, 128}, 8), doctest::Contains("threshold 1 (128) is below threshold 0 (512)"),
                       carve::Exception);
  CHECK_THROWS_ERRC(Errc::invalid_thresholds, Q({512, 128}, 8));
  CHECK_THROWS_ERRC(Errc::invalid_thresholds, Q(carve::TierThresholds(cuda::std::span<const std::uint64_t>()), 8));
  CHECK_THROWS_WITH_AS(Q({128}, 0), doctest::Contains("capacity of at least 1"), carve::Exception);
  CHECK_THROWS_ERRC(Errc::invalid_argument, Q({128}, 0));
  const auto q = std::make_unique<Q>(carve::TierThresholds{128, 512}, 8);
  CHECK(q->status());
  CHECK(q->try_push(Request::make(600, 1)));
}

TEST_CASE("close refuses pushes and lets the queue drain") {
  Queue<carve::RingLanes<>> q(thresholds({128}), 8);
  REQUIRE(q.try_push(Request::make(1, 1)));
  REQUIRE(q.try_push(Request::make(500, 2)));
  CHECK_FALSE(q.closed());
  q.close();
  CHECK(q.closed());
  auto late = Request::make(1, 3);
  CHECK(q.try_push(std::move(late)).error() == Errc::closed);
  CHECK(late.payload != nullptr);
  CHECK(q.try_pop()->id == 1);
  CHECK(q.try_pop()->id == 2);
  CHECK(q.try_pop().error() == Errc::closed);
  CHECK(q.pop().error() == Errc::closed); // blocking pop returns at once on a drained, closed queue
  CHECK(q.pop(std::chrono::seconds(10)).error() == Errc::closed);
  CHECK(q.push(Request::make(1, 4)).error() == Errc::closed);
  q.close(); // twice is harmless
  CHECK(q.try_pop().error() == Errc::closed);
}

TEST_CASE("blocking calls time out") {
  Queue<carve::RingLanes<>> q(thresholds({128}), 1);
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(q.pop(std::chrono::milliseconds(20)).error() == Errc::timed_out);
  CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(20));
  REQUIRE(q.push(Request::make(1, 1)));
  auto r = Request::make(1, 2);
  CHECK(q.push(std::move(r), std::chrono::milliseconds(5)).error() == Errc::timed_out);
  CHECK(r.payload != nullptr);                                        // still the caller's
  CHECK(q.push(Request::make(500, 3), std::chrono::milliseconds(5))); // another tier has room
  CHECK(q.pop(std::chrono::milliseconds(0))->id == 1);
  std::vector<Request> out;
  CHECK(q.pop_bulk(std::back_inserter(out), 8, std::chrono::milliseconds(0)).value() == 1);
  CHECK(q.pop_bulk(std::back_inserter(out), 8, std::chrono::milliseconds(1)).error() == Errc::timed_out);
}

TEST_CASE("bulk pop takes up to max, in drain order") {
  Queue<carve::RingLanes<>> q(thresholds({128, 512}), 16);
  for (std::uint64_t i = 0; i < 4; ++i) {
    REQUIRE(q.try_push(Request::make(1, i)));
    REQUIRE(q.try_push(Request::make(1000, 100 + i)));
  }
  std::vector<Request> out;
  CHECK(q.try_pop_bulk(std::back_inserter(out), 5) == 5);
  std::vector<std::uint64_t> ids;
  for (const auto& r : out) {
    ids.push_back(r.id);
  }
  CHECK(ids == std::vector<std::uint64_t>{0, 100, 1, 101, 2});
  CHECK(q.try_pop_bulk(std::back_inserter(out), 0) == 0);
  CHECK(q.try_pop_bulk(std::back_inserter(out), 100) == 3);
  CHECK(q.try_pop_bulk(std::back_inserter(out), 100).error() == Errc::empty);
  Request raw[2];
  REQUIRE(q.try_push(Request::make(1, 7)));
  CHECK(q.try_pop_bulk(raw, 2) == 1); // plain pointers work as output iterators (device code)
  CHECK(raw[0].id == 7);
}

TEST_CASE("bulk pop says closed in the same call once a closed queue is drained") {
  Queue<carve::RingLanes<>> q(thresholds({128, 512}), 16);
  REQUIRE(q.try_push(Request::make(1, 1)));
  REQUIRE(q.try_push(Request::make(1000, 2)));
  q.close();
  std::vector<Request> out;
  CHECK(q.try_pop_bulk(std::back_inserter(out), 1) == 1); // closed, but requests are left
  CHECK(q.try_pop_bulk(std::back_inserter(out), 8) == 1);
  CHECK(q.try_pop_bulk(std::back_inserter(out), 8).error() == Errc::closed);
  CHECK(out.size() == 2);
}

TEST_CASE("the wait histogram records push-to-pop time per tier") {
  ScriptedClock::set(1000);
  Queue<carve::RingLanes<>> q(thresholds({128}), 64, every_wait);
  for (int i = 0; i < 10; ++i) {
    REQUIRE(q.try_push(Request::make(1, 0)));
  }
  REQUIRE(q.try_push(Request::make(500, 0)));
  ScriptedClock::advance(1000); // every request waits 1000 ticks
  for (int i = 0; i < 11; ++i) {
    REQUIRE(q.try_pop());
  }
  const auto s = q.stats();
  CHECK(s.tier[0].wait.count() == 10);
  CHECK(s.tier[1].wait.count() == 1);
  CHECK(s.tier[0].wait.counts[carve::WaitHistogram<cuda::thread_scope_system>::bucket(1000)] == 10);
  const double p50 = s.tier[0].wait.quantile_ns(0.5);
  CHECK(p50 >= 512.0);
  CHECK(p50 <= 1024.0);
  CHECK(s.depth() == 0);
  const std::string text = carve::format_stats(s, q.thresholds());
  CHECK(text.find("0..128") != std::string::npos);
  CHECK(text.find("> 128") != std::string::npos);

  carve::WaitHistogramSnapshot none;
  CHECK(none.quantile_ns(0.99) == 0.0);
  CHECK(carve::WaitHistogram<cuda::thread_scope_system>::bucket(0) == 0);
  CHECK(carve::WaitHistogram<cuda::thread_scope_system>::bucket(1) == 1);
  CHECK(carve::WaitHistogram<cuda::thread_scope_system>::bucket(~std::uint64_t{0}) == carve::wait_buckets - 1);
}

TEST_CASE("the wait histogram samples one request in wait_sample, or none") {
  for (const std::uint32_t every : {0U, 4U, 16U}) {
    CAPTURE(every);
    ScriptedClock::set(1000);
    Queue<carve::RingLanes<>> q(thresholds({128}), 256, carve::QueueOptions{.wait_sample = every});
    for (std::uint64_t i = 0; i < 64; ++i) {
      REQUIRE(q.try_push(Request::make(1 + 200 * (i % 2), i)));
    }
    ScriptedClock::advance(1000);
    while (q.try_pop()) {
    }
    const auto s = q.stats();
    CHECK(s.tier[0].wait_sample == every);
    CHECK(s.tier[0].dequeued + s.tier[1].dequeued == 64); // the counts stay exact
    CHECK(s.tier[0].wait.count() + s.tier[1].wait.count() == (every == 0 ? 0 : 64 / every));
    for (const carve::TierStats& ts : {s.tier[0], s.tier[1]}) {
      if (ts.wait.count() != 0) { // a sampled wait is the whole wait (within the stamp's marker bit)
        CHECK(ts.wait.quantile_ns(1.0) >= 512.0);
        CHECK(ts.wait.quantile_ns(1.0) <= 1024.0);
      }
    }
  }
  // A policy that compares stamps gets every request stamped, and the histogram still samples.
  using Aging = carve::SizeTieredQueue<Request, RequestSize, carve::RingLanes<>, carve::StrictPriority, ScriptedClock>;
  Aging q(thresholds({128}), 256, carve::QueueOptions{.wait_sample = 8}, carve::StrictPriority::with_aging(100));
  for (std::uint64_t i = 0; i < 64; ++i) {
    REQUIRE(q.try_push(Request::make(1, i)));
  }
  while (q.try_pop()) {
  }
  CHECK(q.stats().tier[0].wait.count() == 8);
}

TEST_CASE("requests left in a queue are destroyed with it, exactly once") {
  Counted::live = 0;
  {
    using Q = carve::SizeTieredQueue<Counted, CountedSize>;
    Q q(thresholds({10}), 8);
    for (std::uint64_t i = 0; i < 12; ++i) {
      (void)q.try_push(Counted(i, i));
    }
    CHECK(Counted::live == 9); // sizes 0..10 go to tier 0, which takes 8; size 11 to tier 1
    auto one = q.try_pop();
    REQUIRE(one);
    CHECK(Counted::live == 9);
  }
  CHECK(Counted::live == 0);
}

TEST_CASE("the real clock stamps requests and converts to nanoseconds") {
  using Q = carve::SizeTieredQueue<Request, RequestSize>;
  const auto q = std::make_unique<Q>(carve::TierThresholds{128}, 8, carve::QueueOptions{.wait_sample = 1});
  REQUIRE(q->try_push(Request::make(1, 1)));
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  REQUIRE(q->try_pop());
  const double waited = q->stats().tier[0].wait.quantile_ns(0.5);
  CHECK(waited > 1e6); // at least a millisecond (the bucket holds 2 ms within a factor of 2)
  CHECK(waited < 1e9);
  CHECK(carve::QueueClock::ns_per_tick() > 0.0);
  const std::uint64_t a = carve::QueueClock::now();
  CHECK(carve::QueueClock::now() >= a);
}

TEST_CASE("MpmcRing over many laps of odd and power-of-two capacities, reopening with room once full") {
  for (const std::size_t capacity : {std::size_t{1}, std::size_t{2}, std::size_t{3}, std::size_t{5}, std::size_t{7},
                                     std::size_t{8}, std::size_t{16}, std::size_t{64}, std::size_t{100}}) {
    CAPTURE(capacity);
    MpmcRing<Request> ring(capacity);
    REQUIRE(ring.capacity() == capacity);
    CHECK(ring.reopen_room() == capacity / 16 + 1);
    std::deque<std::uint64_t> model;
    bool reopening = false; // found full, and not yet reopen_room() cells free since
    std::mt19937_64 rng(capacity);
    std::uint64_t next = 0;
    std::size_t refused_with_room = 0;
    for (int step = 0; step < 5000; ++step) {
      const bool filling = (step / 500) % 2 == 0; // phases that reach full and empty again
      if (rng() % 5 < (filling ? 3U : 2U)) {
        auto r = Request::make(0, next);
        const bool pushed = ring.try_push(r, next * 10);
        const std::size_t needed = reopening ? ring.reopen_room() : 1;
        CHECK(pushed == (capacity - model.size() >= needed));
        refused_with_room += !pushed && model.size() < capacity;
        reopening = !pushed;
        if (pushed) {
          CHECK(r.payload == nullptr);
          model.push_back(next);
        } else {
          CHECK(*r.payload == next);
        }
        ++next;
      } else {
        const auto front = ring.front_stamp();
        const auto got = ring.try_pop();
        CHECK(got.has_value() == !model.empty());
        if (got) {
          CHECK(got->value.id == model.front());
          CHECK(*got->value.payload == model.front());
          CHECK(got->stamp == model.front() * 10);
          CHECK(front == got->stamp);
          model.pop_front();
        } else {
          CHECK_FALSE(front.has_value());
        }
      }
      CHECK(ring.size() == model.size());
    }
    CHECK(ring.pushed() - ring.popped() == model.size());
    CHECK((refused_with_room != 0) == (capacity >= 16));
  }
}

TEST_CASE("an MpmcRing of capacity 0 refuses every push and keeps the item") {
  MpmcRing<Request> ring(0);
  CHECK(ring.capacity() == 0);
  auto r = Request::make(1, 7);
  CHECK_FALSE(ring.try_push(r, 0));
  REQUIRE(r.payload != nullptr);
  CHECK(*r.payload == 7);
  CHECK_FALSE(ring.try_pop().has_value());
  CHECK_FALSE(ring.front_stamp().has_value());
  CHECK(ring.size() == 0);
}

TEST_CASE("no memory for a ring's cells is carve's no_space on the host, not std::bad_alloc") {
  // Cells whose bytes overflow size_t: operator new[] would throw std::bad_array_new_length.
  constexpr std::size_t too_many = ~std::size_t{0} / 2;
  CHECK_THROWS_ERRC(Errc::no_space, MpmcRing<Request>(too_many));
  using Q = Queue<carve::RingLanes<>>;
  CHECK_THROWS_ERRC(Errc::no_space, Q({128}, too_many));
}

TEST_CASE_TEMPLATE("a request put back goes to the head of its tier", Lanes, CARVE_TEST_LANES) {
  Queue<Lanes> q(thresholds({128, 512}), 8);
  for (std::uint64_t i = 0; i < 4; ++i) {
    REQUIRE(q.try_push(Request::make(10, i)));
  }
  auto first = q.try_pop();
  REQUIRE(first);
  CHECK(first->id == 0);
  REQUIRE(q.try_push(Request::make(10, 4)));
  // The consumer could not place request 0: it goes back in front of 1, 2, 3 and 4.
  REQUIRE(q.try_push_front(std::move(*first)));
  CHECK(q.size(0) == 5);
  const auto stats = q.stats();
  CHECK(stats.tier[0].requeued == 1);
  CHECK(stats.tier[0].enqueued == 6);
  CHECK(stats.tier[0].depth == 5);
  std::vector<std::uint64_t> order;
  while (auto r = q.try_pop()) {
    CHECK(*r->payload == r->id); // moved whole through the requeue
    order.push_back(r->id);
  }
  CHECK(order == std::vector<std::uint64_t>{0, 1, 2, 3, 4});
  // Several put back: they come out in the order they were put back, before the tier's others.
  REQUIRE(q.try_push(Request::make(10, 10)));
  REQUIRE(q.try_push_front(Request::make(10, 20)));
  REQUIRE(q.try_push_front(Request::make(10, 21)));
  order.clear();
  while (auto r = q.try_pop()) {
    order.push_back(r->id);
  }
  CHECK(order == std::vector<std::uint64_t>{20, 21, 10});
  CHECK(q.empty());
}

TEST_CASE("put back after close: still popped before the queue reports closed") {
  Queue<carve::RingLanes<>> q(thresholds({128}), 4);
  REQUIRE(q.try_push(Request::make(1, 1)));
  auto r = q.try_pop();
  REQUIRE(r);
  q.close();
  CHECK(q.try_push(Request::make(1, 2)).error() == Errc::closed);
  REQUIRE(q.try_push_front(std::move(*r))); // it was in the queue before close(): nothing is lost
  auto again = q.try_pop();
  REQUIRE(again);
  CHECK(again->id == 1);
  CHECK(q.try_pop().error() == Errc::closed);
}

TEST_CASE("the room for requests put back is bounded, and a refusal leaves the request with the caller") {
  using Q = Queue<carve::RingLanes<>>;
  Q q(thresholds({128}), 4); // a tier of 4: at most 4 put back
  for (std::uint64_t i = 0; i < 4; ++i) {
    REQUIRE(q.try_push_front(Request::make(1, i)));
  }
  auto extra = Request::make(1, 99);
  CHECK(q.try_push_front(std::move(extra)).error() == Errc::full);
  REQUIRE(extra.payload != nullptr);
  CHECK(*extra.payload == 99);
  CHECK(q.try_push(Request::make(1, 7))); // the tier's own capacity is untouched
  CHECK(q.size() == 5);
  CHECK(Q::requeue_capacity == 64);
  Q big(thresholds({128}), 1000);
  for (std::uint64_t i = 0; i < Q::requeue_capacity; ++i) {
    REQUIRE(big.try_push_front(Request::make(1, i)));
  }
  CHECK(big.try_push_front(Request::make(1, 64)).error() == Errc::full);
  // A put-back lane found full reopens with room to spare: 64 / 16 + 1 = 5 requests must leave it.
  for (int popped = 1; popped <= 5; ++popped) {
    REQUIRE(big.try_pop());
    CHECK(big.try_push_front(Request::make(1, 100)).has_value() == (popped == 5));
  }
}

} // namespace test_size_tiered_queue
