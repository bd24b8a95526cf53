// carve/topology/cuda_discovery.hpp — the Topology of the GPUs in this machine, asked of the CUDA
// runtime (and of NVML, when enabled).
//
//   carve::Topology topo = carve::discover_topology();   // GPU ordinals as CUDA numbers them
//
// Needs the CUDA runtime: declared only where <cuda_runtime_api.h> is on the include path
// (nvcc, or a target linked to CUDA::cudart), so <carve/carve.hpp> still compiles without it.
//
// What each GPU pair becomes:
// - with NVML (define CARVE_WITH_NVML and link NVML, e.g. CUDA::nvml): one nvlink link per
//   active NVLink between the two; links into NVSwitches count for every pair of GPUs behind
//   them, as min(links of one GPU, links of the other), which is what nvidia-smi reports (NV12
//   on a DGX A100);
// - otherwise, from the CUDA runtime alone: peer access with native atomics (the mark of an
//   NVLink connection) becomes one nvlink link, since the runtime does not count links; peer
//   access without atomics a pcie link; no peer access a system link.
// Each link's label keeps the runtime's P2P performance rank ("NV2 rank 0"). Throws
// std::runtime_error when there is no CUDA device or a query fails.
#pragma once

#if __has_include(<cuda_runtime_api.h>)
#include <carve/topology/topology.hpp>

#include <cuda_runtime_api.h>

#if defined(CARVE_WITH_NVML) && __has_include(<nvml.h>)
#include <nvml.h>
#endif

#include <array>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

namespace carve {
namespace detail {

inline void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw std::runtime_error(std::string("carve::discover_topology: ") + what + ": " + cudaGetErrorString(e));
  }
}

// A PCI address as numbers, so that CUDA's "0000:07:00.0" and NVML's "00000000:07:00.0" compare.
using PciAddress = std::array<unsigned, 4>;

inline PciAddress pci_address(const char* bus_id) {
  PciAddress a{};
  if (std::sscanf(bus_id, "%x:%x:%x.%x", &a[0], &a[1], &a[2], &a[3]) != 4) {
    return PciAddress{~0u, ~0u, ~0u, ~0u};
  }
  return a;
}

#if defined(CARVE_WITH_NVML) && __has_include(<nvml.h>)
// links[i][j]: active NVLinks from GPU i to GPU j, direct or (min of the two) through NVSwitches.
inline std::vector<std::vector<int>> nvml_link_counts(const std::vector<PciAddress>& gpus) {
  const std::size_t n = gpus.size();
  std::vector<std::vector<int>> links(n, std::vector<int>(n, 0));
  if (nvmlInit() != NVML_SUCCESS) {
    throw std::runtime_error("carve::discover_topology: nvmlInit failed");
  }
  std::vector<int> to_switches(n, 0);
  for (std::size_t i = 0; i < n; ++i) {
    char bus_id[32];
    std::snprintf(bus_id, sizeof bus_id, "%08x:%02x:%02x.%x", gpus[i][0], gpus[i][1], gpus[i][2], gpus[i][3]);
    nvmlDevice_t device;
    if (nvmlDeviceGetHandleByPciBusId(bus_id, &device) != NVML_SUCCESS) {
      continue;
    }
    for (unsigned link = 0; link < NVML_NVLINK_MAX_LINKS; ++link) {
      nvmlEnableState_t active;
      nvmlPciInfo_t remote;
      if (nvmlDeviceGetNvLinkState(device, link, &active) != NVML_SUCCESS || active != NVML_FEATURE_ENABLED ||
          nvmlDeviceGetNvLinkRemotePciInfo(device, link, &remote) != NVML_SUCCESS) {
        continue;
      }
      const PciAddress peer = pci_address(remote.busId);
      bool gpu = false;
      for (std::size_t j = 0; j < n; ++j) {
        if (gpus[j] == peer) {
          ++links[i][j];
          gpu = true;
        }
      }
      to_switches[i] += gpu ? 0 : 1;
    }
  }
  nvmlShutdown();
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = 0; j < n; ++j) {
      if (i != j) {
        links[i][j] += to_switches[i] < to_switches[j] ? to_switches[i] : to_switches[j];
      }
    }
  }
  return links;
}
#endif

} // namespace detail

inline Topology discover_topology(LinkBandwidths bw = {}, PathOptions options = {}) {
  using detail::cuda_check;
  int count = 0;
  cuda_check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  if (count == 0) {
    throw std::runtime_error("carve::discover_topology: no CUDA device");
  }
  const auto n = static_cast<std::size_t>(count);
  std::vector<detail::PciAddress> pci(n);
  TopologyBuilder builder(bw);
  for (int d = 0; d < count; ++d) {
    char bus_id[32];
    cuda_check(cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, d), "cudaDeviceGetPCIBusId");
    pci[static_cast<std::size_t>(d)] = detail::pci_address(bus_id);
    builder.add_gpu("GPU" + std::to_string(d), d);
  }
#if defined(CARVE_WITH_NVML) && __has_include(<nvml.h>)
  const std::vector<std::vector<int>> nvlinks = detail::nvml_link_counts(pci);
#endif
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
      int links = access != 0 && atomics != 0 ? 1 : 0;
#if defined(CARVE_WITH_NVML) && __has_include(<nvml.h>)
      links = nvlinks[static_cast<std::size_t>(a)][static_cast<std::size_t>(b)];
#endif
      const NodeId x{static_cast<std::uint32_t>(a)};
      const NodeId y{static_cast<std::uint32_t>(b)};
      const std::string rank_label = " rank " + std::to_string(rank);
      if (links > 0) {
        builder.add_link(x, y, LinkType::nvlink, links, std::nullopt, "NV" + std::to_string(links) + rank_label);
      } else if (access != 0) {
        builder.add_link(x, y, LinkType::pcie, 1, std::nullopt, "PCIe peer" + rank_label);
      } else {
        builder.add_link(x, y, LinkType::system, 1, std::nullopt, "no peer access");
      }
    }
  }
  return builder.build(options);
}

} // namespace carve
#endif
