/// @file carve/slot/allocator/slot_source.hpp
/// The concept every slot allocator models.
///
/// @code
/// template <carve::SlotSource Slots> void drain(Slots& slots) {
///   auto r = slots.allocate(4);          // cuda::std::expected<SlotRange, Errc>
///   if (r) (void)slots.deallocate(*r);   // cuda::std::expected<void, Errc>
/// }
/// @endcode
///
/// A slot source hands out runs of contiguous slots numbered 0..size()-1 and takes them back:
/// allocate(m) gives m slots or an error (invalid_size for m == 0 or more than it could ever
/// hold, no_space when no run is free) and changes nothing on error; deallocate(range) takes back
/// a taken range (out_of_range past the end, not_allocated for a slot already free); free_count()
/// is the number of free slots; reset() frees every slot. SlotAllocator, ConcurrentSlotAllocator,
/// ShardedSlotAllocator and DynamicSlotAllocator model it, so anything built on slots (a
/// SlotArena, a scheduler) takes any of them.
#pragma once

#include <carve/core/errc.hpp>
#include <carve/slot/storage/slot_range.hpp>

#include <cuda/std/concepts>
#include <cuda/std/cstdint>
#include <cuda/std/expected>

namespace carve {

/// A slot allocator: allocate(m), deallocate(range), size(), free_count() and reset() with the
/// contract above.
template <class S>
concept SlotSource = requires(S& slots, const S& cslots, std::uint32_t m, SlotRange range) {
  { slots.allocate(m) } -> cuda::std::same_as<cuda::std::expected<SlotRange, Errc>>;
  { slots.deallocate(range) } -> cuda::std::same_as<cuda::std::expected<void, Errc>>;
  { cslots.size() } -> cuda::std::convertible_to<std::uint32_t>;
  { cslots.free_count() } -> cuda::std::convertible_to<std::uint32_t>;
  slots.reset();
};

} // namespace carve
