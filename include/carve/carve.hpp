/// @file carve/carve.hpp
/// Every carve component; each folder also has its own umbrella
/// (`<carve/slot.hpp>`, `<carve/mr.hpp>`, ...) for programs that need one part.
///
/// Compiles with any C++20 compiler given CCCL's libcu++ headers, and with nvcc in a .cu file
/// whose kernels instantiate carve's allocators. Formatting support for fmt is separate: include
/// `<carve/fmt.hpp>` (and link fmt) to print bitmaps, ranges and errors. Parts that need the CUDA
/// runtime (CudaDeviceResource, CudaMirrorBackend, discover_topology, the service's CUDA IPC
/// mapping) appear only where `<cuda_runtime_api.h>` is on the include path (CudaMemoryMapper also
/// needs `<cuda.h>`, but never libcuda); CCCL memory-resource
/// properties only when LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE is defined (see
/// carve/mr/cuda_mr.hpp); NumaNodeResource needs libnuma when used (carve::numa).
///
/// In a CUDA translation unit (a .cu file: `__CUDACC__` is defined) this header holds what kernels
/// use: core, `<carve/slot.hpp>`, `<carve/mr.hpp>` and `<carve/queue.hpp>`, each without its
/// host-only parts. The host-only components (borrow, mirror, service, sim, tier, topology, trace,
/// vmm) bring sockets, `<filesystem>`, parsers and the service, which nvcc's host pass and its
/// device pass for each architecture would all parse: a .cu including everything took several
/// times as long to compile.
/// Include their umbrellas by name in the .cu files that use them on the host, or define
/// CARVE_CUDA_FULL_UMBRELLAS before the first carve include to get everything here as a C++
/// compiler does.
#pragma once

static_assert(__cplusplus >= 202002L, "carve needs C++20: link carve::carve, or pass -std=c++20 (g++, clang++, nvcc)");

// Below C++20 the assertion above is the only error: the rest would add hundreds more, and
// take as long to fail as to compile.
#if __cplusplus >= 202002L

#include <carve/version.hpp>

#include <carve/core.hpp>  // bits, errors, configuration
#include <carve/mr.hpp>    // memory resources and the combinators that stack them
#include <carve/queue.hpp> // requests queued by size (host and device lanes)
#include <carve/slot.hpp>  // slots on a compute unit (host and device)

// Host-only components: left out of CUDA translation units (see above).
#if !defined(__CUDACC__) || defined(CARVE_CUDA_FULL_UMBRELLAS)
#include <carve/borrow.hpp>   // borrowing across GPUs by link bandwidth (host)
#include <carve/mirror.hpp>   // one virtual device over several (host)
#include <carve/service.hpp>  // the allocation service (host, Linux)
#include <carve/sim.hpp>      // the workgroup scheduling simulator (host)
#include <carve/tier.hpp>     // spill tiers shared fairly among GPUs (host)
#include <carve/topology.hpp> // the machine's cards and links (host)
#include <carve/trace.hpp>    // allocation traces: PyTorch snapshots, RMM logs, carve's CSV (host)
#include <carve/vmm.hpp>      // physical memory, mappings and per-device access (host twin; CUDA driver)
#endif
#endif // C++20
