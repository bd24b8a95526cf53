// TierPlanner: the placement rules, the share arithmetic (checked by hand), plans that exhaust
// tiers, unmet demand, the first-come-first-served comparison, the table and JSON, bad input.
#include <carve/tier.hpp>

#include <doctest/doctest.h>

#include <limits>
#include <string>
#include <vector>

// In a namespace of its own: the area's test files compile as one translation unit.
namespace test_tier_planner {

using carve::SpillTier;
using carve::TierGpu;
using carve::TierPlanner;
using carve::TierTask;

namespace {

std::vector<TierGpu> gpus(std::size_t n, std::uint64_t capacity) {
  std::vector<TierGpu> g;
  for (std::size_t i = 0; i < n; ++i) {
    g.push_back({static_cast<int>(i), capacity});
  }
  return g;
}

std::vector<SpillTier> three_tiers(std::uint64_t dram, std::uint64_t cxl, std::uint64_t disk) {
  return {{"dram", dram, 1}, {"cxl", cxl, 2}, {"disk", disk, 3}};
}

// gpu index of subtask k of task t
std::size_t gpu_of(const std::vector<carve::SubtaskPlacement>& p, std::size_t task, std::size_t subtask) {
  for (const auto& s : p) {
    if (s.task == task && s.subtask == subtask) {
      return s.gpu;
    }
  }
  FAIL("no such subtask");
  return 0;
}

} // namespace

TEST_CASE("no more tasks than GPUs: subtask k goes to GPU k, largest task first") {
  const TierPlanner planner(gpus(4, 100), three_tiers(10, 10, 10));
  const auto p = planner.place({{40}, {80}, {60}});
  REQUIRE(p.size() == 12);
  CHECK(p[0].task == 1); // largest first
  CHECK(p[4].task == 2);
  CHECK(p[8].task == 0);
  for (std::size_t t = 0; t < 3; ++t) {
    for (std::size_t k = 0; k < 4; ++k) {
      CHECK(gpu_of(p, t, k) == k);
    }
  }
}

TEST_CASE("more tasks than GPUs: directions alternate, ties keep input order") {
  const TierPlanner planner(gpus(3, 100), three_tiers(10, 10, 10));
  // Sorted: task 2 (90), then tasks 0 and 3 (60, tie: input order), then task 1 (30).
  const auto p = planner.place({{60}, {30}, {90}, {60}});
  CHECK(p[0].task == 2);
  CHECK(p[3].task == 0);
  CHECK(p[6].task == 3);
  CHECK(p[9].task == 1);
  const std::size_t forward[] = {0, 1, 2};
  const std::size_t reverse[] = {2, 1, 0};
  for (std::size_t k = 0; k < 3; ++k) {
    CHECK(gpu_of(p, 2, k) == forward[k]); // rank 0
    CHECK(gpu_of(p, 0, k) == reverse[k]); // rank 1
    CHECK(gpu_of(p, 3, k) == forward[k]); // rank 2
    CHECK(gpu_of(p, 1, k) == reverse[k]); // rank 3
  }
}

TEST_CASE("subtasks split evenly with the remainder on the first ones, or as given") {
  const TierPlanner planner(gpus(4, 100), three_tiers(10, 10, 10));
  const auto even = planner.place({{10}});
  CHECK(even[0].bytes == 3);
  CHECK(even[1].bytes == 3);
  CHECK(even[2].bytes == 2);
  CHECK(even[3].bytes == 2);
  const auto given = planner.place({{10, {1, 2, 3, 4}}});
  CHECK(given[3].bytes == 4);
}

TEST_CASE("shares by hand: by default a GPU reserves whole shares of the tiers it uses") {
  // Capacity 100 per GPU; demands 130, 110, 160, 50 -> extras 30, 10, 60, 0.
  const TierPlanner planner(gpus(4, 100), three_tiers(100, 200, 1000));
  const auto plan = planner.plan({{450, {130, 110, 160, 50}}});
  const auto& g = plan.gpus;
  // GPU0: shares 100/4 = 25, 200/4 = 50, 250. Extra 30: 25 from dram, 5 from cxl; reserves 25 and 50.
  CHECK(g[0].extra == 30);
  CHECK(g[0].tiers[0].share == 25);
  CHECK(g[0].tiers[0].used == 25);
  CHECK(g[0].tiers[1].used == 5);
  CHECK(g[0].tiers[1].reserved == 50);
  CHECK(g[0].tiers[2].reserved == 0);
  // GPU1: remaining 75, 150 over 3 GPUs: shares 25, 50. Extra 10 fits dram; reserves 25.
  CHECK(g[1].tiers[0].share == 25);
  CHECK(g[1].tiers[0].used == 10);
  CHECK(g[1].tiers[0].reserved == 25);
  CHECK(g[1].tiers[1].reserved == 0);
  // GPU2: remaining 50, 150 over 2: shares 25, 75. Extra 60: 25 + 35; reserves 25, 75.
  CHECK(g[2].tiers[0].share == 25);
  CHECK(g[2].tiers[1].share == 75);
  CHECK(g[2].tiers[1].used == 35);
  CHECK(g[2].tiers[1].reserved == 75);
  // GPU3 spills nothing and reserves nothing.
  CHECK(g[3].extra == 0);
  CHECK(g[3].tiers[0].share == 25);
  CHECK(g[3].tiers[0].reserved == 0);
  CHECK(plan.unmet() == 0);
}

TEST_CASE("handing unused shares back gives later GPUs more") {
  const TierPlanner planner(gpus(4, 100), three_tiers(100, 200, 1000), {.hand_back_unused = true});
  const auto plan = planner.plan({{450, {130, 110, 160, 50}}});
  const auto& g = plan.gpus;
  CHECK(g[0].tiers[1].reserved == 5); // only what it uses
  // GPU1: remaining 75, 195 over 3: shares 25, 65; takes 10 of dram.
  CHECK(g[1].tiers[1].share == 65);
  CHECK(g[1].tiers[0].reserved == 10);
  // GPU2: remaining 65, 195 over 2: shares 32 (floor), 97; extra 60 = 32 + 28.
  CHECK(g[2].tiers[0].share == 32);
  CHECK(g[2].tiers[0].used == 32);
  CHECK(g[2].tiers[1].used == 28);
}

TEST_CASE("a plan that exactly exhausts the tiers, and one that cannot") {
  const TierPlanner planner(gpus(2, 100), {{"dram", 100, 1}, {"disk", 40, 2}});
  const auto exact = planner.plan({{380, {170, 210}}}); // extras 70, 110: shares 50+20, then 50+20
  CHECK(exact.gpus[0].tiers[0].used == 50);
  CHECK(exact.gpus[0].tiers[1].used == 20);
  CHECK(exact.gpus[1].tiers[0].used == 50);
  CHECK(exact.gpus[1].tiers[1].used == 20);
  CHECK(exact.gpus[1].unmet == 40); // 110 - 50 - 20: reported, not hidden
  CHECK(exact.unmet() == 40);
  const auto fits = planner.plan({{340, {170, 170}}});
  CHECK(fits.unmet() == 0);
  CHECK(fits.gpus[1].tiers[1].reserved == 20); // the second GPU takes the last of each tier
}

TEST_CASE("first come, first served lets the first GPU take tier 1") {
  const TierPlanner planner(gpus(4, 100), three_tiers(100, 400, 10000));
  const std::vector<TierTask> tasks = {{800, {200, 200, 200, 200}}}; // every GPU spills 100
  const auto fair = planner.plan(tasks);
  const auto fcfs = planner.first_come_first_served(tasks);
  CHECK(fcfs.gpus[0].tiers[0].used == 100);
  CHECK(fcfs.gpus[3].tiers[0].used == 0);
  const auto f = carve::fairness(fair);
  const auto u = carve::fairness(fcfs);
  CHECK(f.spilling_gpus == 4);
  CHECK(f.worst_tier1_share == doctest::Approx(0.25));
  CHECK(u.worst_tier1_share == doctest::Approx(0.0));
  CHECK(u.worst_tier1_gpu == 1);
  CHECK(f.worst_tier1_coverage == doctest::Approx(0.25));
  CHECK(u.worst_tier1_coverage == doctest::Approx(0.0));
}

TEST_CASE("the share of tier-1 bandwidth counts only what is reserved") {
  // Hand-back: GPU0 spills 10 and reserves 10 of dram's 100; GPU1 spills 60 and gets a share of
  // 90, reserving 60. Capacity shares 10 % and 60 %; bandwidth shares 10/70 and 60/70.
  const TierPlanner planner(gpus(2, 100), three_tiers(100, 400, 10000), {.hand_back_unused = true});
  const auto plan = planner.plan({{270, {110, 160}}});
  REQUIRE(plan.gpus[0].tiers[0].reserved == 10);
  REQUIRE(plan.gpus[1].tiers[0].reserved == 60);
  const auto f = carve::fairness(plan);
  CHECK(f.worst_tier1_share == doctest::Approx(0.10));
  CHECK(f.worst_tier1_bandwidth_share == doctest::Approx(10.0 / 70.0));
  CHECK(f.worst_tier1_bandwidth_gpu == 0);
  // Without hand-back both reserve their whole share (50 each): half the bandwidth each.
  const auto whole = carve::fairness(TierPlanner(gpus(2, 100), three_tiers(100, 400, 10000)).plan({{270, {110, 160}}}));
  CHECK(whole.worst_tier1_share == doctest::Approx(0.5));
  CHECK(whole.worst_tier1_bandwidth_share == doctest::Approx(0.5));
}

TEST_CASE("GPUs are planned in ordinal order whatever order they are given in") {
  const TierPlanner planner({{3, 100}, {1, 100}, {2, 100}}, three_tiers(90, 400, 10000));
  REQUIRE(planner.gpus().size() == 3);
  CHECK(planner.gpus()[0].ordinal == 1);
  CHECK(planner.gpus()[2].ordinal == 3);
  const auto plan = planner.plan({{600, {300, 200, 100}}}); // subtask k goes to the k-th ordinal
  CHECK(plan.gpus[0].ordinal == 1);
  CHECK(plan.gpus[0].demand == 300);
  CHECK(plan.gpus[2].ordinal == 3);
  CHECK(plan.gpus[2].demand == 100);
  CHECK(plan.gpus[0].tiers[0].share == 30); // GPU 1 is planned first: 90 / 3
  CHECK(plan.gpus[2].extra == 0);
}

TEST_CASE("spill read time with known bandwidths") {
  const std::vector<SpillTier> tiers = {{"dram", 100, 1, 100}, {"cxl", 100, 2, 50}};
  const TierPlanner planner(gpus(2, 10), tiers);
  const auto plan = planner.plan({{100, {50, 50}}}); // extras 40, 40: both fit their dram share of 50
  // Both reserve 50 of dram, so each reads its 40 bytes at half of dram's 100 GB/s.
  CHECK(carve::fairness(plan).worst_spill_read_seconds == doctest::Approx(40 / 50e9));
  // First come, first served: GPU0 takes 40, GPU1 40 of dram: the same split here.
  CHECK(carve::fairness(planner.first_come_first_served({{100, {50, 50}}})).worst_spill_read_seconds ==
        doctest::Approx(40 / 50e9));
  // Uneven: GPU0 spills 90 (dram 50 + cxl 40), GPU1 spills 10 (dram 10 of its share 50).
  const auto uneven = planner.plan({{120, {100, 20}}});
  CHECK(uneven.gpus[0].tiers[1].used == 40);
  // GPU0: 50 B on dram at 100e9 * 50/100, 40 B on cxl at all of 50e9.
  CHECK(carve::fairness(uneven).worst_spill_read_seconds == doctest::Approx(50 / 50e9 + 40 / 50e9));
}

TEST_CASE("the plan prints as a table and as JSON") {
  const TierPlanner planner(gpus(2, 1u << 30), three_tiers(1ull << 32, 1ull << 34, 1ull << 40));
  const auto plan = planner.plan({{3ull << 30, {}, "embedding \"big\""}});
  const std::string table = carve::format_table(plan);
  CHECK(table.find("fair shares") != std::string::npos);
  CHECK(table.find("1.5 GiB") != std::string::npos);   // each GPU's demand
  CHECK(table.find("512.0 MiB") != std::string::npos); // each GPU's extra
  const std::string json = carve::to_json(plan);
  CHECK(json.find("\"method\":\"fair shares\"") != std::string::npos);
  CHECK(json.find("\"extra\":536870912") != std::string::npos);
  CHECK(json.find("{\"name\":\"dram\",\"share\":2147483648,\"used\":536870912,\"reserved\":2147483648}") !=
        std::string::npos);
  CHECK(json.front() == '{');
  CHECK(json.back() == '}');
  CHECK(carve::format_bytes(1023) == "1023 B");
  const TierPlanner quoted(gpus(1, 1), {{"fast \"dram\"\n", 10, 1}});
  CHECK(carve::to_json(quoted.plan({{2}})).find("\"fast \\\"dram\\\"\\u000a\"") != std::string::npos);
  CHECK(carve::format_bytes(1536) == "1.5 KiB");
}

TEST_CASE("bad input is refused with a clear error") {
  const auto tiers = three_tiers(10, 10, 10);
  CHECK_THROWS_WITH_AS(TierPlanner({}, tiers), "tier planner: no GPUs", carve::Exception);
  CHECK_THROWS_WITH_AS(TierPlanner({{0, 0}}, tiers), "tier planner: GPU 0 has no memory (capacity 0)",
                       carve::Exception);
  CHECK_THROWS_WITH_AS(TierPlanner({{3, 1}, {3, 1}}, tiers), "tier planner: GPU ordinal 3 is given twice",
                       carve::Exception);
  CHECK_THROWS_WITH_AS(TierPlanner(gpus(1, 1), {}), "tier planner: no spill tiers", carve::Exception);
  CHECK_THROWS_WITH_AS(TierPlanner(gpus(1, 1), {{"cxl", 0, 1}}), "tier planner: tier 'cxl' has no capacity",
                       carve::Exception);
  CHECK_THROWS_WITH_AS(TierPlanner(gpus(1, 1), {{"dram", 5, 2}, {"cxl", 5, 1}}),
                       "tier planner: tier priorities must increase along the list ('dram' has 2, 'cxl' has 1)",
                       carve::Exception);
  const TierPlanner planner(gpus(2, 10), tiers);
  CHECK_THROWS_WITH_AS(planner.plan({{0}}), "tier planner: task 0 needs no memory", carve::Exception);
  CHECK_THROWS_WITH_AS(planner.plan({{10, {10}, "x"}}), "tier planner: task 'x' has 1 subtask sizes for 2 GPUs",
                       carve::Exception);
  CHECK_THROWS_WITH_AS(planner.plan({{10, {4, 5}}}), "tier planner: task 0's subtasks add up to 9 bytes, not 10",
                       carve::Exception);
}

TEST_CASE("sums of sizes past 2^64 bytes are refused, not wrapped") {
  const std::vector<SpillTier> tiers = {{"dram", 1 << 20, 1}};
  const std::uint64_t huge = carve::parse_bytes("10000000TiB"); // 0.6 of 2^64
  const TierPlanner one(gpus(1, 1), tiers);
  // Two tasks on one GPU: its demand would wrap to 3147.2 PiB.
  CHECK_THROWS_WITH_AS(one.plan({{huge, {}, "a"}, {huge, {}, "b"}}),
                       "tier planner: GPU 0's subtasks with task 'b' need more than 2^64 bytes (16 EiB)",
                       carve::Exception);
  CHECK_THROWS_WITH_AS(one.first_come_first_served({{huge}, {huge}}),
                       "tier planner: GPU 0's subtasks with task 1 need more than 2^64 bytes (16 EiB)",
                       carve::Exception);
  // Each GPU's demand fits, but their sum, which bounds the plan's unmet total, would not.
  const TierPlanner two(gpus(2, 1), tiers);
  CHECK_THROWS_WITH_AS(two.plan({{huge, {huge, 0}, "a"}, {huge, {0, huge}, "b"}}),
                       "tier planner: the tasks with task 'b' need more than 2^64 bytes (16 EiB)", carve::Exception);
  CHECK_THROWS_WITH_AS(two.plan({{5, {huge, huge}, "c"}}),
                       "tier planner: the subtasks of task 'c' add up to more than 2^64 bytes (16 EiB)",
                       carve::Exception);
  // Just below the limit still plans.
  const auto fits = one.plan({{huge}, {std::numeric_limits<std::uint64_t>::max() - huge}});
  CHECK(fits.gpus[0].demand == std::numeric_limits<std::uint64_t>::max());
  CHECK(fits.unmet() == std::numeric_limits<std::uint64_t>::max() - 1 - (1 << 20));
}

TEST_CASE("sizes as people write them") {
  CHECK(carve::parse_bytes("4096") == 4096);
  CHECK(carve::parse_bytes("80GiB") == 80ull << 30);
  CHECK(carve::parse_bytes(" 1.5 TiB ") == 3ull << 39);
  CHECK(carve::parse_bytes("512MB") == 512'000'000);
  CHECK(carve::parse_bytes("0") == 0);
  CHECK_THROWS_WITH_AS(carve::parse_bytes("-5GiB"), "size '-5GiB': a size cannot be negative", carve::Exception);
  CHECK_THROWS_WITH_AS(carve::parse_bytes("GiB"), "size 'GiB': expected a number", carve::Exception);
  CHECK_THROWS_WITH_AS(carve::parse_bytes("1.2.3GB"), "size '1.2.3GB': malformed number", carve::Exception);
  CHECK_THROWS_WITH_AS(carve::parse_bytes("5 parsecs"), doctest::Contains("unknown unit"), carve::Exception);
  CHECK_THROWS_WITH_AS(carve::parse_bytes("99999999999TiB"), "size '99999999999TiB': too large", carve::Exception);
  // Whole numbers to the last byte, where a double would round: 2^53 + 1, and 2^64 - 1 itself.
  CHECK(carve::parse_bytes("9007199254740993") == 9007199254740993ull);
  CHECK(carve::parse_bytes("18446744073709551615") == std::numeric_limits<std::uint64_t>::max());
  CHECK(carve::parse_bytes("16777215 TiB") == (std::uint64_t{1} << 40) * 16777215);
  CHECK_THROWS_WITH_AS(carve::parse_bytes("18446744073709551616"), doctest::Contains("too large"), carve::Exception);
  CHECK_THROWS_WITH_AS(carve::parse_bytes("16777216TiB"), doctest::Contains("too large"), carve::Exception);
}

} // namespace test_tier_planner
