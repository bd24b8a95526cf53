// Reads the nvidia-smi texts shipped under tests/data/topology (see SOURCES.md there).
#pragma once

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

} // namespace carve::test
