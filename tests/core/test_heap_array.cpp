#include <carve/core/heap_array.hpp>

#include <doctest/doctest.h>

#include <cstdint>

namespace test_heap_array {

using carve::detail::delete_heap_array;
using carve::detail::new_heap_array;

// Counts constructions and destructions, so a test sees every element made and unmade once.
struct Tracked {
  static inline int alive = 0;
  static inline int made = 0;
  std::uint64_t value = 41;
  Tracked() noexcept {
    ++alive;
    ++made;
  }
  ~Tracked() { --alive; }
};

struct alignas(16) Wide {
  std::uint64_t words[2]{};
};

// Over-aligned (a cache line): works on the host, where the aligned operator new serves it; in
// device code new_heap_array refuses it at compile time (the device heap aligns to 16 bytes).
struct alignas(64) Line {
  std::uint64_t first = 7;
};

TEST_CASE("every element is constructed once and destroyed once, and the bytes go back") {
  Tracked::alive = Tracked::made = 0;
  Tracked* p = new_heap_array<Tracked>(1000);
  REQUIRE(p != nullptr);
  CHECK(Tracked::alive == 1000);
  CHECK(Tracked::made == 1000);
  for (int i = 0; i < 1000; ++i) {
    CHECK(p[i].value == 41);
    p[i].value = static_cast<std::uint64_t>(i); // the whole array is ours (ASan checks the bounds)
  }
  delete_heap_array(p, 1000);
  CHECK(Tracked::alive == 0);
}

TEST_CASE("elements are value-initialized and aligned as their type asks") {
  Wide* w = new_heap_array<Wide>(7);
  REQUIRE(w != nullptr);
  CHECK(reinterpret_cast<std::uintptr_t>(w) % alignof(Wide) == 0);
  for (int i = 0; i < 7; ++i) {
    CHECK(w[i].words[0] == 0);
    CHECK(w[i].words[1] == 0);
  }
  delete_heap_array(w, 7);
  std::uint32_t* words = new_heap_array<std::uint32_t>(64);
  REQUIRE(words != nullptr);
  for (int i = 0; i < 64; ++i) {
    CHECK(words[i] == 0);
  }
  delete_heap_array(words, 64);
  Line* lines = new_heap_array<Line>(9);
  REQUIRE(lines != nullptr);
  for (int i = 0; i < 9; ++i) {
    CHECK(reinterpret_cast<std::uintptr_t>(lines + i) % 64 == 0);
    CHECK(lines[i].first == 7);
  }
  delete_heap_array(lines, 9);
}

TEST_CASE("no elements, or more bytes than size_t holds, is nullptr and constructs nothing") {
  Tracked::alive = Tracked::made = 0;
  CHECK(new_heap_array<Tracked>(0) == nullptr);
  CHECK(new_heap_array<Tracked>(~std::size_t{0} / sizeof(Tracked) + 1) == nullptr);
  CHECK(new_heap_array<Wide>(~std::size_t{0}) == nullptr);
  CHECK(Tracked::made == 0);
  delete_heap_array<Tracked>(nullptr, 5); // nothing to give back
  CHECK(Tracked::alive == 0);
}

} // namespace test_heap_array
