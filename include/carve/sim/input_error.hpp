/// @file carve/sim/input_error.hpp
/// How the simulator reports bad configuration or trace input: a
/// carve::Exception (invalid_argument) whose message says where it came from, the file (or
/// command-line option) and the line, ready to print as "trace.csv:7: ...".
#pragma once

#include <carve/core/error.hpp>

#include <cstddef>
#include <string>

namespace carve::sim {

/// `where` names the source ("trace.csv", "--sizes"); `line` is 1-based, 0 when not from a file.
inline Exception input_error(const std::string& where, std::size_t line, const std::string& what) {
  return Exception(Errc::invalid_argument,
                   line == 0 ? where + ": " + what : where + ":" + std::to_string(line) + ": " + what);
}

} // namespace carve::sim
