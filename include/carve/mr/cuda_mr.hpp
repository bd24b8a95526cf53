// carve/mr/cuda_mr.hpp — whether CCCL's memory-resource concepts (<cuda/memory_resource>) are
// available, so that carve's resources can declare their properties for them.
//
// CCCL 3.0 ships cuda::mr::resource, resource_with, resource_ref and the host_accessible /
// device_accessible properties, but only when LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE is
// defined before the first CCCL include; newer CCCL renames the synchronous concept to
// cuda::mr::synchronous_resource. <cuda/memory_resource> also needs the CUDA runtime headers
// (cuda::stream_ref names cudaStream_t), so a plain host build without the toolkit's include
// directory gets none of this. carve declares properties when that macro is defined, or when
// CARVE_ENABLE_CUDA_MR is (for a CCCL whose memory resources need no opt-in). Either way
// carve's resources offer allocate/deallocate(bytes, alignment) and the newer
// allocate_sync/deallocate_sync spelling, so they satisfy whichever concept the CCCL in use has.
#pragma once

#if defined(LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE) || defined(CARVE_ENABLE_CUDA_MR)
#if __has_include(<cuda/memory_resource>) && __has_include(<cuda_runtime_api.h>)
#include <cuda/memory_resource>
#define CARVE_HAS_CUDA_MR 1
#endif
#endif

#include <cstddef>
#include <new>

namespace carve {

#if defined(CARVE_HAS_CUDA_MR)
inline constexpr bool cuda_mr_available = true;
#else
inline constexpr bool cuda_mr_available = false;
#endif

// Gives a resource with try_allocate (nullptr when out of memory) and deallocate the CCCL
// spellings: allocate throwing std::bad_alloc, and the newer allocate_sync / deallocate_sync.
template <class Derived>
class CcclSpellings {
public:
  void* allocate(std::size_t bytes, std::size_t alignment) {
    if (void* p = self().try_allocate(bytes, alignment)) {
      return p;
    }
    throw std::bad_alloc();
  }
  void* allocate_sync(std::size_t bytes, std::size_t alignment) { return allocate(bytes, alignment); }
  void deallocate_sync(void* p, std::size_t bytes, std::size_t alignment) noexcept {
    self().deallocate(p, bytes, alignment);
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

} // namespace carve
