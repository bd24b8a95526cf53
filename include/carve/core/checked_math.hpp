// carve/core/checked_math.hpp — sums and products of sizes that say when they overflow.
//
// Sizes in carve come from users (a plan's demands, a request's byte count) and are added up
// and scaled; a wrapped sum would pass every later check and print as a small, wrong number.
// Host and device.
#pragma once

#include <carve/core/config.hpp>

#include <cuda/std/concepts>
#include <cuda/std/limits>
#include <cuda/std/optional>

namespace carve {

/// `a + b`, or nothing when the sum does not fit in `T`.
template <cuda::std::unsigned_integral T>
CARVE_HOST_DEVICE constexpr cuda::std::optional<T> checked_add(T a, T b) noexcept {
  if (a > cuda::std::numeric_limits<T>::max() - b) {
    return cuda::std::nullopt;
  }
  return static_cast<T>(a + b);
}

/// `a * b`, or nothing when the product does not fit in `T`.
template <cuda::std::unsigned_integral T>
CARVE_HOST_DEVICE constexpr cuda::std::optional<T> checked_mul(T a, T b) noexcept {
  if (a != 0 && b > cuda::std::numeric_limits<T>::max() / a) {
    return cuda::std::nullopt;
  }
  return static_cast<T>(a * b);
}

} // namespace carve
