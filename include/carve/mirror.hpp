/// @file carve/mirror.hpp
/// One virtual device over several: PagedMirror and its parts.
///
/// Host-only (Linux). CudaMirrorBackend needs the CUDA runtime (declared only with
/// `<cuda_runtime_api.h>`); CudaGreenContexts also needs `<cuda.h>` (no libcuda link).
#pragma once

#include <carve/mirror/atomic_page_bits.hpp>
#include <carve/mirror/compute_grants.hpp>
#include <carve/mirror/cuda_backend.hpp>
#include <carve/mirror/cuda_green_contexts.hpp>
#include <carve/mirror/device_info.hpp>
#include <carve/mirror/device_segments.hpp>
#include <carve/mirror/device_view.hpp>
#include <carve/mirror/fault_handler.hpp>
#include <carve/mirror/host_backend.hpp>
#include <carve/mirror/host_copy_stream.hpp>
#include <carve/mirror/host_stream_copies.hpp>
#include <carve/mirror/mirror_backend.hpp>
#include <carve/mirror/mirror_options.hpp>
#include <carve/mirror/mirror_pages.hpp>
#include <carve/mirror/page_copies.hpp>
#include <carve/mirror/page_table.hpp>
#include <carve/mirror/paged_mirror.hpp>
#include <carve/mirror/peer_views.hpp>
#include <carve/mirror/picker_placement.hpp>
#include <carve/mirror/placement.hpp>
#include <carve/mirror/priority_dispatcher.hpp>
#include <carve/mirror/reserved_memory.hpp>
#include <carve/mirror/simulated_green_contexts.hpp>
#include <carve/mirror/sm_partitioner.hpp>
#include <carve/mirror/sync_report.hpp>
#include <carve/mirror/view_placement.hpp>
#include <carve/mirror/vmm_mirror_backend.hpp>
#include <carve/mirror/write_tracker.hpp>
#include <carve/mirror/write_tracking.hpp>
