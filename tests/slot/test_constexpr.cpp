// The slot code runs in constant evaluation: every check here is a static_assert, so this file
// failing to compile is the test failing.
#include <carve/slot.hpp>

#include <doctest/doctest.h>

// In a namespace of its own: the area's test files compile as one translation unit.
namespace test_constexpr {

namespace {

using carve::Errc;
using carve::SlotRange;

constexpr carve::SlotBitmap<16> seed_16() {
  auto b = carve::SlotBitmap<16>::all_taken(); // 0111_1001_1111_1100
  b.release({1, 4});
  b.release({7, 7});
  return b;
}

constexpr carve::SlotBitmap<128> seed_128() {
  carve::SlotBitmap<128> b;
  b.occupy({0, 2});
  b.occupy({6, 118});
  return b;
}

static_assert(seed_16().free_count() == 11);
static_assert(seed_16().run_starts(4).free_count() == 5);
static_assert(*carve::BoundaryNearestFit{}.find(seed_16(), 4) == 1);
static_assert(*carve::BoundaryNearestFit{}.find(seed_128(), 3) == 125);
static_assert(*carve::FirstFit{}.find(seed_128(), 3) == 2);
static_assert(*carve::LastFit{}.find(seed_128(), 4) == 124);
static_assert(*carve::BestFit{}.find(seed_128(), 4) == 2);
static_assert(!carve::FirstFit{}.find(seed_128(), 5));
static_assert(seed_128().largest_free_run() == 4);

constexpr int count_runs() {
  int n = 0;
  const auto bitmap = seed_16();
  for (const SlotRange r : bitmap.free_runs()) {
    n += static_cast<int>(r.count);
  }
  return n;
}
static_assert(count_runs() == 11);

constexpr bool allocator_round_trip() {
  carve::SlotAllocator<200, carve::BoundaryNearestFit> slots;
  const auto a = slots.allocate(64);  // low end
  const auto b = slots.allocate(100); // high end: 0 slots from the top beats 64 from the bottom
  const auto c = slots.allocate(40);  // 36 slots are left in the middle
  if (!a || !b || c || c.error() != Errc::no_space) {
    return false;
  }
  if (*a != SlotRange{0, 64} || *b != SlotRange{100, 100}) {
    return false;
  }
  const bool freed = slots.deallocate(*a).has_value();
  const bool double_free_caught = slots.deallocate(*a).error() == Errc::not_allocated;
  const bool past_end_caught = slots.deallocate({190, 20}).error() == Errc::out_of_range;
  const bool zero_caught = slots.allocate(0).error() == Errc::invalid_size;
  const bool freed_high = slots.deallocate(*b).has_value();
  return freed && double_free_caught && past_end_caught && zero_caught && freed_high && slots.free_count() == 200;
}
static_assert(allocator_round_trip());

static_assert(carve::to_string(Errc::no_space)[0] == 'n');

} // namespace

TEST_CASE("constant evaluation checks compiled") { CHECK(allocator_round_trip()); }

} // namespace test_constexpr
