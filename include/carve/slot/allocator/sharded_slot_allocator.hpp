/// @file carve/slot/allocator/sharded_slot_allocator.hpp
/// Many independent slot bitmaps behind one interface.
///
/// Under heavy concurrency an exact policy on one bitmap sends every thread to the same words
/// (the lowest free run, say). Sharding splits the slots into `Shards` bitmaps of `ShardSlots`
/// slots, each a ConcurrentSlotAllocator; each caller names a home shard (its SM, block or thread
/// group), is served there under the policy, and only moves on to the next shards when its home
/// cannot hold the request. Callers with different homes never touch the same words until the
/// slots run low.
///
/// @code
/// using Slots = carve::ShardedSlotAllocator<1024, 128, carve::FirstFit, cuda::thread_scope_device>;
/// // words: Slots::word_count 64-bit words of device memory, then one Slots(words).reset()
/// auto r = Slots(words, blockIdx.x).allocate(4);   // slots [r->first, r->first + 4) of 131072
/// @endcode
///
/// The allocator is a handle on words it does not own (device memory, shared memory, a host
/// vector), and carries its caller's home shard, so it costs nothing to create per caller; as a
/// carve::SlotSource it can sit under a SlotArena. Slot s belongs to shard s / ShardSlots, so a
/// range from allocate is freed through any handle without saying where it came from.
#pragma once

#include <carve/core/bits.hpp>
#include <carve/core/config.hpp>
#include <carve/core/errc.hpp>
#include <carve/slot/allocator/concurrent_slot_allocator.hpp>
#include <carve/slot/allocator/slot_source.hpp>
#include <carve/slot/storage/slot_range.hpp>
#include <carve/slot/storage/slot_words.hpp>

#include <cuda/std/cstdint>
#include <cuda/std/expected>

namespace carve {

/// `Shards` lock-free bitmaps of `ShardSlots` slots each, as one SlotSource; a handle on borrowed
/// words that carries the caller's home shard. Thread-safe like ConcurrentSlotAllocator.
template <std::uint32_t ShardSlots, std::uint32_t Shards, class Fit = BoundaryNearestFit,
          cuda::thread_scope Scope = cuda::thread_scope_device>
class ShardedSlotAllocator {
  static_assert(Shards >= 1, "a sharded allocator needs at least one shard");
  static_assert(std::uint64_t{ShardSlots} * Shards <= max_slots, "too many slots");

public:
  /// One shard on its own.
  using shard_type = ConcurrentSlotAllocatorRef<ShardSlots, Fit, Scope>;
  /// The policy every shard uses.
  using policy_type = typename shard_type::policy_type;
  static constexpr std::uint32_t shard_count = Shards;                           ///< shards
  static constexpr std::uint32_t shard_slots = ShardSlots;                       ///< slots per shard
  static constexpr std::uint32_t words_per_shard = bits::word_count(ShardSlots); ///< words per shard
  static constexpr std::uint32_t word_count = words_per_shard * Shards;          ///< the storage it needs

  /// `words` holds word_count 8-byte-aligned words; call reset() once before sharing it. `home`:
  /// the shard this handle's allocate(m) tries first (its SM, block or thread group).
  CARVE_HOST_DEVICE constexpr explicit ShardedSlotAllocator(bits::word* words, std::uint32_t home = 0,
                                                            policy_type fit = {}) noexcept
      : words_(words), home_(home), fit_(fit) {}

  /// This handle with another home shard.
  CARVE_HOST_DEVICE constexpr ShardedSlotAllocator with_home(std::uint32_t home) const noexcept {
    return ShardedSlotAllocator(words_, home, fit_);
  }
  /// The shard this handle tries first.
  CARVE_HOST_DEVICE constexpr std::uint32_t home() const noexcept { return home_; }

  /// Slots in all shards.
  CARVE_HOST_DEVICE static constexpr std::uint32_t size() noexcept { return ShardSlots * Shards; }

  /// m contiguous slots, from shard `home % Shards` if it has room, else from the next shard that
  /// has. Errors: invalid_size (m == 0); no_space (no shard could hold it, m larger than one
  /// shard included: a run never spans shards); what a shard reports otherwise.
  CARVE_HOST_DEVICE cuda::std::expected<SlotRange, Errc> allocate(std::uint32_t m, std::uint32_t home) const noexcept {
    if (const auto ok = check_slot_request(m, ShardSlots); !ok) {
      return cuda::std::unexpected(ok.error());
    }
    for (std::uint32_t i = 0; i < Shards; ++i) {
      const std::uint32_t s = (home % Shards + i) % Shards;
      auto slots = shard(s);
      const auto r = slots.allocate(m);
      if (r) {
        return SlotRange{s * ShardSlots + r->first, r->count};
      }
      if (r.error() != Errc::no_space) {
        return r;
      }
    }
    return cuda::std::unexpected(Errc::no_space);
  }
  /// The same from this handle's home shard.
  CARVE_HOST_DEVICE cuda::std::expected<SlotRange, Errc> allocate(std::uint32_t m) const noexcept {
    return allocate(m, home_);
  }

  /// Errors: invalid_size (empty), out_of_range (past the last shard or wrapping), not_allocated
  /// (a slot of it is free, or it spans two shards, which no allocation does).
  CARVE_HOST_DEVICE cuda::std::expected<void, Errc> deallocate(SlotRange r) const noexcept {
    if (r.count == 0) {
      return cuda::std::unexpected(Errc::invalid_size);
    }
    if (r.end() > size()) {
      return cuda::std::unexpected(Errc::out_of_range);
    }
    const std::uint32_t s = r.first / ShardSlots;
    if (r.end() > std::uint64_t{s + 1} * ShardSlots) {
      return cuda::std::unexpected(Errc::not_allocated);
    }
    auto slots = shard(s);
    return slots.deallocate({r.first - s * ShardSlots, r.count});
  }

  /// Shard s on its own (slots numbered from 0 within it).
  CARVE_HOST_DEVICE shard_type shard(std::uint32_t s) const noexcept {
    return shard_type(BorrowedSlotWords<ShardSlots>(words_ + std::size_t{s} * words_per_shard), fit_);
  }

  /// Free slots over all shards, read now (only a hint while others allocate).
  CARVE_HOST_DEVICE std::uint32_t free_count() const noexcept {
    std::uint32_t n = 0;
    for (std::uint32_t s = 0; s < Shards; ++s) {
      n += shard(s).free_count();
    }
    return n;
  }

  /// All slots free. Not safe against concurrent calls; on a device, threads may reset disjoint
  /// shards in parallel through shard(s).reset().
  CARVE_HOST_DEVICE void reset() const noexcept {
    for (std::uint32_t s = 0; s < Shards; ++s) {
      shard(s).reset();
    }
  }

private:
  bits::word* words_;
  std::uint32_t home_;
  [[no_unique_address]] policy_type fit_;
};

static_assert(SlotSource<ShardedSlotAllocator<128, 4>>);

} // namespace carve
