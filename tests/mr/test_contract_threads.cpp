// The thread-safe resources keep the memory-resource contract with four threads allocating at
// once, each its own blocks (run_shared_contract): no two live blocks overlap across threads, and
// every byte comes back. The single-threaded contract of every resource is test_resource_contract.
#include "mr/contract_fixtures.hpp"

#include <carve/mr.hpp>
#include <carve/slot.hpp>

#include <doctest/doctest.h>

#include <array>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

// In a namespace of its own: the area's test files may compile as one translation unit.
namespace test_contract_threads {

using namespace carve::test;

namespace {

constexpr unsigned threads = 4;

// Each thread runs the shared contract on `resource` at once.
template <class R>
void hammer(R& resource, std::size_t largest, std::size_t alignment) {
  std::array<ContractResult, threads> results{};
  std::vector<std::thread> running;
  for (unsigned t = 0; t < threads; ++t) {
    running.emplace_back([&, t] { results[t] = run_shared_contract(resource, t, 200, largest, alignment); });
  }
  for (std::thread& t : running) {
    t.join();
  }
  for (const ContractResult& r : results) {
    CHECK_MESSAGE(r.passed(), std::string(r.what()));
  }
}

} // namespace

TEST_CASE("thread-safe resources keep the contract with threads allocating at once") {
  SUBCASE("a SlotArena over a ConcurrentSlotAllocator") {
    const auto heap = std::make_unique<ArenaBytes>();
    carve::SlotArena<carve::ConcurrentSlotAllocator<arena_slots, carve::BoundaryNearestFit, cuda::thread_scope_system>>
        arena(heap->bytes, sizeof heap->bytes, slot_bytes);
    hammer(arena, 500, 64);
    CHECK(arena.free_bytes() == arena.capacity());
  }
  SUBCASE("a counted, limited CachingPool") {
    carve::StatsResource<carve::LimitResource<Pool>> pool(
        std::piecewise_construct,
        std::forward_as_tuple(std::piecewise_construct,
                              std::forward_as_tuple(carve::SimulatedCard(4 * MiB), pool_options), 1 * MiB));
    hammer(pool, 20 * KiB, 256);
    CHECK(pool.stats().bytes_in_use == 0);
    CHECK(pool.upstream().used_bytes() == 0);
  }
  SUBCASE("a StreamCachingPool") {
    carve::StreamCachingPool<carve::SimulatedCard, carve::SimulatedStreams> pool(
        carve::SimulatedCard(4 * MiB), pool_options, carve::SimulatedStreams(2));
    hammer(pool, 20 * KiB, 256);
    CHECK(pool.stats().bytes_in_use == 0);
    CHECK(pool.trim() > 0);
    CHECK(pool.upstream().used_bytes() == 0);
    CHECK(pool.consistent());
  }
  SUBCASE("a StreamUsesPool over a StreamOrderedPool") {
    carve::StreamUsesPool<carve::StreamOrderedPool<carve::SimulatedCard, carve::SimulatedStreams>> pool(
        std::piecewise_construct,
        std::forward_as_tuple(carve::SimulatedCard(4 * MiB), carve::StreamPoolOptions{}, carve::SimulatedStreams(2)),
        carve::SimulatedStreams(2));
    hammer(pool, 20 * KiB, 256);
    CHECK(pool.trim() > 0);
    CHECK(pool.pool().upstream().used_bytes() == 0);
  }
}

} // namespace test_contract_threads
