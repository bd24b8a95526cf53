/// @file carve/sim/trace.hpp
/// Workloads as CSV traces, to replay a real workload or share a generated one.
///
/// @code{.unparsed}
/// arrival,size,duration,expected
/// 0,12,40,40
/// 0,3,95,
/// @endcode
///
/// One workgroup per line: the cycle it arrives, its size in slots, its run time in cycles, and
/// optionally the run time the dispatcher expects (the hint; empty or absent means "the run
/// time"). The header line, blank lines and lines starting with '#' are skipped. Workgroups are
/// queued in arrival order, file order among equal arrivals. Any bad line throws carve::Exception (sim::input_error)
/// naming the file and line: a wrong field count, a field that is not a whole number, a negative number, a size of 0 or
/// above the slots of a compute unit, a run time of 0. A trace with no workgroups is an error too.
#pragma once

#include <carve/sim/input_error.hpp>
#include <carve/sim/workload.hpp>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <istream>
#include <ostream>
#include <string>
#include <vector>

namespace carve::sim {

/// The header line write_trace writes.
inline constexpr const char* trace_header = "arrival,size,duration,expected";

/// Writes `workgroups` as a trace (with the header), in queue order.
inline void write_trace(std::ostream& out, const std::vector<Workgroup>& workgroups) {
  out << trace_header << '\n';
  for (const Workgroup& w : workgroups) {
    out << w.arrival << ',' << w.size << ',' << w.duration << ',' << w.expected << '\n';
  }
}

/// Reads a trace for compute units of `slots` slots; `name` is used in error messages.
inline std::vector<Workgroup> read_trace(std::istream& in, const std::string& name, std::uint32_t slots) {
  std::vector<Workgroup> out;
  std::string text;
  std::size_t line = 0;
  while (std::getline(in, text)) {
    ++line;
    if (!text.empty() && text.back() == '\r') {
      text.pop_back();
    }
    const std::size_t first = text.find_first_not_of(" \t");
    if (first == std::string::npos || text[first] == '#') {
      continue;
    }
    if (out.empty() && text.rfind("arrival", first) == first) {
      continue; // the header
    }
    std::vector<std::string> fields;
    std::size_t start = 0;
    for (;;) {
      const std::size_t comma = text.find(',', start);
      std::string field = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      const std::size_t a = field.find_first_not_of(" \t");
      const std::size_t b = field.find_last_not_of(" \t");
      fields.push_back(a == std::string::npos ? std::string() : field.substr(a, b - a + 1));
      if (comma == std::string::npos) {
        break;
      }
      start = comma + 1;
    }
    if (fields.size() < 3 || fields.size() > 4) {
      throw input_error(name, line,
                        "expected 3 or 4 fields (arrival,size,duration[,expected]), found " +
                            std::to_string(fields.size()));
    }
    Workgroup w;
    w.arrival = detail::parse_count(fields[0], "arrival", name, line);
    w.size = detail::parse_count(fields[1], "size", name, line);
    w.duration = detail::parse_count(fields[2], "duration", name, line);
    w.expected =
        fields.size() == 4 && !fields[3].empty() ? detail::parse_count(fields[3], "expected", name, line) : w.duration;
    if (w.size == 0 || w.size > slots) {
      throw input_error(name, line,
                        "size " + std::to_string(w.size) + " is outside 1.." + std::to_string(slots) +
                            " (the slots of a compute unit)");
    }
    if (w.duration == 0) {
      throw input_error(name, line, "duration must be at least 1 cycle");
    }
    if (w.expected == 0) {
      throw input_error(name, line, "expected duration must be at least 1 cycle");
    }
    out.push_back(w);
  }
  if (out.empty()) {
    throw input_error(name, 0, "the trace holds no workgroups");
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const Workgroup& a, const Workgroup& b) { return a.arrival < b.arrival; });
  return out;
}

/// Reads the trace file at `path`; throws input_error also when it cannot be opened.
inline std::vector<Workgroup> read_trace_file(const std::string& path, std::uint32_t slots) {
  std::ifstream in(path);
  if (!in) {
    throw input_error(path, 0, "cannot open the trace");
  }
  return read_trace(in, path, slots);
}

} // namespace carve::sim
