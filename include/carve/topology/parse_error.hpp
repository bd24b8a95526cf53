// carve/topology/parse_error.hpp — the exception the topology readers throw on malformed text.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>

namespace carve {

// Malformed topology text. what() reads "line 7: <reason>"; line() is 1-based.
class ParseError : public std::runtime_error {
public:
  ParseError(std::size_t line, const std::string& reason)
      : std::runtime_error("line " + std::to_string(line) + ": " + reason), line_(line), reason_(reason) {}

  std::size_t line() const noexcept { return line_; }
  const std::string& reason() const noexcept { return reason_; }

private:
  std::size_t line_;
  std::string reason_;
};

} // namespace carve
