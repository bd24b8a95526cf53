// Lookups queued by how many vectors they read: tier 0 up to 128, tier 1 up to 512, tier 2 above.
// Strict priority with aging: small requests never wait behind large ones, and a request older
// than 2 ms is served first, so large ones are not starved.
#include <carve/queue.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <thread>
#include <vector>

struct Lookup {
  std::uint32_t table;
  std::vector<std::uint64_t> rows;
};
struct Vectors {
  std::uint64_t operator()(const Lookup& q) const { return q.rows.size(); }
};

int main() {
  using Queue = carve::SizeTieredQueue<Lookup, Vectors, carve::RingLanes<>, carve::StrictPriority>;
  Queue q({128, 512}, 4096, carve::StrictPriority::with_aging(2'000'000)); // throws carve::Exception on bad input

  std::thread producer([&] {
    for (std::uint32_t i = 0; i < 1000; ++i) {
      if (!q.push(Lookup{i % 8, std::vector<std::uint64_t>(1 + i * 37 % 700)})) { // waits while its tier is full
        break; // expected<void, Errc>: fails only once the queue is closed
      }
    }
    q.close(); // wakes every waiter; what is queued still drains
  });
  std::uint64_t popped = 0;
  while (auto r = q.pop(std::chrono::milliseconds(100))) { // expected<Lookup, Errc>: timed_out, closed
    ++popped;
  }
  producer.join();
  std::puts(carve::format_stats(q.stats(), q.thresholds()).c_str());
  return popped == 1000 ? 0 : 1;
}
