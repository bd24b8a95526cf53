// Workload generation, distributions as text, and CSV traces.
#include "support/errors.hpp"

#include <carve/sim.hpp>

#include <doctest/doctest.h>

#include <sstream>
#include <string>
#include <vector>

// In a namespace of its own: the area's test files compile as one translation unit.
namespace test_sim_workload {

using namespace carve::sim;

namespace {

std::vector<Workgroup> read(const std::string& text, std::uint32_t slots = 128) {
  std::istringstream in(text);
  return read_trace(in, "t.csv", slots);
}

} // namespace

TEST_CASE("a seed names one workload, whatever else runs") {
  WorkloadSpec spec;
  spec.count = 500;
  const auto a = generate(spec, 7);
  const auto b = generate(spec, 7);
  const auto c = generate(spec, 8);
  CHECK(a == b);
  CHECK(a != c);
  for (const Workgroup& w : a) {
    CHECK(w.size >= 1);
    CHECK(w.size <= 32);
    CHECK(w.duration >= 10);
    CHECK(w.duration <= 100);
    CHECK(w.expected == w.duration);
    CHECK(w.arrival == 0);
  }
  // Pinned values: a seed in a README or a paper must keep naming the same workload.
  Rng rng(1);
  CHECK(rng.next() == 12966619160104079557ull);
  CHECK(rng.next() == 9600361134598540522ull);
  const auto first = generate(spec, 1);
  CHECK(first[0] == Workgroup{0, 6, 44, 44});
  CHECK(first[1] == Workgroup{0, 21, 30, 30});
  CHECK(first[2] == Workgroup{0, 20, 16, 16});
}

TEST_CASE("distributions draw what they say") {
  Rng rng(3);
  const auto mean_of = [&](const Distribution& d, int n) {
    double sum = 0;
    for (int i = 0; i < n; ++i) {
      const std::uint32_t v = d.draw(rng);
      REQUIRE(v >= d.min());
      REQUIRE(v <= d.max());
      sum += v;
    }
    return sum / n;
  };
  CHECK(mean_of(Distribution::uniform(1, 32), 200'000) == doctest::Approx(16.5).epsilon(0.01));
  CHECK(mean_of(Distribution::bimodal(1, 8, 24, 48, 0.25), 200'000) ==
        doctest::Approx(0.75 * 4.5 + 0.25 * 36).epsilon(0.01));
  CHECK(mean_of(Distribution::geometric(8.0), 200'000) == doctest::Approx(8.0).epsilon(0.02));
  CHECK(mean_of(Distribution::geometric(8.0, 20), 50'000) < 8.0); // truncated above 20
  CHECK(mean_of(Distribution::fixed(5), 100) == 5.0);
}

TEST_CASE("hint noise: expected run times scatter around the real ones") {
  WorkloadSpec spec;
  spec.count = 20'000;
  spec.hint_noise = 0.5;
  double log_error = 0;
  int off = 0;
  for (const Workgroup& w : generate(spec, 2)) {
    CHECK(w.expected >= 1);
    log_error += std::log(static_cast<double>(w.expected) / w.duration);
    off += w.expected != w.duration ? 1 : 0;
  }
  CHECK(log_error / spec.count == doctest::Approx(0.0).epsilon(0.02).scale(1.0));
  CHECK(off > spec.count / 2);
}

TEST_CASE("poisson arrivals come at the asked rate") {
  WorkloadSpec spec;
  spec.count = 10'000;
  spec.arrivals = Arrivals{0.5};
  const auto w = generate(spec, 4);
  CHECK(w.back().arrival == doctest::Approx(20'000).epsilon(0.05));
  for (std::size_t i = 1; i < w.size(); ++i) {
    CHECK(w[i].arrival >= w[i - 1].arrival);
  }
}

TEST_CASE("distributions and arrivals as text, both ways") {
  for (const char* text : {"uniform 1 32", "bimodal 1 8 24 48 0.25", "geometric 8", "geometric 8.5 64", "fixed 3"}) {
    CHECK(Distribution::parse(text, "x").to_string() == text);
  }
  CHECK(Distribution::parse("uniform:1:32", "x") == Distribution::uniform(1, 32));
  CHECK(Arrivals::parse("poisson 0.25", "x").to_string() == "poisson 0.25");
  CHECK(Arrivals::parse("at-once", "x").per_cycle == 0.0);
}

TEST_CASE("bad distributions say what is wrong and where") {
  CHECK(carve::test::thrown_message([] { Distribution::parse("uniform -3 8", "--sizes"); }) ==
        "--sizes: value -3 is negative");
  CHECK(carve::test::thrown_message([] { Distribution::parse("uniform 8 3", "sim.conf", 4); }) ==
        "sim.conf:4: 'uniform 8 3': range 8..3 is empty");
  CHECK(carve::test::thrown_message([] { Distribution::parse("uniform 0 3", "x"); }) ==
        "x: 'uniform 0 3': values must be at least 1");
  CHECK(carve::test::thrown_message([] { Distribution::parse("uniform 1", "x"); }) ==
        "x: 'uniform 1': expected 'uniform LO HI'");
  CHECK(carve::test::thrown_message([] { Distribution::parse("normal 1 2", "x"); }) ==
        "x: unknown distribution 'normal': expected uniform, bimodal, geometric or fixed");
  CHECK(carve::test::thrown_message([] { Distribution::parse("bimodal 1 2 3 4 1.5", "x"); }) ==
        "x: 'bimodal 1 2 3 4 1.5': probability must lie in [0, 1]");
  CHECK(carve::test::thrown_message([] { Distribution::parse("geometric 0.5", "x"); }) ==
        "x: 'geometric 0.5': the mean must be at least 1");
  // Draws above MAX are redrawn: a mean far above it would redraw (nearly) for ever.
  CHECK(carve::test::thrown_message([] { Distribution::parse("geometric 1e16", "x"); }) ==
        "x: 'geometric 1e16': the mean must be at most 1000 times MAX");
  CHECK(carve::test::thrown_message([] { Distribution::parse("geometric 1e9 128", "x"); }) ==
        "x: 'geometric 1e9 128': the mean must be at most 1000 times MAX");
  carve::sim::Rng rng(1);
  const Distribution wide = Distribution::parse("geometric 1e12", "x"); // 1 - 1/mean is not 1 in log1p
  CHECK(wide.draw(rng) >= 1);
  CHECK(carve::test::thrown_message([] { Distribution::parse("fixed 2x", "x"); }) ==
        "x: value '2x' is not a whole number");
  CHECK(carve::test::thrown_message([] { Distribution::parse("", "x"); }) ==
        "x: empty distribution: expected uniform, bimodal, geometric or fixed");
  CHECK(carve::test::thrown_message([] { Arrivals::parse("poisson -1", "x"); }) ==
        "x: 'poisson -1': the rate must be positive");
  CHECK(carve::test::thrown_message([] { Arrivals::parse("sometimes", "x"); }) ==
        "x: 'sometimes': expected 'at-once' or 'poisson RATE'");
}

TEST_CASE("a trace round-trips exactly") {
  WorkloadSpec spec;
  spec.count = 300;
  spec.hint_noise = 0.3;
  spec.arrivals = Arrivals{0.1};
  const auto w = generate(spec, 9);
  std::ostringstream out;
  write_trace(out, w);
  CHECK(out.str().rfind("arrival,size,duration,expected\n", 0) == 0);
  CHECK(read(out.str()) == w);
}

TEST_CASE("trace details: optional hint, comments, blank lines, CRLF, arrival order") {
  const auto w = read("# a comment\r\n\r\n5, 2, 10\r\n0,3,4,\r\n5,1,1,9\r\n");
  REQUIRE(w.size() == 3);
  CHECK(w[0] == Workgroup{0, 3, 4, 0}); // arrival order; no hint given is 0, never the run time
  CHECK(w[1] == Workgroup{5, 2, 10, 0});
  CHECK(w[2] == Workgroup{5, 1, 1, 9});
}

TEST_CASE("a trace header names its columns in any order; kernels are numbered by first appearance") {
  const auto w = read("kernel,duration,arrival,size\ngemm,40,0,12\nnorm,9,0,2\n,5,1,1\ngemm,44,2,12\n");
  REQUIRE(w.size() == 4);
  CHECK(w[0] == Workgroup{0, 12, 40, 0, 0});
  CHECK(w[1] == Workgroup{0, 2, 9, 0, 1});
  CHECK(w[2] == Workgroup{1, 1, 5, 0, none});
  CHECK(w[3] == Workgroup{2, 12, 44, 0, 0});
  const auto e = read("size,arrival,expected,duration\n3,0,7,5\n");
  CHECK(e[0] == Workgroup{0, 3, 5, 7});
  CHECK(carve::test::thrown_message([] { read("arrival,size,time\n0,1,1\n"); }) ==
        "t.csv:1: unknown column 'time' in the header (columns: arrival, size, duration, and optionally expected and "
        "kernel)");
  CHECK(carve::test::thrown_message([] { read("arrival,size,size,duration\n"); }) ==
        "t.csv:1: column 'size' appears twice in the header");
  CHECK(carve::test::thrown_message([] { read("arrival,duration,kernel\n0,1,a\n"); }) ==
        "t.csv:1: the header has no 'size' column");
  CHECK(carve::test::thrown_message([] { read("arrival,size,duration\n0,1,1,1\n"); }) ==
        "t.csv:2: expected 3 fields as the header says, found 4");
}

TEST_CASE("a kernel workload round-trips through a trace with a kernel column") {
  WorkloadSpec spec;
  spec.count = 200;
  spec.mix = builtin_mix("long-tail", "test");
  spec.mix.stream_waits = false;
  spec.arrivals = Arrivals{0.05};
  auto w = generate(spec, 3);
  std::ostringstream out;
  write_trace(out, w);
  CHECK(out.str().rfind("arrival,size,duration,expected,kernel\n", 0) == 0);
  const auto back = read(out.str());
  REQUIRE(back.size() == w.size());
  // Launches are not in a trace, and kernels are renumbered by first appearance.
  std::vector<std::uint32_t> renumber(spec.mix.kernels.size(), none);
  std::uint32_t next = 0;
  for (std::size_t i = 0; i < w.size(); ++i) {
    if (renumber[w[i].kernel] == none) {
      renumber[w[i].kernel] = next++;
    }
    CHECK(back[i].kernel == renumber[w[i].kernel]);
    CHECK(back[i].duration == w[i].duration);
    CHECK(back[i].arrival == w[i].arrival);
  }
  spec.mix.stream_waits = true;
  CHECK(carve::test::thrown_message([&] {
          write_trace(out, generate(spec, 3), "--write-trace");
        }).rfind("--write-trace: launches that wait", 0) == 0);
}

TEST_CASE("bad traces name the line") {
  CHECK(carve::test::thrown_message([] { read("arrival,size,duration\n0,4,10\n0,-3,10\n"); }) ==
        "t.csv:3: size -3 is negative");
  CHECK(carve::test::thrown_message([] { read("0,129,10\n"); }) ==
        "t.csv:1: size 129 is outside 1..128 (the slots of a compute unit)");
  CHECK(carve::test::thrown_message([] { read("0,0,10\n"); }) ==
        "t.csv:1: size 0 is outside 1..128 (the slots of a compute unit)");
  CHECK(carve::test::thrown_message([] { read("0,4,10\n0,4\n"); }) ==
        "t.csv:2: expected 3 or 4 fields (arrival,size,duration[,expected]), found 2");
  CHECK(carve::test::thrown_message([] { read("0,4,10,1,1\n"); }) ==
        "t.csv:1: expected 3 or 4 fields (arrival,size,duration[,expected]), found 5");
  CHECK(carve::test::thrown_message([] { read("0,four,10\n"); }) == "t.csv:1: size 'four' is not a whole number");
  CHECK(carve::test::thrown_message([] { read("0,4,1.5\n"); }) == "t.csv:1: duration '1.5' is not a whole number");
  CHECK(carve::test::thrown_message([] { read("0,4,\n"); }) == "t.csv:1: duration '' is not a whole number");
  CHECK(carve::test::thrown_message([] { read("0,4,0\n"); }) == "t.csv:1: duration must be at least 1 cycle");
  CHECK(carve::test::thrown_message([] { read("99999999999,4,1\n"); }) == "t.csv:1: arrival 99999999999 is too large");
  CHECK(carve::test::thrown_message([] { read("arrival,size,duration\n# nothing\n\n"); }) ==
        "t.csv: the trace holds no workgroups");
  CHECK(carve::test::thrown_message([] { read(""); }) == "t.csv: the trace holds no workgroups");
  CHECK(carve::test::thrown_message([] { read_trace_file("/nonexistent/trace.csv", 128); }) ==
        "/nonexistent/trace.csv: cannot open the trace");
  CHECK(carve::test::thrown_message([] { read("0,64,10\n", 64); }).empty());
}

} // namespace test_sim_workload
