/// @file carve/mr.hpp
/// Memory resources: the MemoryResource concept, the resources (SimulatedCard, AddressOnlyCard,
/// CudaDeviceResource, CachingPool, StreamCachingPool, StreamOrderedPool, SlotArena), PrivatePools
/// (a CUDA graph's blocks beside a pool) and the combinators that stack them (FallbackResource,
/// Segregator, StatsResource, LimitResource, TraceResource, StreamUsesPool, ref, as_pmr).
///
/// Host and device where the parts are. CudaDeviceResource needs the CUDA runtime (it declares
/// nothing without `<cuda_runtime_api.h>`).
///
/// In a CUDA translation unit (a .cu file: `__CUDACC__` is defined) this header holds only what a
/// kernel can use: the concept, SlotArena, ref and the combinators FallbackResource, Segregator,
/// StatsResource and LimitResource. The host-only resources (pools, cards, CudaDeviceResource,
/// TraceResource, as_pmr) pull in `<map>`, `<mutex>`, `<filesystem>` and `<memory_resource>`,
/// which every kernel translation unit would otherwise parse for each architecture; include them
/// by name (`<carve/mr/caching_pool.hpp>`, `<carve/mr/cuda_device_resource.hpp>`, ...), or
/// define CARVE_CUDA_FULL_UMBRELLAS before the first carve include to get them all.
#pragma once

// What runs in kernels.
#include <carve/mr/cuda_mr.hpp>
#include <carve/mr/fallback_resource.hpp>
#include <carve/mr/limit_resource.hpp>
#include <carve/mr/memory_resource.hpp>
#include <carve/mr/resource_ref.hpp>
#include <carve/mr/segregator.hpp>
#include <carve/mr/slot_arena.hpp>
#include <carve/mr/stats_resource.hpp>

// Host only.
#if !defined(__CUDACC__) || defined(CARVE_CUDA_FULL_UMBRELLAS)
#include <carve/mr/address_only_card.hpp>
#include <carve/mr/as_pmr.hpp>
#include <carve/mr/best_fit_ranges.hpp>
#include <carve/mr/byte_budget.hpp>
#include <carve/mr/caching_pool.hpp>
#include <carve/mr/caching_pool_options.hpp>
#include <carve/mr/cuda_current_device.hpp>
#include <carve/mr/cuda_device_resource.hpp>
#include <carve/mr/cuda_stream_events.hpp>
#include <carve/mr/device_uuid.hpp>
#include <carve/mr/private_pools.hpp>
#include <carve/mr/segment_export.hpp>
#include <carve/mr/simulated_card.hpp>
#include <carve/mr/stream_caching_pool.hpp>
#include <carve/mr/stream_caching_pool_options.hpp>
#include <carve/mr/stream_events.hpp>
#include <carve/mr/stream_ordered_pool.hpp>
#include <carve/mr/stream_ordered_pool_options.hpp>
#include <carve/mr/stream_ordered_resource.hpp>
#include <carve/mr/stream_uses_pool.hpp>
#include <carve/mr/trace_resource.hpp>
#endif
