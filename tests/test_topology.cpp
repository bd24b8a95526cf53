#include "topology_data.hpp"

#include <carve/carve.hpp>

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

using carve::LinkType;
using carve::NodeId;
using carve::ParseError;
using carve::Topology;
using carve::TopologyBuilder;

namespace {

std::size_t description_error_line(const std::string& text) {
  try {
    (void)Topology::from_description(text);
  } catch (const ParseError& e) {
    return e.line();
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

TEST_CASE("builder mistakes throw and change nothing") {
  TopologyBuilder b;
  const NodeId g0 = b.add_gpu("GPU0");
  CHECK_THROWS_AS(b.add_gpu("GPU0"), std::invalid_argument);
  CHECK_THROWS_AS(b.add_gpu("GPUx", 0), std::invalid_argument);
  CHECK_THROWS_AS(b.add_cpu(""), std::invalid_argument);
  CHECK_THROWS_AS(b.add_link(g0, g0, LinkType::nvlink), std::invalid_argument);
  CHECK_THROWS_AS(b.add_link(g0, NodeId{7}, LinkType::nvlink), std::invalid_argument);
  const NodeId g1 = b.add_gpu("GPU1");
  CHECK_THROWS_AS(b.add_link(g0, g1, LinkType::nvlink, 0), std::invalid_argument);
  CHECK_THROWS_AS(b.add_link(g0, g1, LinkType::nvlink, 1, -3.0), std::invalid_argument);
  CHECK_THROWS_AS(b.add_link(g0, g1, LinkType::nvlink, 1, NAN), std::invalid_argument);
  CHECK(b.node_count() == 2);
  CHECK_THROWS_AS(TopologyBuilder({0.0, 24.0, 10.0}), std::invalid_argument);
  TopologyBuilder gap;
  gap.add_gpu("GPU0");
  gap.add_gpu("GPU2", 2);
  CHECK_THROWS_AS(gap.build(), std::invalid_argument);
  CHECK_THROWS_AS(b.build({0}), std::invalid_argument);
  const Topology t = b.build();
  CHECK_THROWS_AS(t.gpu(2), std::out_of_range);
  CHECK_THROWS_AS(t.gpu(-1), std::out_of_range);
  CHECK_THROWS_AS((void)t.path_bandwidth(g0, NodeId{9}), std::out_of_range);
}

TEST_CASE("the seed's Fig. 1 board from a description") {
  const Topology t = Topology::from_description(carve::test::topology_text("seed_fig1.txt"));
  REQUIRE(t.gpu_count() == 8);
  CHECK(t.node_count() == 14);
  CHECK(t.options().max_hops == 3);
  CHECK(t.bandwidths().nvlink == 25.0);
  // GPU0's widest peers are GPU3 and GPU6 (two NVLinks each), as in the seed's experiment.
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

TEST_CASE("description mistakes give ParseError with the line") {
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

  bool relays(NodeId at, LinkType in, LinkType out) const {
    switch (t.node(at).kind) {
    case carve::NodeKind::gpu:
      return in == LinkType::nvlink && out == LinkType::nvlink;
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
    const Topology t = b.build({max_hops});
    for (std::uint32_t s = 0; s < static_cast<std::uint32_t>(nodes); ++s) {
      BruteForce bf{t, max_hops, std::vector<double>(t.node_count(), 0.0), std::vector<int>(t.node_count(), -1),
                    std::vector<bool>(t.node_count(), false)};
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
