// RunTimePredictor's reference model: its two estimates written out in double precision from
// the header's definitions, for one kernel. Shared by the host test and the device test.
#pragma once

#include <carve/slot/policy/run_time_predictor.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace carve::test {

// The definitions, for one kernel: even averaging for the first 1/weight completions, then the
// fixed weight; the quantile moves by q or 1 - q steps of 2 * a * (running mean |deviation|).
struct RunTimeReference {
  carve::RunTimePredictorSettings s;
  double estimate = 0, scale = 0;
  std::uint32_t n = 0;

  void observe(double x) {
    ++n;
    if (n == 1) {
      estimate = x;
      return;
    }
    const double a = std::max(1.0 / n, static_cast<double>(s.weight));
    scale += a * (std::abs(x - estimate) - scale);
    if (s.estimate == carve::RunTimeEstimate::mean) {
      estimate += a * (x - estimate);
    } else {
      const double step = 2 * a * scale;
      estimate += x > estimate ? s.quantile * step : x < estimate ? -(1 - s.quantile) * step : 0.0;
      estimate = std::max(estimate, 1.0);
    }
  }
};

} // namespace carve::test
