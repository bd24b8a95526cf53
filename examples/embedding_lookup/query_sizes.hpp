// How many vectors a query looks up: a DeepRecSys-like heavy-tailed distribution.
//
// DeepRecSys (Gupta et al., ISCA 2020) reports production recommendation query sizes with a
// heavy tail: most queries are small, a few are very large. We draw from a lognormal with
// median 100 and sigma 1 (mean about 165), clipped to [1, max]: with the 128/512 thresholds
// about 60% of queries are small, 35% medium and 5% large.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>

namespace embedding {

struct QuerySizes {
  double median = 100.0;
  double sigma = 1.0;
  std::uint32_t max = 1024;

  std::uint32_t operator()(std::mt19937_64& rng) const {
    std::lognormal_distribution<double> d(std::log(median), sigma);
    const double x = std::round(d(rng));
    return static_cast<std::uint32_t>(std::clamp(x, 1.0, static_cast<double>(max)));
  }
};

} // namespace embedding
