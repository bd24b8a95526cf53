// carve/mr/upstream.hpp — the concept a caching pool's upstream (the card's real allocator) models.
//
//   struct MyCard {
//     void* try_allocate(std::size_t bytes, std::size_t alignment) noexcept; // nullptr: out of memory
//     void deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept;
//     std::size_t free_bytes() const;  // what the card could still hand out (the driver's figure)
//     std::size_t capacity() const;    // the card's total memory
//   };
//
// Semantic requirements: try_allocate returns memory aligned to `alignment` (a power of two)
// or nullptr, never throws for lack of memory; deallocate takes exactly what try_allocate gave
// with the same size and alignment; free_bytes may change under other users' feet (a real GPU
// is shared), so a pool treats it as a hint and still checks every try_allocate.
// carve ships two: SimulatedCard (host memory, fixed capacity) and CudaDeviceResource.
#pragma once

#include <concepts>
#include <cstddef>

namespace carve {

template <class R>
concept UpstreamResource = std::copy_constructible<R> &&
    requires(R& r, const R& cr, void* p, std::size_t n, std::size_t align) {
  { r.try_allocate(n, align) }
  noexcept->std::same_as<void*>;
  { r.deallocate(p, n, align) }
  noexcept;
  { cr.free_bytes() } -> std::convertible_to<std::size_t>;
  { cr.capacity() } -> std::convertible_to<std::size_t>;
};

} // namespace carve
