/// @file carve/mr/fallback_resource.hpp
/// Try one resource, and when it has no room, another.
///
/// @code
/// carve::FallbackResource<carve::SlotArena<Slots>, carve::CachingPool<carve::SimulatedCard>> heap(
///     carve::SlotArena<Slots>(buffer, sizeof buffer, 256), carve::SimulatedCard(64 << 20));
/// @endcode
///
/// try_allocate asks the primary; only when it answers no_space does the fallback get the request
/// (invalid_size and other errors come back as they are: no resource could serve them). Since
/// deallocate is told only the pointer, the primary must know what it owns (OwnsMemory): a block it
/// owns goes back to it, every other block to the fallback. Capabilities: owns when both parts know
/// theirs; free_bytes and capacity (sums) and trim where the parts have them; try_deallocate when
/// both parts check theirs. Parts are held by value, each built from one argument (the part, what
/// its constructor takes, or carve::ref(r) to share one) or in place (std::piecewise_construct and
/// a tuple of constructor arguments per part): the forms of docs/memory-resources.md, "Building a
/// stack"; __host__ __device__ wherever both parts are.
#pragma once

#include <carve/core/config.hpp>
#include <carve/core/errc.hpp>
#include <carve/mr/cuda_mr.hpp>
#include <carve/mr/detail/resource_pair.hpp>
#include <carve/mr/memory_resource.hpp>

#include <cuda/std/cstddef>
#include <cuda/std/expected>

namespace carve {

/// `Primary` first; `Fallback` for the requests Primary has no space for. A MemoryResource.
template <MemoryResource Primary, MemoryResource Fallback>
requires OwnsMemory<Primary>
class FallbackResource : public detail::ResourcePair<Primary, Fallback>,
                         public CcclSpellings<FallbackResource<Primary, Fallback>> {
  using Pair = detail::ResourcePair<Primary, Fallback>;

public:
  using Pair::Pair;

  /// From the primary; from the fallback when the primary says no_space. Errors: the primary's
  /// other errors, or the fallback's.
  CARVE_EXEC_CHECK_DISABLE
  [[nodiscard]] CARVE_HOST_DEVICE cuda::std::expected<void*, Errc> try_allocate(cuda::std::size_t bytes,
                                                                                cuda::std::size_t alignment) noexcept {
    const cuda::std::expected<void*, Errc> p = this->first_.try_allocate(bytes, alignment);
    if (p || p.error() != Errc::no_space) {
      return p;
    }
    return this->second_.try_allocate(bytes, alignment);
  }

  /// To the primary if it owns `p`, else to the fallback.
  CARVE_EXEC_CHECK_DISABLE
  CARVE_HOST_DEVICE void deallocate(void* p, cuda::std::size_t bytes, cuda::std::size_t alignment) noexcept {
    if (this->first_.owns(p)) {
      this->first_.deallocate(p, bytes, alignment);
    } else {
      this->second_.deallocate(p, bytes, alignment);
    }
  }

  /// deallocate, checked by the part that gets `p` (where both parts check).
  CARVE_EXEC_CHECK_DISABLE
  [[nodiscard]] CARVE_HOST_DEVICE cuda::std::expected<void, Errc> try_deallocate(
      void* p, cuda::std::size_t bytes,
      cuda::std::size_t alignment) noexcept requires ChecksDeallocation<Primary> && ChecksDeallocation<Fallback> {
    return this->first_.owns(p) ? this->first_.try_deallocate(p, bytes, alignment)
                                : this->second_.try_deallocate(p, bytes, alignment);
  }

  /// The primary part.
  CARVE_HOST_DEVICE constexpr Primary& primary() noexcept { return this->first_; }
  /// The primary part.
  CARVE_HOST_DEVICE constexpr const Primary& primary() const noexcept { return this->first_; }
  /// The fallback part.
  CARVE_HOST_DEVICE constexpr Fallback& fallback() noexcept { return this->second_; }
  /// The fallback part.
  CARVE_HOST_DEVICE constexpr const Fallback& fallback() const noexcept { return this->second_; }

  /// A property both parts declare (where its memory lives, say) the stack declares too.
  template <class Property>
  requires detail::declares_property<Primary, Property> && detail::declares_property<Fallback, Property>
  friend constexpr void get_property(const FallbackResource&, Property) noexcept {}
};

static_assert(MemoryResource<FallbackResource<detail::OwningArchetype, detail::ResourceArchetype>>);
static_assert(OwnsMemory<FallbackResource<detail::OwningArchetype, detail::OwningArchetype>>);

} // namespace carve
