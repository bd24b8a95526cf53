// RunTimePredictor against a reference model of its two estimates, written out in double precision.
#include "reference_run_time.hpp"
#include "support/errors.hpp"

#include <carve/sim/random.hpp>
#include <carve/slot/policy/run_time_predictor.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

// In a namespace of its own: the area's test files compile as one translation unit.
namespace test_run_time_predictor {

using carve::RunTimeEstimate;
using carve::RunTimePredictor;
using carve::RunTimePredictorSettings;

using Reference = carve::test::RunTimeReference;

TEST_CASE("nothing is predicted before a completion; kernels learn apart; ids beyond the capacity share") {
  RunTimePredictor<4> p;
  CHECK_FALSE(p.predict(0).has_value());
  p.observe(1, 40);
  CHECK_FALSE(p.predict(0).has_value());
  CHECK(p.predict(1) == 40u);
  CHECK(p.predict(5) == 40u); // 5 % 4 == 1
  p.observe(2, 7);
  CHECK(p.predict(1) == 40u);
  CHECK(p.predict(2) == 7u);
  CHECK(p.observed(1) == 1);
}

TEST_CASE("the weighted mean: even at first, then the newest completion weighs `weight`") {
  RunTimePredictor<1> p(RunTimePredictorSettings{RunTimeEstimate::mean, 0.25f});
  for (const std::uint32_t x : {10u, 20u, 30u, 40u}) { // 1/n >= 0.25 throughout: the plain mean
    p.observe(0, x);
  }
  CHECK(p.estimate(0) == doctest::Approx(25.0));
  p.observe(0, 125); // 25 + 0.25 * (125 - 25)
  CHECK(p.estimate(0) == doctest::Approx(50.0));
  CHECK(p.predict(0) == 50u);
}

TEST_CASE("both estimates follow the reference model on long random streams") {
  for (const auto settings :
       {RunTimePredictorSettings{RunTimeEstimate::mean, 0.125f}, RunTimePredictorSettings{RunTimeEstimate::mean, 0.03f},
        RunTimePredictorSettings{RunTimeEstimate::quantile, 0.125f, 0.5f},
        RunTimePredictorSettings{RunTimeEstimate::quantile, 0.05f, 0.9f}}) {
    CAPTURE(settings.weight);
    CAPTURE(settings.quantile);
    RunTimePredictor<2> p(settings);
    Reference ref{settings};
    carve::sim::Rng rng(11);
    for (int i = 0; i < 5000; ++i) {
      const auto x = static_cast<std::uint32_t>(rng.uniform(50, 150));
      p.observe(1, x);
      ref.observe(x);
      REQUIRE(p.estimate(1) == doctest::Approx(ref.estimate).epsilon(1e-3));
    }
  }
}

TEST_CASE("on a stationary stream the estimates settle near the true mean and quantile") {
  const auto settle = [](RunTimePredictorSettings s) {
    RunTimePredictor<1> p(s);
    carve::sim::Rng rng(5);
    double sum = 0;
    int n = 0;
    for (int i = 0; i < 20000; ++i) {
      // Log-normal around 200 (a kernel's run times), skewed so that mean and median differ.
      p.observe(0, static_cast<std::uint32_t>(std::round(200 * std::exp(0.5 * rng.normal()))));
      if (i >= 10000) {
        sum += p.estimate(0);
        ++n;
      }
    }
    return sum / n;
  };
  const double mean = 200 * std::exp(0.125);
  CHECK(settle({RunTimeEstimate::mean, 0.05f}) == doctest::Approx(mean).epsilon(0.03));
  CHECK(settle({RunTimeEstimate::quantile, 0.05f, 0.5f}) == doctest::Approx(200).epsilon(0.04));
  CHECK(settle({RunTimeEstimate::quantile, 0.05f, 0.9f}) ==
        doctest::Approx(200 * std::exp(0.5 * 1.2816)).epsilon(0.06));
}

TEST_CASE("usable in constant expressions, as on a device: no allocation, fixed size") {
  constexpr auto predicted = [] {
    RunTimePredictor<8> p;
    p.observe(3, 90);
    p.observe(3, 110);
    return *p.predict(3);
  }();
  static_assert(predicted == 100);
  static_assert(sizeof(RunTimePredictor<64>) <= 64 * 12 + 12);
}

TEST_CASE("settings outside their domain throw instead of learning nonsense") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const RunTimePredictorSettings bad[] = {
      {RunTimeEstimate::mean, 0.0f, 0.5f},     {RunTimeEstimate::mean, 1.5f, 0.5f},
      {RunTimeEstimate::mean, -0.1f, 0.5f},    {RunTimeEstimate::mean, nan, 0.5f},
      {RunTimeEstimate::quantile, 0.1f, 0.0f}, {RunTimeEstimate::quantile, 0.1f, 1.0f},
      {RunTimeEstimate::quantile, 0.1f, nan},  {static_cast<RunTimeEstimate>(7), 0.1f, 0.5f},
  };
  for (const RunTimePredictorSettings& s : bad) {
    CAPTURE(s.weight);
    CAPTURE(s.quantile);
    CHECK_THROWS_ERRC(carve::Errc::invalid_argument, RunTimePredictor<4>(s));
  }
  const RunTimePredictor<4> edge(RunTimePredictorSettings{RunTimeEstimate::quantile, 1.0f, 0.999f});
  CHECK(edge.status());
  CHECK(RunTimePredictor<4>().status());
}

} // namespace test_run_time_predictor
