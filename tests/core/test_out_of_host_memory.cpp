// An allocation that runs out of host memory for its own bookkeeping, at any point, fails and
// gives back everything it took: the n-th operator new throws std::bad_alloc, for n = 0, 1, 2, ...
// until a request goes through untouched. An executable of its own: it replaces operator new.
#include "support/topology_data.hpp"

#include <carve/borrow.hpp>
#include <carve/mirror.hpp>
#include <carve/mr.hpp>
#include <carve/vmm.hpp>

#include <doctest/doctest.h>

#include <cstdlib>
#include <new>

namespace {

long allocations_left = -1; // before the one that fails; -1: none fails (one thread at a time)

void* counted_new(std::size_t n) {
  if (allocations_left == 0) {
    allocations_left = -1;
    throw std::bad_alloc();
  }
  allocations_left -= allocations_left > 0 ? 1 : 0;
  if (void* p = std::malloc(n != 0 ? n : 1)) {
    return p;
  }
  throw std::bad_alloc();
}

// Calls `attempt(fail_at)` with the fail_at-th allocation inside it failing, for every fail_at
// until one runs with no allocation failing; `attempt` checks what a failure left behind.
template <class Attempt>
void fail_each_allocation(Attempt&& attempt) {
  for (long fail_at = 0;; ++fail_at) {
    CAPTURE(fail_at);
    const bool failed_one = attempt([&](auto&& call) {
      allocations_left = fail_at;
      auto result = call();
      const bool fired = allocations_left == -1;
      allocations_left = -1;
      return std::pair{std::move(result), fired};
    });
    if (!failed_one) {
      return;
    }
    REQUIRE(fail_at < 1000);
  }
}

} // namespace

void* operator new(std::size_t n) { return counted_new(n); }
void* operator new[](std::size_t n) { return counted_new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

TEST_CASE("PagedMirror: an allocation out of host memory takes no page") {
  fail_each_allocation([](auto run) {
    carve::HostMirrorBackend<> devices;
    devices.register_device(carve::SimulatedCard(1 << 20), {.bytes = 1 << 20});
    devices.register_device(carve::SimulatedCard(1 << 20), {.bytes = 1 << 20});
    carve::PagedMirror<carve::HostMirrorBackend<>, carve::StripePlacement> mirror(
        devices, {.page_size = 64 << 10, .tracking = carve::WriteTracking::explicit_calls});
    const std::size_t free_before = mirror.free_bytes();
    const auto [p, fired] = run([&] { return mirror.try_allocate(512 << 10, 1); });
    if (!p) { // no_space, or device_error where the backend could not queue the zeroing
      CHECK(mirror.allocation_count() == 0);
      CHECK(mirror.free_bytes() == free_before);
    }
    return fired;
  });
}

TEST_CASE("BorrowingAllocator: a borrow out of host memory leaves no block with its lender") {
  fail_each_allocation([](auto run) {
    carve::BorrowingAllocator<carve::SimulatedCard> cards(carve::test::dgx1(),
                                                          [](int) { return carve::SimulatedCard(1 << 20); });
    int decisions = 0;
    cards.on_decision([&](const carve::BorrowDecision&) { ++decisions; });
    auto card = cards.card(0);
    const auto [p, fired] = run([&] { return card.try_allocate(4096, 256); });
    if (!p) {
      CHECK(p.error() == carve::Errc::no_space);
      CHECK(cards.live_blocks() == 0);
      for (int c = 0; c < cards.card_count(); ++c) {
        CHECK(cards.resource(c).used_bytes() == 0);
      }
    } else {
      CHECK(decisions == 1);
      card.deallocate(*p, 4096, 256);
    }
    return fired;
  });
}

TEST_CASE("VmmCard: an allocation out of host memory leaves nothing mapped") {
  fail_each_allocation([](auto run) {
    carve::HostMemoryMapper mapper({.granularity = 64 << 10});
    {
      carve::VmmCard<carve::HostMemoryMapper> card(mapper, 0, 1 << 20);
      const auto [p, fired] = run([&] { return card.try_allocate(128 << 10, 256); });
      if (!p) {
        CHECK(p.error() == carve::Errc::no_space);
        CHECK(card.used_bytes() == 0);
        CHECK(mapper.mapping_count() == 0);
        CHECK(mapper.physical_count() == 0);
      } else {
        card.deallocate(*p, 128 << 10, 256);
      }
      if (!fired) {
        return false;
      }
    }
    return true;
  });
}
