/// @file carve/topology/nvidia_smi.hpp
/// Topology::from_nvidia_smi: reads `nvidia-smi topo -m` output.
///
/// Accepted: the matrix as printed by current and older drivers, columns separated by tabs or
/// spaces, with or without terminal underlining; `X` on the diagonal; NV<n> (n bonded NVLinks),
/// PIX, PXB, PHB, NODE, SYS and the older SOC; GPU<n> and NIC rows (NIC<n> named through the "NIC
/// Legend" block, or older names such as mlx5_0 used directly); the CPU Affinity, NUMA Affinity
/// and GPU NUMA ID columns. Text before the header (a shell prompt) and the legends after the
/// matrix are skipped.
///
/// How cells become links: NV<n> is an nvlink link of count n. Any other cell is one end-to-end
/// PCIe path of its class: PIX, PXB, PHB and NODE a `pcie` link, SYS and SOC a `system` link (as
/// wide as the narrower of PCIe and the inter-socket link).
///
/// Malformed text throws carve::Exception (parse_error.hpp) with the 1-based line: no header, a duplicate or unknown
/// column, a row that is missing, out of order, ragged or too long, an unknown code, a diagonal
/// that is not X, an asymmetric matrix, a NIC Legend entry for no column.
#pragma once

#include <carve/core/error.hpp>
#include <carve/topology/parse_error.hpp>
#include <carve/topology/text_lines.hpp>
#include <carve/topology/topology.hpp>

#include <cstddef>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace carve {
namespace detail {

struct SmiCell {
  LinkType type = LinkType::pcie;
  int count = 1;
};

// The link a matrix cell describes; nullopt for a code carve does not know.
inline std::optional<SmiCell> smi_cell(std::string_view code) {
  if (const int n = numbered(code, "NV"); n >= 1) {
    return SmiCell{LinkType::nvlink, n};
  }
  if (code == "PIX" || code == "PXB" || code == "PHB" || code == "NODE") {
    return SmiCell{LinkType::pcie, 1};
  }
  if (code == "SYS" || code == "SOC") {
    return SmiCell{LinkType::system, 1};
  }
  return std::nullopt;
}

// An affinity column's value ("0-11,24-35", "3", "N/A"), which no matrix code looks like.
inline bool smi_value(std::string_view token) { return token == "N/A" || (token[0] >= '0' && token[0] <= '9'); }

// The columns after the device columns, by their (multi-word) titles.
enum class SmiExtra { cpu_affinity, numa_affinity, gpu_numa_id };

struct SmiHeader {
  std::size_t line = 0;
  std::vector<std::string> devices;
  std::vector<SmiExtra> extras;
};

inline SmiHeader parse_smi_header(const TextLine& line) {
  const std::vector<std::string_view> tokens = split_tokens(line.text);
  SmiHeader h;
  h.line = line.number;
  std::size_t i = 0;
  const auto at = [&](std::size_t k, std::string_view word) { return k < tokens.size() && tokens[k] == word; };
  for (; i < tokens.size(); ++i) {
    if ((at(i, "CPU") && at(i + 1, "Affinity")) || (at(i, "NUMA") && at(i + 1, "Affinity")) ||
        (at(i, "GPU") && at(i + 1, "NUMA"))) {
      break;
    }
    for (const std::string& d : h.devices) {
      if (d == tokens[i]) {
        throw parse_error(line.number, "column " + quoted(tokens[i]) + " appears twice in the header");
      }
    }
    h.devices.emplace_back(tokens[i]);
  }
  while (i < tokens.size()) {
    if (at(i, "CPU") && at(i + 1, "Affinity")) {
      h.extras.push_back(SmiExtra::cpu_affinity);
      i += 2;
    } else if (at(i, "NUMA") && at(i + 1, "Affinity")) {
      h.extras.push_back(SmiExtra::numa_affinity);
      i += 2;
    } else if (at(i, "GPU") && at(i + 1, "NUMA") && at(i + 2, "ID")) {
      h.extras.push_back(SmiExtra::gpu_numa_id);
      i += 3;
    } else {
      throw parse_error(line.number, "unknown column " + quoted(tokens[i]) + " after the device columns");
    }
  }
  return h;
}

} // namespace detail

inline Topology Topology::from_nvidia_smi(std::string_view text, LinkBandwidths bw) {
  return from_nvidia_smi(text, bw, PathOptions{});
}

inline Topology Topology::from_nvidia_smi(std::string_view text, LinkBandwidths bw, PathOptions options) {
  using namespace detail;
  if (options.max_hops < 1) {
    throw Exception(Errc::invalid_argument, "carve::Topology: max_hops must be at least 1");
  }
  const std::vector<TextLine> lines = split_lines(text);
  std::size_t k = 0;
  while (k < lines.size() && is_blank(lines[k].text)) {
    ++k;
  }
  if (k == lines.size()) {
    throw parse_error(lines.empty() ? 1 : lines.back().number, "empty input: no nvidia-smi topo -m matrix");
  }
  // The header is the first line whose first column is GPU0; a row GPU0 has X in the next one.
  for (; k < lines.size(); ++k) {
    const auto tokens = split_tokens(lines[k].text);
    if (!tokens.empty() && tokens[0] == "GPU0") {
      if (tokens.size() > 1 && tokens[1] == "X") {
        throw parse_error(lines[k].number, "matrix row GPU0 before any header line");
      }
      break;
    }
  }
  if (k == lines.size()) {
    throw parse_error(lines.front().number, "no nvidia-smi topo -m header (a line whose first column is GPU0)");
  }
  const SmiHeader header = parse_smi_header(lines[k]);
  const std::size_t n = header.devices.size();
  ++k;

  // Rows, in the header's order, up to a blank line or the legend.
  std::vector<std::vector<std::string_view>> cells(n);
  std::vector<std::vector<std::string_view>> extras(n);
  std::vector<std::size_t> row_line(n, 0);
  std::size_t rows = 0;
  for (; k < lines.size() && rows < n; ++k) {
    const TextLine& line = lines[k];
    const auto tokens = split_tokens(line.text);
    if (tokens.empty() || tokens[0] == "Legend:") {
      break;
    }
    const std::string& expected = header.devices[rows];
    if (tokens[0] != expected) {
      throw parse_error(line.number, "expected the row for " + expected + ", found " + quoted(tokens[0]));
    }
    // Matrix cells run up to the first affinity value (those start with a digit, or are N/A).
    std::size_t count = 0;
    while (count + 1 < tokens.size() && !smi_value(tokens[count + 1])) {
      ++count;
    }
    if (count != n) {
      throw parse_error(line.number, "row " + expected + " has " + std::to_string(count) + " cells, the header names " +
                                         std::to_string(n) + " devices");
    }
    if (tokens.size() > n + 1 + header.extras.size()) {
      throw parse_error(line.number, "row " + expected + " has more values than the header has columns");
    }
    cells[rows].assign(tokens.begin() + 1, tokens.begin() + static_cast<std::ptrdiff_t>(n + 1));
    extras[rows].assign(tokens.begin() + static_cast<std::ptrdiff_t>(n + 1), tokens.end());
    row_line[rows] = line.number;
    ++rows;
  }
  if (rows < n) {
    const std::size_t at = k < lines.size() ? lines[k].number : (lines.back().number + 1);
    throw parse_error(at, "the matrix ends without a row for " + header.devices[rows]);
  }

  // Every cell: X exactly on the diagonal, a known code elsewhere, the same code both ways.
  std::vector<std::vector<SmiCell>> links(n, std::vector<SmiCell>(n));
  for (std::size_t r = 0; r < n; ++r) {
    for (std::size_t c = 0; c < n; ++c) {
      const std::string_view code = cells[r][c];
      if (r == c) {
        if (code != "X") {
          throw parse_error(row_line[r],
                            header.devices[r] + "/" + header.devices[c] + " must be X, not " + quoted(code));
        }
        continue;
      }
      const auto cell = smi_cell(code);
      if (!cell) {
        throw parse_error(row_line[r], "unknown code " + quoted(code) + " in column " + header.devices[c]);
      }
      if (c < r && code != cells[c][r]) {
        throw parse_error(row_line[r], header.devices[r] + "/" + header.devices[c] + " is " + std::string(code) +
                                           " but " + header.devices[c] + "/" + header.devices[r] + " is " +
                                           std::string(cells[c][r]) + ": the matrix must be symmetric");
      }
      links[r][c] = *cell;
    }
  }

  // The NIC Legend maps NIC<n> columns to device names.
  std::map<std::string, std::string, std::less<>> nic_names;
  bool in_nic_legend = false;
  for (; k < lines.size(); ++k) {
    const auto tokens = split_tokens(lines[k].text);
    if (tokens.size() == 2 && tokens[0] == "NIC" && tokens[1] == "Legend:") {
      in_nic_legend = true;
      continue;
    }
    if (!in_nic_legend || tokens.empty()) {
      continue;
    }
    const std::string_view label = tokens[0];
    if (tokens.size() != 2 || label.back() != ':' || numbered(label.substr(0, label.size() - 1), "NIC") < 0) {
      in_nic_legend = false; // the legend is over; whatever follows is not nvidia-smi's
      continue;
    }
    const std::string column(label.substr(0, label.size() - 1));
    bool known = false;
    for (const std::string& d : header.devices) {
      known = known || d == column;
    }
    if (!known) {
      throw parse_error(lines[k].number, "the NIC Legend names " + column + ", which is not a matrix column");
    }
    nic_names[column] = std::string(tokens[1]);
  }

  try {
    TopologyBuilder builder(bw);
    for (std::size_t d = 0; d < n; ++d) {
      const std::string& label = header.devices[d];
      if (const int ordinal = numbered(label, "GPU"); ordinal >= 0) {
        const NodeId id = builder.add_gpu(label, ordinal);
        Node& node = builder.node(id);
        for (std::size_t e = 0; e < extras[d].size(); ++e) {
          const std::string_view value = extras[d][e];
          switch (header.extras[e]) {
          case SmiExtra::cpu_affinity:
            node.cpu_affinity = std::string(value);
            break;
          case SmiExtra::numa_affinity:
            if (const int numa = parse_small_uint(value); numa >= 0) {
              node.numa_node = numa;
            }
            break;
          case SmiExtra::gpu_numa_id:
            break;
          }
        }
      } else {
        const auto legend = nic_names.find(label);
        builder.add_nic(legend != nic_names.end() ? legend->second : label);
      }
    }
    for (std::size_t r = 0; r < n; ++r) {
      for (std::size_t c = r + 1; c < n; ++c) {
        builder.add_link(NodeId{static_cast<std::uint32_t>(r)}, NodeId{static_cast<std::uint32_t>(c)}, links[r][c].type,
                         links[r][c].count, std::nullopt, std::string(cells[r][c]));
      }
    }
    return builder.build(options);
  } catch (const Exception& e) {
    throw parse_error(header.line, e.what());
  }
}

} // namespace carve
