// Command-line flags of the embedding-lookup example and of bench_embedding_latency: one parser,
// and the workload flags both programs take (dataset shape, offered load, query sizes, pipeline
// shape). A bad value is an error that names the flag and says what it accepts; programs print
// it and exit with status 2.
//
//   WorkloadOptions w;                          // the program's defaults first
//   Flags flags("embedding_lookup", "what it does");
//   add_workload_flags(flags, w, "queries per second (0: as fast as possible)");
//   flags.choice("--policy", policy, {"strict-aging", "round-robin", "fifo"}, "drain policy");
//   if (const std::optional<int> status = flags.parse_or_exit(argc, argv)) return *status;
//
// Flags are written `--name value` or `--name=value`; a flag given twice keeps the last value;
// `--help` prints every flag with its default.
#pragma once

#include "dataset.hpp"
#include "pipeline.hpp"
#include "query_sizes.hpp"
#include "vector_reader.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace embedding {

// A number as flags and their messages show it: 100, 0.5, 1e+07.
inline std::string flag_number(double x) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%g", x);
  return buffer;
}

// A command line the program cannot run with; what() names the flag.
class FlagError : public std::invalid_argument {
public:
  using std::invalid_argument::invalid_argument;
};

class Flags {
public:
  Flags(std::string program, std::string summary) : program_(std::move(program)), summary_(std::move(summary)) {}

  // A whole number in [min, max] (no sign, no fraction).
  template <std::unsigned_integral Int>
  void integer(std::string name, Int& target, std::uint64_t min, std::uint64_t max, std::string help) {
    const std::string range = "a whole number from " + std::to_string(min) + " to " + std::to_string(max);
    add(std::move(name), std::to_string(target), std::move(help), [&target, min, max, range](const Flag& f) {
      std::uint64_t x = 0;
      const char* first = f.value.data();
      const char* last = first + f.value.size();
      const auto [end, ec] = std::from_chars(first, last, x);
      if (f.value.empty() || ec != std::errc{} || end != last || x < min || x > max) {
        throw FlagError(f.name + " " + quoted(f.value) + ": expected " + range);
      }
      target = static_cast<Int>(x);
    });
  }

  // A finite number in [min, max].
  void real(std::string name, double& target, double min, double max, std::string help) {
    const std::string range = "a number from " + format(min) + " to " + format(max);
    add(std::move(name), format(target), std::move(help), [&target, min, max, range](const Flag& f) {
      char* end = nullptr;
      const double x = std::strtod(f.value.c_str(), &end);
      if (f.value.empty() || end != f.value.c_str() + f.value.size() || !std::isfinite(x) || x < min || x > max) {
        throw FlagError(f.name + " " + quoted(f.value) + ": expected " + range);
      }
      target = x;
    });
  }

  // One of a fixed list of words.
  void choice(std::string name, std::string& target, std::vector<std::string> choices, std::string help) {
    std::string list;
    for (const std::string& c : choices) {
      list += (list.empty() ? "" : ", ") + c;
    }
    add(std::move(name), target, std::move(help) + "; one of " + list, [&target, choices, list](const Flag& f) {
      for (const std::string& c : choices) {
        if (f.value == c) {
          target = c;
          return;
        }
      }
      throw FlagError(f.name + " " + quoted(f.value) + ": expected one of " + list);
    });
  }

  // Any non-empty text (a path, a file name).
  void text(std::string name, std::string& target, std::string help) {
    add(std::move(name), target, std::move(help), [&target](const Flag& f) {
      if (f.value.empty()) {
        throw FlagError(f.name + ": expected a non-empty value");
      }
      target = f.value;
    });
  }

  // Arguments that start with `prefix` are another parser's (e.g. --benchmark_ from dev.sh bench).
  void ignore_prefix(std::string prefix) { ignored_.push_back(std::move(prefix)); }

  // A check over several flags, run after all of them are read; it throws FlagError.
  void check(std::function<void()> rule) { rules_.push_back(std::move(rule)); }

  // Whether the last parse() saw `name` on the command line.
  bool given(const std::string& name) const { return std::find(given_.begin(), given_.end(), name) != given_.end(); }

  // Reads argv. False when --help was asked for (nothing else is checked then). Throws FlagError.
  bool parse(int argc, const char* const* argv) const {
    given_.clear();
    for (int i = 1; i < argc; ++i) {
      if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") {
        return false;
      }
    }
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      if (is_ignored(arg)) {
        continue;
      }
      const std::size_t eq = arg.find('=');
      const std::string name = arg.substr(0, eq);
      const Entry* entry = find(name);
      if (entry == nullptr) {
        throw FlagError("unknown flag " + quoted(name) + " (" + program_ + " --help lists the flags)");
      }
      Flag f{name, {}};
      if (eq != std::string::npos) {
        f.value = arg.substr(eq + 1);
      } else if (i + 1 < argc) {
        f.value = argv[++i];
      } else {
        throw FlagError(name + " needs a value");
      }
      entry->set(f);
      given_.push_back(name);
    }
    for (const auto& rule : rules_) {
      rule();
    }
    return true;
  }

  std::string usage() const {
    std::string out = "usage: " + program_ + " [flags]\n" + summary_ + "\n\nflags:\n";
    for (const Entry& e : entries_) {
      out += "  " + e.name + " <value>" + std::string(e.name.size() < 22 ? 22 - e.name.size() : 1, ' ') + e.help +
             (e.default_value.empty() ? "" : "; default " + e.default_value) + "\n";
    }
    return out;
  }

  // parse() for main(): the status to exit with when the program should stop (0 after --help,
  // 2 after an error, printed to stderr with the program's name), nothing when it should run.
  std::optional<int> parse_or_exit(int argc, const char* const* argv) const {
    try {
      if (!parse(argc, argv)) {
        std::fputs(usage().c_str(), stdout);
        return 0;
      }
    } catch (const FlagError& e) {
      std::fprintf(stderr, "%s: %s\n", program_.c_str(), e.what());
      return 2;
    }
    return std::nullopt;
  }

private:
  struct Flag {
    std::string name;
    std::string value;
  };
  struct Entry {
    std::string name;
    std::string default_value;
    std::string help;
    std::function<void(const Flag&)> set;
  };

  static std::string quoted(const std::string& s) { return "'" + s + "'"; }
  static std::string format(double x) { return flag_number(x); }

  void add(std::string name, std::string default_value, std::string help, std::function<void(const Flag&)> set) {
    if (name.rfind("--", 0) != 0 || find(name) != nullptr) {
      throw std::logic_error("flag " + name + " must start with -- and be declared once");
    }
    entries_.push_back({std::move(name), std::move(default_value), std::move(help), std::move(set)});
  }

  const Entry* find(const std::string& name) const {
    for (const Entry& e : entries_) {
      if (e.name == name) {
        return &e;
      }
    }
    return nullptr;
  }

  bool is_ignored(const std::string& arg) const {
    for (const std::string& p : ignored_) {
      if (arg.rfind(p, 0) == 0) {
        return true;
      }
    }
    return false;
  }

  std::string program_;
  std::string summary_;
  std::vector<Entry> entries_;
  std::vector<std::string> ignored_;
  std::vector<std::function<void()>> rules_;
  mutable std::vector<std::string> given_;
};

// What the example and the benchmark both let the user choose.
struct WorkloadOptions {
  std::uint32_t tables = 8;
  std::uint64_t table_mib = 32; // per table; the 1-4 GiB tables are 1024-4096
  std::uint32_t devices = 2;
  double qps = 0;
  QuerySizes sizes; // lognormal median and sigma, clipped to [1, max]
  std::uint32_t loaders_per_device = 2;
  std::uint32_t in_flight = 4;
  std::uint32_t elements = 2; // processing elements of the compute stage
  double aging_ms = 100;      // StrictPriority::with_aging's bound
  std::string io = "pread";
  std::string dir; // where the dataset is generated (a temporary directory inside it)
  std::uint64_t seed = 1;

  IoMode io_mode() const { return io == "io_uring" ? IoMode::io_uring : IoMode::pread; }
  std::uint64_t table_bytes() const { return table_mib << 20; }
  std::uint64_t aging_ns() const { return static_cast<std::uint64_t>(aging_ms * 1e6); }

  DatasetConfig dataset(const std::filesystem::path& root) const {
    DatasetConfig cfg;
    cfg.root = root;
    cfg.devices = devices;
    cfg.tables = tables;
    cfg.table_bytes = table_bytes();
    return cfg;
  }

  PipelineConfig pipeline() const {
    PipelineConfig pc;
    pc.loaders_per_device = loaders_per_device;
    pc.in_flight = in_flight;
    pc.processing_elements = elements;
    pc.io = io_mode();
    return pc;
  }
};

// Sums stay exact (the pipeline's results can be checked bit for bit) up to this many vectors a query.
inline constexpr std::uint32_t max_query_vectors = 8192;

// Registers the shared flags; `qps_help` says what --qps 0 means for this program.
inline void add_workload_flags(Flags& flags, WorkloadOptions& o, const std::string& qps_help) {
  flags.integer("--tables", o.tables, 1, 1024, "embedding tables to generate");
  flags.integer("--table-mib", o.table_mib, 1, 64 << 10, "size of each table in MiB (1-4 GiB: 1024-4096)");
  flags.integer("--devices", o.devices, 2, 64, "storage devices (directories) the tables are spread over");
  flags.real("--qps", o.qps, 0, 1e7, qps_help);
  flags.real("--median", o.sizes.median, 1, max_query_vectors, "median vectors per query (lognormal)");
  flags.real("--sigma", o.sizes.sigma, 0, 4, "spread of the lognormal query sizes (1: mean about 1.65 x median)");
  flags.integer("--max-vectors", o.sizes.max, 1, max_query_vectors, "largest query, in vectors");
  flags.real("--aging-ms", o.aging_ms, 0, 1e6, "strict priority's aging bound: older requests go first");
  flags.integer("--loaders-per-device", o.loaders_per_device, 1, 64, "loader threads per storage device");
  flags.integer("--in-flight", o.in_flight, 1, 4096, "queries in the I/O stage at once");
  flags.integer("--elements", o.elements, 1, 64, "processing elements (threads) of the compute stage");
  flags.choice("--io", o.io, {"pread", "io_uring"}, "how loaders read; io_uring falls back to pread where missing");
  flags.text("--dir", o.dir, "where the dataset is generated (in a temporary directory, removed at exit)");
  flags.integer("--seed", o.seed, 0, std::numeric_limits<std::uint64_t>::max(), "seed of the query generator");
  flags.check([&o] {
    if (o.sizes.median > o.sizes.max) {
      throw FlagError("--median " + flag_number(o.sizes.median) + " is above --max-vectors " +
                      std::to_string(o.sizes.max));
    }
  });
}

} // namespace embedding
