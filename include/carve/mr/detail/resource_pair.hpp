// carve/mr/detail/resource_pair.hpp — what FallbackResource and Segregator share: two parts held
// by value, built from one argument each or piecewise, and the capabilities a pair has when
// both parts have them (owns: either part; free_bytes and capacity: the sum; trim: each part
// that can). The two combinators add only how a request is routed.
#pragma once

#include <carve/core/config.hpp>
#include <carve/mr/detail/make_part.hpp>
#include <carve/mr/memory_resource.hpp>

#include <cuda/std/concepts>
#include <cuda/std/cstddef>
#include <cuda/std/utility>

namespace carve::detail {

CARVE_HOST_DEVICE constexpr cuda::std::size_t saturating_add(cuda::std::size_t a, cuda::std::size_t b) noexcept {
  return a > static_cast<cuda::std::size_t>(-1) - b ? static_cast<cuda::std::size_t>(-1) : a + b;
}

template <MemoryResource First, MemoryResource Second>
class ResourcePair {
public:
  constexpr ResourcePair() requires cuda::std::default_initializable<First> && cuda::std::default_initializable<Second>
  = default;

  // Each part from one argument: a part itself, or what its constructor takes.
  template <class A, class B>
  requires cuda::std::constructible_from<First, A> && cuda::std::constructible_from<Second, B>
      CARVE_HOST_DEVICE constexpr ResourcePair(A&& first, B&& second)
      : first_(cuda::std::forward<A>(first)), second_(cuda::std::forward<B>(second)) {}

  // Each part built in place from its constructor's arguments (std::piecewise_construct or
  // cuda::std's, then one tuple per part), for parts that take several or cannot move.
  CARVE_EXEC_CHECK_DISABLE
  template <class Tag, class A, class B>
  requires piecewise_tag<Tag> && part_arguments<First, A> && part_arguments<Second, B>
      CARVE_HOST_DEVICE constexpr ResourcePair(Tag, A&& first, B&& second)
      : first_(make_part<First>(static_cast<A&&>(first))), second_(make_part<Second>(static_cast<B&&>(second))) {}

  CARVE_EXEC_CHECK_DISABLE
  CARVE_HOST_DEVICE bool owns(const void* p) const noexcept requires OwnsMemory<First> && OwnsMemory<Second> {
    return first_.owns(p) || second_.owns(p);
  }
  CARVE_EXEC_CHECK_DISABLE
  CARVE_HOST_DEVICE cuda::std::size_t free_bytes() const requires ReportsFreeBytes<First> && ReportsFreeBytes<Second> {
    return saturating_add(first_.free_bytes(), second_.free_bytes());
  }
  CARVE_EXEC_CHECK_DISABLE
  CARVE_HOST_DEVICE cuda::std::size_t capacity() const requires ReportsCapacity<First> && ReportsCapacity<Second> {
    return saturating_add(first_.capacity(), second_.capacity());
  }
  CARVE_EXEC_CHECK_DISABLE
  CARVE_HOST_DEVICE cuda::std::size_t trim() requires Trimmable<First> || Trimmable<Second> {
    cuda::std::size_t released = 0;
    if constexpr (Trimmable<First>) {
      released += first_.trim();
    }
    if constexpr (Trimmable<Second>) {
      released += second_.trim();
    }
    return released;
  }

  friend CARVE_HOST_DEVICE constexpr bool operator==(const ResourcePair& a, const ResourcePair& b) noexcept requires
      cuda::std::equality_comparable<First> && cuda::std::equality_comparable<Second> {
    return a.first_ == b.first_ && a.second_ == b.second_;
  }

protected:
  First first_;
  Second second_;
};

} // namespace carve::detail
