#include "support/errors.hpp"
#include "support/topology_data.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

// In a namespace of its own: the area's test files compile as one translation unit.
namespace test_nvidia_smi {

using carve::LinkType;
using carve::NodeKind;
using carve::Topology;
using carve::test::topology_text;

namespace {

double bw(const Topology& t, int a, int b) { return t.path_bandwidth(t.gpu(a), t.gpu(b)); }
int hops(const Topology& t, int a, int b) { return t.hops(t.gpu(a), t.gpu(b)); }

std::vector<std::string> path_names(const Topology& t, int a, int b) {
  std::vector<std::string> names;
  for (const carve::NodeId n : t.path(t.gpu(a), t.gpu(b))) {
    names.push_back(t.node(n).name);
  }
  return names;
}

// Parses `text` and returns the line the parse error names (0 when it parses).
std::size_t error_line(const std::string& text) {
  try {
    (void)Topology::from_nvidia_smi(text);
  } catch (const carve::Exception& e) {
    return carve::test::message_line(e);
  }
  return 0;
}

std::string error_text(const std::string& text) {
  try {
    (void)Topology::from_nvidia_smi(text);
  } catch (const carve::Exception& e) {
    return e.what();
  }
  return "";
}

// Replaces the first occurrence of `from` after position `after`.
std::string replaced(std::string s, const std::string& from, const std::string& to, std::size_t after = 0) {
  const auto at = s.find(from, after);
  REQUIRE(at != std::string::npos);
  return s.replace(at, from.size(), to);
}

} // namespace

TEST_CASE("DGX-1 V100: direct and two-hop NVLink paths, hand-checked") {
  const Topology t = Topology::from_nvidia_smi(topology_text("dgx1_v100.txt"));
  REQUIRE(t.gpu_count() == 8);
  CHECK(t.node_count() == 9);
  CHECK(t.node(*t.find("mlx5_0")).kind == NodeKind::nic);
  CHECK(t.node(t.gpu(4)).cpu_affinity == "12-23,36-47");

  // 20 GB/s per NVLink: NV2 = 40, NV1 = 20, SYS = min(24, 10) = 10.
  CHECK(bw(t, 0, 3) == 40.0); // NV2, direct
  CHECK(hops(t, 0, 3) == 1);
  CHECK(bw(t, 0, 7) == 40.0); // SYS directly, but NV2 to GPU4 and NV2 on to GPU7
  CHECK(hops(t, 0, 7) == 2);
  CHECK(path_names(t, 0, 7) == std::vector<std::string>{"GPU0", "GPU4", "GPU7"});
  CHECK(bw(t, 0, 5) == 20.0); // every two-hop NVLink path has an NV1 link on it
  CHECK(hops(t, 0, 5) == 2);
  CHECK(bw(t, 0, 1) == 20.0); // NV1 direct; a wider detour would need 3 links
  CHECK(hops(t, 0, 1) == 1);
  CHECK(bw(t, 0, 2) == 40.0); // via GPU3 (NV2, NV2) beats NV1 direct
  CHECK(path_names(t, 0, 2) == std::vector<std::string>{"GPU0", "GPU3", "GPU2"});
  for (int a = 0; a < 8; ++a) {
    for (int b = 0; b < 8; ++b) {
      CHECK(bw(t, a, b) == bw(t, b, a)); // the matrix is symmetric, so are the paths
    }
  }

  // With direct links only, GPU0-GPU7 falls back to SYS.
  const Topology direct = t.with_max_hops(1);
  CHECK(bw(direct, 0, 7) == 10.0);
  CHECK(bw(direct, 0, 5) == 10.0);
  CHECK(bw(direct, 0, 3) == 40.0);

  // Other per-link figures scale the NVLink paths and the SYS fallback.
  const Topology v100 = Topology::from_nvidia_smi(topology_text("dgx1_v100.txt"), {25.0, 16.0, 12.0});
  CHECK(bw(v100, 0, 3) == 50.0);
  CHECK(bw(v100, 0, 5) == 25.0);
  CHECK(bw(v100.with_max_hops(1), 0, 7) == 12.0);
}

TEST_CASE("a NIC does not relay and a GPU relays only NVLink to NVLink") {
  const Topology t = Topology::from_nvidia_smi(topology_text("dgx1_v100.txt"));
  const carve::NodeId nic = *t.find("mlx5_0");
  // GPU2 and GPU3 are PIX (24) to the NIC; GPU0 is NODE (24). GPU0 -> NIC -> GPU2 would be 24,
  // wider than NV1, but a NIC is an end point.
  for (int g = 0; g < 8; ++g) {
    for (const carve::NodeId n : t.path(t.gpu(0), t.gpu(g))) {
      if (g != 0) {
        CHECK(n != nic);
      }
    }
  }
  // GPU4 -> NIC is SYS (10): over NVLink to GPU2 or GPU3 and then PCIe would be 24, but a GPU
  // does not forward from NVLink onto PCIe, so only the direct SYS link counts.
  CHECK(t.path_bandwidth(t.gpu(4), nic) == 10.0);
  CHECK(t.hops(t.gpu(4), nic) == 1);
}

TEST_CASE("DGX A100 (tabs, NIC Legend, NUMA Affinity)") {
  const Topology t = Topology::from_nvidia_smi(topology_text("dgx_a100.txt"));
  REQUIRE(t.gpu_count() == 8);
  CHECK(t.node_count() == 18);
  CHECK(t.find("mlx5_9"));
  CHECK_FALSE(t.find("NIC9")); // named through the legend
  CHECK(*t.node(t.gpu(0)).numa_node == 3);
  CHECK(*t.node(t.gpu(6)).numa_node == 5);
  for (int a = 0; a < 8; ++a) {
    for (int b = 0; b < 8; ++b) {
      if (a != b) {
        CHECK(bw(t, a, b) == 240.0); // NV12 everywhere: no detour can be wider
        CHECK(hops(t, a, b) == 1);
      }
    }
  }
  const carve::NodeId nic0 = *t.find("mlx5_0");
  CHECK(t.path_bandwidth(t.gpu(0), nic0) == 24.0); // PXB
  CHECK(t.path_bandwidth(t.gpu(2), nic0) == 10.0); // SYS
}

TEST_CASE("HGX H200 (NV18, GPU NUMA ID column)") {
  const Topology t = Topology::from_nvidia_smi(topology_text("hgx_h200.txt"));
  REQUIRE(t.gpu_count() == 8);
  CHECK(t.node_count() == 16);
  CHECK(bw(t, 0, 7) == 360.0);
  CHECK(*t.node(t.gpu(5)).numa_node == 1);
  CHECK(t.node(t.gpu(5)).cpu_affinity == "64-127,192-255");
  // Same answers at 25 GB/s per link, the NVLink 4 figure: 18 x 25.
  CHECK(bw(Topology::from_nvidia_smi(topology_text("hgx_h200.txt"), {25.0, 24.0, 10.0}), 3, 4) == 450.0);
}

TEST_CASE("HGX H100 (NV18 through NVSwitches, a shell prompt first, the legend cut short)") {
  // Hand-checked against the matrix: every GPU pair is NV18 (18 bonded NVLinks), GPU0-3 on NUMA
  // node 0 (cores 0-47,96-143), GPU4-7 on node 1 (48-95,144-191); no NICs.
  const Topology t = Topology::from_nvidia_smi(topology_text("hgx_h100.txt"));
  REQUIRE(t.gpu_count() == 8);
  CHECK(t.node_count() == 8);
  CHECK(t.links().size() == 28);
  for (const carve::Link& l : t.links()) {
    CHECK(l.type == carve::LinkType::nvlink);
    CHECK(l.count == 18);
    CHECK(l.label == "NV18");
  }
  for (int a = 0; a < 8; ++a) {
    for (int b = 0; b < 8; ++b) {
      if (a != b) {
        CHECK(bw(t, a, b) == 360.0); // 18 x 20 GB/s, direct
        CHECK(hops(t, a, b) == 1);
      }
    }
    CHECK(*t.node(t.gpu(a)).numa_node == (a < 4 ? 0 : 1));
    CHECK(t.node(t.gpu(a)).cpu_affinity == (a < 4 ? "0-47,96-143" : "48-95,144-191"));
  }
  // At the NVLink 4 figure, 25 GB/s per link: 450 GB/s, H100 SXM's one-way NVLink bandwidth.
  CHECK(bw(Topology::from_nvidia_smi(topology_text("hgx_h100.txt"), {25.0, 24.0, 10.0}), 2, 6) == 450.0);
}

TEST_CASE("8-GPU PCIe box: every pair SYS, NICs without a legend keep their column names") {
  const Topology t = Topology::from_nvidia_smi(topology_text("pcie_8x_rtx4090.txt"));
  REQUIRE(t.gpu_count() == 8);
  CHECK(t.find("NIC0"));
  for (int a = 0; a < 8; ++a) {
    for (int b = 0; b < 8; ++b) {
      if (a != b) {
        CHECK(bw(t, a, b) == 10.0); // GPUs do not relay PCIe, so SYS it is
        CHECK(hops(t, a, b) == 1);
      }
    }
  }
  CHECK(t.path_bandwidth(t.gpu(6), *t.find("NIC1")) == 24.0); // PHB
}

TEST_CASE("old driver: SOC, a shell prompt before the matrix") {
  const Topology t = Topology::from_nvidia_smi(topology_text("power8_minsky_p100.txt"));
  REQUIRE(t.gpu_count() == 4);
  CHECK(bw(t, 0, 1) == 40.0);
  CHECK(bw(t, 2, 3) == 40.0);
  CHECK(bw(t, 0, 2) == 10.0); // SOC = SYS
  CHECK(t.links()[1].type == LinkType::system);
  CHECK(t.links()[1].label == "SOC");
}

TEST_CASE("terminal underlining and CRLF line ends are tolerated") {
  std::string text = topology_text("dgx1_v100.txt");
  text = "\x1b[4m" + replaced(text, "CPU Affinity", "CPU Affinity\x1b[0m");
  std::string crlf;
  for (const char c : text) {
    if (c == '\n') {
      crlf += '\r';
    }
    crlf += c;
  }
  const Topology t = Topology::from_nvidia_smi(crlf);
  CHECK(bw(t, 0, 7) == 40.0);
}

TEST_CASE("malformed matrices give a parse error with the line") {
  const std::string dgx1 = topology_text("dgx1_v100.txt"); // header on line 1, GPU0 on 2, ...

  SUBCASE("empty input") {
    CHECK(error_line("") == 1);
    CHECK(error_line("\n\n   \n") == 3);
    CHECK(error_text("").find("empty input") != std::string::npos);
  }
  SUBCASE("no header") {
    CHECK(error_line("hello\nworld\n") == 1);
    CHECK(error_line("GPU0 X NV1\nGPU1 NV1 X\n") == 1); // a row where the header should be
  }
  SUBCASE("ragged row") {
    const std::string text = replaced(dgx1, "NV2     SYS     SYS     SYS      X ", "NV2     SYS     SYS      X ");
    CHECK(error_line(text) == 6); // the GPU4 row lost a cell
    CHECK(error_text(text).find("row GPU4 has") != std::string::npos);
  }
  SUBCASE("too many cells") {
    CHECK(error_line(replaced(dgx1, "SYS      X\n", "SYS      X     PIX   4   5   6\n")) == 10);
  }
  SUBCASE("unknown code") {
    const std::string text = replaced(dgx1, "NV1", "NVX", dgx1.find("GPU3    NV2"));
    CHECK(error_line(text) == 5);
    CHECK(error_text(text).find("unknown code 'NVX'") != std::string::npos);
    CHECK(error_line(replaced(dgx1, "PIX", "P2P")) == 4);
    CHECK(error_line(replaced(dgx1, "NV1", "NV0")) == 2);
  }
  SUBCASE("asymmetric matrix") {
    // GPU0/GPU3 says NV2; make GPU3/GPU0 say NV1. The later row is the one reported.
    const std::string text = replaced(dgx1, "GPU3    NV2", "GPU3    NV1");
    CHECK(error_line(text) == 5);
    CHECK(error_text(text).find("symmetric") != std::string::npos);
  }
  SUBCASE("diagonal") {
    CHECK(error_line(replaced(dgx1, "GPU1    NV1      X ", "GPU1    NV1     NV1")) == 3);
    CHECK(error_line(replaced(dgx1, "GPU0     X      NV1", "GPU0     X       X ")) == 2);
  }
  SUBCASE("missing, misplaced and duplicate rows or columns") {
    const auto gpu7 = dgx1.find("GPU7    SYS");
    const auto nic = dgx1.find("mlx5_0  NODE");
    CHECK(error_line(dgx1.substr(0, gpu7) + dgx1.substr(nic)) == 9); // GPU7's row is absent
    CHECK(error_line(dgx1.substr(0, nic)) == 10);                    // the NIC's row is absent
    CHECK(error_line(replaced(dgx1, "GPU5    SYS", "GPU9    SYS")) == 7);
    CHECK(error_line(replaced(dgx1, "GPU6    GPU7", "GPU6    GPU6")) == 1);
    CHECK(error_line(replaced(dgx1, "CPU Affinity", "CPU Affinity   Power")) == 1);
  }
  SUBCASE("GPU ordinals with a gap") {
    std::string text = replaced(dgx1, "GPU7    mlx5_0", "GPU9    mlx5_0");
    text = replaced(text, "GPU7    SYS", "GPU9    SYS");
    CHECK(error_line(text) == 1);
  }
  SUBCASE("NIC Legend naming no column") {
    const std::string a100 = topology_text("dgx_a100.txt");
    const std::string text = replaced(a100, "  NIC9: mlx5_9", "  NIC12: mlx5_12");
    CHECK(error_line(text) == 42);
  }
  SUBCASE("max_hops below one") {
    CHECK_THROWS_ERRC(carve::Errc::invalid_argument, (void)Topology::from_nvidia_smi(dgx1, {}, carve::PathOptions{0}));
  }
}

} // namespace test_nvidia_smi
