// <carve/carve.hpp> — every carve component.
//
// Compiles with any C++20 compiler given CCCL's libcu++ headers. Formatting support for fmt is
// separate: include <carve/fmt.hpp> (and link fmt) to print bitmaps, ranges and errors. Parts
// that need the CUDA runtime (CudaDeviceResource, CudaMirrorBackend, discover_topology, the
// service's CUDA IPC mapping) appear only where <cuda_runtime_api.h> is on the include path;
// CCCL memory-resource properties only when LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE is
// defined (see carve/mr/cuda_mr.hpp).
#pragma once

#include <carve/version.hpp>

#include <carve/core/bits.hpp>
#include <carve/core/config.hpp>
#include <carve/core/cpu_pause.hpp>
#include <carve/core/errc.hpp>
#include <carve/core/thread_number.hpp>

// Slots on a compute unit, alone or shared by many threads (host and device).
#include <carve/slot/atomic_words.hpp>
#include <carve/slot/batch_placement.hpp>
#include <carve/slot/best_fit.hpp>
#include <carve/slot/boundary_nearest_fit.hpp>
#include <carve/slot/concurrent_slot_allocator.hpp>
#include <carve/slot/cu_choice.hpp>
#include <carve/slot/dynamic_slot_allocator.hpp>
#include <carve/slot/first_fit.hpp>
#include <carve/slot/fit_policy.hpp>
#include <carve/slot/free_runs.hpp>
#include <carve/slot/hinted_fit_policy.hpp>
#include <carve/slot/last_fit.hpp>
#include <carve/slot/lazy_snapshot.hpp>
#include <carve/slot/release_aligned_fit.hpp>
#include <carve/slot/run_search.hpp>
#include <carve/slot/run_segment.hpp>
#include <carve/slot/sharded_slot_allocator.hpp>
#include <carve/slot/slot_allocator.hpp>
#include <carve/slot/slot_bitmap.hpp>
#include <carve/slot/slot_range.hpp>
#include <carve/slot/slot_words.hpp>
#include <carve/slot/warp_allocate.hpp>
#include <carve/slot/warp_scan.hpp>
#include <carve/slot/word_fingerprint.hpp>
#include <carve/slot/word_source.hpp>

// Requests queued by size (host and device lanes).
#include <carve/queue/backoff.hpp>
#include <carve/queue/bounded_count.hpp>
#include <carve/queue/deficit_round_robin.hpp>
#include <carve/queue/drain_policy.hpp>
#include <carve/queue/lane.hpp>
#include <carve/queue/moodycamel_lane.hpp> // only when moodycamel's header is found (CARVE_HAS_MOODYCAMEL_LANE)
#include <carve/queue/mpmc_ring.hpp>
#include <carve/queue/poll_backoff.hpp>
#include <carve/queue/priority_tag.hpp>
#include <carve/queue/queue_clock.hpp>
#include <carve/queue/queue_stats.hpp>
#include <carve/queue/round_robin.hpp>
#include <carve/queue/size_tiered_queue.hpp>
#include <carve/queue/strict_priority.hpp>
#include <carve/queue/tier_thresholds.hpp>
#include <carve/queue/weighted_round_robin.hpp>

// Machine topology (host-only).
#include <carve/topology/cuda_discovery.hpp>
#include <carve/topology/description.hpp>
#include <carve/topology/gpu_links.hpp>
#include <carve/topology/graph.hpp>
#include <carve/topology/nvidia_smi.hpp>
#include <carve/topology/parse_error.hpp>
#include <carve/topology/topology.hpp>

// Memory resources and the caching pool (host-only).
#include <carve/mr/caching_pool.hpp>
#include <carve/mr/cuda_current_device.hpp>
#include <carve/mr/cuda_device_resource.hpp>
#include <carve/mr/cuda_mr.hpp>
#include <carve/mr/pool_stats.hpp>
#include <carve/mr/segment_export.hpp>
#include <carve/mr/simulated_card.hpp>
#include <carve/mr/upstream.hpp>

// Borrowing across GPUs by link bandwidth (host-only).
#include <carve/borrow/any_strategy.hpp>
#include <carve/borrow/bandwidth_weighted_picker.hpp>
#include <carve/borrow/borrow_history.hpp>
#include <carve/borrow/borrowing_allocator.hpp>
#include <carve/borrow/pick_strategy.hpp>
#include <carve/borrow/strategies.hpp>

// Spill tiers shared fairly among GPUs (host-only).
#include <carve/tier/byte_size.hpp>
#include <carve/tier/gpu_spill.hpp>
#include <carve/tier/spill_tier.hpp>
#include <carve/tier/tier_discovery.hpp>
#include <carve/tier/tier_planner.hpp>
#include <carve/tier/tier_report.hpp>
#include <carve/tier/tier_resources.hpp> // NumaNodeResource needs libnuma (carve::numa) when used
#include <carve/tier/tier_share_resource.hpp>

// One virtual device over several: PagedMirror and its parts (host-only).
#include <carve/mirror/atomic_page_bits.hpp>
#include <carve/mirror/cuda_backend.hpp>
#include <carve/mirror/device_info.hpp>
#include <carve/mirror/device_segments.hpp>
#include <carve/mirror/fault_handler.hpp>
#include <carve/mirror/host_backend.hpp>
#include <carve/mirror/host_copy_stream.hpp>
#include <carve/mirror/mirror_backend.hpp>
#include <carve/mirror/page_table.hpp>
#include <carve/mirror/paged_mirror.hpp>
#include <carve/mirror/picker_placement.hpp>
#include <carve/mirror/placement.hpp>
#include <carve/mirror/priority_dispatcher.hpp>
#include <carve/mirror/reserved_memory.hpp>
#include <carve/mirror/sync_report.hpp>
#include <carve/mirror/write_tracker.hpp>
#include <carve/mirror/write_tracking.hpp>

// The workgroup scheduling simulator: host-only code over the standard library.
#include <carve/sim.hpp>

// The allocation service: carve-served's AllocationServer and the applications'
// AllocationClient. Host-only and Linux-only (Unix sockets, memfd, epoll, SO_PEERCRED). Where
// <cuda_runtime_api.h> is on the include path a client can map CUDA IPC memory (link
// CUDA::cudart then, or define CARVE_SERVICE_NO_CUDA).
#if defined(__linux__)
#include <carve/mr/shared_memory_card.hpp>
#include <carve/service/allocation_client.hpp>
#include <carve/service/allocation_server.hpp>
#include <carve/service/allocation_service.hpp>
#include <carve/service/leased_upstream.hpp>
#include <carve/service/protocol.hpp>
#include <carve/service/segment_mapping.hpp>
#include <carve/service/server_config.hpp>
#include <carve/service/service_error.hpp>
#include <carve/service/unix_socket.hpp>
#include <carve/service/wire.hpp>
#endif

// Kernels and their launchers: only under a CUDA compiler.
#if defined(__CUDACC__)
#include <carve/cuda/batch_kernels.cuh>
#endif
