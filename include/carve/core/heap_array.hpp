/// @file carve/core/heap_array.hpp
/// Arrays from the heap for code that runs on the host and in kernels: new_heap_array<T>(n)
/// and delete_heap_array(p, n). On the host the bytes come from operator new, in device code
/// from the device heap (malloc, sized by cudaLimitMallocHeapSize); either way no memory, or a
/// byte count that overflows, is nullptr, which the caller reports in its own way.
///
/// Why not `new T[n]`: nvcc 13.0's device code gets array new wrong for a trivially destructible
/// T. It asks the device heap for exactly n * sizeof(T) bytes, as no count needs keeping, and
/// still stores the count in the 8 bytes before the block: outside it, where compute-sanitizer's
/// memcheck reports "Invalid __global__ write of size 8 ... out of bounds ... in the device heap"
/// (tests/device_heap shows it in the PTX). Here every element is constructed in place in raw
/// bytes and the caller passes the count back, so there is no count to store anywhere.
#pragma once

#include <carve/core/checked_math.hpp>
#include <carve/core/config.hpp>

#include <cuda/std/cstddef>
#include <cuda/std/type_traits>
#include <nv/target>

#include <new>

namespace carve::detail {

/// What the device heap guarantees for every block (CUDA's in-kernel malloc aligns to 16 bytes).
/// On the host any alignment works: the bytes come from the aligned operator new.
inline constexpr cuda::std::size_t device_heap_alignment = 16;

/// `n` value-initialized Ts, or nullptr for none (n == 0), no memory, or n * sizeof(T) bytes
/// beyond size_t. Give them back with delete_heap_array(p, n), with the same n.
template <class T>
CARVE_HOST_DEVICE T* new_heap_array(cuda::std::size_t n) noexcept {
  static_assert(cuda::std::is_nothrow_default_constructible_v<T>,
                "an element whose construction throws would leave the array half built");
  const auto bytes = checked_mul(n, sizeof(T));
  if (n == 0 || !bytes) {
    return nullptr;
  }
  void* raw = nullptr;
  NV_IF_ELSE_TARGET(
      NV_IS_DEVICE,
      (static_assert(alignof(T) <= device_heap_alignment, "the device heap aligns its blocks to 16 bytes only");
       raw = malloc(*bytes);),
      (raw = ::operator new (*bytes, std::align_val_t{alignof(T)}, std::nothrow);))
  if (raw == nullptr) {
    return nullptr;
  }
  T* first = static_cast<T*>(raw);
  for (cuda::std::size_t i = 0; i < n; ++i) {
    ::new (static_cast<void*>(first + i)) T();
  }
  return first;
}

/// Destroys the `n` elements new_heap_array<T>(n) made at `p` and gives their bytes back;
/// nothing for nullptr.
template <class T>
CARVE_HOST_DEVICE void delete_heap_array(T* p, cuda::std::size_t n) noexcept {
  if (p == nullptr) {
    return;
  }
  for (cuda::std::size_t i = 0; i < n; ++i) {
    p[i].~T();
  }
  NV_IF_ELSE_TARGET(NV_IS_DEVICE, (free(p);),
                    (::operator delete (static_cast<void*>(p), std::align_val_t{alignof(T)});))
}

} // namespace carve::detail
