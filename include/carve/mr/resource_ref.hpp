/// @file carve/mr/resource_ref.hpp
/// A non-owning part: carve::ref(r) lets one resource sit under
/// several stacks.
///
/// @code
/// carve::CachingPool pool(carve::SimulatedCard(1 << 30));
/// carve::StatsResource<carve::ResourceRef<decltype(pool)>> counted(carve::ref(pool));
/// carve::LimitResource<carve::ResourceRef<decltype(pool)>> capped(carve::ref(pool), 64 << 20);
/// @endcode
///
/// Combinators hold their parts by value; a ResourceRef is a value that points at a resource
/// someone else owns (which must outlive it). It models MemoryResource, and every optional
/// capability its resource has (owns, free_bytes, capacity, trim, stats, try_deallocate). Two
/// refs compare equal when they point at the same resource.
#pragma once

#include <carve/core/config.hpp>
#include <carve/core/errc.hpp>
#include <carve/mr/cuda_mr.hpp>
#include <carve/mr/memory_resource.hpp>

#include <cuda/std/cstddef>
#include <cuda/std/expected>

namespace carve {

/// Refers to a resource `R` that someone else owns; every call forwards to it.
template <MemoryResource R>
class ResourceRef : public CcclSpellings<ResourceRef<R>> {
public:
  /// The resource referred to.
  using resource_type = R;

  /// Refers to `resource`, which must outlive this ref.
  CARVE_HOST_DEVICE constexpr explicit ResourceRef(R& resource) noexcept : r_(&resource) {}

  /// The resource's try_allocate.
  CARVE_EXEC_CHECK_DISABLE
  [[nodiscard]] CARVE_HOST_DEVICE cuda::std::expected<void*, Errc> try_allocate(cuda::std::size_t bytes,
                                                                                cuda::std::size_t alignment) noexcept {
    return r_->try_allocate(bytes, alignment);
  }
  /// The resource's deallocate.
  CARVE_EXEC_CHECK_DISABLE
  CARVE_HOST_DEVICE void deallocate(void* p, cuda::std::size_t bytes, cuda::std::size_t alignment) noexcept {
    r_->deallocate(p, bytes, alignment);
  }

  /// The resource's try_deallocate, where it has one.
  CARVE_EXEC_CHECK_DISABLE
  [[nodiscard]] CARVE_HOST_DEVICE cuda::std::expected<void, Errc>
  try_deallocate(void* p, cuda::std::size_t bytes,
                 cuda::std::size_t alignment) noexcept requires ChecksDeallocation<R> {
    return r_->try_deallocate(p, bytes, alignment);
  }
  /// The resource's owns, where it has one.
  CARVE_EXEC_CHECK_DISABLE
  CARVE_HOST_DEVICE bool owns(const void* p) const noexcept requires OwnsMemory<R> { return r_->owns(p); }
  /// The resource's free_bytes, where it has one.
  CARVE_EXEC_CHECK_DISABLE
  CARVE_HOST_DEVICE cuda::std::size_t free_bytes() const requires ReportsFreeBytes<R> { return r_->free_bytes(); }
  /// The resource's capacity, where it has one.
  CARVE_EXEC_CHECK_DISABLE
  CARVE_HOST_DEVICE cuda::std::size_t capacity() const requires ReportsCapacity<R> { return r_->capacity(); }
  /// The resource's trim, where it has one.
  CARVE_EXEC_CHECK_DISABLE
  CARVE_HOST_DEVICE cuda::std::size_t trim() requires Trimmable<R> { return r_->trim(); }
  /// The resource's stats, where it has them.
  CARVE_EXEC_CHECK_DISABLE
  CARVE_HOST_DEVICE decltype(auto) stats() const requires ReportsStats<R> { return r_->stats(); }

  /// The resource referred to.
  CARVE_HOST_DEVICE constexpr R& get() const noexcept { return *r_; }

  /// Equal when both refer to the same resource.
  friend CARVE_HOST_DEVICE constexpr bool operator==(const ResourceRef& a, const ResourceRef& b) noexcept {
    return a.r_ == b.r_;
  }

  /// Declares every CCCL memory property the resource declares.
  template <class Property>
  requires detail::declares_property<R, Property>
  friend constexpr void get_property(const ResourceRef&, Property) noexcept {}

private:
  R* r_;
};

/// A non-owning part that refers to `resource`.
template <MemoryResource R>
CARVE_HOST_DEVICE constexpr ResourceRef<R> ref(R& resource) noexcept {
  return ResourceRef<R>(resource);
}

static_assert(MemoryResource<ResourceRef<detail::ResourceArchetype>> &&
              !OwnsMemory<ResourceRef<detail::ResourceArchetype>> && OwnsMemory<ResourceRef<detail::OwningArchetype>>);

} // namespace carve
