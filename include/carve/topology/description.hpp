/// @file carve/topology/description.hpp
/// Topology::from_description: a machine written down by hand,
/// for machines without nvidia-smi (or boards that only exist on paper).
///
/// @code{.unparsed}
/// # a two-socket board, first socket      (everything after # is a comment)
/// bandwidth nvlink 25          # GB/s per link of a type (before the first node)
/// max_hops 3                   # links on a path (default 2)
/// gpu_relay any                # a GPU relays between any links (default: nvlink, NVLink to
///                              #   NVLink only; never: no relay; see carve/topology/topology.hpp)
/// cpu CPU0
/// pcie_switch PLX0             # also: nvswitch NAME, nic NAME
/// gpu GPU0                     # ordinal 0, the next free one; or: gpu NAME ordinal 4
/// link CPU0 PLX0 pcie 32       # link A B TYPE [xCOUNT] [GB/s per link]
/// link PLX0 GPU0 pcie
/// link GPU0 GPU1 nvlink x2
/// @endcode
///
/// Link types: nvlink, pcie, system (alias sys), inter_socket (aliases qpi, upi). Nodes must be
/// declared before their links. Lines linking the same two nodes with the same type add up. Any mistake throws
/// carve::Exception (parse_error.hpp) with its line.
#pragma once

#include <carve/topology/parse_error.hpp>
#include <carve/topology/text_lines.hpp>
#include <carve/topology/topology.hpp>

#include <charconv>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace carve {
namespace detail {

inline std::optional<LinkType> link_type_named(std::string_view word) {
  if (word == "nvlink") {
    return LinkType::nvlink;
  }
  if (word == "pcie") {
    return LinkType::pcie;
  }
  if (word == "system" || word == "sys") {
    return LinkType::system;
  }
  if (word == "inter_socket" || word == "qpi" || word == "upi") {
    return LinkType::inter_socket;
  }
  return std::nullopt;
}

inline std::optional<NodeKind> node_kind_named(std::string_view word) {
  if (word == "cpu") {
    return NodeKind::cpu;
  }
  if (word == "gpu") {
    return NodeKind::gpu;
  }
  if (word == "pcie_switch") {
    return NodeKind::pcie_switch;
  }
  if (word == "nvswitch") {
    return NodeKind::nvswitch;
  }
  if (word == "nic") {
    return NodeKind::nic;
  }
  return std::nullopt;
}

// A positive, finite number of GB/s.
inline std::optional<double> parse_gbps(std::string_view s) {
  double value = 0.0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc{} || end != s.data() + s.size() || !(value > 0.0) || !(value < 1e12)) {
    return std::nullopt;
  }
  return value;
}

} // namespace detail

inline Topology Topology::from_description(std::string_view text) {
  using namespace detail;
  std::vector<TextLine> lines = split_lines(text);
  LinkBandwidths bw;
  PathOptions options;
  std::optional<TopologyBuilder> builder;
  const auto need_builder = [&]() -> TopologyBuilder& {
    if (!builder) {
      builder.emplace(bw);
    }
    return *builder;
  };
  std::size_t last_line = 1;
  for (TextLine& line : lines) {
    last_line = line.number;
    if (const auto hash = line.text.find('#'); hash != std::string::npos) {
      line.text.erase(hash);
    }
    const auto t = split_tokens(line.text);
    if (t.empty()) {
      continue;
    }
    const auto fail = [&](const std::string& reason) { return parse_error(line.number, reason); };
    // The builder's own refusals (a name used twice, a link to itself) get this line too.
    const auto at_line = [&](auto&& build) {
      try {
        build();
      } catch (const Exception& e) {
        throw fail(e.what());
      }
    };
    if (t[0] == "bandwidth") {
      if (t.size() != 3) {
        throw fail("expected: bandwidth TYPE GBPS");
      }
      if (builder) {
        throw fail("bandwidth must come before the first node");
      }
      const auto type = link_type_named(t[1]);
      const auto gbps = parse_gbps(t[2]);
      if (!type || *type == LinkType::system) {
        throw fail("bandwidth is set for nvlink, pcie or inter_socket, not " + quoted(t[1]));
      }
      if (!gbps) {
        throw fail("bad bandwidth " + quoted(t[2]) + " (a positive number of GB/s)");
      }
      (*type == LinkType::nvlink ? bw.nvlink : *type == LinkType::pcie ? bw.pcie : bw.inter_socket) = *gbps;
    } else if (t[0] == "max_hops") {
      const int hops = t.size() == 2 ? parse_small_uint(t[1]) : -1;
      if (hops < 1) {
        throw fail("expected: max_hops N with N >= 1");
      }
      options.max_hops = hops;
    } else if (t[0] == "gpu_relay") {
      if (t.size() != 2 || (t[1] != "nvlink" && t[1] != "any" && t[1] != "never")) {
        throw fail("expected: gpu_relay nvlink (the default), gpu_relay any or gpu_relay never");
      }
      options.gpu_relay = t[1] == "any"     ? GpuRelay::any_link
                          : t[1] == "never" ? GpuRelay::never
                                            : GpuRelay::nvlink_only;
    } else if (const auto kind = node_kind_named(t[0])) {
      if (*kind == NodeKind::gpu && t.size() == 4 && t[2] == "ordinal") {
        const int ordinal = parse_small_uint(t[3]);
        if (ordinal < 0) {
          throw fail("bad ordinal " + quoted(t[3]));
        }
        at_line([&] { need_builder().add_gpu(std::string(t[1]), ordinal); });
      } else if (t.size() == 2) {
        at_line([&] { need_builder().add(*kind, std::string(t[1])); });
      } else {
        throw fail("expected: " + std::string(t[0]) + " NAME" + (*kind == NodeKind::gpu ? " [ordinal N]" : ""));
      }
    } else if (t[0] == "link") {
      if (t.size() < 4 || t.size() > 6) {
        throw fail("expected: link A B TYPE [xCOUNT] [GBPS]");
      }
      TopologyBuilder& b = need_builder();
      const auto a = b.find(t[1]);
      const auto z = b.find(t[2]);
      if (!a || !z) {
        throw fail("link names an undeclared node " + quoted(!a ? t[1] : t[2]));
      }
      const auto type = link_type_named(t[3]);
      if (!type) {
        throw fail("unknown link type " + quoted(t[3]));
      }
      int count = 1;
      std::optional<double> gbps;
      for (std::size_t i = 4; i < t.size(); ++i) {
        if (t[i].size() > 1 && t[i][0] == 'x' && count == 1 && !gbps) {
          count = parse_small_uint(t[i].substr(1));
          if (count < 1) {
            throw fail("bad link count " + quoted(t[i]));
          }
        } else if (!gbps) {
          gbps = parse_gbps(t[i]);
          if (!gbps) {
            throw fail("bad bandwidth " + quoted(t[i]) + " (a positive number of GB/s)");
          }
        } else {
          throw fail("unexpected " + quoted(t[i]));
        }
      }
      at_line([&] { b.add_link(*a, *z, *type, count, gbps, std::string(t[3])); });
    } else {
      throw fail("unknown statement " + quoted(t[0]));
    }
  }
  if (!builder) {
    throw parse_error(last_line, "the description declares no nodes");
  }
  try {
    return builder->build(options);
  } catch (const Exception& e) {
    throw parse_error(last_line, e.what());
  }
}

} // namespace carve
