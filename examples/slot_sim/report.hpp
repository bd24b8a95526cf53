// The tables slot_sim prints, summary.csv, and the figures (SVG): workgroups remaining and free
// slots over time, the paired makespan difference, and the per-slot wear histogram.
#pragma once

#include "results.hpp"
#include "svg_plot.hpp" // examples/common

#include <carve/sim.hpp>

#include <fmt/format.h>
#include <fmt/os.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace slot_sim {

using carve::svg::palette;
using carve::svg::Plot;
using carve::svg::PlotLine;
using carve::svg::write_svg;

struct PolicySummary {
  std::string name;
  bool bound = false;
  carve::sim::Summary makespan;
  carve::sim::PairedComparison vs_reference; // reference - this policy
  double best_share = 0;                     // of runs where it is the best contiguous policy
  double gap_recovered = std::nan("");       // share of the first-fit-to-bound gap
  double idle_slots = 0, free_runs = 0, largest_run_share = 0;
  double blocked_cycles = 0, fragmentation_blocked_cycles = 0, fragmentation_blocked_groups = 0;
  double wear_max_over_mean = 0, wear_cv = 0, wear_low_half = 0;
  double ns_per_decision = 0; // median over runs
};

inline double mean_of(const std::vector<double>& v) {
  double s = 0;
  for (const double x : v) {
    s += x;
  }
  return v.empty() ? 0.0 : s / static_cast<double>(v.size());
}

inline std::vector<PolicySummary> summarize(const Results& res) {
  using carve::sim::compare_paired;
  const std::string& reference = res.policies.front();
  const std::vector<double> ref = res.column(reference, &RunRow::makespan);
  std::vector<std::vector<double>> contiguous;
  for (const std::string& p : res.policies) {
    if (p != res.bound_name) {
      contiguous.push_back(res.column(p, &RunRow::makespan));
    }
  }
  const std::vector<double> best = carve::sim::best_shares(contiguous);
  const double bound_mean = mean_of(res.column(res.bound_name, &RunRow::makespan));
  const double ref_mean = mean_of(ref);

  std::vector<PolicySummary> out;
  for (std::size_t i = 0; i < res.policies.size(); ++i) {
    const std::string& p = res.policies[i];
    PolicySummary s;
    s.name = p;
    s.bound = p == res.bound_name;
    const auto makespans = res.column(p, &RunRow::makespan);
    s.makespan = carve::sim::summarize(makespans);
    s.vs_reference = compare_paired(ref, makespans);
    if (!s.bound) {
      s.best_share = best[i] / static_cast<double>(ref.size());
    }
    if (ref_mean - bound_mean > 0) {
      s.gap_recovered = (ref_mean - s.makespan.mean) / (ref_mean - bound_mean);
    }
    s.idle_slots = mean_of(res.column(p, &RunRow::idle_slots));
    s.free_runs = mean_of(res.column(p, &RunRow::free_runs));
    s.largest_run_share = mean_of(res.column(p, &RunRow::largest_run_share));
    s.blocked_cycles = mean_of(res.column(p, &RunRow::blocked_cycles));
    s.fragmentation_blocked_cycles = mean_of(res.column(p, &RunRow::fragmentation_blocked_cycles));
    s.fragmentation_blocked_groups = mean_of(res.column(p, &RunRow::fragmentation_blocked_groups));
    s.wear_max_over_mean = mean_of(res.column(p, &RunRow::wear_max_over_mean));
    s.wear_cv = mean_of(res.column(p, &RunRow::wear_cv));
    s.wear_low_half = mean_of(res.column(p, &RunRow::wear_low_half));
    s.ns_per_decision = carve::sim::summarize(res.column(p, &RunRow::ns_per_decision)).median;
    out.push_back(s);
  }
  return out;
}

inline std::string signed_number(double v, int decimals = 1) { return fmt::format("{:+.{}f}", v, decimals); }

inline void print_tables(const std::vector<PolicySummary>& summary, std::size_t runs) {
  const std::string& ref = summary.front().name;
  fmt::print("\nMakespan (cycles until the last workgroup is released), {} paired runs. "
             "Δ = {} - policy: positive is faster.\n",
             runs, ref);
  fmt::print("{:<26} {:>9}  {:>24}  {:>8}  {:>6}  {:>6}  {:>9}\n", "policy", "mean", "Δ mean [95% CI]", "Δ median",
             "wins", "best", "gap rec.");
  for (const PolicySummary& s : summary) {
    const bool is_ref = s.name == ref;
    const auto& d = s.vs_reference.difference;
    const std::string delta =
        is_ref ? "-"
               : fmt::format("{} [{}, {}]", signed_number(d.mean), signed_number(d.ci_low), signed_number(d.ci_high));
    fmt::print("{:<26} {:>9.1f}  {:>24}  {:>8}  {:>6}  {:>6}  {:>9}\n", s.name, s.makespan.mean, delta,
               is_ref ? "-" : signed_number(d.median), is_ref ? "-" : fmt::format("{:.0f}%", 100 * s.vs_reference.wins),
               s.bound ? "-" : fmt::format("{:.0f}%", 100 * s.best_share),
               std::isnan(s.gap_recovered) ? "-" : fmt::format("{:.1f}%", 100 * s.gap_recovered));
  }
  fmt::print("wins: runs faster than {}; best: runs where it is the fastest policy (ties shared); gap rec.: share "
             "of the {}-to-bound gap it recovers.\n",
             ref, ref);

  fmt::print("\nWhile workgroups wait (means over runs; per compute unit):\n");
  fmt::print("{:<26} {:>10} {:>9} {:>12} {:>11} {:>12} {:>9} {:>7} {:>8} {:>11}\n", "policy", "idle slots", "free runs",
             "largest/free", "frag-block", "frag-blocked", "wear max", "wear", "low-half", "ns per");
  fmt::print("{:<26} {:>10} {:>9} {:>12} {:>11} {:>12} {:>9} {:>7} {:>8} {:>11}\n", "", "", "", "", "cycles",
             "workgroups", "/mean", "CV", "share", "decision");
  for (const PolicySummary& s : summary) {
    if (s.bound) {
      fmt::print("{:<26} {:>10.2f} {:>9} {:>12} {:>11} {:>12} {:>9} {:>7} {:>8} {:>11}\n", s.name, s.idle_slots, "-",
                 "-", "-", "-", "-", "-", "-", "-");
      continue;
    }
    const std::string ns = s.ns_per_decision > 0 ? fmt::format("{:.1f}", s.ns_per_decision) : "-"; // --cost off
    fmt::print("{:<26} {:>10.2f} {:>9.2f} {:>12.2f} {:>11.1f} {:>12.1f} {:>9.2f} {:>7.2f} {:>8.2f} {:>11}\n", s.name,
               s.idle_slots, s.free_runs, s.largest_run_share, s.fragmentation_blocked_cycles,
               s.fragmentation_blocked_groups, s.wear_max_over_mean, s.wear_cv, s.wear_low_half, ns);
  }
  fmt::print("frag-block: cycles the queue head waited although a compute unit had enough free slots, and how many "
             "workgroups did.\n"
             "wear: placements per slot; low-half share 0.5 means both ends wear alike. ns per decision: allocator "
             "time per placement attempt (median run).\n");
}

inline void write_summary_csv(const std::vector<PolicySummary>& summary, const std::string& path) {
  auto f = fmt::output_file(path);
  f.print("policy,runs,makespan_mean,makespan_median,makespan_ci_low,makespan_ci_high,delta_mean,delta_ci_low,"
          "delta_ci_high,delta_median,delta_p2_5,delta_p97_5,wins,ties,losses,best_share,gap_recovered,idle_slots,"
          "free_runs,largest_run_share,blocked_cycles,fragmentation_blocked_cycles,fragmentation_blocked_groups,"
          "wear_max_over_mean,wear_cv,wear_low_half,ns_per_decision\n");
  for (const PolicySummary& s : summary) {
    const auto& m = s.makespan;
    const auto& d = s.vs_reference.difference;
    f.print("{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n", s.name, m.n, m.mean,
            m.median, m.ci_low, m.ci_high, d.mean, d.ci_low, d.ci_high, d.median, d.p2_5, d.p97_5, s.vs_reference.wins,
            s.vs_reference.ties, s.vs_reference.losses, s.best_share, s.gap_recovered, s.idle_slots, s.free_runs,
            s.largest_run_share, s.blocked_cycles, s.fragmentation_blocked_cycles, s.fragmentation_blocked_groups,
            s.wear_max_over_mean, s.wear_cv, s.wear_low_half, s.ns_per_decision);
  }
}

// A stable color per policy name, so every figure and every run uses the same one.
inline std::string color_of(const std::string& policy, const Results& res) {
  if (policy == res.bound_name) {
    return "#000000";
  }
  static const std::vector<std::string> order = policy_names();
  // A hinted policy's variants ("name[hints]") take the colors after the built-in policies'.
  const auto it = std::find(order.begin(), order.end(), policy);
  if (it == order.end()) {
    const auto variant = std::find(res.policies.begin(), res.policies.end(), policy);
    return palette()[(order.size() + static_cast<std::size_t>(variant - res.policies.begin())) % palette().size()];
  }
  return palette()[static_cast<std::size_t>(it - order.begin()) % palette().size()];
}

inline void write_figures(const Results& res, const std::string& dir, const std::string& machine,
                          const std::string& workload) {
  const auto runs_of = [&](const std::string& p) {
    return static_cast<double>(res.column(p, &RunRow::makespan).size());
  };
  const std::string& ref = res.policies.front();

  const std::string run_count = fmt::format("{} runs", runs_of(ref));
  Plot remaining{"Workgroups remaining",
                 {machine, workload + "; mean over " + run_count},
                 "cycle",
                 "workgroups not yet finished",
                 {},
                 false,
                 true};
  Plot idle{"Free slots while workgroups wait",
            {machine, workload,
             "mean over the runs with workgroups waiting, while at least half of the runs have some; from the first "
             "sample after cycle 0"},
            "cycle",
            "free slots per compute unit",
            {},
            false,
            true};
  Plot delta{
      "Paired makespan difference",
      {machine, workload, "each run's " + ref + " makespan minus the policy's on the same workload; " + run_count},
      "share of runs (sorted by difference)",
      "cycles saved against " + ref,
      {},
      true,
      false};
  Plot wear{"Placements per slot (wear)",
            {machine, workload + "; mean over " + run_count + ", summed over compute units"},
            "slot",
            "placements per slot per run",
            {},
            false,
            true};

  for (const std::string& p : res.policies) {
    const SeriesSums& s = res.series_of(p);
    const double runs = runs_of(p);
    PlotLine r{p, {}, {}, color_of(p, res), p == res.bound_name};
    PlotLine f = r;
    for (std::size_t k = 0; k < s.remaining.size(); ++k) {
      const double x = static_cast<double>(k) * res.sample_every;
      r.x.push_back(x);
      r.y.push_back(s.remaining[k] / runs);
      if (k != 0 && s.runs_waiting[k] * 2 >= runs) {
        f.x.push_back(x);
        f.y.push_back(s.free_waiting[k] / s.runs_waiting[k]);
      }
    }
    remaining.lines.push_back(r);
    idle.lines.push_back(f);

    if (p != ref) {
      std::vector<double> d;
      const auto a = res.column(ref, &RunRow::makespan);
      const auto b = res.column(p, &RunRow::makespan);
      for (std::size_t k = 0; k < a.size(); ++k) {
        d.push_back(a[k] - b[k]);
      }
      std::sort(d.begin(), d.end());
      PlotLine l{p, {}, {}, color_of(p, res), p == res.bound_name};
      for (std::size_t k = 0; k < d.size(); ++k) {
        l.x.push_back((static_cast<double>(k) + 0.5) / static_cast<double>(d.size()));
        l.y.push_back(d[k]);
      }
      delta.lines.push_back(l);
    }
    if (const auto it = res.wear.find(p); it != res.wear.end()) {
      PlotLine l{p, {}, {}, color_of(p, res), false};
      for (std::size_t slot = 0; slot < it->second.size(); ++slot) {
        l.x.push_back(static_cast<double>(slot));
        l.y.push_back(it->second[slot] / runs);
      }
      wear.lines.push_back(l);
    }
  }
  write_svg(remaining, dir + "/fig12_remaining.svg");
  write_svg(idle, dir + "/fig13_free_slots.svg");
  write_svg(delta, dir + "/fig14_makespan_delta.svg");
  write_svg(wear, dir + "/wear.svg");
}

} // namespace slot_sim
