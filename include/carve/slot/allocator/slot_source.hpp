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
/// allocate(m) gives m slots or an error (invalid_size for m == 0, the one request no slot
/// source could serve; no_space when no run of m is free, m larger than it could ever hold
/// included, so that what sits on it passes the request on) and changes nothing on error;
/// check_slot_request is that first check. deallocate(range) takes back
/// a taken range (out_of_range past the end, not_allocated for a slot already free); free_count()
/// is the number of free slots; reset() frees every slot. SlotAllocator, ConcurrentSlotAllocator,
/// ShardedSlotAllocator and DynamicSlotAllocator model it, so anything built on slots (a
/// SlotArena, a scheduler) takes any of them.
#pragma once

#include <carve/core/config.hpp>
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

/// A slot source whose copies share one set of slots (a handle on borrowed words, as
/// ConcurrentSlotAllocatorRef and ShardedSlotAllocator are), where a copy of any other (a
/// SlotAllocator, a DynamicSlotAllocator) holds slots of its own: it says `shares_slots = true`.
template <class S>
concept SharesSlots = requires {
  requires S::shares_slots;
};

/// The check every slot source's allocate(m) makes first: invalid_size for m == 0, no_space for
/// more slots than the `most` it could ever hold in one run.
[[nodiscard]] CARVE_HOST_DEVICE constexpr cuda::std::expected<void, Errc>
check_slot_request(std::uint32_t m, std::uint32_t most) noexcept {
  if (m == 0) {
    return cuda::std::unexpected(Errc::invalid_size);
  }
  if (m > most) {
    return cuda::std::unexpected(Errc::no_space);
  }
  return {};
}

} // namespace carve
