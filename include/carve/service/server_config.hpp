/// @file carve/service/server_config.hpp
/// carve-served's settings, from command-line flags and from a configuration file with the same
/// keys.
///
/// @code{.unparsed}
///   carve-served --topology nvidia-smi:/etc/carve/topo.txt --strategy weighted-score:history=1
///   carve-served --config /etc/carve/served.conf --socket /run/carve/served.sock
/// @endcode
///
/// A file holds one `key value` (or `key = value`) per line; `#` starts a comment. Flags are
/// `--key value` or `--key=value` and apply in order, so a flag after --config overrides the file.
///
/// @code{.unparsed}
///   socket PATH            where to listen (default: default_socket_path())
///   topology SOURCE        nvidia-smi:FILE | description:FILE | cuda (the CUDA runtime's view)
///   bandwidth TYPE=GBPS    GB/s per link for nvidia-smi text: nvlink, pcie or inter_socket
///   max-hops N             links on a path (default: a description's own, else 2)
///   backend NAME           shared-memory (simulated cards, the default) | host-vmm (simulated
///                          cards lent through the VMM protocol's host twin) | cuda (the GPUs, lent
///                          as CUDA VMM allocations) | cuda-ipc (the GPUs' cudaMalloc memory, lent as
///                          legacy CUDA IPC handles: the fallback)
///   card-memory SIZE       capacity of every simulated card (default 1GiB);
///   card-memory N=SIZE     of card N only
///   strategy TEXT          largest-bandwidth | threshold-most-free[:...] | weighted-score[:...]
///                          (as parse_strategy reads them)
///   history-window N       borrows the weighted strategy remembers (default 1024, at most 2^24)
///   max-clients N          connections served at once (default 256)
///   max-unread-descriptors N  per client, segment descriptors sent that it has not read yet
///                          before its next one waits (default 64)
///   handshake-timeout TIME a connection must say Hello within it (default 5s; 0: no limit)
///   idle-timeout TIME      close clients that hold no memory and sent nothing for it (default 0: never)
///   drain-timeout TIME     after a stop (SIGTERM), how long the server keeps answering (default 2s)
///   pidfile PATH           write the server's pid there once it listens; removed on exit
///   ready-fd N             write "READY=1\n" to descriptor N (above 2) once it listens, then close it
/// @endcode
///
/// Sizes are written as in "64MiB", "1.5GiB", "4096"; times as in "200ms", "5s", "10min", at most
/// 24 hours (a bare number is refused, except 0). Any mistake throws carve::Exception
/// (invalid_argument) naming the key, the value and, for a file, the line.
#pragma once

#include <carve/borrow/any_strategy.hpp>
#include <carve/core/error.hpp>
#include <carve/service/allocation_server.hpp>
#include <carve/service/shared_memory_card.hpp>
#include <carve/service/unix_socket.hpp>
#include <carve/tier/byte_size.hpp>
#include <carve/topology/parse_error.hpp>
#include <carve/topology/topology.hpp>
#include <carve/vmm/host_memory_mapper.hpp>
#include <carve/vmm/vmm_card.hpp>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <climits>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace carve::service {

/// Whose memory carve-served serves.
enum class Backend {
  shared_memory, ///< simulated cards (SharedMemoryCard), lent as memfds
  cuda,          ///< the CUDA devices (VmmCard over CudaMemoryMapper), lent as VMM descriptors (cuda_vmm)
  cuda_ipc,      ///< the CUDA devices (CudaDeviceResource: cudaMalloc), lent as legacy CUDA IPC handles
  host_vmm,      ///< simulated cards (VmmCard over HostMemoryMapper), lent through the host twin (host_vmm)
};

/// carve-served's settings (see the file's description for each key).
struct ServerConfig {
  std::filesystem::path socket_path = default_socket_path(); ///< socket
  std::string topology;                     ///< SOURCE as above; empty: "cuda" for the cuda backend, else an error
  LinkBandwidths bandwidths{};              ///< bandwidth, for nvidia-smi text
  std::optional<int> max_hops;              ///< unset: the description's own, or 2
  Backend backend = Backend::shared_memory; ///< backend
  std::uint64_t card_memory = std::uint64_t{1} << 30; ///< card-memory SIZE: every simulated card's
  std::map<int, std::uint64_t> card_memory_of;        ///< card-memory N=SIZE: capacities that differ
  ServiceOptions service{};                           ///< strategy and history-window
  std::size_t max_clients = 256;                      ///< max-clients
  std::size_t max_unread_descriptors = ServerOptions{}.max_unread_descriptors;     ///< max-unread-descriptors
  std::chrono::milliseconds handshake_timeout = ServerOptions{}.handshake_timeout; ///< handshake-timeout
  std::chrono::milliseconds idle_timeout = ServerOptions{}.idle_timeout;           ///< idle-timeout
  std::chrono::milliseconds drain_timeout = ServerOptions{}.drain_timeout;         ///< drain-timeout
  std::filesystem::path pidfile;                                                   ///< empty: none
  std::optional<int> ready_fd;                                                     ///< unset: none

  /// The capacity of simulated card `card`.
  std::uint64_t capacity_of(int card) const {
    const auto it = card_memory_of.find(card);
    return it == card_memory_of.end() ? card_memory : it->second;
  }
  /// The AllocationServer's options these settings give (the others at their defaults).
  ServerOptions server_options() const {
    ServerOptions o;
    o.socket_path = socket_path;
    o.service = service;
    o.max_clients = max_clients;
    o.max_unread_descriptors = max_unread_descriptors;
    o.handshake_timeout = handshake_timeout;
    o.idle_timeout = idle_timeout;
    o.drain_timeout = drain_timeout;
    return o;
  }
};

namespace detail {

inline std::uint64_t config_count(std::string_view key, std::string_view value, std::uint64_t min,
                                  std::uint64_t max = UINT64_MAX) {
  std::uint64_t n = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
  if (ec != std::errc{} || end != value.data() + value.size() || n < min || n > max) {
    throw Exception(Errc::invalid_argument,
                    std::string(key) + ": '" + std::string(value) + "' is not a whole number " +
                        (max == UINT64_MAX ? ">= " + std::to_string(min)
                                           : "from " + std::to_string(min) + " to " + std::to_string(max)));
  }
  return n;
}

inline std::uint64_t config_size(std::string_view key, std::string_view value) {
  try {
    return parse_bytes(value);
  } catch (const std::exception& e) {
    throw Exception(Errc::invalid_argument, std::string(key) + ": " + e.what());
  }
}

// "200ms", "5s", "10min", "0". At most 24 hours.
inline std::chrono::milliseconds config_duration(std::string_view key, std::string_view value) {
  std::uint64_t n = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
  const std::string_view unit(end, static_cast<std::size_t>(value.data() + value.size() - end));
  const std::uint64_t scale = unit == "ms"             ? 1
                              : unit == "s"            ? 1000
                              : unit == "min"          ? 60000
                              : unit.empty() && n == 0 ? 1
                                                       : 0;
  constexpr std::uint64_t day = 24ull * 3600 * 1000;
  if (ec != std::errc{} || end == value.data() || scale == 0 || n > day / scale) {
    throw Exception(Errc::invalid_argument, std::string(key) + ": '" + std::string(value) +
                                                "' is not a time such as 200ms, 5s or 10min (at most 24 hours)");
  }
  return std::chrono::milliseconds(static_cast<std::int64_t>(n * scale));
}

inline std::string config_text(std::istream& in) {
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

inline std::string read_config_file(const std::filesystem::path& path, std::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw Exception(Errc::invalid_argument, std::string(what) + " " + path.string() + " cannot be read");
  }
  return config_text(in);
}

} // namespace detail

/// Applies one setting. Throws carve::Exception (invalid_argument) for an unknown key or a bad
/// value.
inline void apply_setting(ServerConfig& c, std::string_view key, std::string_view value) {
  using detail::config_count;
  using detail::config_size;
  const std::string k(key);
  if (key == "socket") {
    if (value.empty()) {
      throw Exception(Errc::invalid_argument, "socket: the path is empty");
    }
    c.socket_path = std::string(value);
  } else if (key == "topology") {
    if (value != "cuda" && value.rfind("nvidia-smi:", 0) != 0 && value.rfind("description:", 0) != 0) {
      throw Exception(Errc::invalid_argument,
                      "topology: '" + std::string(value) + "' is not nvidia-smi:FILE, description:FILE or cuda");
    }
    c.topology = std::string(value);
  } else if (key == "bandwidth") {
    const std::size_t eq = value.find('=');
    const std::string_view type = value.substr(0, eq);
    const auto gbps = eq == std::string_view::npos ? std::nullopt : carve::detail::parse_gbps(value.substr(eq + 1));
    if (!gbps || (type != "nvlink" && type != "pcie" && type != "inter_socket")) {
      throw Exception(Errc::invalid_argument,
                      "bandwidth: '" + std::string(value) +
                          "' is not nvlink=GBPS, pcie=GBPS or inter_socket=GBPS (GB/s per link)");
    }
    (type == "nvlink" ? c.bandwidths.nvlink : type == "pcie" ? c.bandwidths.pcie : c.bandwidths.inter_socket) = *gbps;
  } else if (key == "max-hops") {
    c.max_hops = static_cast<int>(config_count(k, value, 1, INT_MAX));
  } else if (key == "backend") {
    if (value == "shared-memory") {
      c.backend = Backend::shared_memory;
    } else if (value == "cuda") {
      c.backend = Backend::cuda;
    } else if (value == "cuda-ipc") {
      c.backend = Backend::cuda_ipc;
    } else if (value == "host-vmm") {
      c.backend = Backend::host_vmm;
    } else {
      throw Exception(Errc::invalid_argument,
                      "backend: '" + std::string(value) + "' is not shared-memory, host-vmm, cuda or cuda-ipc");
    }
  } else if (key == "card-memory") {
    const std::size_t eq = value.find('=');
    if (eq == std::string_view::npos) {
      c.card_memory = config_size(k, value);
    } else {
      const auto card = config_count(k, value.substr(0, eq), 0);
      if (card >= static_cast<std::uint64_t>(max_cards)) {
        throw Exception(Errc::invalid_argument, "card-memory: card " + std::to_string(card) + " is past the limit of " +
                                                    std::to_string(max_cards) + " cards");
      }
      c.card_memory_of[static_cast<int>(card)] = config_size(k, value.substr(eq + 1));
    }
  } else if (key == "strategy") {
    try {
      c.service.strategy = parse_strategy(value);
    } catch (const Exception& e) {
      throw Exception(Errc::invalid_argument, std::string("strategy: ") + e.what());
    }
  } else if (key == "history-window") {
    c.service.history_window = config_count(k, value, 1, std::uint64_t{1} << 24); // reserved up front
  } else if (key == "max-clients") {
    c.max_clients = config_count(k, value, 1);
  } else if (key == "max-unread-descriptors") {
    c.max_unread_descriptors = config_count(k, value, 1);
  } else if (key == "handshake-timeout") {
    c.handshake_timeout = detail::config_duration(k, value);
  } else if (key == "idle-timeout") {
    c.idle_timeout = detail::config_duration(k, value);
  } else if (key == "drain-timeout") {
    c.drain_timeout = detail::config_duration(k, value);
  } else if (key == "pidfile") {
    if (value.empty()) {
      throw Exception(Errc::invalid_argument, "pidfile: the path is empty");
    }
    c.pidfile = std::string(value);
  } else if (key == "ready-fd") {
    const auto fd = config_count(k, value, 0);
    if (fd <= 2 || fd > 1u << 20) {
      throw Exception(Errc::invalid_argument,
                      "ready-fd: '" + std::string(value) +
                          "' is not a descriptor above 2 (0, 1 and 2 are the standard streams)");
    }
    c.ready_fd = static_cast<int>(fd);
  } else {
    throw Exception(Errc::invalid_argument, "unknown setting '" + std::string(key) + "'");
  }
}

/// Applies a configuration file's settings (its text); `name` names it in errors. A line is a key,
/// then spaces or '=' (or both), then the value, which has no spaces. Throws carve::Exception
/// (invalid_argument) naming the line.
inline void apply_config_text(ServerConfig& c, std::string_view text, const std::string& name) {
  const auto space = [](char ch) { return ch == ' ' || ch == '\t' || ch == '\r'; };
  std::size_t line_number = 0;
  std::istringstream in{std::string(text)};
  for (std::string line; std::getline(in, line);) {
    ++line_number;
    std::string_view rest(line);
    rest = rest.substr(0, rest.find('#'));
    while (!rest.empty() && space(rest.front())) {
      rest.remove_prefix(1);
    }
    while (!rest.empty() && space(rest.back())) {
      rest.remove_suffix(1);
    }
    if (rest.empty()) {
      continue;
    }
    std::size_t k = 0;
    while (k < rest.size() && !space(rest[k]) && rest[k] != '=') {
      ++k;
    }
    const std::string key(rest.substr(0, k));
    rest.remove_prefix(k);
    while (!rest.empty() && space(rest.front())) {
      rest.remove_prefix(1);
    }
    if (!rest.empty() && rest.front() == '=') {
      rest.remove_prefix(1);
      while (!rest.empty() && space(rest.front())) {
        rest.remove_prefix(1);
      }
    }
    try {
      if (rest.empty() || std::any_of(rest.begin(), rest.end(), space)) {
        throw Exception(Errc::invalid_argument, "expected: " + key + " VALUE");
      }
      apply_setting(c, key, rest);
    } catch (const Exception& e) {
      throw Exception(Errc::invalid_argument, name + " line " + std::to_string(line_number) + ": " + e.what());
    }
  }
}

/// Reads flags (argv[1..]); --config FILE applies a file where it appears. `--help` is the
/// caller's to handle before. With a cuda backend and no topology, the topology is "cuda".
/// Throws carve::Exception (invalid_argument).
inline ServerConfig parse_server_args(std::span<const std::string_view> args) {
  ServerConfig c;
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string_view arg = args[i];
    if (arg.rfind("--", 0) != 0 || arg.size() == 2) {
      throw Exception(Errc::invalid_argument,
                      "unexpected argument '" + std::string(arg) + "' (settings are --key value)");
    }
    arg.remove_prefix(2);
    std::string_view key = arg;
    std::string_view value;
    if (const auto eq = arg.find('='); eq != std::string_view::npos) {
      key = arg.substr(0, eq);
      value = arg.substr(eq + 1);
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      throw Exception(Errc::invalid_argument, "--" + std::string(key) + " needs a value");
    }
    if (key == "config") {
      apply_config_text(c, detail::read_config_file(std::string(value), "config file"), std::string(value));
    } else {
      try {
        apply_setting(c, key, value);
      } catch (const Exception& e) {
        throw Exception(Errc::invalid_argument, "--" + std::string(e.what()));
      }
    }
  }
  if (c.topology.empty() && (c.backend == Backend::cuda || c.backend == Backend::cuda_ipc)) {
    c.topology = "cuda";
  }
  return c;
}

/// The machine the configuration's topology file describes. For "cuda" the caller calls
/// discover_topology() instead (it needs the CUDA runtime). Throws carve::Exception:
/// invalid_argument (no topology, a file that cannot be read), or the parser's error naming the
/// file.
inline Topology load_topology(const ServerConfig& c) {
  if (c.topology.empty()) {
    throw Exception(Errc::invalid_argument, "no topology: give --topology nvidia-smi:FILE, description:FILE or cuda");
  }
  const bool smi = c.topology.rfind("nvidia-smi:", 0) == 0;
  const std::string file = c.topology.substr(c.topology.find(':') + 1);
  const std::string text = detail::read_config_file(file, "topology file");
  try {
    const Topology t = smi ? Topology::from_nvidia_smi(text, c.bandwidths, PathOptions{c.max_hops.value_or(2)})
                           : Topology::from_description(text);
    return !smi && c.max_hops ? t.with_max_hops(*c.max_hops) : t;
  } catch (const Exception& e) {
    throw Exception(e.code(), "topology file " + file + ": " + e.what());
  }
}

namespace detail {
inline void check_card_memory(const ServerConfig& c, const Topology& topology) {
  if (!c.card_memory_of.empty() && c.card_memory_of.rbegin()->first >= topology.gpu_count()) {
    throw Exception(Errc::invalid_argument,
                    "card-memory names card " + std::to_string(c.card_memory_of.rbegin()->first) +
                        " but the topology has " + std::to_string(topology.gpu_count()) + " GPUs");
  }
  for (int g = 0; g < topology.gpu_count(); ++g) {
    if (c.capacity_of(g) == 0) {
      throw Exception(Errc::invalid_argument, "card " + std::to_string(g) + " would have no memory");
    }
  }
}
} // namespace detail

/// One SharedMemoryCard per GPU of the topology, with the configured capacities. Throws
/// carve::Exception (invalid_argument) for a card-memory setting that names a card the topology
/// lacks, or a card of zero bytes.
inline std::vector<SharedMemoryCard> shared_memory_cards(const ServerConfig& c, const Topology& topology) {
  detail::check_card_memory(c, topology);
  std::vector<SharedMemoryCard> cards;
  for (int g = 0; g < topology.gpu_count(); ++g) {
    cards.emplace_back(static_cast<std::size_t>(c.capacity_of(g)), "carve-" + topology.node(topology.gpu(g)).name);
  }
  return cards;
}

/// One VmmCard over the host twin per GPU of the topology (card g is the twin's device g), with the
/// configured capacities; the twin has the 2 MiB granularity of today's GPUs and the server's CPU
/// stands for every device. Throws carve::Exception as shared_memory_cards does, and
/// invalid_argument for a capacity below 2 MiB.
inline std::vector<VmmCard<HostMemoryMapper>> host_vmm_cards(const ServerConfig& c, const Topology& topology) {
  detail::check_card_memory(c, topology);
  const HostMemoryMapper mapper(
      HostMapperOptions{HostMapperOptions{}.granularity, topology.gpu_count(), HostMemoryMapper::every_device});
  std::vector<VmmCard<HostMemoryMapper>> cards;
  for (int g = 0; g < topology.gpu_count(); ++g) {
    try {
      cards.emplace_back(mapper, g, static_cast<std::size_t>(c.capacity_of(g)));
    } catch (const Exception& e) {
      throw Exception(Errc::invalid_argument, "card " + std::to_string(g) + ": " + e.what());
    }
  }
  return cards;
}

} // namespace carve::service
