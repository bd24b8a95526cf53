// Kernel-structured workloads, launches that wait for their stream, and where hints come from.
#include "support/errors.hpp"

#include <carve/sim.hpp>
#include <carve/slot.hpp>

#include <doctest/doctest.h>

#include <map>
#include <string>
#include <vector>

// In a namespace of its own: the area's test files compile as one translation unit.
namespace test_sim_kernels {

using namespace carve;
using namespace carve::sim;

namespace {

// Records the run time each hinted placement was told.
struct RecordsHints {
  struct hint_type {
    std::uint32_t expected;
    explicit hint_type(const Request& r) : expected(r.expected) {}
  };
  template <std::uint32_t N>
  cuda::std::optional<std::uint32_t> find(const SlotBitmap<N>& b, std::uint32_t m) const {
    return b.lowest_run_start(m);
  }
  template <std::uint32_t N>
  cuda::std::optional<std::uint32_t> find(const SlotBitmap<N>& b, std::uint32_t m, const hint_type& h) const {
    told.push_back(h.expected);
    return b.lowest_run_start(m);
  }
  inline static thread_local std::vector<std::uint32_t> told;
};

} // namespace

TEST_CASE("a kernel mix: launches of one size, run times around the kernel's mean, streams that wait") {
  WorkloadSpec spec;
  spec.count = 4000;
  spec.mix = builtin_mix("inference", "test");
  const auto w = generate(spec, 1);
  REQUIRE(w.size() == spec.count);
  std::map<std::uint32_t, std::uint32_t> launch_size;
  std::vector<double> sum(spec.mix.kernels.size(), 0.0);
  std::vector<double> n(spec.mix.kernels.size(), 0.0);
  std::vector<std::uint32_t> last_of_stream(spec.mix.streams, none);
  for (const Workgroup& g : w) {
    REQUIRE(g.kernel < spec.mix.kernels.size());
    CHECK(g.size == spec.mix.kernels[g.kernel].size);
    const auto [it, fresh] = launch_size.emplace(g.launch, g.kernel);
    CHECK(it->second == g.kernel); // one kernel per launch
    if (fresh) {
      // Round-robin streams, each launch waiting for its stream's previous one.
      CHECK(g.after == last_of_stream[g.launch % spec.mix.streams]);
      last_of_stream[g.launch % spec.mix.streams] = g.launch;
    }
    sum[g.kernel] += g.duration;
    n[g.kernel] += 1;
  }
  for (std::size_t k = 0; k < sum.size(); ++k) {
    REQUIRE(n[k] > 20);
    CHECK(sum[k] / n[k] == doctest::Approx(spec.mix.kernels[k].mean).epsilon(0.08));
  }
  CHECK(generate(spec, 1) == w); // seeded
}

TEST_CASE("hint noise has its own random stream: the workload is the same at every noise level") {
  for (const bool kernels : {false, true}) {
    WorkloadSpec spec;
    spec.count = 500;
    if (kernels) {
      spec.mix = builtin_mix("training", "test");
    }
    auto exact = generate(spec, 7);
    spec.hint_noise = 0.5;
    auto noisy = generate(spec, 7);
    int differ = 0;
    for (std::size_t i = 0; i < exact.size(); ++i) {
      differ += noisy[i].expected != exact[i].expected ? 1 : 0;
      noisy[i].expected = exact[i].expected;
    }
    CHECK(noisy == exact);
    CHECK(differ > 400);
  }
}

TEST_CASE("a launch that waits arrives when its stream's previous launch has finished") {
  // Launch 0: two workgroups (10 and 30 cycles); launch 1 waits for it, 5 cycles after.
  std::vector<Workgroup> w = {{0, 2, 10, 10, 0, 0, none}, {0, 2, 30, 30, 0, 0, none}, {5, 2, 4, 4, 1, 1, 0}};
  const RunResult r = simulate(w, DispatchOptions{}, ContiguousCu<8, FirstFit>{});
  CHECK(r.placements[0].cycle == 0);
  CHECK(r.placements[1].cycle == 1); // one dispatch per cycle
  CHECK(r.placements[2].cycle == 31 + 5);
  CHECK(r.makespan == 31 + 5 + 4);
  w[2].after = 1; // its own launch
  CHECK(carve::test::thrown_message([&] {
          simulate(w, DispatchOptions{}, ContiguousCu<8, FirstFit>{});
        }).find("waits for launch 1, which has no workgroups or does not come before its own") != std::string::npos);
}

TEST_CASE("where hints come from: exact, given, offline means, and learned from completions only") {
  // Kernel 0 runs 10 cycles, kernel 1 runs 100; one at a time (each takes all 8 slots).
  std::vector<Workgroup> w;
  for (std::uint32_t i = 0; i < 6; ++i) {
    const std::uint32_t k = i % 2;
    w.push_back(Workgroup{0, 8, k == 0 ? 10u : 100u, 7, k});
  }
  const auto told = [&](HintMode mode) {
    RecordsHints::told.clear();
    DispatchOptions o;
    o.hints.mode = mode;
    simulate(w, o, ContiguousCu<8, RecordsHints>{});
    // Each workgroup is tried until it fits; keep the hint of its last (successful) try.
    return RecordsHints::told;
  };
  const auto last_per_group = [](const std::vector<std::uint32_t>& all, std::size_t groups) {
    return std::vector<std::uint32_t>(all.end() - static_cast<std::ptrdiff_t>(groups), all.end());
  };
  CHECK(last_per_group(told(HintMode::exact), 1) == std::vector<std::uint32_t>{100});
  for (const std::uint32_t t : told(HintMode::given)) {
    CHECK(t == 7);
  }
  for (const std::uint32_t t : told(HintMode::constant)) {
    CHECK(t == 55);
  }
  // Learned: nothing before the first completion (the plain find, no hint recorded); then the
  // first kernel-1 workgroup is told kernel 0's run time (all that has finished), and from then
  // on each kernel its own: 10 (kernel 1, borrowed), 10, 100, 10, 100.
  RecordsHints::told.clear();
  DispatchOptions o;
  o.hints.mode = HintMode::learned;
  const RunResult r = simulate(w, o, ContiguousCu<8, RecordsHints>{});
  CHECK(r.makespan == 3 * 10 + 3 * 100);
  std::vector<std::uint32_t> distinct;
  for (const std::uint32_t t : RecordsHints::told) {
    if (distinct.empty() || distinct.back() != t) {
      distinct.push_back(t);
    }
  }
  CHECK(distinct == std::vector<std::uint32_t>{10, 100, 10, 100});
  // Given hints need an expected run time; per-kernel ones a kernel.
  w[3].expected = 0;
  CHECK(carve::test::thrown_message([&] {
          DispatchOptions g;
          simulate(w, g, ContiguousCu<8, RecordsHints>{});
        }) == "simulate: workgroup 3 has no expected run time, which given hints need");
  w[3].kernel = none;
  CHECK(carve::test::thrown_message([&] {
          DispatchOptions p;
          p.hints.mode = HintMode::per_kernel;
          simulate(w, p, ContiguousCu<8, RecordsHints>{});
        }) == "simulate: per-kernel hints need every workgroup's kernel");
}

TEST_CASE("kernel types parse from text and print back") {
  const KernelType k = KernelType::parse("gemm size=48 launch=uniform:2:8 mean=400 spread=0.1 weight=2", "x");
  CHECK(k.name == "gemm");
  CHECK(k.size == 48);
  CHECK(k.launch == Distribution::uniform(2, 8));
  CHECK(KernelType::parse(k.to_string(), "x") == k);
  CHECK(carve::test::thrown_message([] { KernelType::parse("gemm size=48", "--kernel"); }) ==
        "--kernel: kernel gemm: size= and mean= are required; expected 'NAME size=SLOTS launch=DIST mean=CYCLES "
        "spread=CV weight=W'");
  CHECK(carve::test::thrown_message([] {
          KernelType::parse("gemm size=4 mean=9 colour=red", "--kernel");
        }).rfind("--kernel: kernel gemm: unknown word 'colour=red'", 0) == 0);
  CHECK(carve::test::thrown_message([] { KernelType::parse("gemm size=4 mean=9 weight=1e308", "x"); }) ==
        "x: kernel gemm: weight must be positive and at most 1e12"); // the weights' sum stays finite
  CHECK(carve::test::thrown_message([] { builtin_mix("decode", "--kernels"); }) ==
        "--kernels: unknown kernel mix 'decode' (built in: inference, long-tail, training)");
}

} // namespace test_sim_kernels
