// Reads the nvidia-smi texts shipped under tests/data/topology (see SOURCES.md there).
#pragma once

#include <carve/topology/topology.hpp>

#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

namespace carve::test {

inline std::string topology_text(const std::string& file) {
  std::ifstream in(std::string(CARVE_TEST_DATA_DIR) + "/topology/" + file, std::ios::binary);
  if (!in) {
    throw std::runtime_error("missing test data file " + file);
  }
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// DGX-1 V100 at 20 GB/s per NVLink. From GPU0: GPU3 and GPU4 at 40 (direct), GPU2 and GPU7 at 40
// (two hops), GPU1, GPU5 and GPU6 at 20.
inline const Topology& dgx1() {
  static const Topology t = Topology::from_nvidia_smi(topology_text("dgx1_v100.txt"));
  return t;
}

} // namespace carve::test
