#include <carve/core/compressed_pair.hpp>

#include <doctest/doctest.h>

#include <cstdint>

namespace test_compressed_pair {

struct Empty {
  constexpr int twice(int x) const noexcept { return 2 * x; }
};
struct FinalEmpty final {};
struct Counter {
  int calls = 0;
};
struct Words {
  std::uint64_t w[2]{};
};

using carve::detail::CompressedPair;

// An empty part costs nothing; a final one cannot be a base and takes its byte; one with state
// is a member.
static_assert(sizeof(CompressedPair<Empty, Words>) == sizeof(Words));
static_assert(sizeof(CompressedPair<Empty, std::uint64_t*>) == sizeof(std::uint64_t*));
static_assert(sizeof(CompressedPair<FinalEmpty, Words>) > sizeof(Words));
static_assert(sizeof(CompressedPair<Counter, Words>) == sizeof(Counter) + sizeof(Words) + 4);

// Usable in constant expressions, value-initialised by default.
static_assert([] {
  CompressedPair<Empty, Words> p;
  p.second().w[1] = 7;
  return p.first().twice(static_cast<int>(p.second().w[1])) + static_cast<int>(p.second().w[0]);
}() == 14);

TEST_CASE("both parts are reached, and kept, whether the first is a base or a member") {
  CompressedPair<Counter, Words> with_state(Counter{3}, Words{{1, 2}});
  ++with_state.first().calls;
  CHECK(with_state.first().calls == 4);
  CHECK(with_state.second().w[1] == 2);

  const CompressedPair<Empty, Words> empty(Empty{}, Words{{5, 6}});
  CHECK(empty.second().w[0] == 5);
  CHECK(empty.first().twice(21) == 42);

  CompressedPair<FinalEmpty, int> final_first;
  CHECK(final_first.second() == 0);
}

} // namespace test_compressed_pair
