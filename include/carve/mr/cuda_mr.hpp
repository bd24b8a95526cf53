/// @file carve/mr/cuda_mr.hpp
/// carve's memory-resource concept, and whether CCCL's memory-resource
/// concepts (`<cuda/memory_resource>`) are available, so that carve's resources can declare their
/// properties for them.
///
/// CCCL 3.0 ships cuda::mr::resource, resource_with, resource_ref and the host_accessible /
/// device_accessible properties, but only when LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE is
/// defined before the first CCCL include; CCCL 3.1 and later call the synchronous concept
/// cuda::mr::synchronous_resource (allocate_sync / deallocate_sync) and give the name `resource`
/// to stream-ordered resources. `<cuda/memory_resource>` also needs the CUDA runtime headers
/// (`cuda::stream_ref` names `cudaStream_t`), so a plain host build without the toolkit's include
/// directory gets none of this. carve declares properties when that macro is defined, or when
/// CARVE_ENABLE_CUDA_MR is (for a CCCL whose memory resources need no opt-in).
///
/// So that the synchronous interface is checked on every build, whatever CCCL is installed,
/// carve states it itself: carve::SynchronousResource<R> requires what CCCL 3.1's
/// cuda::mr::synchronous_resource requires (allocate_sync(bytes, alignment) -> void*,
/// deallocate_sync(p, bytes, alignment) -> void, == and !=), and
/// carve::SynchronousResourceWith<R, Properties...> adds CCCL's has_property test for each
/// property (a get_property(const R&, Property) found by argument-dependent lookup). Every carve
/// resource static_asserts it. Where CCCL has synchronous_resource
/// (CARVE_HAS_CUDA_SYNCHRONOUS_RESOURCE), the resources are checked against CCCL's own concept
/// as well; with CCCL 3.0, against cuda::mr::resource (allocate / deallocate).
#pragma once

#if defined(LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE) || defined(CARVE_ENABLE_CUDA_MR)
#if __has_include(<cuda/memory_resource>) && __has_include(<cuda_runtime_api.h>)
#include <cuda/memory_resource>
#define CARVE_HAS_CUDA_MR 1
#if CCCL_MAJOR_VERSION > 3 || (CCCL_MAJOR_VERSION == 3 && CCCL_MINOR_VERSION >= 1)
#define CARVE_HAS_CUDA_SYNCHRONOUS_RESOURCE 1
#endif
#endif
#endif

#include <carve/core/error.hpp>
#include <carve/core/misuse.hpp>
#include <carve/mr/memory_resource.hpp>

#include <concepts>
#include <cstddef>
#include <string>

namespace carve {

#if defined(CARVE_HAS_CUDA_MR)
/// Whether CCCL's memory-resource concepts are available in this build (CARVE_HAS_CUDA_MR).
inline constexpr bool cuda_mr_available = true;
#else
inline constexpr bool cuda_mr_available = false;
#endif

/// Gives a MemoryResource the spellings CCCL's resource_ref and std::pmr callers use:
/// allocate / allocate_sync, which throw carve::Exception (Errc::no_space when the resource is
/// out of space, the request's own error otherwise), and deallocate_sync. The derived class
/// provides try_allocate, deallocate and ==.
template <class Derived>
class CcclSpellings {
public:
  /// try_allocate, throwing carve::Exception with its error.
  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment) {
    const cuda::std::expected<void*, Errc> p = self().try_allocate(bytes, alignment);
    if (!p) {
      detail::throw_allocation_failure("carve", p.error(), bytes, alignment);
    }
    return *p;
  }
  /// allocate, under the name CCCL 3.1's synchronous_resource uses.
  void* allocate_sync(std::size_t bytes, std::size_t alignment = default_alignment) {
    return allocate(bytes, alignment);
  }
  /// deallocate, under the name CCCL 3.1's synchronous_resource uses.
  void deallocate_sync(void* p, std::size_t bytes, std::size_t alignment = default_alignment) noexcept {
    self().deallocate(p, bytes, alignment);
  }

private:
  Derived& self() noexcept { return static_cast<Derived&>(*this); }
};

/// The stream-ordered spellings, the same on every stream-ordered carve resource
/// (StreamOrderedPool, ExpandablePool, a TraceResource over either), the stream always first:
///
/// @code
/// try_allocate(stream, bytes, alignment)      -> expected<void*, Errc>   the derived class
/// try_deallocate(stream, p, bytes, alignment) -> expected<void, Errc>    the derived class
/// deallocate(stream, p, bytes, alignment)                                here, from try_deallocate
/// deallocate(p, bytes, alignment)                                         here, from try_deallocate
/// allocate(stream, bytes, alignment)          -> void*, throws           here (CCCL 3.1's resource)
/// allocate_async(bytes, alignment, stream)    -> void*, throws           here (CCCL 3.0's async_resource,
/// deallocate_async(p, bytes, alignment, stream)                          the CCCL of CUDA 13.0: stream last)
/// @endcode
///
/// and CcclSpellings' synchronous ones. Each spelling here is a try_ call under CCCL's name:
/// allocate throws carve::Exception with try_allocate's error, and deallocate ends the program
/// with a message naming `Derived::resource_name` when try_deallocate refuses (as free() does
/// with a pointer it never gave). A derived class that records its frees (TraceResource) writes
/// its own deallocate, which hides these.
template <class Derived, class Stream>
class StreamOrderedSpellings : public CcclSpellings<Derived> {
public:
  using CcclSpellings<Derived>::allocate; // the synchronous spellings

  /// try_allocate(stream, bytes, alignment), throwing carve::Exception with its error.
  void* allocate(Stream stream, std::size_t bytes, std::size_t alignment) {
    const cuda::std::expected<void*, Errc> p = self().try_allocate(stream, bytes, alignment);
    if (!p) {
      detail::throw_allocation_failure("carve", p.error(), bytes, alignment);
    }
    return *p;
  }
  /// try_deallocate(stream, ...); misuse ends the program.
  void deallocate(Stream stream, void* p, std::size_t bytes, std::size_t alignment) noexcept {
    if (const auto r = self().try_deallocate(stream, p, bytes, alignment); !r) {
      report_misuse(Derived::resource_name, p, bytes, r.error());
    }
  }
  /// try_deallocate(p, ...), the synchronous free; misuse ends the program.
  void deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept {
    if (const auto r = self().try_deallocate(p, bytes, alignment); !r) {
      report_misuse(Derived::resource_name, p, bytes, r.error());
    }
  }
  /// allocate(stream, bytes, alignment) under CCCL 3.0's name and argument order.
  void* allocate_async(std::size_t bytes, std::size_t alignment, Stream stream) {
    return allocate(stream, bytes, alignment);
  }
  /// deallocate(stream, p, bytes, alignment) under CCCL 3.0's name and argument order.
  void deallocate_async(void* p, std::size_t bytes, std::size_t alignment, Stream stream) noexcept {
    self().deallocate(stream, p, bytes, alignment);
  }

private:
  Derived& self() noexcept { return static_cast<Derived&>(*this); }
};

namespace detail {
// Whether `R` declares the stateless property `P` (a get_property(const R&, P) found by ADL).
template <class R, class P>
concept declares_property = requires(const R& r, P p) {
  get_property(r, p);
};
} // namespace detail

/// What CCCL 3.1's cuda::mr::synchronous_resource requires, stated without CCCL so that every
/// build checks it. Semantic requirements (as CCCL's): allocate_sync returns memory of at least
/// `bytes` aligned to `alignment` or throws (carve's resources: carve::Exception,
/// Errc::no_space when out of memory);
/// deallocate_sync takes back exactly what allocate_sync gave, with the same size and
/// alignment; two resources compare equal when one can free what the other allocated.
template <class R>
concept SynchronousResource = std::equality_comparable<R> &&
    requires(R& r, void* p, std::size_t bytes, std::size_t alignment) {
  { r.allocate_sync(bytes, alignment) } -> std::same_as<void*>;
  { r.deallocate_sync(p, bytes, alignment) } -> std::same_as<void>;
};

/// A SynchronousResource that declares every one of `Properties` (cuda::mr::synchronous_resource_with).
template <class R, class... Properties>
concept SynchronousResourceWith = SynchronousResource<R> &&(detail::declares_property<R, Properties>&&...);

namespace detail {
// CCCL's own concept for `R` where the CCCL in use has one: synchronous_resource from 3.1,
// resource in 3.0 (with the opt-in macro); true where <cuda/memory_resource> is not available.
template <class R>
constexpr bool cccl_accepts() noexcept {
#if defined(CARVE_HAS_CUDA_SYNCHRONOUS_RESOURCE)
  return cuda::mr::synchronous_resource<R>;
#elif defined(CARVE_HAS_CUDA_MR)
  return cuda::mr::resource<R>;
#else
  return true;
#endif
}
} // namespace detail

} // namespace carve
