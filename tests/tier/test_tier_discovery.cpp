// Tier discovery from a fake sysfs tree, disk tiers, and memory behind a plan: a NUMA node here
// and a mapped file, with bytes written and read back.
#include "support/errors.hpp"

#include <carve/mr.hpp>
#include <carve/tier.hpp>

#include <doctest/doctest.h>

#if __has_include(<numaif.h>)
#include <numaif.h>
#endif

#include <sched.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

// In a namespace of its own: the area's test files compile as one translation unit.
namespace test_tier_discovery {

namespace fs = std::filesystem;

namespace {

// A temporary directory removed at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("carve-test-" + std::to_string(std::random_device{}()));
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

void write(const fs::path& file, const std::string& text) {
  fs::create_directories(file.parent_path());
  std::ofstream(file) << text;
}

// `more` is further "Key: kB" lines of the node's meminfo.
void fake_node(const fs::path& sysfs, int id, const std::string& cpus, std::uint64_t total_kb, std::uint64_t free_kb,
               const std::vector<std::pair<std::string, std::uint64_t>>& more = {}) {
  const fs::path node = sysfs / "devices/system/node" / ("node" + std::to_string(id));
  write(node / "cpulist", cpus + "\n");
  const std::string n = "Node " + std::to_string(id) + " ";
  std::string info = n + "MemTotal:       " + std::to_string(total_kb) + " kB\n" + n +
                     "MemFree:        " + std::to_string(free_kb) + " kB\n" + n +
                     "MemUsed:        " + std::to_string(total_kb - free_kb) + " kB\n";
  for (const auto& [key, kb] : more) {
    info += n + key + ":   " + std::to_string(kb) + " kB\n";
  }
  write(node / "meminfo", info);
}

} // namespace

TEST_CASE("CPU-less nodes become the CXL tier") {
  TempDir sys;
  fake_node(sys.path, 0, "0-7", 64 << 20, 60 << 20);
  fake_node(sys.path, 1, "8-15", 64 << 20, 50 << 20);
  fake_node(sys.path, 2, "", 256 << 20, 250 << 20); // CXL expander
  fake_node(sys.path, 3, "16-17", 0, 0);            // CPUs only: no memory, no tier
  write(sys.path / "devices/system/node/online", "0-3\n");
  const auto nodes = carve::discover_memory_nodes(sys.path);
  REQUIRE(nodes.size() == 3);
  CHECK(nodes[2].id == 2);
  CHECK_FALSE(nodes[2].has_cpus);
  CHECK(nodes[2].total_bytes == (256ull << 30));
  CHECK(nodes[2].free_bytes == (250ull << 30));
  const auto tiers = carve::memory_tiers(nodes);
  REQUIRE(tiers.size() == 2);
  CHECK(tiers[0].name == "dram");
  CHECK(tiers[0].capacity == (110ull << 30));
  CHECK(tiers[0].numa_nodes == std::vector<int>{0, 1});
  CHECK(tiers[0].priority == 1);
  CHECK(tiers[1].name == "cxl");
  CHECK(tiers[1].numa_nodes == std::vector<int>{2});
  CHECK(tiers[1].priority == 2);
}

TEST_CASE("tiers are sized by available memory, not by MemFree") {
  // A 24 GiB machine whose page cache holds 19 GiB: MemFree says 1 GiB, a user means 21.
  TempDir sys;
  constexpr std::uint64_t gib_kb = 1 << 20;
  fake_node(sys.path, 0, "0-1", 24 * gib_kb, 1 * gib_kb,
            {{"Active(file)", 10 * gib_kb}, {"Inactive(file)", 9 * gib_kb}, {"KReclaimable", gib_kb}});
  fake_node(sys.path, 1, "2-3", 8 * gib_kb, 1 * gib_kb, {{"Inactive(file)", 20 * gib_kb}}); // more than it has
  const auto nodes = carve::discover_memory_nodes(sys.path);
  REQUIRE(nodes.size() == 2);
  CHECK(nodes[0].free_bytes == (1ull << 30));
  CHECK(nodes[0].available_bytes == (21ull << 30));
  CHECK(nodes[1].available_bytes == (8ull << 30)); // never more than MemTotal
  CHECK(carve::memory_tiers(nodes)[0].capacity == (29ull << 30));
  CHECK(carve::memory_tiers(nodes, 16ull << 30)[0].capacity == (16ull << 30)); // a cap the user gives
}

TEST_CASE("the kernel's memory tiers are used when every node has one") {
  TempDir sys;
  fake_node(sys.path, 0, "0-3", 1 << 20, 1 << 20);
  fake_node(sys.path, 1, "", 4 << 20, 4 << 20);
  write(sys.path / "devices/virtual/memory_tiering/memory_tier4/nodelist", "0\n");
  write(sys.path / "devices/virtual/memory_tiering/memory_tier22/nodelist", "1\n");
  const auto tiers = carve::memory_tiers(carve::discover_memory_nodes(sys.path));
  REQUIRE(tiers.size() == 2);
  CHECK(tiers[0].name == "memory_tier4");
  CHECK(tiers[1].name == "memory_tier22");
  CHECK(tiers[1].capacity == (4ull << 30));
}

TEST_CASE("a node number too large for an int is carve's error, not std::out_of_range") {
  TempDir sys;
  fake_node(sys.path, 0, "0-3", 1 << 20, 1 << 20);
  write(sys.path / "devices/system/node/node99999999999/meminfo", "Node 0 MemTotal: 10 kB\n");
  CHECK(carve::test::thrown_code([&] { (void)carve::discover_memory_nodes(sys.path); }) ==
        carve::Errc::invalid_argument);
}

TEST_CASE("broken sysfs data is reported with the file") {
  TempDir sys;
  CHECK_THROWS_AS(carve::discover_memory_nodes(sys.path), carve::Exception); // no node directory
  fake_node(sys.path, 0, "0-x", 1 << 20, 1 << 20);
  CHECK_THROWS_WITH_AS(carve::discover_memory_nodes(sys.path), doctest::Contains("malformed id list '0-x'"),
                       carve::Exception);
  // Trailing text on either end, and a range up to INT_MAX (which once looped past it), are malformed.
  for (const char* list : {"0x-3", "0-3x", "0-2147483647"}) {
    CAPTURE(list);
    fake_node(sys.path, 0, list, 1 << 20, 1 << 20);
    CHECK_THROWS_WITH_AS(carve::discover_memory_nodes(sys.path), doctest::Contains("malformed id list"),
                         carve::Exception);
  }
  fake_node(sys.path, 0, "0-3", 1 << 20, 1 << 20);
  fs::remove(sys.path / "devices/system/node/node0/meminfo");
  CHECK_THROWS_WITH_AS(carve::discover_memory_nodes(sys.path), doctest::Contains("cannot read"), carve::Exception);
  write(sys.path / "devices/system/node/node0/meminfo", "Node 0 MemFree: 10 kB\n");
  CHECK_THROWS_WITH_AS(carve::discover_memory_nodes(sys.path), doctest::Contains("no MemTotal"), carve::Exception);
  fake_node(sys.path, 0, "0-3", 1 << 20, 1 << 20);
  fs::remove(sys.path / "devices/system/node/node0/cpulist");
  fs::create_directory(sys.path / "devices/system/node/node0/cpulist"); // unreadable as a file, even for root
  CHECK_THROWS_WITH_AS(carve::discover_memory_nodes(sys.path), doctest::Contains("cannot read"), carve::Exception);
  fake_node(sys.path, 1, "", 1 << 20, 1 << 20);
  fs::remove_all(sys.path / "devices/system/node/node0");
  write(sys.path / "devices/virtual/memory_tiering/memory_tierX/nodelist", "1\n");
  CHECK_THROWS_WITH_AS(carve::discover_memory_nodes(sys.path), doctest::Contains("want memory_tier<N>"),
                       carve::Exception);
}

TEST_CASE("this machine's nodes") {
  if (!fs::is_directory("/sys/devices/system/node")) {
    MESSAGE("no NUMA information in /sys here");
    return;
  }
  const auto nodes = carve::discover_memory_nodes();
  REQUIRE_FALSE(nodes.empty());
  CHECK(nodes[0].total_bytes > 0);
  CHECK(nodes[0].free_bytes <= nodes[0].total_bytes);
}

TEST_CASE("a disk tier is a directory") {
  TempDir dir;
  const auto tier = carve::disk_tier(dir.path, 3);
  CHECK(carve::disk_tier(dir.path, 3, "small", 1 << 20).capacity == (1u << 20)); // a tier need not take the disk
  CHECK(tier.capacity > 0);
  CHECK(tier.directory == dir.path.string());
  CHECK_THROWS_WITH_AS(carve::disk_tier(dir.path / "missing", 3), doctest::Contains("is not a directory"),
                       carve::Exception);
}

TEST_CASE("a mapped file holds what is written to it, within its budget") {
  TempDir dir;
  constexpr std::size_t bytes = 3 << 20;
  carve::MappedFileResource file(dir.path, bytes + 4096);
  auto* p = static_cast<unsigned char*>(file.allocate(bytes, 64));
  for (std::size_t i = 0; i < bytes; ++i) {
    p[i] = static_cast<unsigned char>(i * 7);
  }
  bool same = true;
  for (std::size_t i = 0; i < bytes; ++i) {
    same &= p[i] == static_cast<unsigned char>(i * 7);
  }
  CHECK(same);
  CHECK(fs::is_empty(dir.path)); // unlinked at once: nothing left behind
  CHECK(file.free_bytes() == 4096);
  CHECK(file.try_allocate(8192, 64).error() == carve::Errc::no_space); // past the budget
  CHECK(file.try_allocate(0, 64).error() == carve::Errc::invalid_size);
  CHECK(file.try_allocate(64, 3).error() == carve::Errc::invalid_size);                // not a power of two
  CHECK(file.try_allocate(64, std::size_t{2} << 30).error() == carve::Errc::no_space); // alignment beyond 1 GiB
  CHECK_THROWS_ERRC(carve::Errc::no_space, file.allocate(8192, 64));
  file.deallocate(p, bytes, 64);
  CHECK(file.free_bytes() == bytes + 4096);
  CHECK_THROWS_AS(carve::MappedFileResource(dir.path / "missing", 1), carve::Exception);
}

// Runs `body` in a child process inside its own mount namespace with a 4 MiB tmpfs at `dir`;
// its exit code is the result. Nothing when this process may not mount (not root).
template <class Body>
std::optional<int> on_tiny_filesystem(const fs::path& dir, Body body) {
  const pid_t child = ::fork();
  if (child == 0) {
    if (::unshare(CLONE_NEWNS) != 0 || ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        ::mount("carve-test", dir.c_str(), "tmpfs", 0, "size=4m") != 0) {
      ::_exit(77);
    }
    ::_exit(body());
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 77) {
    return std::nullopt;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST_CASE("a disk tier holds real blocks: a full disk is no_space, not a SIGBUS later") {
  TempDir dir;
  const auto result = on_tiny_filesystem(dir.path, [&] {
    carve::MappedFileResource file(dir.path, 64 << 20); // the budget promises more than the disk has
    const auto refused = [&](std::size_t bytes) {
      const auto p = file.try_allocate(bytes, 4096);
      return !p && p.error() == carve::Errc::no_space;
    };
    if (!refused(8 << 20)) {
      return 1; // a sparse file would have been granted
    }
    auto* a = static_cast<unsigned char*>(*file.try_allocate(3 << 20, 4096));
    std::memset(a, 0x5a, 3 << 20); // every byte has a block behind it
    if (!refused(3 << 20)) {
      return 2;
    }
    if (file.free_bytes() != (61u << 20)) {
      return 3; // a refused call gives its budget back
    }
    file.deallocate(a, 3 << 20, 4096);
    return file.try_allocate(3 << 20, 4096) ? 0 : 4; // the space came back
  });
  if (!result) {
    MESSAGE("skipped: mounting a small tmpfs needs root");
    return;
  }
  CHECK(*result == 0);
}

TEST_CASE("large alignments: the slack is trimmed, the mapping is aligned and whole") {
  TempDir dir;
  carve::MappedFileResource file(dir.path, 64 << 20);
  for (const std::size_t alignment : {std::size_t{4096}, std::size_t{64} << 10, std::size_t{2} << 20}) {
    auto* p = static_cast<unsigned char*>(file.allocate(3 << 20, alignment));
    CHECK(reinterpret_cast<std::uintptr_t>(p) % alignment == 0);
    std::memset(p, 0x5a, 3 << 20);
    CHECK(p[(3 << 20) - 1] == 0x5a);
    file.deallocate(p, 3 << 20, alignment);
  }
  CHECK(file.free_bytes() == (64u << 20));
}

TEST_CASE("a caching pool on a disk tier") {
  TempDir dir;
  carve::CachingPool pool(carve::MappedFileResource(dir.path, 8 << 20));
  void* a = pool.allocate(1 << 20, 256);
  void* b = pool.allocate(2 << 20, 256);
  std::memset(a, 1, 1 << 20);
  std::memset(b, 2, 2 << 20);
  CHECK(static_cast<unsigned char*>(b)[(2 << 20) - 1] == 2);
  pool.deallocate(a, 1 << 20, 256);
  pool.deallocate(b, 2 << 20, 256);
}

#if __has_include(<numa.h>)
TEST_CASE("memory on NUMA node 0 round-trips and lives on node 0") {
  if (::numa_available() < 0) {
    MESSAGE("NUMA is not available here");
    return;
  }
  constexpr std::size_t bytes = 4 << 20;
  carve::NumaNodeResource node0(0, bytes);
  auto* p = static_cast<std::uint64_t*>(node0.allocate(bytes, 4096));
  for (std::size_t i = 0; i < bytes / 8; ++i) {
    p[i] = i * 0x9e3779b97f4a7c15ull;
  }
  bool same = true;
  for (std::size_t i = 0; i < bytes / 8; ++i) {
    same &= p[i] == i * 0x9e3779b97f4a7c15ull;
  }
  CHECK(same);
  int where = -1;
  REQUIRE(::get_mempolicy(&where, nullptr, 0, p, MPOL_F_NODE | MPOL_F_ADDR) == 0);
  CHECK(where == 0);
  CHECK(node0.try_allocate(4096, 4096).error() == carve::Errc::no_space); // the budget is spent
  node0.deallocate(p, bytes, 4096);
  CHECK(node0.free_bytes() == bytes);
  CHECK_THROWS_AS(carve::NumaNodeResource(::numa_max_node() + 1, 1), carve::Exception);
}

// Pages of [p, p + bytes) that are in memory now.
std::size_t resident_pages(void* p, std::size_t bytes) {
  const std::size_t page = carve::os_page_size();
  std::vector<unsigned char> in(bytes / page);
  REQUIRE(::mincore(p, bytes, in.data()) == 0);
  return static_cast<std::size_t>(std::count_if(in.begin(), in.end(), [](unsigned char v) { return v & 1; }));
}

TEST_CASE("node memory is there when it is handed out, unless the user asks for a plan") {
  if (::numa_available() < 0) {
    MESSAGE("NUMA is not available here");
    return;
  }
  constexpr std::size_t bytes = 4 << 20;
  carve::NumaNodeResource populated(0, bytes);
  CHECK(populated.backing() == carve::MemoryBacking::populate);
  void* p = populated.allocate(bytes, 4096);
  CHECK(resident_pages(p, bytes) == bytes / carve::os_page_size());
  int where = -1;
  REQUIRE(::get_mempolicy(&where, nullptr, 0, p, MPOL_F_NODE | MPOL_F_ADDR) == 0);
  CHECK(where == 0);
  populated.deallocate(p, bytes, 4096);

  carve::NumaNodeResource planned(0, bytes, carve::MemoryBacking::on_first_touch);
  void* q = planned.allocate(bytes, 4096);
  CHECK(resident_pages(q, bytes) == 0);
  planned.deallocate(q, bytes, 4096);
}

TEST_CASE("a plan backed by real memory: DRAM on node 0 and a disk file") {
  TempDir dir;
  const std::vector<carve::SpillTier> tiers = {{"dram", 8 << 20, 1, 0, {0}},
                                               carve::disk_tier(dir.path, 2, "disk", 16 << 20)};
  const carve::TierPlanner planner({{0, 1 << 20}, {1, 1 << 20}}, tiers);
  const auto plan = planner.plan({{12 << 20, {6 << 20, 6 << 20}}}); // extras 5 MiB each: 4 MiB dram + 1 MiB disk
  carve::GpuSpill spill(plan, 0);
  REQUIRE(spill.regions().size() == 2);
  CHECK(spill.regions()[0].numa_node == 0);
  CHECK(spill.regions()[0].bytes == (4u << 20));
  CHECK(spill.regions()[1].numa_node == -1);
  for (const auto& r : spill.regions()) {
    std::memset(r.data, 0xab, r.bytes);
    CHECK(static_cast<unsigned char*>(r.data)[r.bytes - 1] == 0xab);
  }
}
#endif

} // namespace test_tier_discovery
