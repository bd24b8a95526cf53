/// @file carve/mr/slot_arena.hpp
/// A byte range cut into equal slots, handed out by any slot allocator:
/// the bridge from slots to memory.
///
/// @code
/// // a whole block's scratch in shared memory, served by a lock-free block-scope allocator
/// using Slots = carve::ConcurrentSlotAllocator<128, carve::BoundaryNearestFit, cuda::thread_scope_block>;
/// __shared__ alignas(256) std::byte heap[128 * 256];
/// __shared__ carve::SlotArena<Slots> arena;
/// if (threadIdx.x == 0) arena.reset(heap, sizeof heap, 256);   // shared memory is not constructed: set it up once
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
/// a SlotAllocator one owner, a DynamicSlotAllocator a size chosen at run time. So a copy of the
/// arena shares its slots only where Slots is a handle (SharesSlots); over any other it is a second
/// arena over the same bytes with free slots of its own, never to serve beside the first (move it
/// instead; the two compare unequal). Host and device
/// wherever Slots is. A default-constructed arena holds nothing (every request: no_space) until
/// reset(base, bytes, slot_bytes) points it at its bytes, so it can be declared __shared__ and set
/// up by one thread.
///
/// The arena is told how many bytes it is given and checks them against what its slots need
/// (slots.size() * slot_bytes; more is allowed and left unused). Bad input — a null base, 0 slot
/// bytes, slots that would run past the end of the address space, fewer bytes than the slots
/// need, or slots whose own status() reports an error — throws carve::Exception
/// (invalid_argument) on the host and builds nothing. Device code cannot throw: there the arena's
/// status() reports the code, and every call refuses with it (try_allocate, try_deallocate), so a
/// misconfigured arena under a FallbackResource is an error, not a silent spill to the fallback.
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

#include <string>

namespace carve {

/// Bytes cut into equal slots, placed by a SlotSource `Slots`. A MemoryResource; thread-safe when
/// `Slots` is.
template <SlotSource Slots>
class SlotArena : public CcclSpellings<SlotArena<Slots>> {
public:
  /// The slot allocator.
  using slots_type = Slots;

  /// Over nothing (every request: no_space; status() success) until reset(base, bytes,
  /// slot_bytes).
  constexpr SlotArena() noexcept = default;

  /// `slots.size()` slots of `slot_bytes` bytes each from `base`, all free; `bytes`: the length of
  /// the buffer at `base`, at least slots.size() * slot_bytes. Bad input: see the file's comment.
  CARVE_HOST_DEVICE SlotArena(void* base, cuda::std::size_t bytes,
                              cuda::std::size_t slot_bytes) requires cuda::std::default_initializable<Slots> {
    reset(base, bytes, slot_bytes);
  }
  /// The same over slots built elsewhere (a handle on shared words, a size chosen at run time);
  /// they keep the state they have.
  CARVE_HOST_DEVICE SlotArena(void* base, cuda::std::size_t bytes, cuda::std::size_t slot_bytes,
                              Slots slots) requires cuda::std::move_constructible<Slots>
      : slots_(cuda::std::move(slots)) {
    point_at(base, bytes, slot_bytes);
  }

  /// Points the arena at the `bytes` bytes at `base` and frees every slot; bad input as the
  /// constructor (on a device, status() tells and the slots are left alone). Not safe against
  /// concurrent calls: on a device, one thread of the block, then __syncthreads().
  CARVE_EXEC_CHECK_DISABLE
  CARVE_HOST_DEVICE void reset(void* base, cuda::std::size_t bytes, cuda::std::size_t slot_bytes) {
    if (point_at(base, bytes, slot_bytes)) {
      slots_.reset();
    }
  }

  /// invalid_argument for an arena given bad input in device code (on the host such an arena is
  /// never built: the constructor throws); success otherwise, a default-constructed arena included.
  [[nodiscard]] CARVE_HOST_DEVICE cuda::std::expected<void, Errc> status() const noexcept {
    if (status_ != Errc{}) {
      return cuda::std::unexpected(status_);
    }
    return {};
  }

  /// The run of slots the policy picks for `bytes` rounded up to whole slots; errors above, or
  /// status().
  CARVE_EXEC_CHECK_DISABLE
  [[nodiscard]] CARVE_HOST_DEVICE cuda::std::expected<void*, Errc> try_allocate(cuda::std::size_t bytes,
                                                                                cuda::std::size_t alignment) noexcept {
    if (const auto ok = check_request(bytes, alignment); !ok) {
      return cuda::std::unexpected(ok.error());
    }
    if (status_ != Errc{}) {
      return cuda::std::unexpected(status_);
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
  /// past the arena); status().
  CARVE_EXEC_CHECK_DISABLE
  [[nodiscard]] CARVE_HOST_DEVICE cuda::std::expected<void, Errc> try_deallocate(void* p, cuda::std::size_t bytes,
                                                                                 cuda::std::size_t alignment) noexcept {
    if (const auto ok = check_request(bytes, alignment); !ok) {
      return ok;
    }
    if (status_ != Errc{}) {
      return cuda::std::unexpected(status_);
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

  /// Whether a block from one may be freed through the other: arenas over the same bytes whose
  /// slot allocators share their slots (SharesSlots: copies of one handle); over any other slot
  /// allocator, only itself (a copy holds free slots of its own over the same bytes, so the two
  /// must never serve side by side).
  friend CARVE_HOST_DEVICE bool operator==(const SlotArena& a, const SlotArena& b) noexcept {
    if constexpr (SharesSlots<Slots>) {
      return a.base_ == b.base_ && a.slot_bytes_ == b.slot_bytes_;
    } else {
      return &a == &b;
    }
  }

private:
  /// What is wrong with pointing the arena at `bytes` bytes at `base` (nullptr: nothing).
  CARVE_EXEC_CHECK_DISABLE
  CARVE_HOST_DEVICE const char* problem(void* base, cuda::std::size_t bytes,
                                        cuda::std::size_t slot_bytes) const noexcept {
    if (base == nullptr) {
      return "a null base address";
    }
    if (slot_bytes == 0) {
      return "0 bytes per slot";
    }
    if constexpr (requires { slots_.status(); }) {
      if (!slots_.status()) {
        return "slots whose status() reports an error";
      }
    }
    const auto slots = static_cast<cuda::std::size_t>(slots_.size());
    if (slots > (static_cast<cuda::std::uintptr_t>(-1) - reinterpret_cast<cuda::std::uintptr_t>(base)) / slot_bytes) {
      return "slots that would run past the end of the address space";
    }
    if (bytes < slots * slot_bytes) {
      return "a buffer shorter than its slots need";
    }
    return nullptr;
  }

  /// Points the arena at its bytes, or (bad input) throws on the host and, on a device, leaves it
  /// over nothing with status() invalid_argument. Whether it took them.
  CARVE_EXEC_CHECK_DISABLE
  CARVE_HOST_DEVICE bool point_at(void* base, cuda::std::size_t bytes, cuda::std::size_t slot_bytes) {
    if (const char* why = problem(base, bytes, slot_bytes)) {
      NV_IF_TARGET(NV_IS_HOST,
                   (throw Exception(Errc::invalid_argument,
                                    std::string("carve::SlotArena: ") + why + " (" + std::to_string(slots_.size()) +
                                        " slots of " + std::to_string(slot_bytes) + " bytes from " +
                                        std::to_string(reinterpret_cast<cuda::std::uintptr_t>(base)) + ", " +
                                        std::to_string(bytes) + " bytes given)");));
      base_ = nullptr;
      slot_bytes_ = 0;
      status_ = Errc::invalid_argument;
      return false;
    }
    base_ = static_cast<cuda::std::byte*>(base);
    slot_bytes_ = slot_bytes;
    status_ = Errc{};
    return true;
  }

  Slots slots_{};
  cuda::std::byte* base_ = nullptr;
  cuda::std::size_t slot_bytes_ = 0;
  Errc status_{}; ///< Errc{} (no error) unless bad input reached reset or a constructor in device code
};

static_assert(MemoryResource<SlotArena<SlotAllocator<64>>> && OwnsMemory<SlotArena<SlotAllocator<64>>> &&
              UpstreamResource<SlotArena<SlotAllocator<64>>> && ChecksDeallocation<SlotArena<SlotAllocator<64>>>);

} // namespace carve
