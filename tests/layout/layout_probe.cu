// What nvcc's device side makes of each type in device_types.hpp, written into the PTX this file
// compiles to (one file per architecture), where check_layout.py reads it: for entry I, the kernel
// by_value<I> (a parameter laid out as a launch copies it; types that cannot be copied take a
// pointer instead), device_layout<I, T> = {sizeof, alignof} and member_offset<I, K>, a member
// pointer, which the PTX spells as the member's offset.
#include "layout/device_types.hpp"

#include <cuda/std/utility>

namespace carve_layout {

template <cuda::std::size_t I, class T>
__device__ unsigned long long device_layout[2] = {sizeof(T), alignof(T)};

template <cuda::std::size_t I, cuda::std::size_t K, auto Member>
__device__ decltype(Member) member_offset = Member;

template <cuda::std::size_t I, class T, auto... Members, cuda::std::size_t... K>
__device__ void record(cuda::std::index_sequence<K...>) {
  static_cast<void>(&device_layout<I, T>);
  (static_cast<void>(&member_offset<I, K, Members>), ...);
}

template <cuda::std::size_t I, class T, auto... Members>
__global__ void by_value(T) {
  record<I, T, Members...>(cuda::std::make_index_sequence<sizeof...(Members)>{});
}

template <cuda::std::size_t I, class T, auto... Members>
__global__ void by_pointer(const T*) {
  record<I, T, Members...>(cuda::std::make_index_sequence<sizeof...(Members)>{});
}

template <cuda::std::size_t I, class T, auto... Members>
void instantiate(Probe<T, Members...>) {
  if constexpr (copied_at_launch<T>) {
    static_cast<void>(&by_value<I, T, Members...>);
  } else {
    static_cast<void>(&by_pointer<I, T, Members...>);
  }
}

template <class... P, cuda::std::size_t... I>
void instantiate_all(ProbeList<P...>, cuda::std::index_sequence<I...>) {
  (instantiate<I>(P{}), ...);
}

// Never called: naming each kernel is what makes nvcc compile it.
void instantiate_every_probe() { instantiate_all(DeviceTypes{}, cuda::std::make_index_sequence<DeviceTypes::size>{}); }

} // namespace carve_layout
