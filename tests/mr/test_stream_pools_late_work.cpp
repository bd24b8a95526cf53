// StreamOrderedPool and StreamCachingPool on streams whose work runs late, as a GPU's runs behind
// the host (support/late_stream_work.hpp): random blocks on one to three streams, freed on their own
// stream or another, over a card small enough that the pools give memory back and retry. No block
// lands on memory another stream's queued work still uses, and no block's bytes are disturbed before
// its last kernel; the card's memory is real host memory, so AddressSanitizer sees a kernel that
// writes memory a pool gave back too early.
#include "support/late_stream_work.hpp"

#include <carve/mr/simulated_card.hpp>
#include <carve/mr/stream_caching_pool.hpp>
#include <carve/mr/stream_events.hpp>
#include <carve/mr/stream_ordered_pool.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>

// In a namespace of its own: the area's test files compile as one translation unit.
namespace test_stream_pools_late_work {

using carve::SimulatedCard;
using carve::SimulatedStreams;

namespace {

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;

// A card whose frees first run the queued work, as cudaFree waits for the device: what
// StreamCachingPool relies on when a stream's pool gives segments back on its own.
struct CardThatWaits : SimulatedCard {
  explicit CardThatWaits(std::size_t capacity) : SimulatedCard(capacity) {}
  std::shared_ptr<std::function<void()>> wait = std::make_shared<std::function<void()>>();
  void deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept {
    if (*wait) {
      (*wait)();
    }
    SimulatedCard::deallocate(p, bytes, alignment);
  }
};

// Six seeds of random steps: `run(rng, streams, idle_threshold)` builds a pool and runs them.
template <class Run>
void each_seed(Run&& run) {
  for (const unsigned seed : {1u, 2u, 3u, 4u, 5u, 6u}) {
    CAPTURE(seed);
    std::mt19937_64 rng(seed);
    run(rng, static_cast<std::uint32_t>(1 + seed % 3), seed % 2 == 0 ? 4 * MiB : SIZE_MAX);
  }
}
constexpr int steps = 1500;
constexpr carve::test::BlockSizes sizes{.small = 64 * KiB, .large = 2 * MiB}; // large ones: allocations of their own

} // namespace

TEST_CASE("StreamOrderedPool: random blocks on streams whose work runs late") {
  each_seed([](std::mt19937_64& rng, std::uint32_t streams, std::size_t idle_threshold) {
    carve::StreamOrderedPool<SimulatedCard, SimulatedStreams> pool(
        SimulatedCard(24 * MiB), carve::StreamPoolOptions{.idle_threshold = idle_threshold}, SimulatedStreams(streams));
    carve::test::LateStreamWork work(pool, streams);
    work.random_steps(rng, steps, sizes, [](int) {});
    CHECK(work.intact());
    pool.trim();
    CHECK(pool.stats().bytes_reserved == 0);
  });
}

TEST_CASE("StreamCachingPool: random blocks on streams whose work runs late") {
  each_seed([](std::mt19937_64& rng, std::uint32_t streams, std::size_t idle_threshold) {
    CardThatWaits card(24 * MiB);
    carve::StreamCachingPool<CardThatWaits, SimulatedStreams> pool(
        card, carve::PoolOptions{.idle_threshold = idle_threshold}, SimulatedStreams(streams));
    carve::test::LateStreamWork work(pool, streams);
    *card.wait = [&] { work.complete_all(); };
    work.random_steps(rng, steps, sizes, [](int) {});
    *card.wait = nullptr;
    CHECK(work.intact());
    pool.trim();
    CHECK(card.used_bytes() == 0);
  });
}

} // namespace test_stream_pools_late_work
