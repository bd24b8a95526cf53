/// @file carve/topology/cuda_discovery.hpp
/// The Topology of the GPUs in this machine, asked of the CUDA
/// runtime (and of NVML, when enabled).
///
/// @code
/// carve::Topology topo = carve::discover_topology();   // GPU ordinals as CUDA numbers them
/// @endcode
///
/// Needs the CUDA runtime: declared only where `<cuda_runtime_api.h>` is on the include path
/// (nvcc, or a target linked to CUDA::cudart), so `<carve/carve.hpp>` still compiles without it.
///
/// This header only asks: the runtime for peer access, native atomics and the P2P performance
/// rank of every pair, NVML (when enabled) for the far end of every active NVLink. Turning those
/// answers into links is plain host code, tested without a GPU: count_nvlinks() and
/// topology_from_gpu_links() in carve/topology/gpu_links.hpp, which also says what each pair
/// becomes.
///
/// NVML: define CARVE_WITH_NVML and link NVML (the carve::nvml CMake target does both when the
/// toolkit has `nvml.h` and CUDA::nvml). Without it the runtime cannot count
/// NVLinks, so bonded links (NV2, NV12, NV18) are undercounted as one link each. Defining
/// CARVE_WITH_NVML where `<nvml.h>` is not on the include path is an error, not a silent fallback.
/// Throws carve::Exception (device_error) when there is no CUDA device or a query fails.
#pragma once

#include <carve/core/error.hpp>
#if __has_include(<cuda_runtime_api.h>)
#include <carve/topology/gpu_links.hpp>
#include <carve/topology/topology.hpp>

#include <cuda_runtime_api.h>

#if defined(CARVE_WITH_NVML)
#if !__has_include(<nvml.h>)
#error "CARVE_WITH_NVML is defined but <nvml.h> is not on the include path (link the carve::nvml or CUDA::nvml target)"
#endif
#include <nvml.h>
#endif

#include <array>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

namespace carve {

#if defined(CARVE_WITH_NVML)
/// Whether discover_topology() counts NVLinks with NVML (true when built with CARVE_WITH_NVML).
inline constexpr bool nvml_link_counts = true;
#else
inline constexpr bool nvml_link_counts = false;
#endif

namespace detail {

inline void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw Exception(Errc::device_error,
                    std::string("carve::discover_topology: ") + what + ": " + cudaGetErrorString(e));
  }
}

#if defined(CARVE_WITH_NVML)
// A PCI address as numbers, so that CUDA's "0000:07:00.0" and NVML's "00000000:07:00.0" compare.
using PciAddress = std::array<unsigned, 4>;

inline PciAddress pci_address(const char* bus_id) {
  PciAddress a{};
  if (std::sscanf(bus_id, "%x:%x:%x.%x", &a[0], &a[1], &a[2], &a[3]) != 4) {
    return PciAddress{~0u, ~0u, ~0u, ~0u};
  }
  return a;
}

// For each GPU, the far end of each active NVLink: a GPU ordinal, or nvlink_to_switch.
inline std::vector<std::vector<int>> nvml_far_ends(const std::vector<PciAddress>& gpus) {
  const std::size_t n = gpus.size();
  std::vector<std::vector<int>> far_ends(n);
  if (nvmlInit() != NVML_SUCCESS) {
    throw Exception(Errc::device_error, "carve::discover_topology: nvmlInit failed");
  }
  for (std::size_t i = 0; i < n; ++i) {
    char bus_id[32];
    std::snprintf(bus_id, sizeof bus_id, "%08x:%02x:%02x.%x", gpus[i][0], gpus[i][1], gpus[i][2], gpus[i][3]);
    nvmlDevice_t device;
    if (nvmlDeviceGetHandleByPciBusId(bus_id, &device) != NVML_SUCCESS) {
      continue; // its links count as none
    }
    for (unsigned link = 0; link < NVML_NVLINK_MAX_LINKS; ++link) {
      nvmlEnableState_t active;
      nvmlPciInfo_t remote;
      if (nvmlDeviceGetNvLinkState(device, link, &active) != NVML_SUCCESS || active != NVML_FEATURE_ENABLED ||
          nvmlDeviceGetNvLinkRemotePciInfo(device, link, &remote) != NVML_SUCCESS) {
        continue;
      }
      const PciAddress peer = pci_address(remote.busId);
      int end = nvlink_to_switch;
      for (std::size_t j = 0; j < n; ++j) {
        if (j != i && gpus[j] == peer) {
          end = static_cast<int>(j);
        }
      }
      far_ends[i].push_back(end);
    }
  }
  nvmlShutdown();
  return far_ends;
}
#endif

} // namespace detail

/// The GPUs of this machine, numbered as CUDA numbers them, and their links, asked of the CUDA
/// runtime (and NVML); throws as described above.
inline Topology discover_topology(LinkBandwidths bw = {}, PathOptions options = {}) {
  using detail::cuda_check;
  int count = 0;
  cuda_check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  if (count == 0) {
    throw Exception(Errc::device_error, "carve::discover_topology: no CUDA device");
  }
  GpuLinkTable links(count);
  for (int a = 0; a < count; ++a) {
    for (int b = a + 1; b < count; ++b) {
      int access = 0;
      int rank = 0;
      int atomics = 0;
      cuda_check(cudaDeviceCanAccessPeer(&access, a, b), "cudaDeviceCanAccessPeer");
      if (access != 0) {
        cuda_check(cudaDeviceGetP2PAttribute(&rank, cudaDevP2PAttrPerformanceRank, a, b), "cudaDeviceGetP2PAttribute");
        cuda_check(cudaDeviceGetP2PAttribute(&atomics, cudaDevP2PAttrNativeAtomicSupported, a, b),
                   "cudaDeviceGetP2PAttribute");
      }
      links.pair(a, b) = GpuPairLinks{access != 0, atomics != 0, rank, std::nullopt};
    }
  }
#if defined(CARVE_WITH_NVML)
  std::vector<detail::PciAddress> pci(static_cast<std::size_t>(count)); // how NVML names the same GPUs
  for (int d = 0; d < count; ++d) {
    char bus_id[32];
    cuda_check(cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, d), "cudaDeviceGetPCIBusId");
    pci[static_cast<std::size_t>(d)] = detail::pci_address(bus_id);
  }
  links.set_nvlinks(count_nvlinks(detail::nvml_far_ends(pci)));
#endif
  return topology_from_gpu_links(links, bw, options);
}

} // namespace carve
#endif
