// What a sweep produced, in a form that adds up: per-run rows, and sums over runs for the time
// series and the wear histogram. Shards write the same files; merge adds them.
//
//   runs.csv     one row per (seed, policy)
//   series.csv   per policy and sample: sums over runs of remaining workgroups and of free
//                slots while workgroups wait, and how many runs had workgroups waiting
//   wear.csv     per policy and slot: placements, summed over runs and compute units
//   config.txt   the settings (read back with --config)
#pragma once

#include "options.hpp"

#include <carve/sim.hpp>

#include <fmt/format.h>
#include <fmt/os.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace slot_sim {

struct RunRow {
  std::uint64_t seed = 0;
  std::string policy;
  double makespan = 0, last_dispatch = 0, decisions = 0, ns_per_decision = 0, waiting_cycles = 0;
  double idle_slots = 0, free_runs = 0, largest_run_share = 0;
  double blocked_cycles = 0, fragmentation_blocked_cycles = 0, fragmentation_blocked_groups = 0;
  double wear_max_over_mean = 0, wear_cv = 0, wear_low_half = 0;
};

// The columns of runs.csv after seed and policy, in order.
inline const std::vector<std::pair<const char*, double RunRow::*>>& run_columns() {
  static const std::vector<std::pair<const char*, double RunRow::*>> c = {
      {"makespan", &RunRow::makespan},
      {"last_dispatch", &RunRow::last_dispatch},
      {"decisions", &RunRow::decisions},
      {"ns_per_decision", &RunRow::ns_per_decision},
      {"waiting_cycles", &RunRow::waiting_cycles},
      {"idle_slots", &RunRow::idle_slots},
      {"free_runs", &RunRow::free_runs},
      {"largest_run_share", &RunRow::largest_run_share},
      {"blocked_cycles", &RunRow::blocked_cycles},
      {"fragmentation_blocked_cycles", &RunRow::fragmentation_blocked_cycles},
      {"fragmentation_blocked_groups", &RunRow::fragmentation_blocked_groups},
      {"wear_max_over_mean", &RunRow::wear_max_over_mean},
      {"wear_cv", &RunRow::wear_cv},
      {"wear_low_half", &RunRow::wear_low_half},
  };
  return c;
}

struct SeriesSums {
  std::vector<double> remaining;    // sum over runs
  std::vector<double> free_waiting; // sum over runs with workgroups waiting
  std::vector<double> runs_waiting; // how many runs had workgroups waiting

  void add(const carve::sim::Series& s) {
    grow(s.remaining.size());
    for (std::size_t k = 0; k < s.remaining.size(); ++k) {
      remaining[k] += s.remaining[k];
      if (s.waiting[k] != 0) {
        free_waiting[k] += s.free_slots[k];
        runs_waiting[k] += 1;
      }
    }
  }
  void add(const SeriesSums& o) {
    grow(o.remaining.size());
    for (std::size_t k = 0; k < o.remaining.size(); ++k) {
      remaining[k] += o.remaining[k];
      free_waiting[k] += o.free_waiting[k];
      runs_waiting[k] += o.runs_waiting[k];
    }
  }
  void grow(std::size_t n) {
    if (remaining.size() < n) {
      remaining.resize(n, 0);
      free_waiting.resize(n, 0);
      runs_waiting.resize(n, 0);
    }
  }
};

struct Results {
  std::vector<std::string> policies; // first-fit first; the bound last
  std::string bound_name;
  std::vector<RunRow> rows;
  std::map<std::string, SeriesSums> series;
  std::map<std::string, std::vector<double>> wear;
  std::uint32_t sample_every = 1;
  std::uint32_t slots = 0;

  // The series of policy `p`; throws carve::Exception (out_of_range) naming a policy the results
  // hold no series for (series.csv lacks it).
  const SeriesSums& series_of(const std::string& p) const {
    const auto it = series.find(p);
    if (it == series.end()) {
      throw carve::Exception(carve::Errc::out_of_range, "slot_sim results: no series for policy '" + p + "'");
    }
    return it->second;
  }

  // Makespans by policy, ordered by seed (the pairing).
  std::vector<double> column(const std::string& policy, double RunRow::*field) const {
    std::vector<const RunRow*> mine;
    for (const RunRow& r : rows) {
      if (r.policy == policy) {
        mine.push_back(&r);
      }
    }
    std::sort(mine.begin(), mine.end(), [](const RunRow* a, const RunRow* b) { return a->seed < b->seed; });
    std::vector<double> v;
    for (const RunRow* r : mine) {
      v.push_back(r->*field);
    }
    return v;
  }
};

inline RunRow to_row(std::uint64_t seed, const std::string& policy, const carve::sim::SweepCell& cell) {
  const carve::sim::RunResult& r = cell.result;
  RunRow row;
  row.seed = seed;
  row.policy = policy;
  row.makespan = static_cast<double>(r.makespan);
  row.last_dispatch = static_cast<double>(r.last_dispatch);
  row.decisions = static_cast<double>(r.decisions);
  row.ns_per_decision = cell.ns_per_decision;
  row.waiting_cycles = static_cast<double>(r.waiting_cycles);
  row.idle_slots = r.idle_slots;
  row.free_runs = r.free_runs;
  row.largest_run_share = r.largest_run_share;
  row.blocked_cycles = static_cast<double>(r.blocked_cycles);
  row.fragmentation_blocked_cycles = static_cast<double>(r.fragmentation_blocked_cycles);
  row.fragmentation_blocked_groups = r.fragmentation_blocked_groups;
  row.wear_max_over_mean = r.wear_max_over_mean;
  row.wear_cv = r.wear_cv;
  row.wear_low_half = r.wear_low_half;
  return row;
}

inline void write_results(const Results& res, const std::string& dir, const std::string& config_text) {
  {
    auto f = fmt::output_file(dir + "/runs.csv");
    f.print("seed,policy");
    for (const auto& [name, field] : run_columns()) {
      f.print(",{}", name);
    }
    f.print("\n");
    for (const RunRow& r : res.rows) {
      f.print("{},{}", r.seed, r.policy);
      for (const auto& [name, field] : run_columns()) {
        f.print(",{}", r.*field);
      }
      f.print("\n");
    }
  }
  {
    auto f = fmt::output_file(dir + "/series.csv");
    f.print("policy,cycle,remaining_sum,free_slots_sum_waiting,runs_waiting\n");
    for (const std::string& p : res.policies) {
      const SeriesSums& s = res.series_of(p);
      for (std::size_t k = 0; k < s.remaining.size(); ++k) {
        f.print("{},{},{},{},{}\n", p, k * res.sample_every, s.remaining[k], s.free_waiting[k], s.runs_waiting[k]);
      }
    }
  }
  {
    auto f = fmt::output_file(dir + "/wear.csv");
    f.print("policy,slot,placements\n");
    for (const auto& [p, w] : res.wear) {
      for (std::size_t s = 0; s < w.size(); ++s) {
        f.print("{},{},{}\n", p, s, w[s]);
      }
    }
  }
  std::ofstream(dir + "/config.txt") << config_text;
}

namespace detail {

inline std::vector<std::string> split_csv(const std::string& line) {
  std::vector<std::string> out;
  std::stringstream ss(line);
  std::string f;
  while (std::getline(ss, f, ',')) {
    out.push_back(f);
  }
  return out;
}

inline double number(const std::string& s, const std::string& file, std::size_t line) {
  return carve::sim::detail::parse_real(s, "field", file, line);
}

// Calls f(fields, line) for every data line of a CSV file whose header is `header`.
template <class F>
void for_each_row(const std::string& file, const std::string& header, std::size_t fields, F&& f) {
  std::ifstream in(file);
  if (!in) {
    throw input_error(file, 0, "cannot open (is this a slot_sim output folder?)");
  }
  std::string text;
  std::size_t line = 0;
  while (std::getline(in, text)) {
    ++line;
    if (line == 1) {
      if (text != header) {
        throw input_error(file, 1, "unexpected header: expected '" + header + "'");
      }
      continue;
    }
    const auto v = split_csv(text);
    if (v.size() != fields) {
      throw input_error(file, line,
                        "expected " + std::to_string(fields) + " fields, found " + std::to_string(v.size()));
    }
    f(v, line);
  }
}

} // namespace detail

// Reads one output folder back (a shard's, for merging).
inline Results read_results(const std::string& dir) {
  Results res;
  std::string header = "seed,policy";
  for (const auto& [name, field] : run_columns()) {
    header += std::string(",") + name;
  }
  const std::string runs = dir + "/runs.csv";
  detail::for_each_row(runs, header, 2 + run_columns().size(), [&](const auto& v, std::size_t line) {
    RunRow r;
    r.seed = carve::sim::detail::parse_count(v[0], "seed", runs, line);
    r.policy = v[1];
    for (std::size_t k = 0; k < run_columns().size(); ++k) {
      r.*(run_columns()[k].second) = detail::number(v[2 + k], runs, line);
    }
    if (std::find(res.policies.begin(), res.policies.end(), r.policy) == res.policies.end()) {
      res.policies.push_back(r.policy);
    }
    res.rows.push_back(r);
  });
  const std::string series = dir + "/series.csv";
  detail::for_each_row(series, "policy,cycle,remaining_sum,free_slots_sum_waiting,runs_waiting", 5,
                       [&](const auto& v, std::size_t line) {
                         SeriesSums& s = res.series[v[0]];
                         const std::size_t k = s.remaining.size();
                         s.grow(k + 1);
                         s.remaining[k] = detail::number(v[2], series, line);
                         s.free_waiting[k] = detail::number(v[3], series, line);
                         s.runs_waiting[k] = detail::number(v[4], series, line);
                       });
  const std::string wear = dir + "/wear.csv";
  detail::for_each_row(wear, "policy,slot,placements", 3, [&](const auto& v, std::size_t line) {
    res.wear[v[0]].push_back(detail::number(v[2], wear, line));
  });
  return res;
}

} // namespace slot_sim
