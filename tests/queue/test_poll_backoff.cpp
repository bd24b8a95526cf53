// PollBackoff: the waits start at the first, double up to the cap and start over after reset();
// a wait lasts at least its length; on the host LostRaceBackoff has PollBackoff's default
// lengths; and a consumer thread that polls a SizeTieredQueue with it receives every request of
// a producer thread exactly once, in push order within each tier (run under ThreadSanitizer too).
#include <carve/queue/poll_backoff.hpp>
#include <carve/queue/size_tiered_queue.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

// In a namespace of its own: the area's test files compile as one translation unit.
namespace test_poll_backoff {

namespace {

static_assert(carve::PollBackoff{}.next_ns() == carve::PollBackoff::default_first_ns);
static_assert(carve::PollBackoff{}.max_ns() == carve::PollBackoff::default_max_ns);
static_assert(carve::PollBackoff(500, 100).max_ns() == 500, "a cap below the first wait is raised to it");

struct Request {
  std::uint32_t id;
  std::uint32_t size;
};

struct Size {
  std::uint64_t operator()(const Request& r) const noexcept { return r.size; }
};

// The lengths of `b`'s next `n` waits, each waited.
std::vector<std::uint32_t> wait_lengths(carve::PollBackoff& b, int n) {
  std::vector<std::uint32_t> lengths;
  for (int i = 0; i < n; ++i) {
    lengths.push_back(b.next_ns());
    b.wait();
  }
  return lengths;
}

} // namespace

TEST_CASE("LostRaceBackoff waits on the host as PollBackoff does by default") {
  const carve::LostRaceBackoff lost;
  CHECK(lost.first_ns() == carve::PollBackoff::default_first_ns);
  CHECK(lost.max_ns() == carve::PollBackoff::default_max_ns);
  CHECK(lost.next_ns() == lost.first_ns());
}

TEST_CASE("waits double from the first up to the cap, and reset() starts over") {
  carve::PollBackoff b(100, 800);
  CHECK(wait_lengths(b, 6) == std::vector<std::uint32_t>{100, 200, 400, 800, 800, 800});
  b.reset();
  CHECK(b.next_ns() == 100);
  CHECK(b.first_ns() == 100);
  CHECK(b.max_ns() == 800);
}

TEST_CASE("a cap that is not a power-of-two multiple of the first wait is still reached exactly") {
  carve::PollBackoff b(300, 1000);
  CHECK(wait_lengths(b, 4) == std::vector<std::uint32_t>{300, 600, 1000, 1000});
}

TEST_CASE("a first wait of zero never waits") {
  for (const std::uint32_t cap : {0U, 1000U}) {
    carve::PollBackoff b(0, cap);
    b.wait();
    b.wait();
    CHECK(b.next_ns() == 0);
  }
}

TEST_CASE("a wait lasts at least its length") {
  carve::PollBackoff b(200'000, 200'000);
  const auto start = std::chrono::steady_clock::now();
  b.wait();
  CHECK(std::chrono::steady_clock::now() - start >= std::chrono::microseconds(200));
}

TEST_CASE("a consumer polling with PollBackoff gets every request once, in order within its tier") {
  constexpr std::uint32_t requests = 20'000;
  using Queue = carve::SizeTieredQueue<Request, Size>;
  auto q = std::make_unique<Queue>(carve::TierThresholds{128, 512}, 256);
  const auto size_of = [](std::uint32_t id) { return (id * 37U) % 1100U; };

  std::thread producer([&] {
    carve::PollBackoff full(1'000, 16'000);
    for (std::uint32_t id = 0; id < requests; ++id) {
      while (!q->try_push(Request{id, size_of(id)})) {
        full.wait();
      }
      full.reset();
    }
    q->close();
  });

  std::vector<int> times_seen(requests, 0);
  std::vector<std::int64_t> last_in_tier(q->tier_count(), -1);
  bool in_order = true;
  carve::PollBackoff idle(1'000, 16'000);
  for (;;) {
    auto r = q->try_pop();
    if (!r) {
      if (r.error() == carve::Errc::closed) {
        break;
      }
      REQUIRE(r.error() == carve::Errc::empty);
      idle.wait();
      continue;
    }
    idle.reset();
    ++times_seen[r->id];
    auto& last = last_in_tier[q->tier_of(*r)];
    in_order = in_order && last < static_cast<std::int64_t>(r->id);
    last = r->id;
  }
  producer.join();

  CHECK(in_order);
  CHECK(std::count(times_seen.begin(), times_seen.end(), 1) == requests);
}

} // namespace test_poll_backoff
