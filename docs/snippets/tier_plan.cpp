// Fair spill shares: 4 GPUs of 80 GiB, two tasks that overflow them, DRAM then NVMe.
#include <carve/tier.hpp>

#include <cstdio>

int main() {
  constexpr std::uint64_t gib = 1ull << 30;
  const std::vector<carve::TierGpu> gpus{{0, 80 * gib}, {1, 80 * gib}, {2, 80 * gib}, {3, 80 * gib}};
  const std::vector<carve::SpillTier> tiers{{"dram", 512 * gib, 1, 200}, {"nvme", 8192 * gib, 2, 12}};
  const std::vector<carve::TierTask> tasks{{600 * gib}, {400 * gib, {160 * gib, 120 * gib, 80 * gib, 40 * gib}}};

  const carve::TierPlanner planner(gpus, tiers);
  const auto plan = planner.plan(tasks);
  std::fputs(carve::format_table(plan).c_str(), stdout);
  const carve::TierFairness f = carve::fairness(plan);
  std::printf("worst spilling GPU: %.1f%% of DRAM; unmet %s\n", 100 * f.worst_tier1_share,
              carve::format_bytes(plan.unmet()).c_str());
  return plan.unmet() == 0 ? 0 : 1;
}
