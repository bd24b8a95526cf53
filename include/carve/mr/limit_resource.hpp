/// @file carve/mr/limit_resource.hpp
/// A byte budget in front of a resource.
///
/// @code
/// carve::LimitResource<carve::ResourceRef<Pool>> tenant(carve::ref(pool), 256 << 20);  // 256 MiB for this tenant
/// @endcode
///
/// Each allocation counts its aligned footprint: `bytes` rounded up to a multiple of its
/// `alignment` (so 1 byte at 512 counts 512; what the resource rounds beyond that is its own). A
/// request that would take
/// the live total past the budget gets no_space (so a FallbackResource can pass it on) and never
/// reaches the resource. The count is an atomic of scope `Scope`: many threads may share one
/// budget, and the budget is never exceeded, not even for a moment. free_bytes is what is left of
/// the budget (or of the resource, when that is less); capacity is the budget (or the resource's
/// capacity, when that is less). owns, trim and try_deallocate pass through where the resource
/// has them: so over a shared resource (a ResourceRef) owns answers for all of its memory, and such
/// a budget must not be a FallbackResource's primary over memory its fallback draws from too (the
/// fallback's blocks would come back through this budget). Frees must name the bytes and alignment
/// their allocation did, as every resource's do: a resource below that accepts others leaves the
/// count off by the difference. Each budget is its own object: a copy counts apart (so copies
/// compare unequal, and each is equal only to itself). A kernel parameter is such a copy, one per
/// thread that allocates through it: to share one budget in a kernel, keep it in global or shared
/// memory and pass carve::ref to it.
#pragma once

#include <carve/core/config.hpp>
#include <carve/core/errc.hpp>
#include <carve/mr/cuda_mr.hpp>
#include <carve/mr/detail/make_part.hpp>
#include <carve/mr/detail/take_within.hpp>
#include <carve/mr/memory_resource.hpp>

#include <cuda/atomic>
#include <cuda/std/cstddef>
#include <cuda/std/expected>
#include <cuda/std/utility>

namespace carve {

/// Resource `R` behind a budget of bytes counted by threads of scope `Scope`. A MemoryResource.
template <MemoryResource R, cuda::thread_scope Scope = cuda::thread_scope_device>
class LimitResource : public CcclSpellings<LimitResource<R, Scope>> {
public:
  /// The resource behind the budget.
  using resource_type = R;

  /// A budget of nothing (every request: no_space) until assigned: how a __shared__ stack starts.
  constexpr LimitResource() requires cuda::std::default_initializable<R>
  = default;
  /// `budget` bytes of `resource` (the resource itself, or what its constructor takes).
  template <class Resource>
  requires cuda::std::constructible_from<R, Resource>
      CARVE_HOST_DEVICE constexpr LimitResource(Resource&& resource, cuda::std::size_t budget)
      : r_(cuda::std::forward<Resource>(resource)), budget_(budget) {}
  /// `budget` bytes of the resource built in place from `args`, its constructor's arguments
  /// (`std::piecewise_construct, std::forward_as_tuple(...)`): for resources that cannot move.
  CARVE_EXEC_CHECK_DISABLE
  template <class Tag, class Args>
  requires detail::piecewise_tag<Tag> && detail::part_arguments<R, Args>
      CARVE_HOST_DEVICE constexpr LimitResource(Tag, Args&& args, cuda::std::size_t budget)
      : r_(detail::make_part<R>(static_cast<Args&&>(args))), budget_(budget) {}

  /// From the resource if the budget has the footprint left. Errors: invalid_size (check_request,
  /// or a footprint that overflows);
  /// no_space (over budget); the resource's own.
  CARVE_EXEC_CHECK_DISABLE
  [[nodiscard]] CARVE_HOST_DEVICE cuda::std::expected<void*, Errc> try_allocate(cuda::std::size_t bytes,
                                                                                cuda::std::size_t alignment) noexcept {
    if (const auto ok = check_request(bytes, alignment); !ok) {
      return cuda::std::unexpected(ok.error());
    }
    const cuda::std::size_t footprint = round_up(bytes, alignment);
    if (footprint == 0) { // overflows when rounded: no resource could serve it
      return cuda::std::unexpected(Errc::invalid_size);
    }
    if (!detail::take_within(used_ref(), footprint, budget_)) {
      return cuda::std::unexpected(Errc::no_space);
    }
    const cuda::std::expected<void*, Errc> p = r_.try_allocate(bytes, alignment);
    if (!p) {
      used_ref().fetch_sub(footprint, cuda::std::memory_order_relaxed);
    }
    return p;
  }

  /// To the resource; the footprint goes back to the budget.
  CARVE_EXEC_CHECK_DISABLE
  CARVE_HOST_DEVICE void deallocate(void* p, cuda::std::size_t bytes, cuda::std::size_t alignment) noexcept {
    r_.deallocate(p, bytes, alignment);
    used_ref().fetch_sub(round_up(bytes, alignment), cuda::std::memory_order_relaxed);
  }

  /// The resource's try_deallocate; the budget gets the footprint back only when it succeeds.
  CARVE_EXEC_CHECK_DISABLE
  [[nodiscard]] CARVE_HOST_DEVICE cuda::std::expected<void, Errc>
  try_deallocate(void* p, cuda::std::size_t bytes,
                 cuda::std::size_t alignment) noexcept requires ChecksDeallocation<R> {
    const cuda::std::expected<void, Errc> r = r_.try_deallocate(p, bytes, alignment);
    if (r) {
      used_ref().fetch_sub(round_up(bytes, alignment), cuda::std::memory_order_relaxed);
    }
    return r;
  }

  /// The budget in bytes.
  CARVE_HOST_DEVICE cuda::std::size_t budget() const noexcept { return budget_; }
  /// The footprints of the allocations made through this resource and not yet freed.
  CARVE_HOST_DEVICE cuda::std::size_t used_bytes() const noexcept {
    return cuda::atomic_ref<cuda::std::size_t, Scope>(const_cast<cuda::std::size_t&>(used_))
        .load(cuda::std::memory_order_relaxed);
  }

  /// What is left of the budget, or of the resource when that is less.
  CARVE_EXEC_CHECK_DISABLE
  CARVE_HOST_DEVICE cuda::std::size_t free_bytes() const {
    const cuda::std::size_t left = budget_ - used_bytes();
    if constexpr (ReportsFreeBytes<R>) {
      const cuda::std::size_t inner = r_.free_bytes();
      return inner < left ? inner : left;
    } else {
      return left;
    }
  }
  /// The budget, or the resource's capacity when that is less.
  CARVE_EXEC_CHECK_DISABLE
  CARVE_HOST_DEVICE cuda::std::size_t capacity() const {
    if constexpr (ReportsCapacity<R>) {
      const cuda::std::size_t inner = r_.capacity();
      return inner < budget_ ? inner : budget_;
    } else {
      return budget_;
    }
  }
  /// The resource's owns, where it has one.
  CARVE_EXEC_CHECK_DISABLE
  CARVE_HOST_DEVICE bool owns(const void* p) const noexcept requires OwnsMemory<R> { return r_.owns(p); }
  /// The resource's trim, where it has one.
  CARVE_EXEC_CHECK_DISABLE
  CARVE_HOST_DEVICE cuda::std::size_t trim() requires Trimmable<R> { return r_.trim(); }
  /// The resource's stats, where it has them.
  CARVE_EXEC_CHECK_DISABLE
  CARVE_HOST_DEVICE decltype(auto) stats() const requires ReportsStats<R> { return r_.stats(); }

  /// The resource behind the budget.
  CARVE_HOST_DEVICE constexpr R& upstream() noexcept { return r_; }
  /// The resource behind the budget.
  CARVE_HOST_DEVICE constexpr const R& upstream() const noexcept { return r_; }

  /// Equal only to itself: a block counted in one budget must not go back through another.
  friend CARVE_HOST_DEVICE constexpr bool operator==(const LimitResource& a, const LimitResource& b) noexcept {
    return &a == &b;
  }

  /// Declares every CCCL memory property the resource declares.
  template <class Property>
  requires detail::declares_property<R, Property>
  friend constexpr void get_property(const LimitResource&, Property) noexcept {}

private:
  CARVE_HOST_DEVICE cuda::atomic_ref<cuda::std::size_t, Scope> used_ref() noexcept {
    return cuda::atomic_ref<cuda::std::size_t, Scope>(used_);
  }

  R r_{};
  cuda::std::size_t budget_ = 0;
  cuda::std::size_t used_ = 0; ///< touched only through atomic_ref
};

static_assert(UpstreamResource<LimitResource<detail::ResourceArchetype>>);

} // namespace carve
