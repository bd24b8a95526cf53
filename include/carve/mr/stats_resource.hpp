/// @file carve/mr/stats_resource.hpp
/// Counts what passes through a resource.
///
/// @code
/// carve::StatsResource<carve::CachingPool<carve::SimulatedCard>> pool(carve::SimulatedCard(1 << 30));
/// ...
/// carve::ResourceStats s = pool.stats();   // allocations, deallocations, bytes_in_use, peak_bytes, failed
/// @endcode
///
/// Every call is counted with relaxed atomics of scope `Scope` (a block-shared arena can count at
/// block scope), so many threads, host or device, may share one. bytes_in_use and peak_bytes
/// count the bytes asked for, not what the resource rounded them to; `failed` counts every
/// refused call (try_allocate errors, and try_deallocate errors where the resource checks).
/// Counters read while other threads allocate are each exact, but not taken at one instant.
/// Capabilities of the resource (owns, free_bytes, capacity, trim, try_deallocate) pass through;
/// its own stats() is upstream().stats().
#pragma once

#include <carve/core/config.hpp>
#include <carve/core/errc.hpp>
#include <carve/mr/cuda_mr.hpp>
#include <carve/mr/detail/make_part.hpp>
#include <carve/mr/memory_resource.hpp>

#include <cuda/atomic>
#include <cuda/std/cstddef>
#include <cuda/std/cstdint>
#include <cuda/std/expected>
#include <cuda/std/utility>

namespace carve {

/// What a StatsResource counted.
struct ResourceStats {
  cuda::std::uint64_t allocations = 0;   ///< successful try_allocate calls
  cuda::std::uint64_t deallocations = 0; ///< deallocate calls (and successful try_deallocate calls)
  cuda::std::size_t bytes_in_use = 0;    ///< asked for by live allocations
  cuda::std::size_t peak_bytes = 0;      ///< the most bytes_in_use has been
  cuda::std::uint64_t failed = 0;        ///< refused calls
};

/// Resource `R` with every call counted (atomics of scope `Scope`). A MemoryResource.
template <MemoryResource R, cuda::thread_scope Scope = cuda::thread_scope_device>
class StatsResource : public CcclSpellings<StatsResource<R, Scope>> {
public:
  /// The resource counted.
  using resource_type = R;

  constexpr StatsResource() requires cuda::std::default_initializable<R>
  = default;
  /// `resource` counted (the resource itself, what its constructor takes, or carve::ref(r)).
  template <class Resource>
  requires cuda::std::constructible_from<R, Resource>
      CARVE_HOST_DEVICE constexpr explicit StatsResource(Resource&& resource)
      : r_(cuda::std::forward<Resource>(resource)) {}
  /// The resource built in place from `args`, its constructor's arguments
  /// (`std::piecewise_construct, std::forward_as_tuple(...)`): for resources that cannot move.
  CARVE_EXEC_CHECK_DISABLE
  template <class Tag, class Args>
  requires detail::piecewise_tag<Tag> && detail::part_arguments<R, Args>
      CARVE_HOST_DEVICE constexpr StatsResource(Tag, Args&& args)
      : r_(detail::make_part<R>(static_cast<Args&&>(args))) {}

  /// The resource's try_allocate, counted.
  CARVE_EXEC_CHECK_DISABLE
  [[nodiscard]] CARVE_HOST_DEVICE cuda::std::expected<void*, Errc> try_allocate(cuda::std::size_t bytes,
                                                                                cuda::std::size_t alignment) noexcept {
    const cuda::std::expected<void*, Errc> p = r_.try_allocate(bytes, alignment);
    if (!p) {
      counter(counts_.failed).fetch_add(1, cuda::std::memory_order_relaxed);
      return p;
    }
    counter(counts_.allocations).fetch_add(1, cuda::std::memory_order_relaxed);
    const cuda::std::size_t now =
        counter(counts_.bytes_in_use).fetch_add(bytes, cuda::std::memory_order_relaxed) + bytes;
    counter(counts_.peak_bytes).fetch_max(now, cuda::std::memory_order_relaxed);
    return p;
  }

  /// The bytes leave the count before they go back, and join it after they were handed out, so
  /// bytes_in_use (and its peak) never counts more than the resource really has out.
  CARVE_EXEC_CHECK_DISABLE
  CARVE_HOST_DEVICE void deallocate(void* p, cuda::std::size_t bytes, cuda::std::size_t alignment) noexcept {
    counter(counts_.bytes_in_use).fetch_sub(bytes, cuda::std::memory_order_relaxed);
    r_.deallocate(p, bytes, alignment);
    counter(counts_.deallocations).fetch_add(1, cuda::std::memory_order_relaxed);
  }

  /// The resource's try_deallocate, counted (where it has one).
  CARVE_EXEC_CHECK_DISABLE
  [[nodiscard]] CARVE_HOST_DEVICE cuda::std::expected<void, Errc>
  try_deallocate(void* p, cuda::std::size_t bytes,
                 cuda::std::size_t alignment) noexcept requires ChecksDeallocation<R> {
    // A free the resource refuses never reaches the count: a bad one would take from it bytes it
    // never held, and an allocation meanwhile would see the count wrapped (and keep it as its peak).
    // Where the resource can say beforehand, the bytes leave first (never counted more, as in
    // deallocate); else only once it has taken the block back.
    constexpr bool checks_first = requires { r_.check_deallocate(p, bytes, alignment); };
    if constexpr (checks_first) {
      if (const auto ok = r_.check_deallocate(p, bytes, alignment); !ok) {
        counter(counts_.failed).fetch_add(1, cuda::std::memory_order_relaxed);
        return ok;
      }
      counter(counts_.bytes_in_use).fetch_sub(bytes, cuda::std::memory_order_relaxed);
    }
    const cuda::std::expected<void, Errc> r = r_.try_deallocate(p, bytes, alignment);
    if (r) {
      if constexpr (!checks_first) {
        counter(counts_.bytes_in_use).fetch_sub(bytes, cuda::std::memory_order_relaxed);
      }
      counter(counts_.deallocations).fetch_add(1, cuda::std::memory_order_relaxed);
    } else {
      if constexpr (checks_first) { // freed meanwhile by another thread (a racing double free)
        counter(counts_.bytes_in_use).fetch_add(bytes, cuda::std::memory_order_relaxed);
      }
      counter(counts_.failed).fetch_add(1, cuda::std::memory_order_relaxed);
    }
    return r;
  }

  /// The counters now, each read atomically.
  CARVE_HOST_DEVICE ResourceStats stats() const noexcept {
    return {load(counts_.allocations), load(counts_.deallocations), load(counts_.bytes_in_use),
            load(counts_.peak_bytes), load(counts_.failed)};
  }

  /// The resource's owns, where it has one.
  CARVE_EXEC_CHECK_DISABLE
  CARVE_HOST_DEVICE bool owns(const void* p) const noexcept requires OwnsMemory<R> { return r_.owns(p); }
  /// The resource's free_bytes, where it has one.
  CARVE_EXEC_CHECK_DISABLE
  CARVE_HOST_DEVICE cuda::std::size_t free_bytes() const requires ReportsFreeBytes<R> { return r_.free_bytes(); }
  /// The resource's capacity, where it has one.
  CARVE_EXEC_CHECK_DISABLE
  CARVE_HOST_DEVICE cuda::std::size_t capacity() const requires ReportsCapacity<R> { return r_.capacity(); }
  /// The resource's trim, where it has one.
  CARVE_EXEC_CHECK_DISABLE
  CARVE_HOST_DEVICE cuda::std::size_t trim() requires Trimmable<R> { return r_.trim(); }

  /// The resource counted.
  CARVE_HOST_DEVICE constexpr R& upstream() noexcept { return r_; }
  /// The resource counted.
  CARVE_HOST_DEVICE constexpr const R& upstream() const noexcept { return r_; }

  /// Equal only to itself: a block counted here must not go back through another's counts.
  friend CARVE_HOST_DEVICE constexpr bool operator==(const StatsResource& a, const StatsResource& b) noexcept {
    return &a == &b;
  }

  /// Declares every CCCL memory property the resource declares.
  template <class Property>
  requires detail::declares_property<R, Property>
  friend constexpr void get_property(const StatsResource&, Property) noexcept {}

private:
  template <class T>
  CARVE_HOST_DEVICE static cuda::atomic_ref<T, Scope> counter(T& value) noexcept {
    return cuda::atomic_ref<T, Scope>(value);
  }
  template <class T>
  CARVE_HOST_DEVICE static T load(const T& value) noexcept {
    return cuda::atomic_ref<T, Scope>(const_cast<T&>(value)).load(cuda::std::memory_order_relaxed);
  }

  R r_{};
  /// Plain fields touched only through atomic_ref, so the adaptor stays constant-initialisable
  /// (a __shared__ variable) and copyable (a snapshot).
  ResourceStats counts_{};
};

static_assert(MemoryResource<StatsResource<detail::ResourceArchetype>> &&
              ReportsStats<StatsResource<detail::ResourceArchetype>>);

} // namespace carve
