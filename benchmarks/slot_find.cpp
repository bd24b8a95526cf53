// How fast a fit policy finds room: carve's word-parallel search against the run-walking scan
// (the shape of Linux's bitmap_find_next_zero_area) and a per-start AND of the m slot bits done
// literally.
//
// Inputs are snapshots of random allocate/free processes (see workload.hpp). Before timing,
// every implementation is run on every input and must give the same answer.
#include "baselines.hpp"
#include "compare.hpp"
#include "workload.hpp"

#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <deque>
#include <string>
#include <vector>

namespace {

using namespace carve;
using namespace carve::bench;

// Finds the start a policy would pick from the complete run-start mask: what a search costs
// when it cannot stop at the first candidate from each end.
struct FullMaskBoundaryNearest {
  template <std::uint32_t N>
  cuda::std::optional<std::uint32_t> find(const SlotBitmap<N>& b, std::uint32_t m) const {
    const SlotBitmap<N> starts = b.run_starts(m);
    const auto i = runs::next_free(starts.words(), N, 0);
    if (i == N) {
      return cuda::std::nullopt;
    }
    const std::uint32_t j = *starts.highest_run_start(1);
    return i + j <= N - m ? i : j;
  }
};

template <class Fit>
std::string label(const char* impl) {
  return std::string(impl) + ":" + policy_name<Fit>();
}

template <std::uint32_t N>
struct Suite {
  std::string name; // e.g. "N=128/m=1..16"
  std::vector<FindInput<N>> inputs;
};

// Inputs stay alive for the whole run; benchmarks refer to them.
template <std::uint32_t N>
std::deque<Suite<N>>& suites() {
  static std::deque<Suite<N>> s;
  return s;
}

// Working sets of ~1 MiB at most, so that large bitmaps measure the search, not DRAM.
template <std::uint32_t N>
std::size_t input_count() {
  std::size_t n = 4096;
  while (n > 16 && n * sizeof(FindInput<N>) > (1u << 20)) {
    n /= 2;
  }
  return n;
}

// One benchmark iteration is one pass over all inputs; the reported time is per find.
template <std::uint32_t N, class Fit>
void register_find(const Suite<N>& suite, const std::string& impl) {
  benchmark::RegisterBenchmark(("find/" + suite.name + "/" + impl).c_str(), [&suite](benchmark::State& state) {
    const Fit fit{};
    for (auto _ : state) {
      for (const FindInput<N>& in : suite.inputs) {
        auto start = fit.find(in.bitmap, in.m); // not const: GCC then spills the optional through the stack
        consume(start ? *start : N);
      }
    }
    state.counters["per_item"] = per_item(suite.inputs.size());
  });
}

// Every implementation in Fits must answer like Reference on every input.
template <std::uint32_t N, class Reference, class... Fits>
void verify(const Suite<N>& suite) {
  for (const FindInput<N>& in : suite.inputs) {
    const auto want = Reference{}.find(in.bitmap, in.m);
    const bool same = ((Fits{}.find(in.bitmap, in.m) == want) && ...);
    if (!same) {
      std::fprintf(stderr, "%s: implementations disagree for m = %u; refusing to time them\n", suite.name.c_str(),
                   in.m);
      std::exit(1);
    }
  }
}

template <std::uint32_t N>
const Suite<N>& make_suite(std::string name, SizeDistribution process_sizes, SizeDistribution queries) {
  auto inputs = fragmented_inputs<N>(input_count<N>(), process_sizes, queries, 0x5eed + N);
  return suites<N>().emplace_back(Suite<N>{std::move(name), std::move(inputs)});
}

// The headline comparison: N = 128 (64 KiB of shared memory in 512-byte slots), m in 1..16.
void register_headline() {
  constexpr std::uint32_t N = 128;
  const auto& s = make_suite<N>("N=128/m=1..16", {16, false}, {16, false});
  verify<N, BoundaryNearestFit, RunWalkBoundaryNearest, LiteralBoundaryNearest, FullMaskBoundaryNearest>(s);
  verify<N, FirstFit, RunWalkFirstFit>(s);
  register_find<N, BoundaryNearestFit>(s, label<BoundaryNearestFit>("carve"));
  register_find<N, FirstFit>(s, label<FirstFit>("carve"));
  register_find<N, LastFit>(s, label<LastFit>("carve"));
  register_find<N, BestFit>(s, label<BestFit>("carve"));
  register_find<N, RunWalkBoundaryNearest>(s, "run-walk:boundary-nearest");
  register_find<N, RunWalkFirstFit>(s, "run-walk:first-fit");
  register_find<N, LiteralBoundaryNearest>(s, "literal-and:boundary-nearest");
  register_find<N, FullMaskBoundaryNearest>(s, "full-mask:boundary-nearest");
}

// Growth with N, requests from 1 slot up to the whole bitmap (log-uniform).
template <std::uint32_t N>
void register_scaling() {
  const std::uint32_t process_max = N / 8 > 16 ? N / 8 : 16;
  const std::string n = "N=" + std::to_string(N);
  const auto& any = make_suite<N>(n + "/m=1..N", {process_max, true}, {N, true});
  verify<N, BoundaryNearestFit, RunWalkBoundaryNearest, FullMaskBoundaryNearest>(any);
  register_find<N, BoundaryNearestFit>(any, label<BoundaryNearestFit>("carve"));
  register_find<N, FirstFit>(any, label<FirstFit>("carve"));
  register_find<N, LastFit>(any, label<LastFit>("carve"));
  register_find<N, BestFit>(any, label<BestFit>("carve"));
  register_find<N, RunWalkBoundaryNearest>(any, "run-walk:boundary-nearest");
  register_find<N, FullMaskBoundaryNearest>(any, "full-mask:boundary-nearest");
  if constexpr (N <= 128) {
    verify<N, BoundaryNearestFit, LiteralBoundaryNearest>(any);
    register_find<N, LiteralBoundaryNearest>(any, "literal-and:boundary-nearest");
  }
  if constexpr (N != 128) {
    const auto& small = make_suite<N>(n + "/m=1..16", {16, false}, {16, false});
    verify<N, BoundaryNearestFit, RunWalkBoundaryNearest>(small);
    register_find<N, BoundaryNearestFit>(small, label<BoundaryNearestFit>("carve"));
    register_find<N, RunWalkBoundaryNearest>(small, "run-walk:boundary-nearest");
  }
}

template <std::uint32_t N>
void print_scaling_row(const MedianCollector& c) {
  const std::string n = "find/N=" + std::to_string(N);
  const auto cell = [&](const std::string& name) {
    const auto t = c.ns(name);
    return t ? *t : -1.0;
  };
  const double bn_any = cell(n + "/m=1..N/carve:boundary-nearest");
  const double bn_small = cell(n + "/m=1..16/carve:boundary-nearest");
  std::printf("  %6u %6u %10.2f %10.2f %10.3f %10.2f %10.2f %10.2f %12.2f %12.2f\n", N, SlotBitmap<N>::word_count,
              bn_small, bn_any, bn_any / SlotBitmap<N>::word_count, cell(n + "/m=1..N/carve:first-fit"),
              cell(n + "/m=1..N/carve:last-fit"), cell(n + "/m=1..N/carve:best-fit"),
              cell(n + "/m=1..N/run-walk:boundary-nearest"), cell(n + "/m=1..N/full-mask:boundary-nearest"));
}

} // namespace

int main(int argc, char** argv) {
  register_headline();
  register_scaling<64>();
  register_scaling<128>();
  register_scaling<1024>();
  register_scaling<4096>();
  register_scaling<65536>();

  MedianCollector c;
  run_with_medians(argc, argv, c);

  const std::string h = "find/N=128/m=1..16/";
  std::printf("\nN = 128, m in 1..16, medians:\n");
  print_bound(c, "carve boundary-nearest find", h + "carve:boundary-nearest", 6.0);
  print_ratio(c, "run-walk / carve (boundary-nearest)", h + "run-walk:boundary-nearest", h + "carve:boundary-nearest",
              3);
  print_ratio(c, "literal per-start AND / carve (boundary-nearest)", h + "literal-and:boundary-nearest",
              h + "carve:boundary-nearest", 50);
  print_ratio(c, "run-walk / carve (first-fit)", h + "run-walk:first-fit", h + "carve:first-fit", 1);
  print_ratio(c, "full mask / carve (boundary-nearest)", h + "full-mask:boundary-nearest", h + "carve:boundary-nearest",
              1);

  std::printf("\nScaling, median ns per find (m=1..N is log-uniform; -1 = not run):\n");
  std::printf("  %6s %6s %10s %10s %10s %10s %10s %10s %12s %12s\n", "N", "words", "BN m<=16", "BN m<=N", "BN/word",
              "FF m<=N", "LF m<=N", "BF m<=N", "walk BN m<=N", "mask BN m<=N");
  print_scaling_row<64>(c);
  print_scaling_row<128>(c);
  print_scaling_row<1024>(c);
  print_scaling_row<4096>(c);
  print_scaling_row<65536>(c);
  return 0;
}
