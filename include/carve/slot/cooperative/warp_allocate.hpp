/// @file carve/slot/cooperative/warp_allocate.hpp
/// One allocation for all the lanes of a warp that ask together.
/// The device function exists under a CUDA compiler only (sm_70 or newer); share_of, the
/// arithmetic it relies on, everywhere.
///
/// When the lanes of a warp call allocate at the same time, mostly with the same size, one claim
/// of k * m slots by a leader replaces k claims of m, so k times fewer atomics hit the bitmap's
/// hottest words. Each lane still receives (and later frees) its own m slots; a lane's range is
/// independent of the others'. Lanes are grouped by size with __match_any_sync over the member
/// mask the caller states; when a group's combined run does not fit, its lanes fall back to
/// allocating one by one.
///
/// @code
/// const unsigned members = __ballot_sync(0xffffffff, i < requests);   // before any lane leaves
/// if (i >= requests) return;
/// const auto r = carve::warp_allocate(members, slots, m);
/// @endcode
#pragma once

#include <carve/core/errc.hpp>
#include <carve/slot/storage/slot_range.hpp>

#include <cuda/std/cstdint>
#include <cuda/std/expected>

namespace carve {

/// The part of a group's run that goes to the lane of the given rank.
CARVE_HOST_DEVICE constexpr SlotRange share_of(SlotRange group_run, std::uint32_t m, std::uint32_t rank) noexcept {
  return {group_run.first + rank * m, m};
}

#if defined(__CUDACC__)
/// Call from every lane of `members` together (one-dimensional blocks), and only from them:
/// `members` is the warp's member mask, as for any *_sync intrinsic, so it must include the
/// calling lane and name exactly the lanes that reach this call (e.g. 0xffffffff where the whole
/// warp calls, or `__ballot_sync(0xffffffff, wants_slots)` taken before a branch). It is not
/// __activemask(): which lanes happen to be converged at a call is not something the program
/// controls, and a lane of the group missing from the mask would wait at a shuffle forever.
///
/// `slots` is a carve slot allocator shared by those lanes, and `args` follow m in its allocate
/// (a hint for a hinted policy; a ShardedSlotAllocator handle carries its home shard, so build
/// it with a home the lanes share instead: the warp's own keeps each shard to one leader, where
/// shards suffice, and leaders that share a shard race for its lowest free words). A group's
/// run is allocated by its leader with the leader's
/// args, so pass args that agree across the lanes asking for the same m (a hint the warp
/// shares). Every lane frees its own share: a share is an ordinary range of the allocator.
template <class Allocator, class... Args>
[[nodiscard]] __device__ cuda::std::expected<SlotRange, Errc> warp_allocate(unsigned members, Allocator& slots,
                                                                            std::uint32_t m, Args... args) {
  const unsigned group = __match_any_sync(members, m);
  const std::uint32_t lanes = static_cast<std::uint32_t>(__popc(group));
  const unsigned lanes_below = group & ((1u << (threadIdx.x % 32)) - 1u); // of the group

  // One call of allocate, in a loop of at most two turns (the group's run, then each lane's own),
  // so that a kernel holds one inlined copy of the allocator rather than two: half the code, and
  // fewer registers (which bound how many threads an SM holds).
  bool group_turn = lanes > 1 && m != 0 && std::uint64_t{m} * lanes <= 0xffff'ffffu;
  for (;;) {
    cuda::std::expected<SlotRange, Errc> run = cuda::std::unexpected(Errc::no_space);
    if (!group_turn || lanes_below == 0) { // the group's leader is its lowest lane
      run = slots.allocate(group_turn ? lanes * m : m, args...);
    }
    if (!group_turn) {
      return run;
    }
    const int leader = __ffs(static_cast<int>(group)) - 1;
    const int whole = __shfl_sync(group, run ? 1 : 0, leader);
    const std::uint32_t first = __shfl_sync(group, run ? run->first : 0u, leader);
    // A shuffle orders no memory: this does, so the leader's claim and the policy's record of it
    // (a hinted policy's stamps) happen before any lane uses or frees its share.
    __syncwarp(group);
    if (whole != 0) {
      return share_of({first, lanes * m}, m, static_cast<std::uint32_t>(__popc(lanes_below)));
    }
    group_turn = false;
  }
}
#endif

} // namespace carve
