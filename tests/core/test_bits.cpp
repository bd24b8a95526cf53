#include <carve/core/bits.hpp>

#include <doctest/doctest.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <random>

namespace bits = carve::bits;

namespace {
// How many free slots start at each slot of w (itself included), counted bit by bit from the top.
std::array<std::uint32_t, 65> free_run_from(bits::word w) {
  std::array<std::uint32_t, 65> length{};
  for (int i = 63; i >= 0; --i) {
    length[static_cast<std::size_t>(i)] = (w >> i & 1) != 0 ? length[static_cast<std::size_t>(i) + 1] + 1 : 0;
  }
  return length;
}

// Bit i set when slots i..i+m-1 are all free.
bits::word run_starts_bit_by_bit(const std::array<std::uint32_t, 65>& length, std::uint32_t m) {
  bits::word starts = 0;
  for (std::uint32_t i = 0; i < 64; ++i) {
    if (length[i] >= m) {
      starts |= bits::word{1} << i;
    }
  }
  return starts;
}
} // namespace

TEST_CASE("masks") {
  CHECK(bits::low_mask(0) == 0);
  CHECK(bits::low_mask(1) == 1);
  CHECK(bits::low_mask(63) == 0x7fff'ffff'ffff'ffffull);
  CHECK(bits::low_mask(64) == ~0ull);
  CHECK(bits::range_mask(4, 3) == 0b111'0000u);
  CHECK(bits::range_mask(0, 64) == ~0ull);
  CHECK(bits::range_mask(63, 1) == 1ull << 63);
  CHECK(bits::word_count(1) == 1);
  CHECK(bits::word_count(64) == 1);
  CHECK(bits::word_count(65) == 2);
}

TEST_CASE("runs at the ends of a word") {
  CHECK(bits::low_run(0) == 0);
  CHECK(bits::low_run(0b0111) == 3);
  CHECK(bits::low_run(~0ull) == 64);
  CHECK(bits::high_run(~0ull << 60) == 4);
  CHECK(bits::high_run(~0ull) == 64);
  CHECK(bits::lowest_set(0b1000) == 3);
  CHECK(bits::highest_set(0b1001) == 3);
}

TEST_CASE("run starts within a word match a bit-by-bit check for every m") {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 4000; ++trial) {
    // Mix dense and sparse words so that long and short runs both occur.
    bits::word w = rng();
    for (int k = trial % 4; k > 0; --k) {
      w |= rng();
    }
    if (trial % 5 == 0) {
      w = ~bits::word{0} << (trial % 64);
    }
    const auto length = free_run_from(w);
    CAPTURE(w);
    for (std::uint32_t m = 1; m <= 64; ++m) {
      CAPTURE(m);
      REQUIRE(bits::run_starts(w, m) == run_starts_bit_by_bit(length, m));
    }
  }
}
