/// @file carve/core/compressed_pair.hpp
/// A value beside a policy object that, when empty, takes no bytes: laid out alike by the host
/// compiler and by nvcc's device side.
///
/// @code
/// carve::detail::CompressedPair<BoundaryNearestFit, SlotBitmap<128>> state;   // sizeof == 16
/// state.first().find(state.second(), 4);
/// @endcode
///
/// Why not `[[no_unique_address]]`: g++ and clang give such a member no bytes, and so does nvcc's
/// device code in memory, but nvcc lays out a kernel's parameters with the member taking room, so
/// an object built on the host and passed to a kernel by value is read at the wrong offsets there.
/// An empty base class takes no bytes under the rule both sides share everywhere (the Itanium C++
/// ABI's), so an empty policy is held as a base. tests/layout checks every device-capable type's
/// layout on both sides.
#pragma once

#include <carve/core/config.hpp>

#include <cuda/std/type_traits>
#include <cuda/std/utility>

namespace carve::detail {

/// Whether `T` can be held as an empty base (a final class cannot be derived from).
template <class T>
inline constexpr bool empty_base_v = cuda::std::is_empty_v<T> && !cuda::std::is_final_v<T>;

/// `First` (typically a policy, often empty) and `Second`, each value-initialised unless given.
/// The two are reached by first() and second(); where `First` is empty it is a base and takes no
/// bytes, otherwise both are members in that order.
template <class First, class Second, bool = empty_base_v<First>>
class CompressedPair : private First {
public:
  constexpr CompressedPair() = default;
  CARVE_HOST_DEVICE constexpr CompressedPair(First first, Second second) noexcept(
      cuda::std::is_nothrow_move_constructible_v<First>&& cuda::std::is_nothrow_move_constructible_v<Second>)
      : First(cuda::std::move(first)), second_(cuda::std::move(second)) {}

  CARVE_HOST_DEVICE constexpr First& first() noexcept { return *this; }
  CARVE_HOST_DEVICE constexpr const First& first() const noexcept { return *this; }
  CARVE_HOST_DEVICE constexpr Second& second() noexcept { return second_; }
  CARVE_HOST_DEVICE constexpr const Second& second() const noexcept { return second_; }

private:
  Second second_{};
};

/// A `First` with state: both are members.
template <class First, class Second>
class CompressedPair<First, Second, false> {
public:
  constexpr CompressedPair() = default;
  CARVE_HOST_DEVICE constexpr CompressedPair(First first, Second second) noexcept(
      cuda::std::is_nothrow_move_constructible_v<First>&& cuda::std::is_nothrow_move_constructible_v<Second>)
      : first_(cuda::std::move(first)), second_(cuda::std::move(second)) {}

  CARVE_HOST_DEVICE constexpr First& first() noexcept { return first_; }
  CARVE_HOST_DEVICE constexpr const First& first() const noexcept { return first_; }
  CARVE_HOST_DEVICE constexpr Second& second() noexcept { return second_; }
  CARVE_HOST_DEVICE constexpr const Second& second() const noexcept { return second_; }

private:
  First first_{};
  Second second_{};
};

} // namespace carve::detail
