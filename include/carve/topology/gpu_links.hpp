/// @file carve/topology/gpu_links.hpp
/// A Topology from what the CUDA runtime and NVML say about each
/// pair of GPUs, as plain data (no CUDA needed: discover_topology() fills it in on a machine with
/// GPUs, tests fill it in by hand).
///
/// @code
/// carve::GpuLinkTable links(8);
/// links.pair(0, 3) = {.peer_access = true, .native_atomics = true, .nvlinks = 2};
/// carve::Topology t = carve::topology_from_gpu_links(links);   // GPU0-GPU3: NV2, 40 GB/s
/// @endcode
///
/// What each pair becomes (one direct link, as in an nvidia-smi matrix):
/// - `nvlinks` known and > 0 (NVML counted them): an nvlink link of that count ("NV2");
/// - `nvlinks` unknown (no NVML): peer access with native atomics, the mark of an NVLink
///   connection, becomes one nvlink link, since the CUDA runtime does not count links; so NV2,
///   NV12 or NV18 pairs are undercounted as NV1 without NVML;
/// - otherwise peer access makes a `pcie` link, and no peer access a `system` link (the pair
///   talks through host memory, as across sockets).
/// Each link's label keeps the runtime's P2P performance rank: "NV2 rank 0", "PCIe peer rank 1".
///
/// NVLink counts come from count_nvlinks(): for each GPU, the far end of each of its active
/// NVLinks (another GPU, or not a GPU: an NVSwitch). A pair's count is the links joining the two
/// directly, as both ends report them, plus, when both reach NVSwitches, the smaller of their
/// NVSwitch link counts (what nvidia-smi prints: NV12 on a DGX A100, NV18 on an HGX H100).
#pragma once

#include <carve/core/error.hpp>
#include <carve/topology/topology.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace carve {

/// What is known about one pair of GPUs.
struct GpuPairLinks {
  bool peer_access = false;     ///< cudaDeviceCanAccessPeer, either way round
  bool native_atomics = false;  ///< cudaDevP2PAttrNativeAtomicSupported
  int performance_rank = 0;     ///< cudaDevP2PAttrPerformanceRank (0 is the best link)
  std::optional<int> nvlinks{}; ///< active NVLinks between the two (NVML); nullopt when not counted
};

/// Every pair of `gpu_count` GPUs, by CUDA ordinal; pair(a, b) and pair(b, a) are the same entry.
class GpuLinkTable {
public:
  /// Every pair unknown (no peer access, no NVLink counts). Throws carve::Exception
  /// (invalid_argument) for fewer than one GPU.
  explicit GpuLinkTable(int gpu_count) : n_(gpu_count) {
    if (gpu_count < 1) {
      throw Exception(Errc::invalid_argument, "carve::GpuLinkTable: at least one GPU");
    }
    pairs_.resize(static_cast<std::size_t>(n_) * static_cast<std::size_t>(n_));
  }

  /// GPUs in the table.
  int gpu_count() const noexcept { return n_; }

  /// The entry of GPUs a and b. Throws carve::Exception (out_of_range) for an unknown ordinal or
  /// a GPU paired with itself.
  GpuPairLinks& pair(int a, int b) { return pairs_[index(a, b)]; }
  /// The entry of GPUs a and b, read-only; throws as the other overload.
  const GpuPairLinks& pair(int a, int b) const { return pairs_[index(a, b)]; }

  /// Sets every pair's NVLink count from a matrix such as count_nvlinks() returns.
  void set_nvlinks(const std::vector<std::vector<int>>& counts) {
    if (counts.size() != static_cast<std::size_t>(n_)) {
      throw Exception(Errc::invalid_argument, "carve::GpuLinkTable: NVLink counts for " +
                                                  std::to_string(counts.size()) + " GPUs, the table has " +
                                                  std::to_string(n_));
    }
    for (int a = 0; a < n_; ++a) {
      if (counts[static_cast<std::size_t>(a)].size() != static_cast<std::size_t>(n_)) {
        throw Exception(Errc::invalid_argument,
                        "carve::GpuLinkTable: NVLink count row " + std::to_string(a) + " is ragged");
      }
      for (int b = a + 1; b < n_; ++b) {
        pair(a, b).nvlinks = counts[static_cast<std::size_t>(a)][static_cast<std::size_t>(b)];
      }
    }
  }

private:
  std::size_t index(int a, int b) const {
    if (a < 0 || b < 0 || a >= n_ || b >= n_ || a == b) {
      throw Exception(Errc::out_of_range,
                      "carve::GpuLinkTable: no GPU pair (" + std::to_string(a) + ", " + std::to_string(b) + ")");
    }
    const int lo = std::min(a, b);
    const int hi = std::max(a, b);
    return static_cast<std::size_t>(lo) * static_cast<std::size_t>(n_) + static_cast<std::size_t>(hi);
  }

  int n_;
  std::vector<GpuPairLinks> pairs_;
};

/// The far end of one active NVLink of a GPU, as NVML reports it (nvmlDeviceGetNvLinkRemotePciInfo).
inline constexpr int nvlink_to_switch = -1; // not a GPU of this machine: an NVSwitch (or a bridge NVML cannot name)

/// `far_ends[g]` lists, for each active NVLink of GPU g, the ordinal of the GPU at its far end or
/// nvlink_to_switch. Returns the NVLink count of every pair (0 on the diagonal): the direct links
/// both ends report (the smaller of the two counts, should they disagree), plus, for two GPUs
/// that both reach NVSwitches, the smaller of their NVSwitch link counts. Throws
/// carve::Exception (invalid_argument) for an ordinal out of range or a GPU linked to itself.
inline std::vector<std::vector<int>> count_nvlinks(const std::vector<std::vector<int>>& far_ends) {
  const std::size_t n = far_ends.size();
  std::vector<std::vector<int>> direct(n, std::vector<int>(n, 0));
  std::vector<int> to_switches(n, 0);
  for (std::size_t g = 0; g < n; ++g) {
    for (const int end : far_ends[g]) {
      if (end == nvlink_to_switch) {
        ++to_switches[g];
      } else if (end < 0 || static_cast<std::size_t>(end) >= n || static_cast<std::size_t>(end) == g) {
        throw Exception(Errc::invalid_argument, "carve::count_nvlinks: GPU " + std::to_string(g) +
                                                    " has an NVLink to " + std::to_string(end) +
                                                    ", which is not another GPU of the " + std::to_string(n));
      } else {
        ++direct[g][static_cast<std::size_t>(end)];
      }
    }
  }
  std::vector<std::vector<int>> counts(n, std::vector<int>(n, 0));
  for (std::size_t a = 0; a < n; ++a) {
    for (std::size_t b = 0; b < n; ++b) {
      if (a != b) {
        counts[a][b] = std::min(direct[a][b], direct[b][a]) + std::min(to_switches[a], to_switches[b]);
      }
    }
  }
  return counts;
}

/// The Topology of the GPUs in `links`: one GPU node per ordinal ("GPU0", ...) and one link per
/// pair, as described at the top of this header.
inline Topology topology_from_gpu_links(const GpuLinkTable& links, LinkBandwidths bw = {}, PathOptions options = {}) {
  TopologyBuilder builder(bw);
  for (int g = 0; g < links.gpu_count(); ++g) {
    builder.add_gpu("GPU" + std::to_string(g), g);
  }
  for (int a = 0; a < links.gpu_count(); ++a) {
    for (int b = a + 1; b < links.gpu_count(); ++b) {
      const GpuPairLinks& p = links.pair(a, b);
      if (p.nvlinks && *p.nvlinks < 0) {
        throw Exception(Errc::invalid_argument, "carve::topology_from_gpu_links: GPU" + std::to_string(a) + "-GPU" +
                                                    std::to_string(b) + " has a negative NVLink count");
      }
      const int nvlinks = p.nvlinks ? *p.nvlinks : (p.peer_access && p.native_atomics ? 1 : 0);
      const NodeId x{static_cast<std::uint32_t>(a)};
      const NodeId y{static_cast<std::uint32_t>(b)};
      const std::string rank = " rank " + std::to_string(p.performance_rank);
      if (nvlinks > 0) {
        builder.add_link(x, y, LinkType::nvlink, nvlinks, std::nullopt, "NV" + std::to_string(nvlinks) + rank);
      } else if (p.peer_access) {
        builder.add_link(x, y, LinkType::pcie, 1, std::nullopt, "PCIe peer" + rank);
      } else {
        builder.add_link(x, y, LinkType::system, 1, std::nullopt, "no peer access");
      }
    }
  }
  return builder.build(options);
}

} // namespace carve
