#include "reference.hpp"

#include <doctest/doctest.h>

#include <random>
#include <vector>

// In a namespace of its own: the area's test files compile as one translation unit.
namespace test_slot_allocator {

using carve::Errc;
using carve::SlotAllocator;
using carve::SlotBitmap;
using carve::SlotRange;
using namespace carve::test;

static_assert(std::is_same_v<SlotAllocator<128>::policy_type, carve::BoundaryNearestFit>);
static_assert(std::is_trivially_copyable_v<SlotAllocator<128>>);
static_assert(sizeof(SlotAllocator<128>) == sizeof(SlotBitmap<128>)); // the policy takes no space

TEST_CASE("allocate and deallocate a few workgroups") {
  SlotAllocator<128> slots;
  const auto a = slots.allocate(4);
  REQUIRE(a);
  CHECK(*a == SlotRange{0, 4});
  const auto b = slots.allocate(5); // the low candidate is 4 from its end, the high one 0
  REQUIRE(b);
  CHECK(*b == SlotRange{123, 5});
  CHECK(slots.free_count() == 119);
  CHECK(slots.largest_free_run() == 119);
  CHECK(slots.deallocate(*a));
  CHECK(slots.deallocate(*b));
  CHECK(slots.bitmap() == SlotBitmap<128>{});
}

TEST_CASE("allocating until full hands out every slot exactly once") {
  SlotAllocator<100> slots;
  std::vector<bool> owned(100, false);
  std::uint32_t m = 1;
  for (;;) {
    const auto r = slots.allocate(m);
    if (!r) {
      CHECK(r.error() == Errc::no_space);
      CHECK(slots.largest_free_run() < m);
      break;
    }
    for (std::uint32_t s = r->first; s < r->end(); ++s) {
      REQUIRE_FALSE(owned[s]);
      owned[s] = true;
    }
    m = m % 7 + 1;
  }
  while (slots.free_count() != 0) {
    REQUIRE(slots.allocate(1));
  }
  CHECK(slots.allocate(1).error() == Errc::no_space);
}

TEST_CASE("bad input returns the pinned error and changes nothing") {
  SlotAllocator<130> slots;
  REQUIRE(slots.allocate(10));
  REQUIRE(slots.allocate(70));
  const auto before = slots.bitmap();
  const auto unchanged = [&] { CHECK(slots.bitmap() == before); };

  CHECK(slots.allocate(0).error() == Errc::invalid_size);
  unchanged();
  CHECK(slots.allocate(131).error() == Errc::no_space); // more than it could ever hold: a fallback's
  unchanged();
  CHECK(slots.allocate(0xffff'ffff).error() == Errc::no_space);
  unchanged();
  CHECK(slots.allocate(51).error() == Errc::no_space);
  unchanged();

  CHECK(slots.deallocate({0, 0}).error() == Errc::invalid_size);
  unchanged();
  CHECK(slots.deallocate({130, 1}).error() == Errc::out_of_range);
  unchanged();
  CHECK(slots.deallocate({125, 6}).error() == Errc::out_of_range);
  unchanged();
  CHECK(slots.deallocate({0xffff'fff0, 0x20}).error() == Errc::out_of_range); // wraps past 2^32
  unchanged();
  CHECK(slots.deallocate({0xffff'ffff, 0xffff'ffff}).error() == Errc::out_of_range);
  unchanged();
  CHECK(slots.deallocate({30, 5}).error() == Errc::not_allocated); // never allocated
  unchanged();
  CHECK(slots.deallocate({5, 10}).error() == Errc::not_allocated); // half allocated, half free
  unchanged();

  REQUIRE(slots.deallocate({0, 10}));
  const auto after_free = slots.bitmap();
  CHECK(slots.deallocate({0, 10}).error() == Errc::not_allocated); // double free
  CHECK(slots.bitmap() == after_free);
}

TEST_CASE("part of an allocation can be returned") {
  SlotAllocator<64, carve::FirstFit> slots;
  const auto r = slots.allocate(16);
  REQUIRE(r);
  CHECK(slots.deallocate({r->first + 8, 8}));
  CHECK(slots.free_count() == 56);
  CHECK(slots.deallocate({r->first, 8}));
  CHECK(slots.free_count() == 64);
}

TEST_CASE("reset frees everything") {
  SlotAllocator<256> slots;
  while (slots.allocate(3)) {
  }
  slots.reset();
  CHECK(slots.free_count() == 256);
  CHECK(slots.bitmap() == SlotBitmap<256>{});
}

// A user policy: starts aligned to the request rounded up to a power of two, as hardware that
// addresses shared memory in power-of-two banks might want.
struct AlignedFirstFit {
  template <std::uint32_t N>
  constexpr cuda::std::optional<std::uint32_t> find(const SlotBitmap<N>& b, std::uint32_t m) const noexcept {
    if (m == 0 || m > N) {
      return cuda::std::nullopt;
    }
    std::uint32_t align = 1;
    while (align < m) {
      align *= 2;
    }
    const auto starts = b.run_starts(m);
    for (std::uint32_t s = 0; s + m <= N; s += align) {
      if (starts.is_free(s)) {
        return s;
      }
    }
    return cuda::std::nullopt;
  }
};
static_assert(carve::FitPolicy<AlignedFirstFit>);

TEST_CASE("a user-defined policy plugs in") {
  SlotAllocator<64, AlignedFirstFit> slots;
  CHECK(*slots.allocate(3) == SlotRange{0, 3});
  CHECK(*slots.allocate(3) == SlotRange{4, 3});
  CHECK(*slots.allocate(5) == SlotRange{8, 5});
  CHECK(*slots.allocate(1) == SlotRange{3, 1});
}

// A broken user policy must not be able to make the allocator hand a slot out twice.
struct AlwaysZero {
  template <std::uint32_t N>
  constexpr cuda::std::optional<std::uint32_t> find(const SlotBitmap<N>&, std::uint32_t) const noexcept {
    return 0;
  }
};
struct PastTheEnd {
  template <std::uint32_t N>
  constexpr cuda::std::optional<std::uint32_t> find(const SlotBitmap<N>&, std::uint32_t) const noexcept {
    return N - 1;
  }
};

TEST_CASE("a policy that proposes a taken or out-of-range run is refused") {
  SlotAllocator<32, AlwaysZero> zero;
  REQUIRE(zero.allocate(4));
  const auto before = zero.bitmap();
  CHECK(zero.allocate(4).error() == Errc::invalid_placement);
  CHECK(zero.bitmap() == before);

  SlotAllocator<32, PastTheEnd> past;
  CHECK(past.allocate(2).error() == Errc::invalid_placement);
  CHECK(past.free_count() == 32);
}

// A random allocate/free process, step by step against a reference allocator built from the
// brute-force policies.
template <std::uint32_t N, class Fit>
void replay_random_process(std::uint64_t seed, std::uint32_t max_m, int steps) {
  CAPTURE(N);
  CAPTURE(carve::policy_name<Fit>());
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  SlotAllocator<N, Fit> slots;
  Slots model(N, true);
  std::vector<SlotRange> live;
  std::uniform_int_distribution<std::uint32_t> size(1, max_m);
  for (int step = 0; step < steps; ++step) {
    const bool do_free = !live.empty() && std::bernoulli_distribution(0.45)(rng);
    if (do_free) {
      const std::size_t k = std::uniform_int_distribution<std::size_t>(0, live.size() - 1)(rng);
      REQUIRE(slots.deallocate(live[k]));
      for (std::uint32_t s = live[k].first; s < live[k].end(); ++s) {
        model[s] = true;
      }
      live[k] = live.back();
      live.pop_back();
    } else {
      const std::uint32_t m = size(rng);
      const auto want = ref_find<Fit>(model, m);
      const auto got = slots.allocate(m);
      if (!want) {
        REQUIRE_FALSE(got);
        REQUIRE(got.error() == Errc::no_space);
      } else {
        REQUIRE(got);
        REQUIRE(*got == SlotRange{*want, m});
        for (std::uint32_t s = got->first; s < got->end(); ++s) {
          model[s] = false;
        }
        live.push_back(*got);
      }
    }
    REQUIRE(to_slots(slots.bitmap()) == model);
  }
}

template <class Fit>
void replay_sizes() {
  for (std::uint64_t seed = 1; seed <= 3; ++seed) {
    replay_random_process<16, Fit>(seed, 8, 400);
    replay_random_process<128, Fit>(seed, 16, 2000);
    replay_random_process<130, Fit>(seed, 70, 1000);
    replay_random_process<1024, Fit>(seed, 200, 600);
  }
}

TEST_CASE("random allocate/free processes match the reference step by step") {
  replay_sizes<carve::FirstFit>();
  replay_sizes<carve::LastFit>();
  replay_sizes<carve::BestFit>();
  replay_sizes<carve::BoundaryNearestFit>();
}

} // namespace test_slot_allocator
