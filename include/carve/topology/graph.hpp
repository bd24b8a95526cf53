/// @file carve/topology/graph.hpp
/// The parts of a machine graph: nodes, links and link bandwidths.
///
/// A node is a processor card (CPU socket, GPU) or a piece of fabric (PCIe switch or host
/// bridge, NVSwitch, NIC). A link joins two nodes; `count` parallel links of one kind add up, so
/// "NV2" is one Link of type nvlink with count 2. Bandwidths are GB/s in one direction.
#pragma once

#include <compare>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace carve {

/// Index of a node in its Topology. A distinct type, so that a GPU ordinal (what CUDA calls a
/// device) is never mistaken for a node index: Topology::gpu(ordinal) converts.
struct NodeId {
  std::uint32_t value = 0; ///< the index
  /// Equal at the same index.
  // Written out rather than defaulted: nvcc's host pass rejects the implicit operator==.
  friend constexpr bool operator==(NodeId a, NodeId b) noexcept { return a.value == b.value; }
  /// By index.
  friend constexpr auto operator<=>(NodeId a, NodeId b) noexcept { return a.value <=> b.value; }
};

/// What a node is.
enum class NodeKind : std::uint8_t {
  cpu,         ///< a CPU socket (NUMA node)
  gpu,         ///< a GPU card
  pcie_switch, ///< a PCIe switch or host bridge
  nvswitch,    ///< an NVSwitch
  nic,         ///< a network card: an end point, never a relay
};

/// What kind of connection a link is.
enum class LinkType : std::uint8_t {
  nvlink,       ///< NVLink, GPU-GPU or GPU-NVSwitch; `count` bonded links
  pcie,         ///< a PCIe path; in an nvidia-smi matrix one of PIX, PXB, PHB, NODE
  system,       ///< a PCIe path that also crosses the inter-socket link (nvidia-smi SYS / SOC)
  inter_socket, ///< QPI / UPI / Infinity Fabric between CPU sockets
};

/// The enumerator's name ("cpu", "gpu", "pcie_switch", ...).
constexpr std::string_view to_string(NodeKind k) noexcept {
  switch (k) {
  case NodeKind::cpu:
    return "cpu";
  case NodeKind::gpu:
    return "gpu";
  case NodeKind::pcie_switch:
    return "pcie_switch";
  case NodeKind::nvswitch:
    return "nvswitch";
  case NodeKind::nic:
    return "nic";
  }
  return "unknown";
}

/// The enumerator's name ("nvlink", "pcie", "system", "inter_socket").
constexpr std::string_view to_string(LinkType t) noexcept {
  switch (t) {
  case LinkType::nvlink:
    return "nvlink";
  case LinkType::pcie:
    return "pcie";
  case LinkType::system:
    return "system";
  case LinkType::inter_socket:
    return "inter_socket";
  }
  return "unknown";
}

/// GB/s of one link of each kind, used wherever a link's bandwidth is not given explicitly.
/// The defaults are the figures NCCL uses: 20 GB/s per NVLink (V100/A100 generation), 24 GB/s
/// for a PCIe Gen4 x16 path, 10 GB/s for the inter-socket link.
struct LinkBandwidths {
  double nvlink = 20.0;       ///< one NVLink
  double pcie = 24.0;         ///< a PCIe path
  double inter_socket = 10.0; ///< the link between CPU sockets

  /// One link of `type`. A `system` path crosses PCIe and the inter-socket link, so it is as
  /// wide as the narrower of the two.
  constexpr double of(LinkType type) const noexcept {
    switch (type) {
    case LinkType::nvlink:
      return nvlink;
    case LinkType::pcie:
      return pcie;
    case LinkType::system:
      return pcie < inter_socket ? pcie : inter_socket;
    case LinkType::inter_socket:
      return inter_socket;
    }
    return 0.0;
  }
};

/// A node of the machine graph.
struct Node {
  NodeKind kind = NodeKind::gpu; ///< what it is
  std::string name;              ///< "GPU0", "CPU1", "mlx5_0", ...
  int ordinal = -1;              ///< CUDA ordinal for a GPU, -1 for other nodes
  std::optional<int> numa_node;  ///< from nvidia-smi's "NUMA Affinity" column, when known
  std::string cpu_affinity;      ///< from nvidia-smi's "CPU Affinity" column, e.g. "0-11,24-35"
};

/// A connection between two nodes, in both directions.
struct Link {
  NodeId a;                       ///< one end
  NodeId b;                       ///< the other end
  LinkType type = LinkType::pcie; ///< what kind of connection
  int count = 1;                  ///< parallel links; their bandwidths add
  double per_link_gbps = 0.0;     ///< bandwidth of one of them
  std::string label;              ///< how the source named it: "NV2", "PIX", "SYS", ...

  /// GB/s of all the parallel links together.
  constexpr double bandwidth() const noexcept { return per_link_gbps * count; }
};

} // namespace carve
