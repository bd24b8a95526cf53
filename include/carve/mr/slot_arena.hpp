/// @file carve/mr/slot_arena.hpp
/// A byte range cut into equal slots, handed out by any slot allocator:
/// the bridge from slots to memory.
///
/// @code
/// // a whole block's scratch in shared memory, served by a lock-free block-scope allocator
/// using Slots = carve::ConcurrentSlotAllocator<128, carve::BoundaryNearestFit, cuda::thread_scope_block>;
/// __shared__ alignas(256) std::byte heap[128 * 256];
/// __shared__ carve::SlotArena<Slots> arena;
/// if (threadIdx.x == 0) arena.reset(heap, 256);   // shared memory is not constructed: set it up once
/// __syncthreads();
/// auto p = arena.try_allocate(1000, 16);   // 4 slots from any thread: expected<void*, Errc>
/// arena.deallocate(*p, 1000, 16);
/// @endcode
///
/// A request is rounded up to whole slots; the run the allocator's policy picks becomes
/// base + first * slot_bytes, so placement (boundary-nearest, first fit, ...) is the policy's and
/// the arena adds only the arithmetic. Errors (nothing changes): invalid_size for 0 bytes or an
/// alignment that is not a power of two; no_space when no run is free, when the request is
/// larger than the whole arena, or when it asks for an alignment finer than every slot start has
/// (the largest power of two dividing both the base and slot_bytes), so that a FallbackResource
/// passes it on. deallocate hands the run back; try_deallocate reports a pointer that is not a
/// slot start of this arena or a run that is not taken (not_allocated, out_of_range).
///
/// Slots is any carve::SlotSource, held by value: a ConcurrentSlotAllocator serves many threads,
/// a SlotAllocator one owner, a DynamicSlotAllocator a size chosen at run time. Host and device
/// wherever Slots is. A default-constructed arena holds nothing (every request: no_space) until
/// reset(base, slot_bytes) points it at its bytes, so it can be declared __shared__ and set up by
/// one thread. Given a null base or 0 slot bytes it throws carve::Exception on the host; device
/// code cannot throw, and gets an arena that holds nothing.
#pragma once

#include <carve/core/config.hpp>
#include <carve/core/error.hpp>
#include <carve/core/misuse.hpp>
#include <carve/mr/cuda_mr.hpp>
#include <carve/mr/memory_resource.hpp>
#include <carve/slot/allocator/slot_allocator.hpp>
#include <carve/slot/allocator/slot_source.hpp>
#include <carve/slot/storage/slot_range.hpp>

#include <nv/target>

#include <cuda/std/cstddef>
#include <cuda/std/cstdint>
#include <cuda/std/expected>
#include <cuda/std/utility>

namespace carve {

/// Bytes cut into equal slots, placed by a SlotSource `Slots`. A MemoryResource; thread-safe when
/// `Slots` is.
template <SlotSource Slots>
class SlotArena : public CcclSpellings<SlotArena<Slots>> {
public:
  /// The slot allocator.
  using slots_type = Slots;

  /// Over nothing (every request: no_space) until reset(base, slot_bytes).
  constexpr SlotArena() noexcept = default;

  /// `slots.size()` slots of `slot_bytes` bytes each from `base`, all free.
  CARVE_HOST_DEVICE SlotArena(void* base,
                              cuda::std::size_t slot_bytes) requires cuda::std::default_initializable<Slots> {
    reset(base, slot_bytes);
  }
  /// The same over slots built elsewhere (a handle on shared words, a size chosen at run time);
  /// they keep the state they have.
  CARVE_HOST_DEVICE SlotArena(void* base, cuda::std::size_t slot_bytes,
                              Slots slots) requires cuda::std::move_constructible<Slots>
      : slots_(cuda::std::move(slots)) {
    point_at(base, slot_bytes);
  }

  /// Points the arena at `base` and frees every slot. Not safe against concurrent calls: on a
  /// device, one thread of the block, then __syncthreads().
  CARVE_EXEC_CHECK_DISABLE
  CARVE_HOST_DEVICE void reset(void* base, cuda::std::size_t slot_bytes) {
    point_at(base, slot_bytes);
    slots_.reset();
  }

  /// The run of slots the policy picks for `bytes` rounded up to whole slots; errors above.
  CARVE_EXEC_CHECK_DISABLE
  CARVE_HOST_DEVICE cuda::std::expected<void*, Errc> try_allocate(cuda::std::size_t bytes,
                                                                  cuda::std::size_t alignment) noexcept {
    if (const auto ok = check_request(bytes, alignment); !ok) {
      return cuda::std::unexpected(ok.error());
    }
    if (bytes > capacity() || alignment > slot_alignment()) {
      return cuda::std::unexpected(Errc::no_space);
    }
    // Slot sources answer no_space for a run longer than they hand out in one piece (a sharded
    // allocator's shard), as for one that is not free now: a fallback's to serve either way.
    const auto run = slots_.allocate(static_cast<cuda::std::uint32_t>(pieces(bytes, slot_bytes_)));
    if (!run) {
      return cuda::std::unexpected(run.error());
    }
    return base_ + run->first * slot_bytes_;
  }

  /// Hands the run back; misuse ends the program (see try_deallocate).
  CARVE_HOST_DEVICE void deallocate(void* p, cuda::std::size_t bytes, cuda::std::size_t alignment) noexcept {
    if (const auto r = try_deallocate(p, bytes, alignment); !r) {
      report_misuse("carve::SlotArena::deallocate", p, bytes, r.error());
    }
  }

  /// Errors (nothing changes): invalid_size (0 bytes, a bad alignment); not_allocated (`p` is not
  /// a slot start of this arena, or a slot of the run is free); out_of_range (the run would end
  /// past the arena).
  CARVE_EXEC_CHECK_DISABLE
  CARVE_HOST_DEVICE cuda::std::expected<void, Errc> try_deallocate(void* p, cuda::std::size_t bytes,
                                                                   cuda::std::size_t alignment) noexcept {
    if (const auto ok = check_request(bytes, alignment); !ok) {
      return ok;
    }
    if (!owns(p)) {
      return cuda::std::unexpected(Errc::not_allocated);
    }
    const auto offset = static_cast<cuda::std::size_t>(static_cast<cuda::std::byte*>(p) - base_);
    if (offset % slot_bytes_ != 0) {
      return cuda::std::unexpected(Errc::not_allocated);
    }
    const cuda::std::size_t count = pieces(bytes, slot_bytes_);
    if (count > slots_.size()) {
      return cuda::std::unexpected(Errc::out_of_range);
    }
    return slots_.deallocate(
        SlotRange{static_cast<cuda::std::uint32_t>(offset / slot_bytes_), static_cast<cuda::std::uint32_t>(count)});
  }

  /// Whether `p` lies inside the arena's bytes.
  CARVE_HOST_DEVICE bool owns(const void* p) const noexcept {
    const auto* b = static_cast<const cuda::std::byte*>(p);
    return base_ != nullptr && b >= base_ && b < base_ + capacity();
  }
  /// Bytes in free slots (not necessarily in one run).
  CARVE_EXEC_CHECK_DISABLE
  CARVE_HOST_DEVICE cuda::std::size_t free_bytes() const noexcept {
    return static_cast<cuda::std::size_t>(slots_.free_count()) * slot_bytes_;
  }
  /// Bytes in all slots.
  CARVE_EXEC_CHECK_DISABLE
  CARVE_HOST_DEVICE cuda::std::size_t capacity() const noexcept {
    return static_cast<cuda::std::size_t>(slots_.size()) * slot_bytes_;
  }
  /// Frees every slot (for a persistent kernel's next round). Not safe against concurrent calls.
  CARVE_EXEC_CHECK_DISABLE
  CARVE_HOST_DEVICE void reset() noexcept { slots_.reset(); }

  /// The alignment every slot start has: the largest power of two dividing the base and the slot
  /// size (0 for an arena over nothing).
  CARVE_HOST_DEVICE cuda::std::size_t slot_alignment() const noexcept {
    const cuda::std::uintptr_t both = reinterpret_cast<cuda::std::uintptr_t>(base_) | slot_bytes_;
    return static_cast<cuda::std::size_t>(both & (~both + 1));
  }
  /// The first slot's address.
  CARVE_HOST_DEVICE void* base() const noexcept { return base_; }
  /// Bytes per slot.
  CARVE_HOST_DEVICE cuda::std::size_t slot_bytes() const noexcept { return slot_bytes_; }
  /// The slot allocator.
  CARVE_HOST_DEVICE constexpr Slots& slots() noexcept { return slots_; }
  /// The slot allocator.
  CARVE_HOST_DEVICE constexpr const Slots& slots() const noexcept { return slots_; }

  /// Equal only to itself.
  friend CARVE_HOST_DEVICE bool operator==(const SlotArena& a, const SlotArena& b) noexcept {
    return a.base_ == b.base_ && a.slot_bytes_ == b.slot_bytes_;
  }

private:
  CARVE_EXEC_CHECK_DISABLE
  CARVE_HOST_DEVICE void point_at(void* base, cuda::std::size_t slot_bytes) {
    const bool fits =
        slot_bytes != 0 && base != nullptr &&
        static_cast<cuda::std::size_t>(slots_.size()) <=
            (static_cast<cuda::std::uintptr_t>(-1) - reinterpret_cast<cuda::std::uintptr_t>(base)) / slot_bytes;
    if (!fits) {
      NV_IF_TARGET(NV_IS_HOST,
                   (throw Exception(Errc::invalid_argument,
                                    "carve::SlotArena: needs a base address and a slot size whose slots stay inside "
                                    "the address space (slot_bytes " +
                                        std::to_string(slot_bytes) + ")");));
      base = nullptr;
      slot_bytes = 0;
    }
    base_ = static_cast<cuda::std::byte*>(base);
    slot_bytes_ = slot_bytes;
  }

  Slots slots_{};
  cuda::std::byte* base_ = nullptr;
  cuda::std::size_t slot_bytes_ = 0;
};

static_assert(MemoryResource<SlotArena<SlotAllocator<64>>> && OwnsMemory<SlotArena<SlotAllocator<64>>> &&
              UpstreamResource<SlotArena<SlotAllocator<64>>> && ChecksDeallocation<SlotArena<SlotAllocator<64>>>);

} // namespace carve
