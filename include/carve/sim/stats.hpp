/// @file carve/sim/stats.hpp
/// Summaries of repeated runs and paired comparisons between policies.
///
/// Every policy runs on the same workloads (one per seed), so policies are compared run by run:
/// the difference of two makespans on the same seed removes that workload's own luck, which is
/// far larger than most differences between policies.
#pragma once

#include <algorithm>
#include <carve/core/error.hpp>
#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <vector>

namespace carve::sim {

/// The two-sided 95% critical value of Student's t with `df` degrees of freedom.
inline double t_critical_95(std::size_t df) {
  // Exact for the smallest df, then the Cornish-Fisher expansion around the normal quantile
  // (error below 0.001 from df = 5 on).
  static constexpr double small[] = {0.0, 12.706, 4.303, 3.182, 2.776};
  if (df == 0) {
    return std::numeric_limits<double>::infinity();
  }
  if (df < 5) {
    return small[df];
  }
  const double z = 1.959964;
  const double n = static_cast<double>(df);
  const double z3 = z * z * z;
  const double z5 = z3 * z * z;
  const double z7 = z5 * z * z;
  return z + (z3 + z) / (4 * n) + (5 * z5 + 16 * z3 + 3 * z) / (96 * n * n) +
         (3 * z7 + 19 * z5 + 17 * z3 - 15 * z) / (384 * n * n * n);
}

/// The value below which a share `q` of `sorted` lies (linear interpolation between ranks).
inline double quantile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) {
    return std::nan("");
  }
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(pos));
  const std::size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (pos - static_cast<double>(lo)) * (sorted[hi] - sorted[lo]);
}

/// Mean, spread and confidence interval of a set of values.
struct Summary {
  std::size_t n = 0; ///< values
  double mean = 0;   ///< their mean
  double stddev = 0; ///< sample standard deviation (n - 1)
  double median = 0; ///< their median
  /// The low end of the 95% confidence interval of the mean (Student t).
  double ci_low = 0, ci_high = 0; ///< the high end of that interval
  /// The 2.5th percentile: with p97_5, the middle 95% of the values themselves.
  double p2_5 = 0, p97_5 = 0; ///< the 97.5th percentile
};

/// The Summary of `values` (all zero when there are none).
inline Summary summarize(std::vector<double> values) {
  Summary s;
  s.n = values.size();
  if (values.empty()) {
    return s;
  }
  std::sort(values.begin(), values.end());
  double sum = 0;
  for (const double v : values) {
    sum += v;
  }
  s.mean = sum / static_cast<double>(s.n);
  double ss = 0;
  for (const double v : values) {
    ss += (v - s.mean) * (v - s.mean);
  }
  s.stddev = s.n > 1 ? std::sqrt(ss / static_cast<double>(s.n - 1)) : 0.0;
  const double half = s.n > 1 ? t_critical_95(s.n - 1) * s.stddev / std::sqrt(static_cast<double>(s.n)) : 0.0;
  s.ci_low = s.mean - half;
  s.ci_high = s.mean + half;
  s.median = quantile(values, 0.5);
  s.p2_5 = quantile(values, 0.025);
  s.p97_5 = quantile(values, 0.975);
  return s;
}

/// A candidate against a reference on the same runs; differences are reference - candidate, so
/// a positive difference means the candidate finished sooner.
struct PairedComparison {
  Summary difference; ///< of reference - candidate, run by run
  double wins = 0;    ///< share of runs where the candidate is strictly lower
  double ties = 0;    ///< share of runs where the two are equal
  double losses = 0;  ///< share of runs where the candidate is higher
};

/// `candidate` against `reference`, run i against run i. Throws carve::Exception
/// (invalid_argument) when the two do not have the same number of runs.
inline PairedComparison compare_paired(const std::vector<double>& reference, const std::vector<double>& candidate) {
  if (reference.size() != candidate.size()) {
    throw Exception(Errc::invalid_argument, "compare_paired: the runs do not pair up");
  }
  PairedComparison c;
  std::vector<double> diff(reference.size());
  for (std::size_t i = 0; i < diff.size(); ++i) {
    diff[i] = reference[i] - candidate[i];
    (diff[i] > 0 ? c.wins : diff[i] < 0 ? c.losses : c.ties) += 1;
  }
  if (!diff.empty()) {
    const auto n = static_cast<double>(diff.size());
    c.wins /= n;
    c.ties /= n;
    c.losses /= n;
  }
  c.difference = summarize(std::move(diff));
  return c;
}

/// For each run, the share of the lowest value that each candidate holds: 1 for the single best,
/// 1/k each for a k-way tie. Returns one share sum per candidate (divide by runs for a rate).
/// Every candidate must hold the same runs: throws carve::Exception (out_of_range) naming the
/// first candidate whose count differs from candidate 0's.
inline std::vector<double> best_shares(const std::vector<std::vector<double>>& candidates) {
  std::vector<double> shares(candidates.size(), 0.0);
  if (candidates.empty()) {
    return shares;
  }
  const std::size_t runs = candidates[0].size();
  for (std::size_t k = 1; k < candidates.size(); ++k) {
    if (candidates[k].size() != runs) {
      throw Exception(Errc::out_of_range, "best_shares: candidate " + std::to_string(k) + " has " +
                                              std::to_string(candidates[k].size()) + " runs, candidate 0 has " +
                                              std::to_string(runs));
    }
  }
  for (std::size_t run = 0; run < runs; ++run) {
    double best = std::numeric_limits<double>::infinity();
    for (const auto& c : candidates) {
      best = std::min(best, c[run]);
    }
    std::size_t tied = 0;
    for (const auto& c : candidates) {
      tied += c[run] == best ? std::size_t{1} : std::size_t{0};
    }
    for (std::size_t k = 0; k < candidates.size(); ++k) {
      shares[k] += candidates[k][run] == best ? 1.0 / static_cast<double>(tied) : 0.0;
    }
  }
  return shares;
}

} // namespace carve::sim
