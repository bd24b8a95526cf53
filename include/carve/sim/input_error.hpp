// carve/sim/input_error.hpp — what the simulator throws for bad configuration or trace input.
//
// The simulator is a host-only tool layer, so bad input is an exception carrying where it came
// from: the file (or command-line option) and the line, ready to print as "trace.csv:7: ...".
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>

namespace carve::sim {

class InputError : public std::runtime_error {
public:
  // `where` names the source ("trace.csv", "--sizes"); `line` is 1-based, 0 when not from a file.
  InputError(std::string where, std::size_t line, const std::string& what)
      : std::runtime_error(line == 0 ? where + ": " + what : where + ":" + std::to_string(line) + ": " + what),
        where_(std::move(where)), line_(line) {}

  const std::string& where() const noexcept { return where_; }
  std::size_t line() const noexcept { return line_; }

private:
  std::string where_;
  std::size_t line_;
};

} // namespace carve::sim
