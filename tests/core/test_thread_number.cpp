// carve::thread_number: distinct for threads running at once, and given back when a thread
// exits, so that shards picked by it stay apart however many threads came before.
#include <carve/core/thread_number.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <barrier>
#include <set>
#include <thread>
#include <vector>

TEST_CASE("threads running at once hold distinct numbers") {
  constexpr int threads = 24;
  std::vector<std::uint32_t> numbers(threads);
  std::barrier all_hold(threads);
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i) {
    pool.emplace_back([&, i] {
      numbers[static_cast<std::size_t>(i)] = carve::thread_number();
      all_hold.arrive_and_wait(); // nobody exits (and gives its number back) before all have one
      CHECK(carve::thread_number() == numbers[static_cast<std::size_t>(i)]);
    });
  }
  for (auto& t : pool) {
    t.join();
  }
  const std::set<std::uint32_t> distinct(numbers.begin(), numbers.end());
  CHECK(distinct.size() == threads);
  // The lowest free numbers: with this thread's own, at most threads + 1 are in use.
  CHECK(*std::max_element(numbers.begin(), numbers.end()) <= threads);
}

TEST_CASE("a thread that exits gives its number back") {
  const std::uint32_t mine = carve::thread_number();
  std::set<std::uint32_t> seen;
  for (int i = 0; i < 200; ++i) {
    std::uint32_t n = 0;
    std::thread([&n] { n = carve::thread_number(); }).join();
    seen.insert(n);
  }
  // One after another, every thread takes the same lowest free number, never this thread's.
  CHECK(seen.size() == 1);
  CHECK(*seen.begin() != mine);
}
