// A GPU's tier reservations as real memory: how a share splits over a tier's NUMA nodes, the
// TierShareResource that draws from the parts, GpuSpill, and a PagedMirror whose devices are
// spill shares.
#include "support/errors.hpp"

#include <carve/mirror.hpp>
#include <carve/mr.hpp>
#include <carve/tier.hpp>

#include <doctest/doctest.h>

#if __has_include(<numaif.h>)
#include <numaif.h>
#endif

#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

// In a namespace of its own: the area's test files compile as one translation unit.
namespace test_tier_share {

namespace fs = std::filesystem;
using carve::MemoryNode;
using carve::SharePart;
using carve::SpillNodes;
using carve::SpillTier;

namespace {

constexpr std::uint64_t MiB = 1 << 20;

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("carve-share-" + std::to_string(std::random_device{}()));
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

MemoryNode node(int id, std::uint64_t free) { return {id, true, free, free, -1}; }

bool same(const std::vector<SharePart>& a, const std::vector<SharePart>& b) {
  if (a.size() != b.size()) {
    return false;
  }
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].node != b[i].node || a[i].bytes != b[i].bytes) {
      return false;
    }
  }
  return true;
}

bool numa_here() {
#if __has_include(<numa.h>)
  return ::numa_available() >= 0;
#else
  return false;
#endif
}

} // namespace

TEST_CASE("a share goes to the GPU's own node first, then the nodes with most free memory") {
  const SpillTier cxl{"cxl", 100 * MiB, 2, 0, {2, 3, 4}};
  const SpillNodes where{4, {node(2, 30 * MiB), node(3, 50 * MiB), node(4, 10 * MiB)}};
  CHECK(same(carve::split_share(cxl, 70 * MiB, 0, where), {{4, 10 * MiB}, {3, 50 * MiB}, {2, 10 * MiB}}));
  CHECK(same(carve::split_share(cxl, 5 * MiB, 0, where), {{4, 5 * MiB}}));
  // Unknown home: most free first.
  CHECK(same(carve::split_share(cxl, 60 * MiB, 0, {-1, where.nodes}), {{3, 50 * MiB}, {2, 10 * MiB}}));
  // A home outside the tier does not count.
  CHECK(same(carve::split_share(cxl, 60 * MiB, 0, {0, where.nodes}), {{3, 50 * MiB}, {2, 10 * MiB}}));
  CHECK_THROWS_WITH_AS(carve::split_share(cxl, 91 * MiB, 0, where), doctest::Contains("the share needs"),
                       carve::Exception);
  CHECK(carve::split_share(cxl, 0, 0, where).empty());
}

TEST_CASE("without free-memory figures GPUs take the tier's nodes in turn") {
  const SpillTier dram{"dram", 100 * MiB, 1, 0, {0, 1}};
  CHECK(same(carve::split_share(dram, 8 * MiB, 0), {{0, 8 * MiB}}));
  CHECK(same(carve::split_share(dram, 8 * MiB, 1), {{1, 8 * MiB}}));
  CHECK(same(carve::split_share(dram, 8 * MiB, 2), {{0, 8 * MiB}}));
  CHECK(same(carve::split_share(dram, 8 * MiB, 2, {1, {}}), {{1, 8 * MiB}})); // a known home still wins
}

TEST_CASE("disk tiers are one part; a tier with nothing behind it is an error") {
  CHECK(same(carve::split_share({"disk", 1 << 30, 3, 0, {}, "/tmp"}, 7 * MiB, 5), {{-1, 7 * MiB}}));
  CHECK_THROWS_WITH_AS(carve::split_share({"far", 1 << 30, 3}, 1, 0), doctest::Contains("neither NUMA nodes"),
                       carve::Exception);
}

TEST_CASE("splitting GPU after GPU against figures that shrink never promises a node twice") {
  const SpillTier dram{"dram", 120 * MiB, 1, 0, {0, 1}};
  std::vector<MemoryNode> nodes = {node(0, 60 * MiB), node(1, 60 * MiB)};
  std::uint64_t placed = 0;
  for (std::size_t gpu = 0; gpu < 4; ++gpu) {
    const auto parts = carve::split_share(dram, 30 * MiB, gpu, {static_cast<int>(gpu % 2), nodes});
    CHECK(parts.front().node == static_cast<int>(gpu % 2));
    for (const SharePart& p : parts) {
      placed += p.bytes;
    }
    nodes = carve::subtract_parts(nodes, parts);
  }
  CHECK(placed == 120 * MiB);
  CHECK(nodes[0].available_bytes == 0);
  CHECK(nodes[1].available_bytes == 0);
  CHECK_THROWS_AS(carve::split_share(dram, 1, 4, {-1, nodes}), carve::Exception);
}

TEST_CASE("a disk-tier share as a memory resource: budget, alignment, errors") {
  TempDir dir;
  const carve::TierPlanner planner({{0, 4 * MiB}, {1, 4 * MiB}}, {carve::disk_tier(dir.path, 1, "disk", 16 * MiB)});
  const auto plan = planner.plan({{20 * MiB, {10 * MiB, 10 * MiB}}}); // extras 6 MiB each
  carve::TierShareResource share(plan, 1, 0);
  REQUIRE(share.parts().size() == 1);
  CHECK(share.capacity() == plan.gpus[1].tiers[0].reserved);
  const std::size_t capacity = share.capacity();
  auto* a = static_cast<unsigned char*>(share.allocate(2 * MiB, 2 * MiB));
  CHECK(reinterpret_cast<std::uintptr_t>(a) % (2 * MiB) == 0);
  std::memset(a, 0x33, 2 * MiB);
  CHECK(share.free_bytes() == capacity - 2 * MiB);
  CHECK(share.try_allocate(capacity, 4096).error() == carve::Errc::no_space); // past the reservation
  CHECK(share.free_bytes() == capacity - 2 * MiB);                            // and nothing changed
  share.deallocate(a, 2 * MiB, 2 * MiB);
  CHECK(share.free_bytes() == capacity);
  CHECK_THROWS_ERRC(carve::Errc::out_of_range, carve::TierShareResource(plan, 2, 0));
  CHECK_THROWS_ERRC(carve::Errc::out_of_range, carve::TierShareResource(plan, 0, 1));
  CHECK_THROWS_ERRC(carve::Errc::out_of_range, carve::GpuSpill(plan, 2)); // a bad index, not a bad argument
  // A plan put together by hand whose GPU lists fewer tier uses than the plan has tiers: the
  // share and the spill read past that list before.
  carve::TierPlan uneven = plan;
  uneven.gpus[1].tiers.clear();
  CHECK_THROWS_ERRC(carve::Errc::out_of_range, carve::TierShareResource(uneven, 1, 0));
  CHECK_THROWS_ERRC(carve::Errc::out_of_range, carve::GpuSpill(uneven, 1));
  const carve::GpuSpill spill(plan, 1); // the disk tier alone: one file
  REQUIRE(spill.regions().size() == 1);
  CHECK(spill.regions().front().bytes == plan.gpus[1].tiers[0].reserved);
}

TEST_CASE("a caching pool and a PagedMirror on spill shares") {
  TempDir dir;
  const carve::TierPlanner planner({{0, 4 * MiB}, {1, 4 * MiB}}, {carve::disk_tier(dir.path, 1, "disk", 32 * MiB)});
  const auto plan = planner.plan({{40 * MiB, {20 * MiB, 20 * MiB}}}); // 16 MiB of spill each

  carve::CachingPool pool(carve::TierShareResource(plan, 0, 0));
  void* p = pool.allocate(3 * MiB, 256);
  std::memset(p, 7, 3 * MiB);
  pool.deallocate(p, 3 * MiB, 256);

  // Each GPU's disk share becomes one device of a mirror: host writes go to the files on sync.
  carve::HostMirrorBackend<carve::TierShareResource> backend;
  for (std::size_t gpu = 0; gpu < 2; ++gpu) {
    backend.register_device(carve::TierShareResource(plan, gpu, 0), {.bytes = 8 * MiB});
  }
  carve::PagedMirror mirror(backend, {.page_size = 64 << 10});
  auto* data = static_cast<std::uint32_t*>(*mirror.try_allocate(12 * MiB, 1)); // spans both devices
  for (std::size_t i = 0; i < 12 * MiB / 4; i += 1024) {
    data[i] = static_cast<std::uint32_t>(i);
  }
  REQUIRE(mirror.mark_dirty(data, 12 * MiB));
  const auto report = mirror.sync();
  REQUIRE(report);
  CHECK(report->bytes == 12 * MiB);
  std::memset(data, 0, 12 * MiB);        // forget the host copy ...
  REQUIRE(mirror.fetch(data, 12 * MiB)); // ... and read it back from the spill files
  bool intact = true;
  for (std::size_t i = 0; i < 12 * MiB / 4; i += 1024) {
    intact &= data[i] == static_cast<std::uint32_t>(i);
  }
  CHECK(intact);
}

TEST_CASE("a DRAM share on this machine's node lands there, and a GpuSpill holds every reserved byte") {
  if (!numa_here()) {
    MESSAGE("NUMA is not available here");
    return;
  }
  const auto nodes = carve::discover_memory_nodes();
  REQUIRE(!nodes.empty());
  const SpillTier dram{"dram", 64 * MiB, 1, 0, {nodes.front().id}};
  TempDir dir;
  const carve::TierPlanner planner({{0, 1 * MiB}, {1, 1 * MiB}},
                                   {dram, carve::disk_tier(dir.path, 2, "disk", 16 * MiB)});
  const auto plan = planner.plan({{80 * MiB, {40 * MiB, 40 * MiB}}}); // 39 MiB each: 32 dram + 7 disk
  const SpillNodes where{nodes.front().id, nodes};

  carve::TierShareResource share(plan, 0, 0, where);
  REQUIRE(share.parts().size() == 1);
  CHECK(share.parts()[0].node == nodes.front().id);
  auto* p = static_cast<unsigned char*>(share.allocate(4 * MiB, 4096));
  std::memset(p, 1, 4 * MiB);
#if __has_include(<numaif.h>)
  int where_node = -1;
  REQUIRE(::get_mempolicy(&where_node, nullptr, 0, p, MPOL_F_NODE | MPOL_F_ADDR) == 0);
  CHECK(where_node == nodes.front().id);
#endif
  share.deallocate(p, 4 * MiB, 4096);

  carve::GpuSpill spill(plan, 1, where);
  std::uint64_t held = 0;
  for (const carve::SpillRegion& r : spill.regions()) {
    std::memset(r.data, 0xab, r.bytes);
    held += r.bytes;
  }
  CHECK(held == plan.gpus[1].tiers[0].reserved + plan.gpus[1].tiers[1].reserved);
  CHECK(spill.regions().front().numa_node == nodes.front().id);
  CHECK(spill.regions().back().numa_node == -1);
  CHECK_THROWS_AS(carve::GpuSpill(plan, 2, where), carve::Exception);
}

} // namespace test_tier_share
