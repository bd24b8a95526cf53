/// @file carve/mirror/sm_partitioner.hpp
/// How a compute grant is backed: the `SmPartitioner` concept, `SmLayout`, and
/// `AdvisorySmLedger`, the partitioner that backs nothing and says so.
///
/// PriorityDispatcher keeps a ledger of which SMs of each device belong to which grant. A ledger
/// alone enforces nothing: a kernel launched "for" a grant of 16 SMs may run on every SM of the
/// device. An SmPartitioner turns a ledger entry into something the hardware honours, where it
/// can: CudaGreenContexts (carve/mirror/cuda_green_contexts.hpp) creates a green context holding
/// exactly the grant's SMs and a stream in it; SimulatedGreenContexts
/// (carve/mirror/simulated_green_contexts.hpp) is its host twin, with the driver's partition rules
/// and a simulated stream per grant; AdvisorySmLedger (here) backs nothing and reports
/// `enforced == false`.
///
/// The partition rules shape the ledger. The driver splits a device's SMs into groups of a fixed
/// size (the granule: 2 SMs on compute capability 6.x and 7.x, 4 on 8.x, 8 on 9.0 and later), and
/// a green context can only hold whole groups. Splitting the whole device separately for each
/// grant would give groups that overlap; so a partitioner splits each device once, when the
/// dispatcher is built, and the dispatcher's slots are those groups: a grant is a run of whole
/// groups, a request is rounded up to whole groups, and SMs that fall in no group (132 SMs in
/// groups of 8 leave 4) are never handed out. The ledger therefore holds exactly what the
/// partitions hold.
///
/// Release follows completion: every grant has a stream (its own, on enforcing partitioners);
/// PriorityDispatcher::run() (the work and the hand-back in one step) and release() only mark the
/// grant finished, and its groups return to the ledger when the partitioner reports the stream
/// idle (polled by reclaim(), which dispatch() calls first), so no new grant gets SMs that old
/// work still runs on.
#pragma once

#include <carve/core/error.hpp>
#include <carve/slot/storage/slot_range.hpp>

#include <concepts>
#include <cstdint>

namespace carve {

/// How a partitioner cuts one device: `groups` groups of `granule` SMs each, and whether a
/// partition made of them is enforced by the hardware.
struct SmLayout {
  std::uint32_t granule = 1; ///< SMs per group: the smallest unit a grant is rounded to
  std::uint32_t groups = 0;  ///< groups the dispatcher may hand out (granule x groups SMs in all)
  /// true: work on a grant's stream runs on the grant's SMs only (a green context); false: the
  /// grant is a ledger entry, and work runs wherever the device puts it.
  bool enforced = false;
};

/// What PriorityDispatcher needs to back its grants.
///
/// - `layout(device, units)` is asked once per device, when the dispatcher is built: how it cuts
///   that device, using at most `units` SMs (DeviceInfo::compute_units).
/// - `create(device, groups)` backs a grant of the groups `groups` (indices into that device's
///   layout; the dispatcher never passes a group that a live partition holds).
/// - `stream(partition)` is where work for the grant goes; `idle(partition)` says, without
///   waiting, whether everything queued there has run; `destroy(partition)` ends it (called
///   once the partition is idle, or when the dispatcher goes away: then it must wait first).
template <class P>
concept SmPartitioner = requires(P& p, const P& cp, std::uint32_t device, std::uint32_t units, SlotRange groups,
                                 const typename P::partition_type& partition) {
  typename P::stream_type;
  { p.layout(device, units) } -> std::same_as<SmLayout>;
  { p.create(device, groups) } -> std::same_as<Result<typename P::partition_type>>;
  { cp.stream(partition) } -> std::same_as<typename P::stream_type>;
  { p.idle(partition) } -> std::convertible_to<bool>;
  { p.destroy(partition) }
  noexcept;
};

/// The stream of an advisory grant: none. Launch the work wherever suits; nothing ties it to the
/// grant's SMs.
struct NoStream {
  /// All equal.
  friend constexpr bool operator==(NoStream, NoStream) noexcept = default;
};

/// Backs nothing: a grant is an entry in the dispatcher's ledger and the hardware does not know
/// of it (`enforced == false` on every device). One SM per group, so grants are exact; a released
/// grant's SMs return at once, since the ledger cannot see the work. The default partitioner, and
/// the only honest one where green contexts are missing (no CUDA, a driver before 12.5, a GPU
/// before compute capability 6.0, simulated cards).
struct AdvisorySmLedger {
  /// No stream.
  using stream_type = NoStream;
  /// Nothing to hold.
  struct partition_type {};

  /// Every unit its own group, not enforced.
  SmLayout layout(std::uint32_t /*device*/, std::uint32_t units) const noexcept { return {1, units, false}; }
  /// Nothing to create.
  [[nodiscard]] Result<partition_type> create(std::uint32_t /*device*/, SlotRange /*groups*/) const noexcept {
    return partition_type{};
  }
  /// No stream.
  NoStream stream(const partition_type&) const noexcept { return {}; }
  /// Always: the ledger sees no work.
  bool idle(const partition_type&) const noexcept { return true; }
  /// Nothing to end.
  void destroy(const partition_type&) const noexcept {}
};

static_assert(SmPartitioner<AdvisorySmLedger>);

} // namespace carve
