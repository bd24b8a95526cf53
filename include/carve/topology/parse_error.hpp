/// @file carve/topology/parse_error.hpp
/// How the topology readers report malformed text: a
/// carve::Exception (invalid_argument) whose message starts with the 1-based line, "line 7: ...".
#pragma once

#include <carve/core/error.hpp>

#include <cstddef>
#include <string>

namespace carve {

/// The exception for malformed text at 1-based `line`: invalid_argument, "line 7: <reason>".
inline Exception parse_error(std::size_t line, const std::string& reason) {
  return Exception(Errc::invalid_argument, "line " + std::to_string(line) + ": " + reason);
}

} // namespace carve
