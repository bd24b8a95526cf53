/// @file carve/vmm.hpp
/// Physical memory mapped the way CUDA's virtual memory management API does it: the
/// PhysicalMemoryMapper concept, its host twin (HostMemoryMapper), the CUDA driver model
/// (CudaMemoryMapper, only where `<cuda.h>` and `<cuda_runtime_api.h>` are on the include path),
/// VmmCard, an exportable card built on either, and ExpandablePool, a pool whose physical memory
/// follows its live blocks (over an OnDemandReservation per stream).
#pragma once

#include <carve/vmm/cuda_memory_mapper.hpp>
#include <carve/vmm/device_granules.hpp>
#include <carve/vmm/expandable_pool.hpp>
#include <carve/vmm/expandable_pool_options.hpp>
#include <carve/vmm/host_mapper_tables.hpp>
#include <carve/vmm/host_memory_mapper.hpp>
#include <carve/vmm/on_demand_reservation.hpp>
#include <carve/vmm/physical_memory_mapper.hpp>
#include <carve/vmm/vmm_card.hpp>
