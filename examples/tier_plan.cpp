// Plans spill tiers for a set of GPUs and tasks, and compares fair, pre-reserved shares with
// first come, first served. Without arguments: 8 GPUs of 80 GiB, DRAM/CXL/NVMe tiers and twelve
// tasks whose first subtasks are the largest; then the memory tiers of this machine.
//
//   tier_plan [--gpus 8x80GiB] [--tier dram:1TiB:200]... [--task 300GiB[:sub,sub,...]]...
//             [--hand-back] [--json]
#include <carve/carve.hpp>

#include <cstdio>
#include <exception>
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

void default_setup(std::vector<carve::TierGpu>& gpus, std::vector<carve::SpillTier>& tiers,
                   std::vector<carve::TierTask>& tasks) {
  constexpr std::uint64_t gib = 1ull << 30;
  if (gpus.empty()) {
    for (int i = 0; i < 8; ++i) {
      gpus.push_back({i, 80 * gib});
    }
  }
  if (tiers.empty()) {
    tiers = {{"dram", 1024 * gib, 1, 200}, {"cxl", 2048 * gib, 2, 60}, {"disk", 16384 * gib, 3, 12}};
  }
  if (tasks.empty()) {
    for (std::uint64_t i = 1; i <= 12; ++i) {
      carve::TierTask task{0};
      for (std::uint64_t k = 0; k < gpus.size(); ++k) {
        task.subtasks.push_back(i * (gpus.size() - k) * 4 * gib);
        task.need += task.subtasks.back();
      }
      tasks.push_back(task);
    }
  }
}

} // namespace

int main(int argc, char** argv) try {
  std::vector<carve::TierGpu> gpus;
  std::vector<carve::SpillTier> tiers;
  std::vector<carve::TierTask> tasks;
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
    } else if (arg == "--hand-back") {
      hand_back = true;
    } else if (arg == "--json") {
      json = true;
    } else {
      throw carve::Exception(carve::Errc::invalid_argument, "unknown argument " + arg);
    }
  }
  const bool built_in = gpus.empty() && tiers.empty() && tasks.empty();
  default_setup(gpus, tiers, tasks);

  const carve::TierPlanner planner(gpus, tiers, {.hand_back_unused = hand_back});
  const auto fair = planner.plan(tasks);
  if (json) {
    std::puts(carve::to_json(fair).c_str());
    return 0;
  }
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
  if (built_in) {
    std::puts("\nmemory tiers on this machine:");
    try {
      for (const auto& t : carve::memory_tiers(carve::discover_memory_nodes())) {
        std::printf("  %-14s %10s free on %zu node(s)\n", t.name.c_str(), carve::format_bytes(t.capacity).c_str(),
                    t.numa_nodes.size());
      }
    } catch (const carve::Exception& e) {
      std::printf("  (none found: %s)\n", e.what());
    }
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "tier_plan: %s\n", e.what());
  return 1;
}
