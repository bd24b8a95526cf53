/// @file carve/sim/random.hpp
/// The simulator's random numbers, the same with every standard library.
///
/// The standard distributions are implementation-defined (libstdc++ and libc++ draw different
/// numbers from the same engine), so a seed would not name the same workload everywhere. These
/// are small, specified algorithms: xoshiro256** seeded through splitmix64, unbiased bounded
/// integers by rejection, and Box-Muller normals.
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>

namespace carve::sim {

/// xoshiro256** with the distributions the simulator draws from; one per thread.
class Rng {
public:
  /// The state for `seed`, spread by splitmix64.
  explicit constexpr Rng(std::uint64_t seed) noexcept {
    for (std::uint64_t& s : state_) {
      seed += 0x9e37'79b9'7f4a'7c15ull; // splitmix64
      std::uint64_t z = seed;
      z = (z ^ (z >> 30)) * 0xbf58'476d'1ce4'e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d0'49bb'1331'11ebull;
      s = z ^ (z >> 31);
    }
  }

  /// The next 64 random bits.
  constexpr std::uint64_t next() noexcept {
    const std::uint64_t result = rotl(state_[1] * 5, 7) * 9;
    const std::uint64_t t = state_[1] << 17;
    state_[2] ^= state_[0];
    state_[3] ^= state_[1];
    state_[1] ^= state_[2];
    state_[0] ^= state_[3];
    state_[2] ^= t;
    state_[3] = rotl(state_[3], 45);
    return result;
  }

  /// Uniform in [lo, hi] (inclusive), unbiased: draws below 2^64 mod span are rejected, so every
  /// residue is equally likely.
  constexpr std::uint64_t uniform(std::uint64_t lo, std::uint64_t hi) noexcept {
    const std::uint64_t span = hi - lo + 1;
    if (span == 0) { // the whole 64-bit range
      return next();
    }
    const std::uint64_t threshold = (0 - span) % span;
    std::uint64_t x = next();
    while (x < threshold) {
      x = next();
    }
    return lo + x % span;
  }

  /// Uniform in [0, 1), 53 random bits.
  constexpr double unit() noexcept { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

  /// Standard normal (Box-Muller; the second value is dropped to keep the stream simple).
  double normal() noexcept {
    const double u = 1.0 - unit(); // (0, 1]: log is finite
    const double v = unit();
    return std::sqrt(-2.0 * std::log(u)) * std::cos(2.0 * std::numbers::pi * v);
  }

private:
  static constexpr std::uint64_t rotl(std::uint64_t x, int k) noexcept { return (x << k) | (x >> (64 - k)); }

  std::uint64_t state_[4]{};
};

} // namespace carve::sim
