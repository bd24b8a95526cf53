// Plans spill tiers for a set of GPUs and tasks, and compares fair, pre-reserved shares with
// first come, first served.
//
// By default it plans on this machine: its memory tiers (NUMA nodes, sized by available memory)
// and a disk tier in --disk-dir (the temporary directory unless given), for --gpus (8 of 80 GiB
// unless given) and twelve tasks shaped like the example's, sized to need all the GPUs' memory
// and 90% of the tiers'. --tier replaces the discovered tiers with given ones; --example plans the fixed
// example (8 GPUs of 80 GiB over DRAM 1 TiB, CXL 2 TiB and NVMe 16 TiB).
//
//   tier_plan [--gpus 8x80GiB] [--tier dram:1TiB:200]... [--task 300GiB[:sub,sub,...]]...
//             [--disk-dir DIR] [--disk-cap SIZE] [--memory-cap SIZE] [--example]
//             [--hand-back] [--json]
#include <carve/tier.hpp>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace {

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> parts;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, sep);) {
    parts.push_back(part);
  }
  return parts;
}

// A whole number in [1, limit], or throws carve::Exception naming the flag and the text.
int parse_count(const std::string& text, const std::string& flag, int limit) {
  const bool digits = !text.empty() && text.size() <= 9 && text.find_first_not_of("0123456789") == std::string::npos;
  const int value = digits ? std::stoi(text) : 0;
  if (value < 1 || value > limit) {
    throw carve::Exception(carve::Errc::invalid_argument, flag + " '" + text +
                                                              "': the count must be a whole number from 1 to " +
                                                              std::to_string(limit));
  }
  return value;
}

// GB/s, a finite number >= 0, or throws carve::Exception naming the flag and the text.
double parse_gbps(const std::string& text, const std::string& flag) {
  std::size_t used = 0;
  double value = -1;
  try {
    value = std::stod(text, &used);
  } catch (const std::logic_error&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || !(value >= 0) || value > 1e9) {
    throw carve::Exception(carve::Errc::invalid_argument, flag + " bandwidth '" + text + "': want GB/s, a number >= 0");
  }
  return value;
}

// The fixed example: 8 GPUs of 80 GiB, DRAM/CXL/NVMe, twelve tasks whose first subtasks are the
// largest.
void example_setup(std::vector<carve::TierGpu>& gpus, std::vector<carve::SpillTier>& tiers,
                   std::vector<carve::TierTask>& tasks) {
  constexpr std::uint64_t gib = 1ull << 30;
  gpus.clear();
  for (int i = 0; i < 8; ++i) {
    gpus.push_back({i, 80 * gib});
  }
  tiers = {{"dram", 1024 * gib, 1, 200}, {"cxl", 2048 * gib, 2, 60}, {"disk", 16384 * gib, 3, 12}};
  tasks.clear();
  for (std::uint64_t i = 1; i <= 12; ++i) {
    carve::TierTask task{0};
    for (std::uint64_t k = 0; k < gpus.size(); ++k) {
      task.subtasks.push_back(i * (gpus.size() - k) * 4 * gib);
      task.need += task.subtasks.back();
    }
    tasks.push_back(task);
  }
}

// This machine's memory tiers and a disk tier in `directory`, fastest first.
std::vector<carve::SpillTier> discovered_tiers(const std::filesystem::path& directory,
                                               std::optional<std::uint64_t> memory_cap,
                                               std::optional<std::uint64_t> disk_cap) {
  std::vector<carve::SpillTier> tiers;
  try {
    tiers = carve::memory_tiers(carve::discover_memory_nodes(), memory_cap);
  } catch (const carve::Exception& e) {
    std::fprintf(stderr, "tier_plan: no memory tiers (%s); planning on the disk alone\n", e.what());
  }
  tiers.push_back(carve::disk_tier(directory, static_cast<int>(tiers.size()) + 1, "disk", disk_cap));
  std::erase_if(tiers, [](const carve::SpillTier& t) { return t.capacity == 0; });
  if (tiers.empty()) {
    throw carve::Exception(carve::Errc::no_space, "no tier on this machine has room (and " + directory.string() +
                                                      " has no free space); give tiers with --tier");
  }
  return tiers;
}

// Twelve tasks with the example's shape (task i's subtask k weighs i * (G - k)), scaled so that
// they need all the GPUs' memory and 90% of the tiers': a plan that spills into every tier.
std::vector<carve::TierTask> scaled_tasks(const std::vector<carve::TierGpu>& gpus,
                                          const std::vector<carve::SpillTier>& tiers) {
  long double room = 0;
  for (const auto& g : gpus) {
    room += static_cast<long double>(g.capacity);
  }
  for (const auto& t : tiers) {
    room += 0.9L * static_cast<long double>(t.capacity);
  }
  const std::size_t n = gpus.size();
  const long double weights = 78.0L * static_cast<long double>(n * (n + 1) / 2); // sum over i of i, times k's
  std::vector<carve::TierTask> tasks;
  for (std::uint64_t i = 1; i <= 12; ++i) {
    carve::TierTask task{0};
    for (std::size_t k = 0; k < n; ++k) {
      const long double w = static_cast<long double>(i * (n - k));
      task.subtasks.push_back(std::max<std::uint64_t>(1, static_cast<std::uint64_t>(room * w / weights)));
      task.need += task.subtasks.back();
    }
    tasks.push_back(task);
  }
  return tasks;
}

} // namespace

int main(int argc, char** argv) try {
  std::vector<carve::TierGpu> gpus;
  std::vector<carve::SpillTier> tiers;
  std::vector<carve::TierTask> tasks;
  std::filesystem::path disk_dir = std::filesystem::temp_directory_path();
  std::optional<std::uint64_t> disk_cap;
  std::optional<std::uint64_t> memory_cap;
  bool example = false;
  bool hand_back = false;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        throw carve::Exception(carve::Errc::invalid_argument, arg + " needs a value");
      }
      return argv[++i];
    };
    if (arg == "--gpus") {
      const auto parts = split(next(), 'x');
      if (parts.size() != 2) {
        throw carve::Exception(carve::Errc::invalid_argument, "--gpus wants COUNTxSIZE, e.g. 8x80GiB");
      }
      const int count = parse_count(parts[0], "--gpus", 4096);
      for (int g = 0; g < count; ++g) {
        gpus.push_back({g, carve::parse_bytes(parts[1])});
      }
    } else if (arg == "--tier") {
      const auto parts = split(next(), ':');
      if (parts.size() < 2 || parts.size() > 3) {
        throw carve::Exception(carve::Errc::invalid_argument, "--tier wants NAME:SIZE[:GBPS], e.g. cxl:2TiB:60");
      }
      tiers.push_back({parts[0], carve::parse_bytes(parts[1]), static_cast<int>(tiers.size()) + 1,
                       parts.size() == 3 ? parse_gbps(parts[2], "--tier") : 0.0});
    } else if (arg == "--task") {
      const auto parts = split(next(), ':');
      carve::TierTask task{carve::parse_bytes(parts[0])};
      if (parts.size() > 1) {
        for (const auto& sub : split(parts[1], ',')) {
          task.subtasks.push_back(carve::parse_bytes(sub));
        }
      }
      tasks.push_back(task);
    } else if (arg == "--disk-dir") {
      disk_dir = next();
    } else if (arg == "--disk-cap") {
      disk_cap = carve::parse_bytes(next());
    } else if (arg == "--memory-cap") {
      memory_cap = carve::parse_bytes(next());
    } else if (arg == "--example") {
      example = true;
    } else if (arg == "--hand-back") {
      hand_back = true;
    } else if (arg == "--json") {
      json = true;
    } else {
      throw carve::Exception(carve::Errc::invalid_argument, "unknown argument " + arg);
    }
  }
  std::string source = "given tiers";
  if (example) {
    if (!gpus.empty() || !tiers.empty() || !tasks.empty()) {
      throw carve::Exception(carve::Errc::invalid_argument, "--example plans fixed numbers: drop --gpus/--tier/--task");
    }
    example_setup(gpus, tiers, tasks);
    source = "the fixed example";
  } else {
    if (gpus.empty()) {
      for (int g = 0; g < 8; ++g) {
        gpus.push_back({g, 80ull << 30});
      }
    }
    if (tiers.empty()) {
      tiers = discovered_tiers(disk_dir, memory_cap, disk_cap);
      source = "this machine's tiers";
    }
    if (tasks.empty()) {
      tasks = scaled_tasks(gpus, tiers);
    }
  }

  const carve::TierPlanner planner(gpus, tiers, {.hand_back_unused = hand_back});
  const auto fair = planner.plan(tasks);
  if (json) {
    std::puts(carve::to_json(fair).c_str());
    return 0;
  }
  std::printf("planning on %s:\n", source.c_str());
  for (const auto& t : tiers) {
    std::printf("  %-14s %10s%s%s\n", t.name.c_str(), carve::format_bytes(t.capacity).c_str(),
                t.directory.empty() ? "" : " free in ", t.directory.c_str());
  }
  std::puts("");
  const auto fcfs = planner.first_come_first_served(tasks);
  std::fputs(carve::format_table(fair).c_str(), stdout);
  std::fputs("\n", stdout);
  std::fputs(carve::format_table(fcfs).c_str(), stdout);
  std::puts("\nworst spilling GPU             tier-1 share   tier-1 bandwidth   extra on tier 1   spill read once");
  for (const auto* p : {&fair, &fcfs}) {
    const carve::TierFairness f = carve::fairness(*p);
    std::printf("%-29s %9.1f %%   %14.1f %%   %13.1f %%   %12.1f s   unmet %s\n",
                (p->method + (p->options.hand_back_unused ? " + hand-back" : "")).c_str(), 100 * f.worst_tier1_share,
                100 * f.worst_tier1_bandwidth_share, 100 * f.worst_tier1_coverage, f.worst_spill_read_seconds,
                carve::format_bytes(p->unmet()).c_str());
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "tier_plan: %s\n", e.what());
  return 1;
}
