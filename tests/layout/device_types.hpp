// Every device-capable type carve has, in the forms the guides, examples and tests use in device
// code: the list whose layouts tests/layout checks on both sides of a launch. layout_probe.cu
// declares, for each entry, a kernel that takes the type by value (where it can be copied) and
// device variables holding its size, alignment and listed member offsets as nvcc's device side
// computes them; layout_host.cpp prints the same as the host compiler computes them;
// check_layout.py compares the two and fails on any difference, and on any device-capable class
// in include/carve that no entry names (docs/testing.md, "Layouts across a launch").
#pragma once

#include <carve/mr.hpp>
#include <carve/queue.hpp>
#include <carve/slot.hpp>

#include <cuda/std/cstddef>
#include <cuda/std/cstdint>
#include <cuda/std/type_traits>

namespace carve_layout {

/// One entry: a type, and the public data members whose offsets are compared too (those of
/// aggregates whose fields a kernel reads by name).
template <class T, auto... Members>
struct Probe {
  using type = T;
};

template <class... P>
struct ProbeList {
  static constexpr cuda::std::size_t size = sizeof...(P);
};

/// Whether a kernel can take the type by value: a copy is what a launch makes.
template <class T>
inline constexpr bool copied_at_launch = cuda::std::is_copy_constructible_v<T>;

// The forms the device tests, examples and guides use.
using Local =
    carve::SlotArena<carve::ConcurrentSlotAllocator<128, carve::BoundaryNearestFit, cuda::thread_scope_block>>;
using Global = carve::SlotArena<carve::ConcurrentSlotAllocatorRef<2048, carve::FirstFit>>;
using Counted = carve::StatsResource<carve::LimitResource<Global>>;
using Stack = carve::FallbackResource<Local, carve::Segregator<512, Counted, Global>>;
using Sharded = carve::ShardedSlotAllocator<6400, 16, carve::BoundaryNearestFit>;

struct Request {
  cuda::std::uint32_t id;
  cuda::std::uint32_t vectors;
};
struct Vectors {
  CARVE_HOST_DEVICE cuda::std::uint64_t operator()(const Request& r) const noexcept { return r.vectors; }
};
template <class Drain>
using DeviceQueue = carve::SizeTieredQueue<Request, Vectors, carve::RingLanes<cuda::thread_scope_device>, Drain>;

using carve::CuPlacement;
using carve::QueueStats;
using carve::ResourceStats;
using carve::RunSegment;
using carve::SlotRange;
using carve::WaitHistogramSnapshot;
constexpr auto block = cuda::thread_scope_block;
constexpr auto device = cuda::thread_scope_device;
constexpr auto system = cuda::thread_scope_system;

using DeviceTypes = ProbeList<
    // Slots: storage, searches and policies.
    Probe<SlotRange, &SlotRange::first, &SlotRange::count>, Probe<carve::WordMasks>,
    Probe<RunSegment, &RunSegment::length, &RunSegment::low, &RunSegment::high, &RunSegment::lowest,
          &RunSegment::highest>,
    Probe<carve::SlotBitmap<128>>, Probe<carve::SlotBitmap<6400>>, Probe<carve::OwnedSlotWords<128>>,
    Probe<carve::BorrowedSlotWords<4096>>, Probe<carve::AtomicWords<128, block>>,
    Probe<carve::LazySnapshot<128, device>>, Probe<carve::FreeRuns<>>, Probe<carve::FreeRuns<4>>, Probe<carve::BestFit>,
    Probe<carve::BoundaryNearestFit>, Probe<carve::FirstFit>, Probe<carve::LastFit>,
    Probe<carve::ReleaseAlignedPlacements<128>>, Probe<carve::SharedReleaseAlignedPlacements<128, block>>,
    Probe<carve::RunTimePredictor<8>>,
    Probe<carve::RunTimePredictorSettings, &carve::RunTimePredictorSettings::estimate,
          &carve::RunTimePredictorSettings::weight, &carve::RunTimePredictorSettings::quantile>,
    // Slot allocators of every policy and scope, over owned and borrowed words, and sharded.
    Probe<carve::SlotAllocator<128>>, Probe<carve::SlotAllocator<128, carve::FirstFit>>,
    Probe<carve::SlotAllocator<128, carve::LastFit>>, Probe<carve::SlotAllocator<128, carve::BestFit>>,
    Probe<carve::SlotAllocator<128, carve::ReleaseAlignedFit>>, Probe<carve::SlotAllocator<4096>>,
    Probe<carve::ConcurrentSlotAllocator<128, carve::BoundaryNearestFit, block>>,
    Probe<carve::ConcurrentSlotAllocator<128, carve::ReleaseAlignedFit, block>>,
    Probe<carve::ConcurrentSlotAllocator<4096, carve::FirstFit, device>>,
    Probe<carve::ConcurrentSlotAllocator<128, carve::BestFit, system>>, Probe<carve::ConcurrentSlotAllocatorRef<4096>>,
    Probe<carve::ConcurrentSlotAllocatorRef<2048, carve::FirstFit>>,
    Probe<carve::ConcurrentSlotAllocatorRef<64, carve::LastFit, block>>, Probe<Sharded>,
    Probe<carve::ShardedSlotAllocator<6400, 1000, carve::FirstFit>>,
    // Batch placement and cooperative search; the outcomes its kernels write for the host to read.
    Probe<CuPlacement, &CuPlacement::cu, &CuPlacement::range>, Probe<carve::BatchPlacement>, Probe<carve::BatchRelease>,
    Probe<carve::FirstFittingCu>, Probe<carve::LeastLoadedCu>, Probe<carve::NearestBoundaryCu>,
    // Arenas and every combinator over them, alone and stacked as the guides stack them.
    Probe<Local>, Probe<Global>, Probe<carve::SlotArena<carve::ConcurrentSlotAllocatorRef<4096>>>,
    Probe<carve::SlotArena<carve::SlotAllocator<128>>>, Probe<carve::SlotArena<Sharded>>,
    Probe<carve::SlotArena<carve::ShardedSlotAllocator<256, 8, carve::FirstFit>>>, Probe<carve::LimitResource<Global>>,
    Probe<carve::LimitResource<Local, block>>, Probe<carve::StatsResource<Global>>, Probe<Counted>,
    Probe<carve::FallbackResource<Local, Global>>, Probe<carve::Segregator<512, Counted, Global>>, Probe<Stack>,
    Probe<carve::ResourceRef<Global>>, Probe<carve::FallbackResource<Local, carve::ResourceRef<Global>>>,
    Probe<ResourceStats, &ResourceStats::allocations, &ResourceStats::deallocations, &ResourceStats::bytes_in_use,
          &ResourceStats::peak_bytes, &ResourceStats::failed>,
    // Queues: the queue with each drain policy, its parts, and what it reports.
    Probe<DeviceQueue<carve::RoundRobin>>, Probe<DeviceQueue<carve::StrictPriority>>,
    Probe<DeviceQueue<carve::WeightedRoundRobin>>, Probe<DeviceQueue<carve::DeficitRoundRobin>>,
    Probe<carve::MpmcRing<Request, device>>, Probe<carve::MpmcRing<int, system>>, Probe<carve::BoundedCount<device>>,
    Probe<carve::WaitHistogram<device>>, Probe<carve::TierThresholds>, Probe<carve::QueueClock>,
    Probe<carve::PriorityTag>, Probe<carve::PollBackoff>, Probe<carve::LostRaceBackoff>, Probe<carve::RetryAtOnce>,
    Probe<carve::RoundRobin>, Probe<carve::StrictPriority>, Probe<carve::WeightedRoundRobin>,
    Probe<carve::DeficitRoundRobin>,
    Probe<WaitHistogramSnapshot, &WaitHistogramSnapshot::counts, &WaitHistogramSnapshot::ns_per_tick>,
    Probe<QueueStats, &QueueStats::tiers, &QueueStats::tier>>;

/// Device-capable classes in include/carve with no entry above, and why: a name, then the reason.
/// Every other such class outside a detail namespace must have an entry.
inline constexpr const char* not_listed[][2] = {
    {"DeviceWarp", "defined in device compiles only (a warp's shuffles): there is no host layout to compare"},
    {"DeviceBlock", "defined in device compiles only (a block's barrier): there is no host layout to compare"},
};

} // namespace carve_layout
