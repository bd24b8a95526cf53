// Plans spill tiers for 8 GPUs of 80 GiB running a mixed set of tasks, and compares fair,
// pre-reserved shares with first come, first served. Also lists the memory tiers of the machine
// it runs on (`tier_plan --json` prints the fair plan as JSON instead).
#include <carve/carve.hpp>

#include <cstdio>
#include <cstring>
#include <exception>
#include <vector>

int main(int argc, char** argv) try {
  constexpr std::uint64_t gib = 1ull << 30;
  std::vector<carve::TierGpu> gpus;
  for (int i = 0; i < 8; ++i) {
    gpus.push_back({i, 80 * gib});
  }
  // DRAM 1 TiB at 200 GB/s, CXL 2 TiB at 60 GB/s, NVMe 16 TiB at 12 GB/s.
  const std::vector<carve::SpillTier> tiers = {
      {"dram", 1024 * gib, 1, 200}, {"cxl", 2048 * gib, 2, 60}, {"disk", 16384 * gib, 3, 12}};
  // Twelve tasks (more than GPUs, so directions alternate), from 160 GiB to 1.9 TiB each, whose
  // first subtasks are the largest (subtask k weighs 8 - k).
  std::vector<carve::TierTask> tasks;
  for (std::uint64_t i = 1; i <= 12; ++i) {
    carve::TierTask task{0};
    for (std::uint64_t k = 0; k < 8; ++k) {
      task.subtasks.push_back(i * (8 - k) * 4 * gib);
      task.need += task.subtasks.back();
    }
    tasks.push_back(task);
  }

  const carve::TierPlanner seed(gpus, tiers);
  const carve::TierPlanner hand_back(gpus, tiers, {.hand_back_unused = true});
  const auto fair = seed.plan(tasks);
  if (argc > 1 && std::strcmp(argv[1], "--json") == 0) {
    std::puts(carve::to_json(fair).c_str());
    return 0;
  }
  const auto shared = hand_back.plan(tasks);
  const auto fcfs = seed.first_come_first_served(tasks);
  std::fputs(carve::format_table(fair).c_str(), stdout);
  std::fputs("\n", stdout);
  std::fputs(carve::format_table(fcfs).c_str(), stdout);

  std::puts("\nworst spilling GPU          tier-1 share   extra on tier 1   spill read once");
  for (const auto* p : {&fair, &shared, &fcfs}) {
    const carve::TierFairness f = carve::fairness(*p);
    std::printf("%-26s %9.1f %%   %13.1f %%   %12.1f s   unmet %s\n",
                (p->method + (p->options.hand_back_unused ? " + hand-back" : "")).c_str(), 100 * f.worst_tier1_share,
                100 * f.worst_tier1_coverage, f.worst_spill_read_seconds, carve::format_bytes(p->unmet()).c_str());
  }

  std::puts("\nmemory tiers on this machine:");
  try {
    for (const auto& t : carve::memory_tiers(carve::discover_memory_nodes())) {
      std::printf("  %-14s %10s free on %zu node(s)\n", t.name.c_str(), carve::format_bytes(t.capacity).c_str(),
                  t.numa_nodes.size());
    }
  } catch (const carve::TierError& e) {
    std::printf("  (none found: %s)\n", e.what());
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "tier_plan: %s\n", e.what());
  return 1;
}
