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
/// auto r = Slots(words, blockIdx.x).allocate(4);        // slots [r->first, r->first + 4) of 131072
/// auto q = Slots(words).allocate_near(4, blockIdx.x);   // the same, naming the home per call
/// @endcode
///
/// The allocator is a handle on words it does not own (device memory, shared memory, a host
/// vector), and carries its caller's home shard, so it costs nothing to create per caller; as a
/// carve::SlotSource it can sit under a SlotArena. Slot s belongs to shard s / ShardSlots, so a
/// range from allocate is freed through any handle without saying where it came from.
///
/// A home is any number (a block index, an SM id): shard `home % Shards` is tried first. The
/// home shard is named by allocate_near(m, home), not by a second argument to allocate: the
/// other slot allocators read `allocate(m, x)` as a hinted allocation, and a home passed where
/// generic code meant a hint must not compile.
///
/// Bad input (null words, or words not aligned for 8-byte atomics) throws carve::Exception
/// (invalid_argument) on the host. Device code cannot throw: there the handle's status() reports
/// invalid_argument and every call refuses with it (free_count() is 0, reset() does nothing).
#pragma once

#include <carve/core/bits.hpp>
#include <carve/core/compressed_pair.hpp>
#include <carve/core/config.hpp>
#include <carve/core/errc.hpp>
#include <carve/core/error.hpp>
#include <carve/core/misuse.hpp>
#include <carve/slot/allocator/concurrent_slot_allocator.hpp>
#include <carve/slot/allocator/slot_source.hpp>
#include <carve/slot/storage/slot_range.hpp>
#include <carve/slot/storage/slot_words.hpp>

#include <nv/target>

#include <cuda/std/cstdint>
#include <cuda/std/expected>

namespace carve {

/// `Shards` lock-free bitmaps of `ShardSlots` slots each, as one SlotSource; a handle on borrowed
/// words that carries the caller's home shard. Thread-safe like ConcurrentSlotAllocator.
template <std::uint32_t ShardSlots, std::uint32_t Shards, class Fit = BoundaryNearestFit,
          cuda::thread_scope Scope = cuda::thread_scope_device>
class ShardedSlotAllocator {
  static_assert(Shards >= 1, "a sharded allocator needs at least one shard");
  static_assert(ShardSlots >= 1, "a sharded allocator's shards need at least one slot each");
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
  static constexpr bool shares_slots = true; ///< a handle: its copies share the words (SharesSlots)

  /// `words` holds word_count 8-byte-aligned words; call reset() once before sharing it. `home`:
  /// the shard this handle's allocate(m) tries first (its SM, block or thread group; taken modulo
  /// Shards). Bad input: see the file's comment.
  CARVE_HOST_DEVICE explicit ShardedSlotAllocator(bits::word* words, std::uint32_t home = 0, policy_type fit = {})
      : state_(fit, words), home_(home) {
    if (words == nullptr || reinterpret_cast<cuda::std::uintptr_t>(words) % alignof(bits::word) != 0) {
      NV_IF_TARGET(NV_IS_HOST,
                   (throw Exception(Errc::invalid_argument,
                                    words == nullptr ? "carve::ShardedSlotAllocator: null words"
                                                     : "carve::ShardedSlotAllocator: words not 8-byte aligned");));
      shard_words() = nullptr;
    }
  }

  /// invalid_argument for a handle built in device code from bad input (on the host such a handle
  /// is never built: the constructor throws); success otherwise.
  [[nodiscard]] CARVE_HOST_DEVICE constexpr cuda::std::expected<void, Errc> status() const noexcept {
    if (shard_words() == nullptr) {
      return cuda::std::unexpected(Errc::invalid_argument);
    }
    return {};
  }

  /// This handle with another home shard (and the same status()).
  CARVE_HOST_DEVICE constexpr ShardedSlotAllocator with_home(std::uint32_t home) const noexcept {
    return ShardedSlotAllocator(Checked{}, shard_words(), home, fit());
  }
  /// The shard this handle tries first.
  CARVE_HOST_DEVICE constexpr std::uint32_t home() const noexcept { return home_; }

  /// Slots in all shards.
  CARVE_HOST_DEVICE static constexpr std::uint32_t size() noexcept { return ShardSlots * Shards; }

  /// m contiguous slots, from shard `home % Shards` if it has room, else from the next shard that
  /// has. Errors: invalid_size (m == 0); no_space (no shard could hold it, m larger than one
  /// shard included: a run never spans shards); status(); what a shard reports otherwise.
  [[nodiscard]] CARVE_HOST_DEVICE cuda::std::expected<SlotRange, Errc>
  allocate_near(std::uint32_t m, std::uint32_t home) const noexcept {
    if (const auto ok = check_slot_request(m, ShardSlots); !ok) {
      return cuda::std::unexpected(ok.error());
    }
    if (const auto ok = status(); !ok) {
      return cuda::std::unexpected(ok.error());
    }
    for (std::uint32_t i = 0; i < Shards; ++i) {
      const std::uint32_t s = (home % Shards + i) % Shards;
      auto slots = shard_at(s);
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
  /// allocate_near from this handle's home shard.
  [[nodiscard]] CARVE_HOST_DEVICE cuda::std::expected<SlotRange, Errc> allocate(std::uint32_t m) const noexcept {
    return allocate_near(m, home_);
  }

  /// Errors: invalid_size (empty), out_of_range (past the last shard or wrapping), not_allocated
  /// (a slot of it is free, or it spans two shards, which no allocation does), status().
  [[nodiscard]] CARVE_HOST_DEVICE cuda::std::expected<void, Errc> deallocate(SlotRange r) const noexcept {
    if (r.count == 0) {
      return cuda::std::unexpected(Errc::invalid_size);
    }
    if (const auto ok = status(); !ok) {
      return ok;
    }
    if (r.end() > size()) {
      return cuda::std::unexpected(Errc::out_of_range);
    }
    const std::uint32_t s = r.first / ShardSlots;
    if (r.end() > std::uint64_t{s + 1} * ShardSlots) {
      return cuda::std::unexpected(Errc::not_allocated);
    }
    auto slots = shard_at(s);
    return slots.deallocate({r.first - s * ShardSlots, r.count});
  }

  /// Shard s on its own (slots numbered from 0 within it). s must be below Shards and the handle's
  /// status() a success: otherwise carve::Exception (out_of_range, invalid_argument) on the host,
  /// and on a device the program stops with a message (report_misuse), as a shard over no words
  /// cannot be handed out.
  CARVE_HOST_DEVICE shard_type shard(std::uint32_t s) const {
    if (s >= Shards || shard_words() == nullptr) {
      NV_IF_ELSE_TARGET(NV_IS_HOST,
                        (throw Exception(s >= Shards ? Errc::out_of_range : Errc::invalid_argument,
                                         "carve::ShardedSlotAllocator::shard(" + std::to_string(s) + "): " +
                                             (s >= Shards ? "there are " + std::to_string(Shards) + " shards"
                                                          : std::string("the handle has no words")));),
                        (report_misuse("carve::ShardedSlotAllocator::shard", shard_words(), s,
                                       s >= Shards ? Errc::out_of_range : Errc::invalid_argument);))
    }
    return shard_at(s);
  }

  /// Free slots over all shards, read now (only a hint while others allocate); 0 when status()
  /// reports an error.
  CARVE_HOST_DEVICE std::uint32_t free_count() const noexcept {
    std::uint32_t n = 0;
    for (std::uint32_t s = 0; s < Shards && shard_words() != nullptr; ++s) {
      n += shard_at(s).free_count();
    }
    return n;
  }

  /// All slots free (nothing when status() reports an error). Not safe against concurrent calls;
  /// on a device, threads may reset disjoint shards in parallel through shard(s).reset().
  CARVE_HOST_DEVICE void reset() const noexcept {
    for (std::uint32_t s = 0; s < Shards && shard_words() != nullptr; ++s) {
      shard_at(s).reset();
    }
  }

private:
  struct Checked {}; ///< the arguments were checked already (with_home)
  CARVE_HOST_DEVICE constexpr ShardedSlotAllocator(Checked, bits::word* words, std::uint32_t home,
                                                   policy_type fit) noexcept
      : state_(fit, words), home_(home) {}

  CARVE_HOST_DEVICE shard_type shard_at(std::uint32_t s) const noexcept {
    return shard_type(BorrowedSlotWords<ShardSlots>(shard_words() + std::size_t{s} * words_per_shard), fit());
  }

  CARVE_HOST_DEVICE constexpr bits::word*& shard_words() noexcept { return state_.second(); }
  CARVE_HOST_DEVICE constexpr bits::word* shard_words() const noexcept { return state_.second(); }
  CARVE_HOST_DEVICE constexpr const policy_type& fit() const noexcept { return state_.first(); }

  // The policy every shard is handed (no bytes when it has no state) and the shards' words.
  detail::CompressedPair<policy_type, bits::word*> state_;
  std::uint32_t home_;
};

static_assert(SlotSource<ShardedSlotAllocator<128, 4>>);

} // namespace carve
