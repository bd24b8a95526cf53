/// @file carve/topology/topology.hpp
/// A machine's cards and links, with the best path between any two.
///
/// @code
/// auto topo = carve::Topology::from_nvidia_smi(text);          // or TopologyBuilder, or
/// double gbps = topo.path_bandwidth(topo.gpu(0), topo.gpu(7));  // from_description(text)
/// @endcode
///
/// A path's bandwidth is that of its narrowest link. Between two nodes the widest path wins, and
/// among equally wide paths the one with fewer links. Paths have at most PathOptions::max_hops
/// links (default 2: one intermediate, like NCCL's NVLink-through-a-GPU paths).
///
/// What may relay traffic: CPUs, PCIe switches and NVSwitches relay anything; a NIC never does;
/// a GPU, by default (GpuRelay::nvlink_only), only from NVLink to NVLink. Why: a GPU's PCIe port
/// is an end point, not a switch. A PCIe transfer addressed to GPU3 ends in GPU3's memory; no
/// hardware forwards it onto GPU3's NVLinks. Traffic "through" a GPU is the GPU's copy engines
/// copying out of its own memory again: NCCL does that only from NVLink to NVLink (its
/// NVLink-through-an-intermediate-GPU paths), where both legs are many times wider than PCIe.
/// So a path such as CPU0-GPU3-GPU0 is not a path here by default: CPU0 reaches GPU0 over its
/// own PCIe path. GpuRelay::any_link lets a GPU relay between any two of its links (a store-and-
/// forward through the relay's memory), for users who do stage copies that way. Both describe
/// copies. A kernel that dereferences a peer's memory uses no relay at all (GpuRelay::never): its
/// loads go over the direct link, or over PCIe through switches and CPUs, never through a third
/// GPU, so a pointer borrowed from a card two NVLink hops away is only as fast as the direct path.
///
/// Every pair is computed once when the topology is built (O(nodes x links x layers), where the
/// layers stop once no path widens), so queries are table look-ups.
/// Host-only code: bad input throws carve::Exception (invalid_argument from the builder, from the
/// readers with the line).
#pragma once

#include <carve/core/error.hpp>
#include <carve/topology/graph.hpp>
#include <carve/topology/parse_error.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

namespace carve {

/// Which links a GPU passes traffic between (see the top of this header).
enum class GpuRelay : std::uint8_t {
  nvlink_only, ///< NVLink in, NVLink out (the default; what NCCL does)
  any_link,    ///< any link in, any link out, e.g. CPU0 -> GPU3 -> GPU0 over PCIe then NVLink
  /// Nothing: the paths a GPU's own loads and stores to another GPU's memory take (peer access).
  /// A GPU does not forward another GPU's memory traffic; only copies staged through it relay.
  never,
};

/// Which paths a Topology considers.
struct PathOptions {
  int max_hops = 2;                           ///< links on a path, >= 1; longer indirect paths need a larger value
  GpuRelay gpu_relay = GpuRelay::nvlink_only; ///< what a GPU may relay
};

class TopologyBuilder;

/// A machine's nodes and links, and the best path between every two nodes. Immutable once
/// built, so threads may share one.
class Topology {
public:
  /// Reads the matrix printed by `nvidia-smi topo -m` (see carve/topology/nvidia_smi.hpp).
  static Topology from_nvidia_smi(std::string_view text, LinkBandwidths bw = {});
  /// The same with path options.
  static Topology from_nvidia_smi(std::string_view text, LinkBandwidths bw, PathOptions options);
  /// Reads carve's small machine description (see carve/topology/description.hpp).
  static Topology from_description(std::string_view text);

  /// GB/s over the best path; 0 when no path of at most max_hops links exists; +infinity from a
  /// node to itself (local memory is not a link).
  double path_bandwidth(NodeId from, NodeId to) const { return pair(from, to).bandwidth; }
  /// Links on that path: 0 from a node to itself, -1 when there is no path.
  int hops(NodeId from, NodeId to) const { return pair(from, to).hops; }
  /// The nodes along that path, `from` first and `to` last; empty when there is none.
  std::span<const NodeId> path(NodeId from, NodeId to) const {
    const Pair& p = pair(from, to);
    return std::span<const NodeId>(path_nodes_).subspan(p.path_offset, p.path_length);
  }

  /// The node of the GPU with this CUDA ordinal. Throws carve::Exception (out_of_range) for an
  /// unknown one.
  NodeId gpu(int ordinal) const {
    if (ordinal < 0 || static_cast<std::size_t>(ordinal) >= gpus_.size() || !gpus_[static_cast<std::size_t>(ordinal)]) {
      throw Exception(Errc::out_of_range, "carve::Topology: no GPU with ordinal " + std::to_string(ordinal));
    }
    return *gpus_[static_cast<std::size_t>(ordinal)];
  }
  /// Ordinals run from 0 to gpu_count() - 1 without gaps (the builder checks).
  int gpu_count() const noexcept { return static_cast<int>(gpus_.size()); }

  /// Nodes in the machine.
  std::size_t node_count() const noexcept { return nodes_.size(); }
  /// A node. Throws carve::Exception (out_of_range) for an id that names no node.
  const Node& node(NodeId id) const {
    if (id.value >= nodes_.size()) {
      throw Exception(Errc::out_of_range, "carve::Topology: no node with id " + std::to_string(id.value) +
                                              " (the machine has " + std::to_string(nodes_.size()) + ")");
    }
    return nodes_[id.value];
  }
  /// Every node, indexed by NodeId::value.
  std::span<const Node> nodes() const noexcept { return nodes_; }
  /// Every link.
  std::span<const Link> links() const noexcept { return links_; }
  /// The node called `name` ("GPU0", "CPU1", ...), or nullopt.
  std::optional<NodeId> find(std::string_view name) const {
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
      if (nodes_[i].name == name) {
        return NodeId{static_cast<std::uint32_t>(i)};
      }
    }
    return std::nullopt;
  }

  /// The bandwidths links were given by default.
  const LinkBandwidths& bandwidths() const noexcept { return bandwidths_; }
  /// The path options in force.
  const PathOptions& options() const noexcept { return options_; }

  /// The same machine with another path length limit, or other path options (all pairs are
  /// recomputed).
  Topology with_max_hops(int max_hops) const {
    PathOptions o = options_;
    o.max_hops = max_hops;
    return with_options(o);
  }
  /// The same machine with other path options (all pairs are recomputed).
  Topology with_options(PathOptions options) const {
    Topology t = *this;
    t.options_ = options;
    t.compute_paths();
    return t;
  }

private:
  friend class TopologyBuilder;

  struct Pair {
    double bandwidth = 0.0;
    int hops = -1;
    std::uint32_t path_offset = 0;
    std::uint32_t path_length = 0;
  };

  Topology() = default;

  const Pair& pair(NodeId from, NodeId to) const {
    const std::size_t n = nodes_.size();
    if (from.value >= n || to.value >= n) {
      throw Exception(Errc::out_of_range, "carve::Topology: node id out of range");
    }
    return pairs_[std::size_t{from.value} * n + to.value];
  }

  /// Whether traffic that arrived at `via` (over NVLink or not) may leave over `out`.
  bool relays(NodeId via, bool arrived_by_nvlink, LinkType out) const {
    switch (nodes_[via.value].kind) {
    case NodeKind::cpu:
    case NodeKind::pcie_switch:
    case NodeKind::nvswitch:
      return true;
    case NodeKind::gpu:
      return options_.gpu_relay == GpuRelay::any_link ||
             (options_.gpu_relay == GpuRelay::nvlink_only && arrived_by_nvlink && out == LinkType::nvlink);
    case NodeKind::nic:
      return false;
    }
    return false;
  }

  /// Widest path per source by hop count: layer h holds, for every (node, how it was reached)
  /// state, the widest walk of exactly h links. Allowing walks (not just simple paths) loses
  /// nothing: cutting a cycle out of a walk keeps every relay legal (a GPU relays NVLink to
  /// NVLink on both visits, so also across the cut; with GpuRelay::any_link it relays anything)
  /// and never narrows it, so the widest walk with the fewest links is a simple path. A layer that widens nothing ends
  /// the search early, so a large max_hops costs only as many layers as the machine needs.
  void compute_paths() {
    if (options_.max_hops < 1) {
      throw Exception(Errc::invalid_argument, "carve::Topology: max_hops must be at least 1");
    }
    const std::size_t n = nodes_.size();
    const std::size_t states = 3 * n; // state = node * 3 + arrival (0 start, 1 other link, 2 NVLink)
    constexpr std::uint32_t none = std::numeric_limits<std::uint32_t>::max();
    struct Step {
      double width = 0.0;
      std::uint32_t from = none; ///< previous state
    };
    pairs_.assign(n * n, Pair{});
    path_nodes_.clear();
    std::vector<std::vector<Step>> layers;
    std::vector<Pair> best(n);
    std::vector<std::uint32_t> best_state(n);
    std::vector<NodeId> walk;
    for (std::size_t s = 0; s < n; ++s) {
      layers.assign(1, std::vector<Step>(states));
      layers[0][3 * s] = Step{std::numeric_limits<double>::infinity(), none};
      std::fill(best.begin(), best.end(), Pair{});
      best[s] = Pair{std::numeric_limits<double>::infinity(), 0, 0, 0};
      best_state[s] = static_cast<std::uint32_t>(3 * s);
      std::vector<double> widest(states, 0.0); // over all layers so far, per state
      widest[3 * s] = std::numeric_limits<double>::infinity();
      for (int h = 1; h <= options_.max_hops; ++h) {
        std::vector<Step> next(states);
        const std::vector<Step>& prev = layers.back();
        for (const Link& link : links_) {
          for (int dir = 0; dir < 2; ++dir) {
            const NodeId at = dir == 0 ? link.a : link.b;
            const NodeId to = dir == 0 ? link.b : link.a;
            for (std::uint32_t arrival = 0; arrival < 3; ++arrival) {
              const std::uint32_t from = static_cast<std::uint32_t>(3 * at.value) + arrival;
              if (prev[from].width <= 0.0 || (arrival != 0 && !relays(at, arrival == 2, link.type))) {
                continue;
              }
              const double w = std::min(prev[from].width, link.bandwidth());
              const std::uint32_t into = 3 * to.value + (link.type == LinkType::nvlink ? 2u : 1u);
              if (w > next[into].width) {
                next[into] = Step{w, from};
              }
            }
          }
        }
        bool widened = false;
        for (std::size_t st = 0; st < states; ++st) {
          if (next[st].width > widest[st]) {
            widest[st] = next[st].width;
            widened = true;
          }
          const std::size_t node = st / 3;
          if (next[st].width > best[node].bandwidth) { // strictly wider only: earlier layers had fewer links
            best[node] = Pair{next[st].width, h, 0, 0};
            best_state[node] = static_cast<std::uint32_t>(st);
          }
        }
        layers.push_back(std::move(next));
        if (!widened) {
          break;
        }
      }
      for (std::size_t t = 0; t < n; ++t) {
        Pair p = best[t];
        if (p.hops >= 0) {
          walk.clear();
          std::uint32_t st = best_state[t];
          for (int h = p.hops; h >= 0; --h) {
            walk.push_back(NodeId{st / 3});
            st = layers[static_cast<std::size_t>(h)][st].from;
          }
          p.path_offset = static_cast<std::uint32_t>(path_nodes_.size());
          p.path_length = static_cast<std::uint32_t>(walk.size());
          path_nodes_.insert(path_nodes_.end(), walk.rbegin(), walk.rend());
        }
        pairs_[s * n + t] = p;
      }
    }
  }

  std::vector<Node> nodes_;
  std::vector<Link> links_;
  std::vector<std::optional<NodeId>> gpus_; ///< by ordinal
  LinkBandwidths bandwidths_;
  PathOptions options_;
  std::vector<Pair> pairs_; ///< n x n, row = from
  std::vector<NodeId> path_nodes_;
};

/// Builds a Topology node by node and link by link. Every mistake throws carve::Exception and
/// leaves the builder unchanged: out_of_range for a node id it did not hand out, invalid_argument
/// for the rest (a duplicate name or ordinal, a non-positive bandwidth or count, a link from a node
/// to itself, more than max_nodes nodes or max_links links).
class TopologyBuilder {
public:
  /// The most nodes a topology holds: it keeps a path for every pair (24 MiB at this many), and a
  /// machine, even a rack of 72 GPUs with its switches, NICs and sockets, has a few hundred.
  static constexpr std::size_t max_nodes = 1024;
  /// The most distinct links (each a pair and a type; parallel ones count once): path search is
  /// nodes x links per layer.
  static constexpr std::size_t max_links = 16384;

  /// No nodes yet; links without an explicit bandwidth get `bw`'s figure for their type.
  explicit TopologyBuilder(LinkBandwidths bw = {}) : bandwidths_(bw) {
    check_bandwidth(bw.nvlink);
    check_bandwidth(bw.pcie);
    check_bandwidth(bw.inter_socket);
  }

  /// A GPU gets the next free ordinal unless one is given.
  NodeId add_gpu(std::string name, int ordinal = -1) {
    if (ordinal < 0) {
      ordinal = 0;
      while (ordinal_taken(ordinal)) {
        ++ordinal;
      }
    } else if (ordinal_taken(ordinal)) {
      throw Exception(Errc::invalid_argument,
                      "carve::TopologyBuilder: GPU ordinal " + std::to_string(ordinal) + " used twice");
    }
    const NodeId id = add_node(NodeKind::gpu, std::move(name));
    nodes_.back().ordinal = ordinal;
    return id;
  }
  /// A CPU socket.
  NodeId add_cpu(std::string name) { return add(NodeKind::cpu, std::move(name)); }
  /// A PCIe switch or host bridge.
  NodeId add_pcie_switch(std::string name) { return add(NodeKind::pcie_switch, std::move(name)); }
  /// An NVSwitch.
  NodeId add_nvswitch(std::string name) { return add(NodeKind::nvswitch, std::move(name)); }
  /// A network card.
  NodeId add_nic(std::string name) { return add(NodeKind::nic, std::move(name)); }
  /// A node of any kind (a GPU gets the next free ordinal).
  NodeId add(NodeKind kind, std::string name) {
    if (kind == NodeKind::gpu) {
      return add_gpu(std::move(name));
    }
    return add_node(kind, std::move(name));
  }

  /// `count` parallel links of `type`, each `per_link_gbps` wide (default: the LinkBandwidths
  /// figure for the type). Links of one type between the same two nodes are one link whose
  /// bandwidth is their sum, however many lines they were given in: two NVLinks are twice as
  /// wide as one whether written `x2` or twice.
  void add_link(NodeId a, NodeId b, LinkType type, int count = 1, std::optional<double> per_link_gbps = {},
                std::string label = {}) {
    check_node(a);
    check_node(b);
    if (a == b) {
      throw Exception(Errc::invalid_argument,
                      "carve::TopologyBuilder: link from " + nodes_[a.value].name + " to itself");
    }
    if (count < 1) {
      throw Exception(Errc::invalid_argument, "carve::TopologyBuilder: link count must be at least 1");
    }
    const double per_link = per_link_gbps ? *per_link_gbps : bandwidths_.of(type);
    check_bandwidth(per_link);
    if (label.empty()) {
      label = std::string(to_string(type));
    }
    const auto key = std::tuple(std::min(a.value, b.value), std::max(a.value, b.value), type);
    if (const auto found = link_of_.find(key); found != link_of_.end()) {
      Link& l = links_[found->second];
      if (l.per_link_gbps == per_link) {
        if (count > std::numeric_limits<int>::max() - l.count) {
          throw Exception(Errc::invalid_argument, "carve::TopologyBuilder: more than 2^31 - 1 links between " +
                                                      nodes_[a.value].name + " and " + nodes_[b.value].name);
        }
        l.count += count;
      } else { // links of different widths: one link as wide as all of them
        l.per_link_gbps = l.bandwidth() + per_link * count;
        l.count = 1;
      }
      l.label += "+" + label;
      return;
    }
    if (links_.size() == max_links) {
      throw Exception(Errc::invalid_argument,
                      "carve::TopologyBuilder: more than " + std::to_string(max_links) + " distinct links");
    }
    links_.push_back(Link{a, b, type, count, per_link, std::move(label)});
    try {
      link_of_.emplace(key, links_.size() - 1);
    } catch (...) {
      links_.pop_back(); // the builder is left as it was
      throw;
    }
  }

  /// A node added so far, to fill in details (NUMA node, CPU affinity); throws carve::Exception
  /// (out_of_range) for an unknown id.
  Node& node(NodeId id) {
    check_node(id);
    return nodes_[id.value];
  }
  /// The node called `name`, or nullopt.
  std::optional<NodeId> find(std::string_view name) const {
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
      if (nodes_[i].name == name) {
        return NodeId{static_cast<std::uint32_t>(i)};
      }
    }
    return std::nullopt;
  }
  /// Nodes added so far.
  std::size_t node_count() const noexcept { return nodes_.size(); }
  /// The default link bandwidths.
  const LinkBandwidths& bandwidths() const noexcept { return bandwidths_; }

  /// Computes every pair's best path. GPU ordinals must run 0..count-1 without gaps.
  Topology build(PathOptions options = {}) const {
    Topology t;
    t.nodes_ = nodes_;
    t.links_ = links_;
    t.bandwidths_ = bandwidths_;
    t.options_ = options;
    // Ordinals must be 0..gpus-1: one past that leaves a gap below it, found by the check after
    // (so a hostile ordinal of 10^9 costs nothing).
    const auto gpus = static_cast<std::size_t>(
        std::count_if(nodes_.begin(), nodes_.end(), [](const Node& n) { return n.kind == NodeKind::gpu; }));
    t.gpus_.resize(gpus);
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
      const auto ordinal = static_cast<std::size_t>(nodes_[i].ordinal);
      if (nodes_[i].kind == NodeKind::gpu && ordinal < gpus) {
        t.gpus_[ordinal] = NodeId{static_cast<std::uint32_t>(i)};
      }
    }
    for (std::size_t o = 0; o < t.gpus_.size(); ++o) {
      if (!t.gpus_[o]) {
        throw Exception(Errc::invalid_argument,
                        "carve::TopologyBuilder: GPU ordinals have a gap at " + std::to_string(o));
      }
    }
    t.compute_paths();
    return t;
  }

private:
  NodeId add_node(NodeKind kind, std::string name) {
    if (name.empty()) {
      throw Exception(Errc::invalid_argument, "carve::TopologyBuilder: a node needs a name");
    }
    if (find(name)) {
      throw Exception(Errc::invalid_argument, "carve::TopologyBuilder: node name " + name + " used twice");
    }
    if (nodes_.size() == max_nodes) {
      throw Exception(Errc::invalid_argument,
                      "carve::TopologyBuilder: more than " + std::to_string(max_nodes) + " nodes");
    }
    nodes_.push_back(Node{kind, std::move(name), -1, std::nullopt, {}});
    return NodeId{static_cast<std::uint32_t>(nodes_.size() - 1)};
  }
  bool ordinal_taken(int ordinal) const {
    for (const Node& n : nodes_) {
      if (n.kind == NodeKind::gpu && n.ordinal == ordinal) {
        return true;
      }
    }
    return false;
  }
  void check_node(NodeId id) const {
    if (id.value >= nodes_.size()) {
      throw Exception(Errc::out_of_range, "carve::TopologyBuilder: unknown node id " + std::to_string(id.value));
    }
  }
  static void check_bandwidth(double gbps) {
    if (!(gbps > 0.0) || !std::isfinite(gbps)) {
      throw Exception(Errc::invalid_argument,
                      "carve::TopologyBuilder: a bandwidth must be a positive finite number of GB/s");
    }
  }

  LinkBandwidths bandwidths_;
  std::vector<Node> nodes_;
  std::vector<Link> links_;
  std::map<std::tuple<std::uint32_t, std::uint32_t, LinkType>, std::size_t> link_of_; // (lower, higher, type): index
};

} // namespace carve

// The readers define Topology::from_nvidia_smi and Topology::from_description.
#include <carve/topology/description.hpp>
#include <carve/topology/nvidia_smi.hpp>
