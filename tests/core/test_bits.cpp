#include <carve/core/bits.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <random>

namespace bits = carve::bits;

namespace {
bool run_free(bits::word w, std::uint32_t i, std::uint32_t m) {
  for (std::uint32_t k = i; k < i + m; ++k) {
    if (k >= 64 || (w >> k & 1) == 0) {
      return false;
    }
  }
  return true;
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
    for (std::uint32_t m = 1; m <= 64; ++m) {
      const bits::word starts = bits::run_starts(w, m);
      for (std::uint32_t i = 0; i < 64; ++i) {
        REQUIRE(((starts >> i & 1) != 0) == run_free(w, i, m));
      }
    }
  }
}
