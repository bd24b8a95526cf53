// The sweep runs seeds on several threads (this test also runs under ThreadSanitizer).
#include "support/errors.hpp"
#include <carve/sim.hpp>
#include <carve/slot.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <stdexcept>
#include <vector>

using namespace carve;
using namespace carve::sim;

namespace {

std::vector<PolicyRunner> policies() {
  return {contiguous<64, FirstFit>(), contiguous<64, BoundaryNearestFit>(), contiguous<64, ReleaseAlignedFit>(),
          bound<64>()};
}

std::vector<Workgroup> small_workload(std::uint64_t seed) {
  WorkloadSpec spec;
  spec.count = 200;
  spec.sizes = Distribution::uniform(1, 16);
  return generate(spec, seed);
}

} // namespace

TEST_CASE("a progress callback that throws: the sweep's threads are joined and the exception comes back") {
  SweepOptions o;
  o.threads = 2;
  o.progress = [](std::size_t, std::size_t) { throw std::runtime_error("progress bar broke"); };
  CHECK_THROWS_WITH_AS(sweep(policies(), {1, 2, 3, 4}, small_workload, o), "progress bar broke", std::runtime_error);
}

TEST_CASE("a sweep on two threads gives what one thread gives") {
  const std::vector<std::uint64_t> seeds = {1, 2, 3, 4, 5, 6, 7};
  SweepOptions one;
  one.threads = 1;
  one.dispatch.sample_every = 50;
  SweepOptions two = one;
  two.threads = 2;
  std::atomic<int> calls{0};
  two.progress = [&](std::size_t done, std::size_t total) {
    CHECK(done <= total);
    ++calls;
  };
  const auto a = sweep(policies(), seeds, small_workload, one);
  const auto b = sweep(policies(), seeds, small_workload, two);
  CHECK(calls > 0);
  REQUIRE(a.size() == seeds.size());
  for (std::size_t s = 0; s < seeds.size(); ++s) {
    REQUIRE(a[s].size() == 4);
    for (std::size_t p = 0; p < 4; ++p) {
      CHECK(a[s][p].result.makespan == b[s][p].result.makespan);
      CHECK(a[s][p].result.series.remaining == b[s][p].result.series.remaining);
      CHECK(a[s][p].result.wear == b[s][p].result.wear);
    }
    // The bound is a bound; every contiguous policy measured its cost.
    for (std::size_t p = 0; p < 3; ++p) {
      CHECK(a[s][3].result.makespan <= a[s][p].result.makespan);
      CHECK(a[s][p].ns_per_decision > 0.0);
    }
  }
}

TEST_CASE("an error in a run reaches the caller") {
  const auto bad = [](std::uint64_t seed) {
    if (seed == 3) {
      return std::vector<Workgroup>{Workgroup{0, 65, 1, 1}}; // larger than the 64 slots
    }
    return small_workload(seed);
  };
  SweepOptions o;
  o.threads = 2;
  CHECK_THROWS_ERRC(carve::Errc::invalid_argument, sweep(policies(), {1, 2, 3, 4}, bad, o));
}
