/// @file carve/mr/segregator.hpp
/// Small requests to one resource, large ones to another.
///
/// @code
/// carve::Segregator<4096, carve::SlotArena<Slots>, carve::CachingPool<carve::SimulatedCard>> heap(
///     carve::SlotArena<Slots>(buffer, sizeof buffer, 256), carve::SimulatedCard(64 << 20));
/// @endcode
///
/// A request of at most Threshold bytes goes to Small, a larger one to Large, and deallocate routes
/// by the same size, so neither part needs to know what it owns. A part that has no room says
/// no_space; the request does not move to the other part (put a FallbackResource in the stack for
/// that). Capabilities: owns when both parts know theirs; free_bytes and capacity (sums) and trim
/// where the parts have them; try_deallocate when both parts check theirs. Parts are held by value,
/// each built from one argument (the part, what its constructor takes, or carve::ref(r) to share
/// one) or in place (std::piecewise_construct and a tuple of constructor arguments per part): the
/// forms of docs/memory-resources.md, "Building a stack"; __host__ __device__ wherever both parts
/// are.
#pragma once

#include <carve/core/config.hpp>
#include <carve/core/errc.hpp>
#include <carve/mr/cuda_mr.hpp>
#include <carve/mr/detail/resource_pair.hpp>
#include <carve/mr/memory_resource.hpp>

#include <cuda/std/cstddef>
#include <cuda/std/expected>

namespace carve {

/// Requests of at most `Threshold` bytes to `Small`, larger ones to `Large`. A MemoryResource.
template <cuda::std::size_t Threshold, MemoryResource Small, MemoryResource Large>
class Segregator : public detail::ResourcePair<Small, Large>,
                   public CcclSpellings<Segregator<Threshold, Small, Large>> {
  using Pair = detail::ResourcePair<Small, Large>;

public:
  /// The largest request that goes to Small.
  static constexpr cuda::std::size_t threshold = Threshold;

  using Pair::Pair;

  /// From the part the size selects; its errors are returned as they are.
  CARVE_EXEC_CHECK_DISABLE
  [[nodiscard]] CARVE_HOST_DEVICE cuda::std::expected<void*, Errc> try_allocate(cuda::std::size_t bytes,
                                                                                cuda::std::size_t alignment) noexcept {
    return bytes <= Threshold ? this->first_.try_allocate(bytes, alignment)
                              : this->second_.try_allocate(bytes, alignment);
  }

  /// To the part the size selects.
  CARVE_EXEC_CHECK_DISABLE
  CARVE_HOST_DEVICE void deallocate(void* p, cuda::std::size_t bytes, cuda::std::size_t alignment) noexcept {
    if (bytes <= Threshold) {
      this->first_.deallocate(p, bytes, alignment);
    } else {
      this->second_.deallocate(p, bytes, alignment);
    }
  }

  /// deallocate, checked by the part the size selects (where both parts check).
  CARVE_EXEC_CHECK_DISABLE
  [[nodiscard]] CARVE_HOST_DEVICE cuda::std::expected<void, Errc>
  try_deallocate(void* p, cuda::std::size_t bytes,
                 cuda::std::size_t alignment) noexcept requires ChecksDeallocation<Small> && ChecksDeallocation<Large> {
    return bytes <= Threshold ? this->first_.try_deallocate(p, bytes, alignment)
                              : this->second_.try_deallocate(p, bytes, alignment);
  }

  /// The part for small requests.
  CARVE_HOST_DEVICE constexpr Small& small() noexcept { return this->first_; }
  /// The part for small requests.
  CARVE_HOST_DEVICE constexpr const Small& small() const noexcept { return this->first_; }
  /// The part for large requests.
  CARVE_HOST_DEVICE constexpr Large& large() noexcept { return this->second_; }
  /// The part for large requests.
  CARVE_HOST_DEVICE constexpr const Large& large() const noexcept { return this->second_; }

  /// A property both parts declare the stack declares too.
  template <class Property>
  requires detail::declares_property<Small, Property> && detail::declares_property<Large, Property>
  friend constexpr void get_property(const Segregator&, Property) noexcept {}
};

static_assert(MemoryResource<Segregator<64, detail::ResourceArchetype, detail::ResourceArchetype>>);
static_assert(OwnsMemory<Segregator<64, detail::OwningArchetype, detail::OwningArchetype>>);

} // namespace carve
