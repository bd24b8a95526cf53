#include "support/errors.hpp"

#include <carve/sim.hpp>

#include <doctest/doctest.h>

#include <vector>

// In a namespace of its own: the area's test files compile as one translation unit.
namespace test_sim_stats {

using namespace carve::sim;

TEST_CASE("Student t critical values match the tables") {
  CHECK(t_critical_95(1) == doctest::Approx(12.706));
  CHECK(t_critical_95(4) == doctest::Approx(2.776));
  CHECK(t_critical_95(5) == doctest::Approx(2.571).epsilon(0.001));
  CHECK(t_critical_95(10) == doctest::Approx(2.228).epsilon(0.001));
  CHECK(t_critical_95(30) == doctest::Approx(2.042).epsilon(0.001));
  CHECK(t_critical_95(199) == doctest::Approx(1.972).epsilon(0.001));
}

TEST_CASE("a summary of known values") {
  const Summary s = summarize({4, 1, 3, 2, 5});
  CHECK(s.n == 5);
  CHECK(s.mean == 3.0);
  CHECK(s.median == 3.0);
  CHECK(s.stddev == doctest::Approx(1.5811388));
  CHECK(s.ci_low == doctest::Approx(3.0 - 2.776 * 1.5811388 / std::sqrt(5.0)));
  CHECK(s.ci_high == doctest::Approx(3.0 + 2.776 * 1.5811388 / std::sqrt(5.0)));
  CHECK(s.p2_5 == doctest::Approx(1.1));
  CHECK(s.p97_5 == doctest::Approx(4.9));
  CHECK(summarize({}).n == 0);
  CHECK(summarize({7}).ci_low == 7.0);
}

TEST_CASE("paired comparisons count wins, ties and losses run by run") {
  const PairedComparison c = compare_paired({10, 10, 10, 10}, {9, 10, 12, 8});
  CHECK(c.wins == 0.5);
  CHECK(c.ties == 0.25);
  CHECK(c.losses == 0.25);
  CHECK(c.difference.mean == doctest::Approx(0.25)); // (1 + 0 - 2 + 2) / 4
  CHECK_THROWS(compare_paired({1, 2}, {1}));
}

TEST_CASE("the best of several, with ties shared") {
  const auto shares = best_shares({{1, 5, 3}, {2, 5, 3}, {3, 4, 3}});
  CHECK(shares[0] == doctest::Approx(1 + 1.0 / 3));
  CHECK(shares[1] == doctest::Approx(1.0 / 3));
  CHECK(shares[2] == doctest::Approx(1 + 1.0 / 3));
}

TEST_CASE("best_shares refuses candidates of unequal runs with carve's exception, naming the candidate") {
  // A shorter candidate after the first was read past its end (vector::at: std::out_of_range).
  const auto call = [] { (void)best_shares({{1, 2, 3}, {1, 2, 3}, {1, 2}}); };
  CHECK(carve::test::thrown_code(call) == carve::Errc::out_of_range);
  CHECK(carve::test::thrown_message(call).find("candidate 2") != std::string::npos);
}

} // namespace test_sim_stats
