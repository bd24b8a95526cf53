#include "support/errors.hpp"
#include "support/topology_data.hpp"

#include <carve/topology.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

// In a namespace of its own: the area's test files compile as one translation unit.
namespace test_topology {

using carve::LinkType;
using carve::NodeId;
using carve::Topology;
using carve::TopologyBuilder;

namespace {

std::size_t description_error_line(const std::string& text) {
  try {
    (void)Topology::from_description(text);
  } catch (const carve::Exception& e) {
    return carve::test::message_line(e);
  }
  return 0;
}

} // namespace

TEST_CASE("parallel links add, the narrowest link bounds a path, fewer hops break ties") {
  TopologyBuilder b;
  const NodeId g0 = b.add_gpu("GPU0");
  const NodeId g1 = b.add_gpu("GPU1");
  const NodeId g2 = b.add_gpu("GPU2");
  const NodeId g3 = b.add_gpu("GPU3");
  b.add_link(g0, g1, LinkType::nvlink, 3);       // 60
  b.add_link(g1, g2, LinkType::nvlink, 1);       // 20
  b.add_link(g0, g2, LinkType::nvlink, 1, 20.0); // 20 direct: as wide as via GPU1, fewer hops
  b.add_link(g2, g3, LinkType::nvlink, 2);       // 40
  const Topology t = b.build();
  CHECK(t.path_bandwidth(g0, g1) == 60.0);
  CHECK(t.path_bandwidth(g0, g2) == 20.0);
  CHECK(t.hops(g0, g2) == 1);
  CHECK(t.path_bandwidth(g0, g3) == 20.0); // GPU0-GPU2-GPU3
  CHECK(t.hops(g0, g3) == 2);
  CHECK(t.path_bandwidth(g1, g3) == 20.0);
  CHECK(std::isinf(t.path_bandwidth(g1, g1)));
  CHECK(t.hops(g1, g1) == 0);
  CHECK(t.path(g1, g1).size() == 1);
  // No path of at most max_hops links: bandwidth 0, hops -1, empty path.
  TopologyBuilder chain;
  NodeId prev = chain.add_gpu("GPU0");
  for (int i = 1; i < 5; ++i) {
    const NodeId next = chain.add_gpu("GPU" + std::to_string(i));
    chain.add_link(prev, next, LinkType::nvlink);
    prev = next;
  }
  const Topology c2 = chain.build();
  CHECK(c2.path_bandwidth(c2.gpu(0), c2.gpu(2)) == 20.0);
  CHECK(c2.path_bandwidth(c2.gpu(0), c2.gpu(3)) == 0.0);
  CHECK(c2.hops(c2.gpu(0), c2.gpu(3)) == -1);
  CHECK(c2.path(c2.gpu(0), c2.gpu(3)).empty());
  const Topology c4 = chain.build({4});
  CHECK(c4.path_bandwidth(c4.gpu(0), c4.gpu(4)) == 20.0);
  CHECK(c4.hops(c4.gpu(0), c4.gpu(4)) == 4);
}

TEST_CASE("link lines between the same two nodes add up") {
  const Topology t = Topology::from_description("bandwidth nvlink 25\ngpu GPU0\ngpu GPU1\ngpu GPU2\n"
                                                "link GPU0 GPU1 nvlink\nlink GPU1 GPU0 nvlink\n"       // twice: 50
                                                "link GPU0 GPU2 nvlink x2\nlink GPU2 GPU0 nvlink 10\n" // 50 + 10
                                                "link GPU1 GPU2 nvlink\nlink GPU1 GPU2 pcie\n"); // types stay apart
  CHECK(t.path_bandwidth(t.gpu(0), t.gpu(1)) == 50.0);
  CHECK(t.path_bandwidth(t.gpu(0), t.gpu(2)) == 60.0);
  const Topology direct = t.with_options({1, carve::GpuRelay::never});
  CHECK(direct.path_bandwidth(direct.gpu(1), direct.gpu(2)) == 25.0); // the wider type, not the sum
  CHECK(t.links().size() == 4);
  CHECK(t.links()[0].count == 2);
  CHECK(t.links()[0].label == "nvlink+nvlink");
}

TEST_CASE("GpuRelay::never: a peer's loads take the direct path, not two NVLink hops") {
  // GPU0 -NV1- GPU2, and GPU0 -NV2- GPU3 -NV2- GPU2: a copy staged through GPU3 gets 40 GB/s, a
  // kernel on GPU0 reading GPU2's memory gets the direct link's 20.
  const std::string text = "gpu GPU0\ngpu GPU2\ngpu GPU3\nlink GPU0 GPU2 nvlink\n"
                           "link GPU0 GPU3 nvlink x2\nlink GPU3 GPU2 nvlink x2\n";
  const Topology copies = Topology::from_description(text);
  CHECK(copies.path_bandwidth(copies.gpu(0), copies.gpu(1)) == 40.0);
  CHECK(copies.hops(copies.gpu(0), copies.gpu(1)) == 2);
  const Topology loads = copies.with_options({2, carve::GpuRelay::never});
  CHECK(loads.path_bandwidth(loads.gpu(0), loads.gpu(1)) == 20.0);
  CHECK(loads.hops(loads.gpu(0), loads.gpu(1)) == 1);
  const Topology described = Topology::from_description("gpu_relay never\n" + text);
  CHECK(described.options().gpu_relay == carve::GpuRelay::never);
  CHECK(described.path_bandwidth(described.gpu(0), described.gpu(1)) == 20.0);
}

TEST_CASE("CPUs and switches relay PCIe; a GPU does not") {
  TopologyBuilder b({20.0, 16.0, 10.0});
  const NodeId cpu = b.add_cpu("CPU0");
  const NodeId sw = b.add_pcie_switch("SW0");
  const NodeId g0 = b.add_gpu("GPU0");
  const NodeId g1 = b.add_gpu("GPU1");
  const NodeId g2 = b.add_gpu("GPU2");
  b.add_link(cpu, sw, LinkType::pcie, 1, 32.0);
  b.add_link(sw, g0, LinkType::pcie);
  b.add_link(sw, g1, LinkType::pcie);
  b.add_link(g1, g2, LinkType::nvlink, 4); // 80, but GPU1 will not pass PCIe traffic on
  const Topology t = b.build({3});
  CHECK(t.path_bandwidth(g0, g1) == 16.0);
  CHECK(t.hops(g0, g1) == 2);
  CHECK(t.path_bandwidth(g0, g2) == 0.0);
  CHECK(t.path_bandwidth(cpu, g0) == 16.0);
}

TEST_CASE("GpuRelay::any_link: CPU0-GPU3-GPU0, PCIe into a GPU and on over NVLink, which the default rule forbids") {
  // GPU0's own PCIe path is narrow (x8, 8 GB/s); GPU3 has a full one and a double NVLink to GPU0.
  TopologyBuilder b({20.0, 16.0, 10.0});
  const NodeId cpu0 = b.add_cpu("CPU0");
  const NodeId g0 = b.add_gpu("GPU0");
  b.add_gpu("GPU1");
  b.add_gpu("GPU2");
  const NodeId g3 = b.add_gpu("GPU3");
  b.add_link(cpu0, g0, LinkType::pcie, 1, 8.0);
  b.add_link(cpu0, g3, LinkType::pcie);
  b.add_link(g3, g0, LinkType::nvlink, 2);
  const Topology t = b.build();
  CHECK(t.options().gpu_relay == carve::GpuRelay::nvlink_only);
  CHECK(t.path_bandwidth(cpu0, g0) == 8.0); // GPU3 does not pass PCIe traffic on to NVLink
  CHECK(t.hops(cpu0, g0) == 1);
  const Topology relay = t.with_options({2, carve::GpuRelay::any_link});
  CHECK(relay.path_bandwidth(cpu0, g0) == 16.0); // CPU0 -> GPU3 (PCIe 16) -> GPU0 (NVLink 40)
  REQUIRE(relay.path(cpu0, g0).size() == 3);
  CHECK(relay.path(cpu0, g0)[1] == g3);
  CHECK(relay.path_bandwidth(g0, cpu0) == 16.0); // and back the same way
  CHECK(relay.with_max_hops(1).path_bandwidth(cpu0, g0) == 8.0);
  CHECK(relay.with_max_hops(1).options().gpu_relay == carve::GpuRelay::any_link);
  // In a description.
  const Topology d =
      Topology::from_description("gpu_relay any\ncpu CPU0\ngpu GPU0\ngpu GPU3\n"
                                 "link CPU0 GPU0 pcie 8\nlink CPU0 GPU3 pcie\nlink GPU3 GPU0 nvlink x2\n");
  CHECK(d.options().gpu_relay == carve::GpuRelay::any_link);
  CHECK(d.path_bandwidth(*d.find("CPU0"), d.gpu(0)) == 24.0);
  CHECK(description_error_line("cpu CPU0\ngpu_relay sometimes\n") == 2);
  CHECK(description_error_line("gpu_relay\n") == 1);
}

TEST_CASE("builder mistakes throw and change nothing") {
  TopologyBuilder b;
  const NodeId g0 = b.add_gpu("GPU0");
  CHECK_THROWS_ERRC(carve::Errc::invalid_argument, b.add_gpu("GPU0"));
  CHECK_THROWS_ERRC(carve::Errc::invalid_argument, b.add_gpu("GPUx", 0));
  CHECK_THROWS_ERRC(carve::Errc::invalid_argument, b.add_cpu(""));
  CHECK_THROWS_ERRC(carve::Errc::invalid_argument, b.add_link(g0, g0, LinkType::nvlink));
  CHECK_THROWS_ERRC(carve::Errc::out_of_range, b.add_link(g0, NodeId{7}, LinkType::nvlink)); // a bad index
  CHECK_THROWS_ERRC(carve::Errc::out_of_range, b.node(NodeId{7}));
  const NodeId g1 = b.add_gpu("GPU1");
  CHECK_THROWS_ERRC(carve::Errc::invalid_argument, b.add_link(g0, g1, LinkType::nvlink, 0));
  CHECK_THROWS_ERRC(carve::Errc::invalid_argument, b.add_link(g0, g1, LinkType::nvlink, 1, -3.0));
  CHECK_THROWS_ERRC(carve::Errc::invalid_argument, b.add_link(g0, g1, LinkType::nvlink, 1, NAN));
  CHECK(b.node_count() == 2);
  CHECK_THROWS_ERRC(carve::Errc::invalid_argument, TopologyBuilder({0.0, 24.0, 10.0}));
  TopologyBuilder gap;
  gap.add_gpu("GPU0");
  gap.add_gpu("GPU2", 2);
  CHECK_THROWS_ERRC(carve::Errc::invalid_argument, gap.build());
  CHECK_THROWS_ERRC(carve::Errc::invalid_argument, b.build({0}));
  const Topology t = b.build();
  CHECK_THROWS_ERRC(carve::Errc::out_of_range, t.gpu(2));
  CHECK_THROWS_ERRC(carve::Errc::out_of_range, t.gpu(-1));
  CHECK_THROWS_ERRC(carve::Errc::out_of_range, (void)t.path_bandwidth(g0, NodeId{9}));
  CHECK_THROWS_ERRC(carve::Errc::out_of_range, t.node(NodeId{9})); // carve's exception, not std::out_of_range
  CHECK(t.node(g1).name == "GPU1");
}

TEST_CASE("a topology holds at most max_nodes nodes and max_links links: a huge description is refused, not tabled") {
  TopologyBuilder b;
  for (std::size_t i = 0; i < TopologyBuilder::max_nodes; ++i) {
    b.add_cpu("N" + std::to_string(i));
  }
  CHECK_THROWS_ERRC(carve::Errc::invalid_argument, b.add_cpu("one more"));
  CHECK(b.node_count() == TopologyBuilder::max_nodes);
  std::size_t links = 0;
  for (std::uint32_t a = 0; links < TopologyBuilder::max_links; ++a) {
    for (std::uint32_t c = a + 1; c < TopologyBuilder::max_nodes && links < TopologyBuilder::max_links; ++c, ++links) {
      b.add_link(NodeId{a}, NodeId{c}, LinkType::pcie);
    }
  }
  CHECK_THROWS_ERRC(carve::Errc::invalid_argument, b.add_link(NodeId{1000}, NodeId{1001}, LinkType::pcie));
  b.add_link(NodeId{0}, NodeId{1}, LinkType::pcie); // a parallel link is no new one
  std::string text;
  for (std::size_t i = 0; i <= TopologyBuilder::max_nodes; ++i) {
    text += "cpu C" + std::to_string(i) + "\n";
  }
  CHECK(description_error_line(text) == TopologyBuilder::max_nodes + 1);
}

TEST_CASE("two CPUs and eight GPUs in PCIe pairs, joined by NVLink, from a description") {
  const Topology t = Topology::from_description(carve::test::topology_text("seed_fig1.txt"));
  REQUIRE(t.gpu_count() == 8);
  CHECK(t.node_count() == 14);
  CHECK(t.options().max_hops == 3);
  CHECK(t.bandwidths().nvlink == 25.0);
  // GPU0's widest peers are GPU3 and GPU6 (two NVLinks each).
  CHECK(t.path_bandwidth(t.gpu(0), t.gpu(3)) == 50.0);
  CHECK(t.path_bandwidth(t.gpu(0), t.gpu(6)) == 50.0);
  CHECK(t.path_bandwidth(t.gpu(0), t.gpu(1)) == 25.0);
  CHECK(t.path_bandwidth(t.gpu(0), t.gpu(7)) == 50.0); // via GPU6 (x2, x2)
  CHECK(t.hops(t.gpu(0), t.gpu(7)) == 2);
  // CPU to CPU directly over QPI; a GPU reaches the other CPU over PCIe and QPI.
  const NodeId cpu0 = *t.find("CPU0");
  const NodeId cpu1 = *t.find("CPU1");
  CHECK(t.path_bandwidth(cpu0, cpu1) == 20.0);
  CHECK(t.path_bandwidth(t.gpu(0), cpu0) == 16.0);
  CHECK(t.path_bandwidth(t.gpu(0), cpu1) == 16.0);
  CHECK(t.hops(t.gpu(0), cpu1) == 3);
}

TEST_CASE("description mistakes give a parse error with the line") {
  CHECK(description_error_line("") == 1);
  CHECK(description_error_line("# only a comment\n") == 1);
  CHECK(description_error_line("gpu GPU0\nlink GPU0 GPU1 nvlink\n") == 2);
  CHECK(description_error_line("gpu GPU0\ngpu GPU1\nlink GPU0 GPU1 warp\n") == 3);
  CHECK(description_error_line("gpu GPU0\ngpu GPU1\nlink GPU0 GPU1 nvlink x0\n") == 3);
  CHECK(description_error_line("gpu GPU0\ngpu GPU1\nlink GPU0 GPU1 nvlink -5\n") == 3);
  CHECK(description_error_line("gpu GPU0\ngpu GPU1\nlink GPU0 GPU1 nvlink x2 5 6\n") == 3);
  CHECK(description_error_line("gpu GPU0\ngpu GPU0\n") == 2);
  CHECK(description_error_line("gpu GPU0\nbandwidth nvlink 30\n") == 2);
  CHECK(description_error_line("bandwidth sys 30\n") == 1);
  CHECK(description_error_line("max_hops 0\n") == 1);
  CHECK(description_error_line("gpu GPU0\nteleport GPU0\n") == 2);
  CHECK(description_error_line("gpu A ordinal 1\ngpu B ordinal 2\n") == 2); // gap at 0
  CHECK(description_error_line("gpu A ordinal x\n") == 1);
  // An ordinal of 10^9 is a gap, found without a table of 10^9 GPUs; link counts that add up
  // past 2^31 - 1 are refused, not wrapped; an escape left open ends at its line's end.
  CHECK(description_error_line("gpu A\ngpu B ordinal 999999999\n") == 2);
  CHECK(description_error_line("gpu A\ngpu B\nlink A B nvlink x999999999\nlink A B nvlink x999999999\n"
                               "link A B nvlink x999999999\n") == 5);
  CHECK(description_error_line("cpu A\n\x1b[1\n#c\ncpu B\nbogus\n") == 5);
  const Topology t = Topology::from_description("bandwidth nvlink 50\ngpu A ordinal 1\ngpu B\nlink A B nvlink x3\n");
  CHECK(t.node(t.gpu(1)).name == "A");
  CHECK(t.node(t.gpu(0)).name == "B");
  CHECK(t.path_bandwidth(t.gpu(0), t.gpu(1)) == 150.0);
}

namespace {

// Brute force: every simple path of at most `max_hops` links, with the relay rules spelled out.
struct BruteForce {
  const Topology& t;
  int max_hops;
  std::vector<double> bw;
  std::vector<int> hops;
  std::vector<bool> on_path;
  bool gpu_relays_any = false;

  bool relays(NodeId at, LinkType in, LinkType out) const {
    switch (t.node(at).kind) {
    case carve::NodeKind::gpu:
      return gpu_relays_any || (in == LinkType::nvlink && out == LinkType::nvlink);
    case carve::NodeKind::nic:
      return false;
    default:
      return true;
    }
  }
  void walk(NodeId at, std::optional<LinkType> in, double width, int depth) {
    if (depth == max_hops) {
      return;
    }
    on_path[at.value] = true;
    for (const carve::Link& l : t.links()) {
      if (l.a != at && l.b != at) {
        continue;
      }
      const NodeId next = l.a == at ? l.b : l.a;
      if (on_path[next.value] || (in && !relays(at, *in, l.type))) {
        continue;
      }
      const double w = std::min(width, l.bandwidth());
      if (w > bw[next.value] || (w == bw[next.value] && depth + 1 < hops[next.value])) {
        bw[next.value] = w;
        hops[next.value] = depth + 1;
      }
      walk(next, l.type, w, depth + 1);
    }
    on_path[at.value] = false;
  }
};

} // namespace

TEST_CASE("all-pairs paths match a brute-force search on random machines") {
  std::mt19937 rng(42);
  const carve::NodeKind kinds[] = {carve::NodeKind::cpu,     carve::NodeKind::gpu,         carve::NodeKind::gpu,
                                   carve::NodeKind::gpu,     carve::NodeKind::pcie_switch, carve::NodeKind::nic,
                                   carve::NodeKind::nvswitch};
  const LinkType types[] = {LinkType::nvlink, LinkType::nvlink, LinkType::pcie, LinkType::system,
                            LinkType::inter_socket};
  for (int round = 0; round < 300; ++round) {
    TopologyBuilder b;
    const int nodes = 3 + static_cast<int>(rng() % 6);
    for (int i = 0; i < nodes; ++i) {
      std::string name = std::to_string(i); // not "N" + ...: GCC 12 -O3 warns falsely (-Wrestrict)
      name.insert(name.begin(), 'N');
      b.add(kinds[rng() % std::size(kinds)], name);
    }
    const int links = static_cast<int>(rng() % 14);
    for (int l = 0; l < links; ++l) {
      const auto a = static_cast<std::uint32_t>(rng() % static_cast<unsigned>(nodes));
      const auto z = static_cast<std::uint32_t>(rng() % static_cast<unsigned>(nodes));
      if (a != z) {
        b.add_link(NodeId{a}, NodeId{z}, types[rng() % std::size(types)], 1 + static_cast<int>(rng() % 3),
                   static_cast<double>(5 * (1 + rng() % 4)));
      }
    }
    const int max_hops = 1 + static_cast<int>(rng() % 4);
    const bool any = round % 3 == 2;
    const Topology t = b.build({max_hops, any ? carve::GpuRelay::any_link : carve::GpuRelay::nvlink_only});
    for (std::uint32_t s = 0; s < static_cast<std::uint32_t>(nodes); ++s) {
      BruteForce bf{t,
                    max_hops,
                    std::vector<double>(t.node_count(), 0.0),
                    std::vector<int>(t.node_count(), -1),
                    std::vector<bool>(t.node_count(), false),
                    any};
      bf.walk(NodeId{s}, std::nullopt, std::numeric_limits<double>::infinity(), 0);
      for (std::uint32_t d = 0; d < static_cast<std::uint32_t>(nodes); ++d) {
        if (d == s) {
          continue;
        }
        CHECK(t.path_bandwidth(NodeId{s}, NodeId{d}) == bf.bw[d]);
        CHECK(t.hops(NodeId{s}, NodeId{d}) == bf.hops[d]);
        const auto path = t.path(NodeId{s}, NodeId{d});
        if (bf.hops[d] >= 0) {
          REQUIRE(path.size() == static_cast<std::size_t>(bf.hops[d]) + 1);
          CHECK(path.front() == NodeId{s});
          CHECK(path.back() == NodeId{d});
          std::vector<bool> seen(t.node_count(), false);
          for (const NodeId n : path) {
            CHECK_FALSE(seen[n.value]); // a simple path
            seen[n.value] = true;
          }
        }
      }
    }
  }
}

// What discover_topology() does with the answers of the CUDA runtime and NVML, fed by hand.
namespace {

using carve::count_nvlinks;
using carve::GpuLinkTable;
using carve::GpuPairLinks;
using carve::topology_from_gpu_links;
constexpr int sw = carve::nvlink_to_switch;

double gbps(const Topology& t, int a, int b) { return t.path_bandwidth(t.gpu(a), t.gpu(b)); }

// The one link between two GPUs (topology_from_gpu_links makes one per pair).
const carve::Link& link_between(const Topology& t, int a, int b) {
  for (const carve::Link& l : t.links()) {
    if ((l.a == t.gpu(a) && l.b == t.gpu(b)) || (l.a == t.gpu(b) && l.b == t.gpu(a))) {
      return l;
    }
  }
  throw std::logic_error("no link");
}

// A table where every pair with NVLinks also has peer access and native atomics, and every
// other pair has no peer access (as across the sockets of a DGX).
GpuLinkTable table_from_counts(const std::vector<std::vector<int>>& counts) {
  GpuLinkTable t(static_cast<int>(counts.size()));
  t.set_nvlinks(counts);
  for (int a = 0; a < t.gpu_count(); ++a) {
    for (int b = a + 1; b < t.gpu_count(); ++b) {
      GpuPairLinks& p = t.pair(a, b);
      p.peer_access = p.native_atomics = *p.nvlinks > 0;
    }
  }
  return t;
}

} // namespace

TEST_CASE("NVLink counts: bonded direct links, both ends agreeing, NVSwitch links as the smaller side") {
  // Two GPUs joined by a bridge of two links.
  CHECK(count_nvlinks({{1, 1}, {0, 0}}) == std::vector<std::vector<int>>{{0, 2}, {2, 0}});
  // The ends disagree (one link reported down at one end): only links both ends report count.
  CHECK(count_nvlinks({{1, 1}, {0}}) == std::vector<std::vector<int>>{{0, 1}, {1, 0}});
  // DGX A100: every GPU has 12 NVLinks, all into the NVSwitches: NV12 between every pair.
  std::vector<std::vector<int>> a100(8, std::vector<int>(12, sw));
  auto counts = count_nvlinks(a100);
  for (int a = 0; a < 8; ++a) {
    for (int b = 0; b < 8; ++b) {
      CHECK(counts[static_cast<std::size_t>(a)][static_cast<std::size_t>(b)] == (a == b ? 0 : 12));
    }
  }
  // One of GPU3's links is down: its pairs are NV11, the rest stay NV12.
  a100[3].pop_back();
  counts = count_nvlinks(a100);
  CHECK(counts[3][5] == 11);
  CHECK(counts[5][3] == 11);
  CHECK(counts[4][5] == 12);
  // Direct links and switch links add: one direct, two and three into switches.
  CHECK(count_nvlinks({{1, sw, sw}, {0, sw, sw, sw}})[0][1] == 3);
  // A GPU with no NVLinks (NVML could not name it) has none with anyone.
  CHECK(count_nvlinks({{sw, sw}, {}})[0][1] == 0);
  CHECK_THROWS_ERRC(carve::Errc::invalid_argument, count_nvlinks({{2}, {0}})); // no GPU 2
  CHECK_THROWS_ERRC(carve::Errc::invalid_argument, count_nvlinks({{0}, {0}})); // GPU0 to itself
  CHECK_THROWS_ERRC(carve::Errc::invalid_argument, count_nvlinks({{-2}, {}}));
}

TEST_CASE("GPU links -> Topology: DGX-1 V100 NVLink counts give the same paths as its nvidia-smi matrix") {
  // Each GPU's NVLinks and the GPU at their far end, as NVML lists them (NV2 = two entries).
  const std::vector<std::vector<int>> far_ends{
      {1, 2, 3, 3, 4, 4}, {0, 2, 2, 3, 5, 5}, {0, 1, 1, 3, 3, 6}, {0, 0, 1, 2, 2, 7},
      {0, 0, 5, 6, 7, 7}, {1, 1, 4, 6, 6, 7}, {2, 4, 5, 5, 7, 7}, {3, 4, 4, 5, 6, 6},
  };
  const Topology from_links = topology_from_gpu_links(table_from_counts(count_nvlinks(far_ends)));
  const Topology& smi = carve::test::dgx1();
  REQUIRE(from_links.gpu_count() == 8);
  CHECK(from_links.node_count() == 8);
  for (int a = 0; a < 8; ++a) {
    for (int b = 0; b < 8; ++b) {
      CAPTURE(a);
      CAPTURE(b);
      CHECK(gbps(from_links, a, b) == gbps(smi, a, b));
      CHECK(from_links.hops(from_links.gpu(a), from_links.gpu(b)) == smi.hops(smi.gpu(a), smi.gpu(b)));
    }
  }
  CHECK(gbps(from_links, 0, 3) == 40.0); // NV2
  CHECK(gbps(from_links, 0, 7) == 40.0); // NV2 + NV2 through GPU4
  CHECK(gbps(from_links, 0, 5) == 20.0);
  CHECK(link_between(from_links, 0, 3).label == "NV2 rank 0");
  CHECK(link_between(from_links, 0, 3).count == 2);
  CHECK(link_between(from_links, 0, 5).type == LinkType::system);
  CHECK(link_between(from_links, 0, 5).label == "no peer access");

  // Without NVML the runtime only says "peer access with native atomics": every NVLink pair
  // becomes one link, so NV2 pairs are undercounted (what counting with NVML fixes).
  GpuLinkTable runtime_only = table_from_counts(count_nvlinks(far_ends));
  for (int a = 0; a < 8; ++a) {
    for (int b = a + 1; b < 8; ++b) {
      runtime_only.pair(a, b).nvlinks.reset();
    }
  }
  const Topology undercounted = topology_from_gpu_links(runtime_only);
  CHECK(gbps(undercounted, 0, 3) == 20.0);
  CHECK(link_between(undercounted, 0, 3).label == "NV1 rank 0");
  CHECK(gbps(undercounted, 0, 5) == 20.0);
}

TEST_CASE("GPU links -> Topology: NV12 and NV18 through NVSwitches match the DGX A100 and HGX H100 matrices") {
  const auto all_switch = [](std::size_t links) {
    return std::vector<std::vector<int>>(8, std::vector<int>(links, sw));
  };
  const Topology a100 = topology_from_gpu_links(table_from_counts(count_nvlinks(all_switch(12))));
  const Topology a100_smi = Topology::from_nvidia_smi(carve::test::topology_text("dgx_a100.txt"));
  const Topology h100 = topology_from_gpu_links(table_from_counts(count_nvlinks(all_switch(18))), {25.0, 24.0, 10.0});
  const Topology h100_smi = Topology::from_nvidia_smi(carve::test::topology_text("hgx_h100.txt"), {25.0, 24.0, 10.0});
  for (int a = 0; a < 8; ++a) {
    for (int b = 0; b < 8; ++b) {
      if (a != b) {
        CHECK(gbps(a100, a, b) == 240.0);
        CHECK(gbps(a100, a, b) == gbps(a100_smi, a, b));
        CHECK(gbps(h100, a, b) == 450.0); // 18 links x 25 GB/s (NVLink 4)
        CHECK(gbps(h100, a, b) == gbps(h100_smi, a, b));
        CHECK(h100.hops(h100.gpu(a), h100.gpu(b)) == 1);
      }
    }
  }
  CHECK(link_between(a100, 2, 6).label == "NV12 rank 0");
  CHECK(link_between(h100, 7, 0).label == "NV18 rank 0");
}

TEST_CASE("GPU links -> Topology: NVLink-bridged pairs mixed with PCIe peers and no peer access") {
  // Four PCIe cards in two NVLink-bridged pairs (0-1, 2-3, NV2 each); 0-2 and 1-3 share a PCIe
  // switch (peer access, rank 1); 0-3 and 1-2 sit on different sockets (no peer access).
  GpuLinkTable t(4);
  t.pair(0, 1) = GpuPairLinks{true, true, 0, 2};
  t.pair(2, 3) = GpuPairLinks{true, true, 0, 2};
  t.pair(0, 2) = GpuPairLinks{true, false, 1, 0};
  t.pair(1, 3) = GpuPairLinks{true, false, 1, 0};
  t.pair(0, 3) = GpuPairLinks{false, false, 0, 0};
  t.pair(1, 2) = GpuPairLinks{false, false, 0, 0};
  CHECK(&t.pair(3, 0) == &t.pair(0, 3));
  const Topology topo = topology_from_gpu_links(t); // 20 per NVLink, 24 per PCIe path, 10 across sockets
  CHECK(link_between(topo, 0, 1).label == "NV2 rank 0");
  CHECK(link_between(topo, 0, 2).type == LinkType::pcie);
  CHECK(link_between(topo, 0, 2).label == "PCIe peer rank 1");
  CHECK(link_between(topo, 0, 3).type == LinkType::system);
  CHECK(gbps(topo, 0, 1) == 40.0);
  CHECK(gbps(topo, 0, 2) == 24.0);
  // 0-3: directly across the sockets (10); 0 -> 2 -> 3 would be 24, but GPU2 does not pass
  // PCIe traffic on to NVLink, unless GPUs may relay any link.
  CHECK(gbps(topo, 0, 3) == 10.0);
  CHECK(topo.hops(topo.gpu(0), topo.gpu(3)) == 1);
  const Topology relay = topology_from_gpu_links(t, {}, {2, carve::GpuRelay::any_link});
  CHECK(gbps(relay, 0, 3) == 24.0);
  CHECK(relay.hops(relay.gpu(0), relay.gpu(3)) == 2);

  // Mistakes.
  CHECK_THROWS_ERRC(carve::Errc::invalid_argument, GpuLinkTable(0));
  CHECK_THROWS_ERRC(carve::Errc::out_of_range, (void)t.pair(1, 1));
  CHECK_THROWS_ERRC(carve::Errc::out_of_range, (void)t.pair(0, 4));
  CHECK_THROWS_ERRC(carve::Errc::invalid_argument, t.set_nvlinks({{0, 1}, {1, 0}}));
  CHECK_THROWS_ERRC(carve::Errc::invalid_argument, t.set_nvlinks({{0}, {0}, {0}, {0}}));
  t.pair(1, 2).nvlinks = -1;
  CHECK_THROWS_ERRC(carve::Errc::invalid_argument, (void)topology_from_gpu_links(t));
}

} // namespace test_topology
