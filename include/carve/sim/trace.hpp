/// @file carve/sim/trace.hpp
/// Workloads as CSV traces, to replay a real workload or share a generated one.
///
/// @code{.unparsed}
/// arrival,size,duration,expected,kernel
/// 0,12,40,40,gemm
/// 0,3,95,,softmax
/// @endcode
///
/// One workgroup per line: the cycle it arrives, its size in slots, its run time in cycles,
/// optionally the run time it is expected to take (empty: none given) and optionally its kernel
/// (any word or number naming a kernel type; empty: none). A trace may begin with a header line
/// naming its columns: `arrival`, `size` and `duration`, plus `expected` and `kernel` if present,
/// in any order. Without a header the columns are `arrival,size,duration[,expected]`. Blank lines
/// and lines starting with '#' are skipped. Workgroups are queued in arrival order, file order
/// among equal arrivals; kernels are numbered in order of first appearance. Any bad line throws
/// carve::Exception (sim::input_error) naming the file and line: a wrong field count, a field
/// that is not a whole number, a negative number, a size of 0 or above the slots of a compute
/// unit, a run time of 0, an unknown, repeated or missing column in the header. A trace with no
/// workgroups is an error too.
#pragma once

#include <carve/sim/input_error.hpp>
#include <carve/sim/workload.hpp>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <fstream>
#include <istream>
#include <iterator>
#include <map>
#include <ostream>
#include <string>
#include <vector>

namespace carve::sim {

/// The header line write_trace writes for workgroups without kernels.
inline constexpr const char* trace_header = "arrival,size,duration,expected";

/// Writes `workgroups` as a trace (with the header), in queue order; with a `kernel` column when
/// any workgroup has a kernel. Throws input_error naming `name` for workgroups that wait for a
/// launch: their arrival depends on the run, which a trace cannot say.
inline void write_trace(std::ostream& out, const std::vector<Workgroup>& workgroups,
                        const std::string& name = "trace") {
  bool kernels = false;
  for (const Workgroup& w : workgroups) {
    if (w.after != none) {
      throw input_error(name, 0,
                        "launches that wait for their stream's previous one arrive when it finishes, which a trace "
                        "cannot hold; generate with streams that do not wait");
    }
    kernels = kernels || w.kernel != none;
  }
  out << trace_header << (kernels ? ",kernel" : "") << '\n';
  for (const Workgroup& w : workgroups) {
    out << w.arrival << ',' << w.size << ',' << w.duration << ',';
    if (w.expected != 0) {
      out << w.expected;
    }
    if (kernels) {
      out << ',';
      if (w.kernel != none) {
        out << w.kernel;
      }
    }
    out << '\n';
  }
}

/// Reads a trace for compute units of `slots` slots; `name` is used in error messages.
inline std::vector<Workgroup> read_trace(std::istream& in, const std::string& name, std::uint32_t slots) {
  enum Column : std::size_t { arrival, size, duration, expected, kernel, columns };
  static constexpr const char* column_names[] = {"arrival", "size", "duration", "expected", "kernel"};
  // Field index of each column (none: absent); without a header, arrival,size,duration[,expected].
  std::size_t at[columns] = {0, 1, 2, 3, none};
  bool header_read = false;
  std::size_t fields_min = 3;
  std::size_t fields_max = 4;
  std::map<std::string, std::uint32_t> kernel_ids;
  std::vector<Workgroup> out;
  std::string text;
  std::size_t line = 0;
  const auto split = [](const std::string& t) {
    std::vector<std::string> fields;
    std::size_t start = 0;
    for (;;) {
      const std::size_t comma = t.find(',', start);
      std::string field = t.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      const std::size_t a = field.find_first_not_of(" \t");
      const std::size_t b = field.find_last_not_of(" \t");
      fields.push_back(a == std::string::npos ? std::string() : field.substr(a, b - a + 1));
      if (comma == std::string::npos) {
        return fields;
      }
      start = comma + 1;
    }
  };
  while (std::getline(in, text)) {
    ++line;
    if (!text.empty() && text.back() == '\r') {
      text.pop_back();
    }
    const std::size_t first = text.find_first_not_of(" \t");
    if (first == std::string::npos || text[first] == '#') {
      continue;
    }
    std::vector<std::string> fields = split(text);
    if (out.empty() && !header_read && std::isalpha(static_cast<unsigned char>(text[first])) != 0) {
      // The header: which column is where.
      header_read = true;
      for (std::size_t& a : at) {
        a = none;
      }
      for (std::size_t f = 0; f < fields.size(); ++f) {
        const auto* it = std::find_if(std::begin(column_names), std::end(column_names),
                                      [&](const char* c) { return fields[f] == c; });
        if (it == std::end(column_names)) {
          throw input_error(name, line,
                            "unknown column '" + fields[f] +
                                "' in the header (columns: arrival, size, duration, "
                                "and optionally expected and kernel)");
        }
        const auto c = static_cast<std::size_t>(it - std::begin(column_names));
        if (at[c] != none) {
          throw input_error(name, line, "column '" + fields[f] + "' appears twice in the header");
        }
        at[c] = f;
      }
      for (const Column c : {arrival, size, duration}) {
        if (at[c] == none) {
          throw input_error(name, line, std::string("the header has no '") + column_names[c] + "' column");
        }
      }
      fields_min = fields_max = fields.size();
      continue;
    }
    if (fields.size() < fields_min || fields.size() > fields_max) {
      throw input_error(name, line,
                        header_read ? "expected " + std::to_string(fields_min) + " fields as the header says, found " +
                                          std::to_string(fields.size())
                                    : "expected 3 or 4 fields (arrival,size,duration[,expected]), found " +
                                          std::to_string(fields.size()));
    }
    const auto field = [&](Column c) -> const std::string& {
      static const std::string empty;
      return at[c] != none && at[c] < fields.size() ? fields[at[c]] : empty;
    };
    Workgroup w;
    w.arrival = detail::parse_count(field(arrival), "arrival", name, line);
    w.size = detail::parse_count(field(size), "size", name, line);
    w.duration = detail::parse_count(field(duration), "duration", name, line);
    w.expected = field(expected).empty() ? 0 : detail::parse_count(field(expected), "expected", name, line);
    if (!field(kernel).empty()) {
      w.kernel = kernel_ids.emplace(field(kernel), static_cast<std::uint32_t>(kernel_ids.size())).first->second;
    }
    if (w.size == 0 || w.size > slots) {
      throw input_error(name, line,
                        "size " + std::to_string(w.size) + " is outside 1.." + std::to_string(slots) +
                            " (the slots of a compute unit)");
    }
    if (w.duration == 0) {
      throw input_error(name, line, "duration must be at least 1 cycle");
    }
    if (!field(expected).empty() && w.expected == 0) {
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
