/// @file carve/tier/tier_discovery.hpp
/// This machine's spill tiers, read from Linux sysfs.
///
/// NUMA nodes are listed in `<sysfs>/devices/system/node/node<N>`; a node whose cpulist is empty
/// has memory but no CPUs, which is how CXL memory expanders (and other far memory) appear. When
/// the kernel groups nodes into memory tiers
/// (`<sysfs>/devices/virtual/memory_tiering/memory_tier<K>/nodelist`, a lower K being faster),
/// those tiers are used; otherwise nodes with CPUs form the DRAM tier and CPU-less nodes the CXL
/// tier. A disk tier is a directory, sized by statvfs. The sysfs root is a parameter so tests can
/// point it at a fake tree.
#pragma once

#include <carve/core/checked_math.hpp>
#include <carve/tier/spill_tier.hpp>

#include <sys/statvfs.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace carve {

/// A NUMA node with memory, as sysfs describes it.
struct MemoryNode {
  int id;                    ///< the node's number
  bool has_cpus;             ///< false for CXL and other far memory
  std::uint64_t total_bytes; ///< MemTotal
  std::uint64_t free_bytes;  ///< MemFree: unused pages only, often a small part of what can be had
  int memory_tier;           ///< the kernel's `memory_tier<K>`, or -1 when the kernel does not say
  /// What a program can have without swapping: MemFree plus the node's page cache and reclaimable
  /// slab, at most MemTotal. The per-node form of /proc/meminfo's MemAvailable, which sizes tiers.
  std::uint64_t available_bytes = free_bytes;
};

namespace detail {

inline std::string read_text(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in || !std::filesystem::is_regular_file(file)) { // a directory opens, then reads as nothing
    throw Exception(Errc::io_error, "cannot read " + file.string());
  }
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// "0-3,8,10-11\n" -> {0, 1, 2, 3, 8, 10, 11}; "" or "\n" -> {}.
inline std::vector<int> parse_list(const std::string& text, const std::filesystem::path& file) {
  std::vector<int> ids;
  std::stringstream parts(text);
  std::string part;
  while (std::getline(parts, part, ',')) {
    part.erase(std::remove_if(part.begin(), part.end(), [](char c) { return c == '\n' || c == ' '; }), part.end());
    if (part.empty()) {
      continue;
    }
    const std::size_t dash = part.find('-');
    try {
      // Ids and ranges as the kernel writes them (at most max_listed_id): "0x-3", "0-3x" or a
      // range of two billion ids is malformed, not a loop that runs for minutes.
      constexpr int max_listed_id = 1 << 20;
      std::size_t used_lo = 0;
      std::size_t used_hi = 0;
      const std::string lo_text = part.substr(0, dash);
      const std::string hi_text = dash == std::string::npos ? lo_text : part.substr(dash + 1);
      const int lo = std::stoi(lo_text, &used_lo);
      const int hi = std::stoi(hi_text, &used_hi);
      if (lo < 0 || hi < lo || hi > max_listed_id || used_lo != lo_text.size() || used_hi != hi_text.size()) {
        throw Exception(Errc::invalid_argument, "");
      }
      for (int id = lo; id <= hi; ++id) {
        ids.push_back(id);
      }
    } catch (const std::exception&) {
      throw Exception(Errc::invalid_argument, "malformed id list '" + part + "' in " + file.string());
    }
  }
  return ids;
}

// The value of "Node <n> <key>: <value> kB" in a node's meminfo, in bytes; nothing when absent.
inline std::optional<std::uint64_t> find_meminfo_bytes(const std::string& text, const std::string& key) {
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream words(line);
    std::string node, id, name, unit;
    unsigned long long value = 0;
    if (words >> node >> id >> name >> value >> unit && name == key + ":" && unit == "kB") {
      if (const auto bytes = checked_mul<std::uint64_t>(value, 1024)) {
        return *bytes;
      }
    }
  }
  return std::nullopt;
}

inline std::uint64_t meminfo_bytes(const std::string& text, const std::string& key, const std::filesystem::path& file) {
  if (const auto bytes = find_meminfo_bytes(text, key)) {
    return *bytes;
  }
  throw Exception(Errc::invalid_argument, "no " + key + " (in kB, below 2^54) in " + file.string());
}

// MemFree plus what the kernel reclaims before it swaps: file pages and reclaimable slab
// (KReclaimable, or SReclaimable on kernels before 4.20). Terms the kernel omits count 0.
inline std::uint64_t meminfo_available(const std::string& text, std::uint64_t total, std::uint64_t free) {
  const auto term = [&](const char* key) { return find_meminfo_bytes(text, key).value_or(0); };
  const std::uint64_t slab = find_meminfo_bytes(text, "KReclaimable").value_or(term("SReclaimable"));
  std::uint64_t sum = free;
  for (const std::uint64_t t : {term("Active(file)"), term("Inactive(file)"), slab}) {
    sum = checked_add(sum, t).value_or(total);
  }
  return std::min(sum, total);
}

} // namespace detail

/// Every NUMA node with memory, by id. Throws carve::Exception: unsupported when the node
/// directory is missing, io_error when a file in it cannot be read, invalid_argument when one
/// cannot be parsed.
inline std::vector<MemoryNode> discover_memory_nodes(const std::filesystem::path& sysfs = "/sys") {
  const std::filesystem::path nodes_dir = sysfs / "devices/system/node";
  if (!std::filesystem::is_directory(nodes_dir)) {
    throw Exception(Errc::unsupported, "no NUMA node directory at " + nodes_dir.string());
  }
  std::map<int, int> tier_of;
  const std::filesystem::path tiering = sysfs / "devices/virtual/memory_tiering";
  if (std::filesystem::is_directory(tiering)) {
    for (const auto& entry : std::filesystem::directory_iterator(tiering)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("memory_tier", 0) != 0 || !std::filesystem::exists(entry.path() / "nodelist")) {
        continue;
      }
      const std::string number = name.substr(11);
      if (number.empty() || number.size() > 6 ||
          !std::all_of(number.begin(), number.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        throw Exception(Errc::invalid_argument,
                        "unexpected memory tier directory " + entry.path().string() + " (want memory_tier<N>)");
      }
      const int tier = std::stoi(number);
      for (const int node : detail::parse_list(detail::read_text(entry.path() / "nodelist"), entry.path())) {
        tier_of[node] = tier;
      }
    }
  }
  std::vector<MemoryNode> nodes;
  for (const auto& entry : std::filesystem::directory_iterator(nodes_dir)) {
    const std::string name = entry.path().filename().string();
    if (name.size() <= 4 || name.rfind("node", 0) != 0 ||
        !std::all_of(name.begin() + 4, name.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      continue;
    }
    if (name.size() > 10) { // std::stoi would throw std::out_of_range, which carve does not throw
      throw Exception(Errc::invalid_argument,
                      "unexpected node directory " + entry.path().string() + " (want node<N>, N below 10^6)");
    }
    const int id = std::stoi(name.substr(4));
    const std::filesystem::path meminfo = entry.path() / "meminfo";
    const std::string info = detail::read_text(meminfo);
    const std::uint64_t total = detail::meminfo_bytes(info, "MemTotal", meminfo);
    if (total == 0) {
      continue; // a node without memory (CPUs only) holds no spill
    }
    const bool cpus =
        !detail::parse_list(detail::read_text(entry.path() / "cpulist"), entry.path() / "cpulist").empty();
    const auto tier = tier_of.find(id);
    const std::uint64_t free = std::min(detail::meminfo_bytes(info, "MemFree", meminfo), total);
    nodes.push_back({id, cpus, total, free, tier == tier_of.end() ? -1 : tier->second,
                     detail::meminfo_available(info, total, free)});
  }
  std::sort(nodes.begin(), nodes.end(), [](const MemoryNode& a, const MemoryNode& b) { return a.id < b.id; });
  return nodes;
}

/// A directory as a spill tier, sized by the space free to unprivileged users, or by `capacity`
/// when that is given and smaller (a tier need not claim the whole disk). Throws carve::Exception:
/// invalid_argument when it is not a directory, io_error when statvfs fails.
inline SpillTier disk_tier(const std::filesystem::path& directory, int priority, std::string name = "disk",
                           std::optional<std::uint64_t> capacity = std::nullopt) {
  if (!std::filesystem::is_directory(directory)) {
    throw Exception(Errc::invalid_argument, "disk tier: " + directory.string() + " is not a directory");
  }
  struct statvfs fs {};
  if (::statvfs(directory.c_str(), &fs) != 0) {
    throw Exception(Errc::io_error, "disk tier: cannot statvfs " + directory.string());
  }
  const std::uint64_t free = static_cast<std::uint64_t>(fs.f_bavail) * fs.f_frsize;
  return {std::move(name), capacity ? std::min(*capacity, free) : free, priority, 0, {}, directory.string()};
}

/// Memory tiers from nodes, fastest first, each sized by its nodes' available memory and at most
/// `cap` bytes when given (spill need not take every page the machine could free): the kernel's
/// memory tiers when every node has one, else "dram" (nodes with CPUs) then "cxl" (CPU-less
/// nodes). Priorities start at 1. Throws carve::Exception (invalid_argument) when a tier's size
/// would pass 2^64 bytes.
inline std::vector<SpillTier> memory_tiers(const std::vector<MemoryNode>& nodes,
                                           std::optional<std::uint64_t> cap = std::nullopt) {
  std::map<std::pair<int, std::string>, SpillTier> groups; // ordered fastest first
  const bool kernel_tiers =
      !nodes.empty() && std::all_of(nodes.begin(), nodes.end(), [](const MemoryNode& n) { return n.memory_tier >= 0; });
  for (const MemoryNode& n : nodes) {
    const auto key = kernel_tiers ? std::pair{n.memory_tier, "memory_tier" + std::to_string(n.memory_tier)}
                                  : std::pair{n.has_cpus ? 0 : 1, std::string(n.has_cpus ? "dram" : "cxl")};
    SpillTier& tier = groups.try_emplace(key, SpillTier{key.second, 0, 0}).first->second;
    const auto capacity = checked_add(tier.capacity, n.available_bytes);
    if (!capacity) {
      throw Exception(Errc::invalid_argument, "memory tiers: node " + std::to_string(n.id) + " brings tier '" +
                                                  tier.name + "' past 2^64 bytes");
    }
    tier.capacity = *capacity;
    tier.numa_nodes.push_back(n.id);
  }
  std::vector<SpillTier> tiers;
  for (auto& [key, tier] : groups) {
    tier.priority = static_cast<int>(tiers.size()) + 1;
    tier.capacity = cap ? std::min(*cap, tier.capacity) : tier.capacity;
    tiers.push_back(std::move(tier));
  }
  return tiers;
}

} // namespace carve
