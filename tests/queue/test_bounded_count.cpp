// BoundedCount: the bound is exact alone and under real threads (also run under
// ThreadSanitizer), cancelled and refused reservations give their room back, and a producer that
// sees a released count newer than its own reservation still grants it.
#include <carve/queue/bounded_count.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstdint>
#include <thread>
#include <vector>

// In a namespace of its own: the area's test files compile as one translation unit.
namespace test_bounded_count {

using Count = carve::BoundedCount<cuda::thread_scope_system>;

TEST_CASE("grants exactly the bound, then refuses without counting the refusal") {
  Count c(3);
  CHECK(c.try_acquire());
  CHECK(c.try_acquire());
  CHECK(c.try_acquire());
  CHECK_FALSE(c.try_acquire());
  CHECK_FALSE(c.try_acquire());
  CHECK(c.acquired() == 3);
  CHECK(c.released() == 0);
}

TEST_CASE("a release makes room; a cancel gives a reservation back") {
  Count c(2);
  REQUIRE(c.try_acquire());
  REQUIRE(c.try_acquire());
  REQUIRE_FALSE(c.try_acquire());
  c.release();
  CHECK(c.try_acquire());
  CHECK_FALSE(c.try_acquire());
  c.cancel(); // the item of the last reservation was never stored
  CHECK(c.acquired() - c.released() == 1);
  CHECK(c.try_acquire());
  CHECK_FALSE(c.try_acquire());
}

TEST_CASE("room freed while the producers' view was stale is found") {
  Count c(1);
  for (int round = 0; round < 100; ++round) {
    REQUIRE(c.try_acquire());
    REQUIRE_FALSE(c.try_acquire()); // leaves the producers' view at this round's released count
    c.release();
  }
  CHECK(c.acquired() == 100);
  CHECK(c.released() == 100);
}

TEST_CASE("a bound of zero grants nothing") {
  Count c(0);
  CHECK_FALSE(c.try_acquire());
  CHECK(c.acquired() == 0);
}

// Producers take room and consumers give it back as fast as they can; every thread checks after
// each grant that no more than `bound` are held (counting its own grant from the moment it was
// made), and at the end the books balance.
TEST_CASE("under threads, the number held never passes the bound") {
  constexpr std::uint64_t bound = 8;
  constexpr int producers = 3;
  constexpr int consumers = 2;
  constexpr std::uint64_t per_producer = 20000;
  Count c(bound);
  std::atomic<std::int64_t> held{0}; // granted and not yet released, counted by the test
  std::atomic<std::int64_t> most{0};
  std::atomic<std::uint64_t> granted{0};
  std::atomic<int> producers_left{producers};
  std::barrier start(producers + consumers);

  std::vector<std::thread> threads;
  for (int p = 0; p < producers; ++p) {
    threads.emplace_back([&] {
      start.arrive_and_wait();
      for (std::uint64_t n = 0; n < per_producer;) {
        if (!c.try_acquire()) {
          std::this_thread::yield();
          continue;
        }
        const std::int64_t now = held.fetch_add(1) + 1;
        std::int64_t seen = most.load();
        while (now > seen && !most.compare_exchange_weak(seen, now)) {
        }
        granted.fetch_add(1);
        ++n;
      }
      producers_left.fetch_sub(1);
    });
  }
  for (int k = 0; k < consumers; ++k) {
    threads.emplace_back([&] {
      start.arrive_and_wait();
      for (;;) {
        std::int64_t h = held.load();
        if (h > 0 && held.compare_exchange_weak(h, h - 1)) {
          c.release(); // after the test's own count dropped: the test never undercounts
          continue;
        }
        if (producers_left.load() == 0 && held.load() == 0) {
          return;
        }
        std::this_thread::yield();
      }
    });
  }
  for (auto& t : threads) {
    t.join();
  }
  CHECK(granted.load() == producers * per_producer);
  CHECK(most.load() <= static_cast<std::int64_t>(bound));
  CHECK(most.load() >= 2); // the threads did overlap
  CHECK(c.acquired() == producers * per_producer);
  CHECK(c.released() == producers * per_producer);
}

} // namespace test_bounded_count
