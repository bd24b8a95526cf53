// How long choosing a lending card takes for 16 cards: carve's BandwidthWeightedPicker (path
// bandwidths read from the table the topology computed once) against a naive picker that
// searches the machine graph for the widest path to every card on every request.
//
// Inputs: 4096 requests from a full card, with random free memory on the others, on a 16-GPU
// two-socket board (PCIe switches per GPU pair, NVLink rings with cross links of 1 or 2 links,
// so two-hop paths matter). Before timing, both pickers must choose the same card every time.
#include "compare.hpp"

#include <carve/borrow.hpp>

#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace {

using namespace carve;
using namespace carve::bench;

constexpr int cards = 16;

Topology sixteen_gpu_board() {
  TopologyBuilder b;
  const NodeId cpu0 = b.add_cpu("CPU0");
  const NodeId cpu1 = b.add_cpu("CPU1");
  b.add_link(cpu0, cpu1, LinkType::inter_socket);
  std::vector<NodeId> gpu;
  for (int i = 0; i < cards; ++i) {
    gpu.push_back(b.add_gpu("GPU" + std::to_string(i)));
  }
  for (int s = 0; s < cards / 2; ++s) {
    const NodeId sw = b.add_pcie_switch("SW" + std::to_string(s));
    b.add_link(s < cards / 4 ? cpu0 : cpu1, sw, LinkType::pcie, 1, 32.0);
    b.add_link(sw, gpu[static_cast<std::size_t>(2 * s)], LinkType::pcie);
    b.add_link(sw, gpu[static_cast<std::size_t>(2 * s + 1)], LinkType::pcie);
  }
  for (int i = 0; i < cards; ++i) {
    const auto at = [&](int k) { return gpu[static_cast<std::size_t>((i + k) % cards)]; };
    b.add_link(gpu[static_cast<std::size_t>(i)], at(1), LinkType::nvlink, i % 2 == 0 ? 2 : 1);
    if (i % 4 == 0) {
      b.add_link(gpu[static_cast<std::size_t>(i)], at(5), LinkType::nvlink, 2);
    }
  }
  return b.build();
}

// The per-request search a picker without precomputed paths does: widest path (fewest hops on
// ties) from the requester to every node, over simple paths of at most max_hops links that a
// peer's loads can take (no GPU relays them, as carve's picker scores).
class NaivePicker {
public:
  explicit NaivePicker(const Topology& t) : topo_(t) {}

  std::optional<int> pick(int requester, std::size_t bytes, std::span<const CardState> states) const {
    if (states[static_cast<std::size_t>(requester)].largest_free_block >= bytes) {
      return requester;
    }
    const std::size_t n = topo_.node_count();
    best_bw_.assign(n, 0.0);
    best_hops_.assign(n, -1);
    on_path_.assign(n, false);
    search(topo_.gpu(requester), std::nullopt, std::numeric_limits<double>::infinity(), 0);
    int best = -1;
    for (int c = 0; c < cards; ++c) {
      const CardState& s = states[static_cast<std::size_t>(c)];
      const std::size_t node = topo_.gpu(c).value;
      if (c == requester || s.largest_free_block < bytes || best_bw_[node] <= 0.0) {
        continue;
      }
      if (best < 0) {
        best = c;
        continue;
      }
      const std::size_t b = topo_.gpu(best).value;
      const CardState& bs = states[static_cast<std::size_t>(best)];
      if (best_bw_[node] != best_bw_[b]       ? best_bw_[node] > best_bw_[b]
          : best_hops_[node] != best_hops_[b] ? best_hops_[node] < best_hops_[b]
                                              : s.free_bytes > bs.free_bytes) {
        best = c;
      }
    }
    return best < 0 ? std::nullopt : std::optional<int>(best);
  }

private:
  bool relays(NodeId at, LinkType, LinkType) const {
    switch (topo_.node(at).kind) {
    case NodeKind::gpu:
      return false;
    case NodeKind::nic:
      return false;
    default:
      return true;
    }
  }
  void search(NodeId at, std::optional<LinkType> arrived, double width, int depth) const {
    if (depth == topo_.options().max_hops) {
      return;
    }
    on_path_[at.value] = true;
    for (const Link& l : topo_.links()) {
      if (l.a != at && l.b != at) {
        continue;
      }
      const NodeId next = l.a == at ? l.b : l.a;
      if (on_path_[next.value] || (arrived && !relays(at, *arrived, l.type))) {
        continue;
      }
      const double w = std::min(width, l.bandwidth());
      if (w > best_bw_[next.value] || (w == best_bw_[next.value] && depth + 1 < best_hops_[next.value])) {
        best_bw_[next.value] = w;
        best_hops_[next.value] = depth + 1;
      }
      search(next, l.type, w, depth + 1);
    }
    on_path_[at.value] = false;
  }

  const Topology& topo_;
  mutable std::vector<double> best_bw_;
  mutable std::vector<int> best_hops_;
  mutable std::vector<bool> on_path_;
};

struct Request {
  int requester;
  std::size_t bytes;
  std::vector<CardState> states;
};

const Topology& board() {
  static const Topology t = sixteen_gpu_board();
  return t;
}

const std::vector<Request>& requests() {
  static const std::vector<Request> r = [] {
    std::mt19937_64 rng(0x5eed);
    constexpr std::size_t GiB = std::size_t{1} << 30;
    std::vector<Request> out;
    for (int i = 0; i < 4096; ++i) {
      Request q{static_cast<int>(rng() % cards), (1 + rng() % 8) * GiB, {}};
      for (int c = 0; c < cards; ++c) {
        const std::size_t free = (rng() % 40) * GiB / 2;
        q.states.push_back(CardState{free, free - (free / 8) * (rng() % 2)});
      }
      q.states[static_cast<std::size_t>(q.requester)] = CardState{GiB / 4, GiB / 4}; // full
      out.push_back(std::move(q));
    }
    return out;
  }();
  return r;
}

template <class Picker>
void run(benchmark::State& state, const Picker& picker) {
  const auto& reqs = requests();
  for (auto _ : state) {
    for (const Request& q : reqs) {
      const auto p = picker.pick(q.requester, q.bytes, q.states);
      consume(p ? static_cast<std::uint32_t>(p->card) : 99u);
    }
  }
  state.counters["per_item"] = per_item(reqs.size());
}

struct NaiveAdapter {
  NaivePicker naive;
  struct Out {
    int card;
  };
  std::optional<Out> pick(int r, std::size_t bytes, std::span<const CardState> s) const {
    const auto c = naive.pick(r, bytes, s);
    return c ? std::optional<Out>(Out{*c}) : std::nullopt;
  }
};

void verify() {
  const BandwidthWeightedPicker<LargestBandwidth> carve_picker(board());
  const NaivePicker naive(board());
  for (const Request& q : requests()) {
    const auto a = carve_picker.pick(q.requester, q.bytes, q.states);
    const auto b = naive.pick(q.requester, q.bytes, q.states);
    if (a.has_value() != b.has_value() || (a && a->card != *b)) {
      std::fprintf(stderr, "pickers disagree for requester %d; refusing to time them\n", q.requester);
      std::exit(1);
    }
  }
}

} // namespace

int main(int argc, char** argv) {
  verify();
  static const BandwidthWeightedPicker<LargestBandwidth> largest(board());
  static const BandwidthWeightedPicker<ThresholdMostFree> threshold(board(), ThresholdMostFree{30.0});
  static const BandwidthWeightedPicker<WeightedScore> weighted(board());
  static const NaiveAdapter naive{NaivePicker(board())};
  benchmark::RegisterBenchmark("pick/16 cards/carve:largest-bandwidth", [](benchmark::State& s) { run(s, largest); });
  benchmark::RegisterBenchmark("pick/16 cards/carve:threshold-most-free",
                               [](benchmark::State& s) { run(s, threshold); });
  benchmark::RegisterBenchmark("pick/16 cards/carve:weighted-score", [](benchmark::State& s) { run(s, weighted); });
  benchmark::RegisterBenchmark("pick/16 cards/naive-path-search:largest-bandwidth",
                               [](benchmark::State& s) { run(s, naive); });

  MedianCollector c;
  run_with_medians(argc, argv, c);
  const std::string p = "pick/16 cards/";
  std::printf("\n16 cards, medians per decision:\n");
  print_bound(c, "carve largest-bandwidth pick", p + "carve:largest-bandwidth", 1000.0);
  print_bound(c, "carve threshold-most-free pick", p + "carve:threshold-most-free", 1000.0);
  print_bound(c, "carve weighted-score pick", p + "carve:weighted-score", 1000.0);
  print_ratio(c, "naive path search / carve (largest-bandwidth)", p + "naive-path-search:largest-bandwidth",
              p + "carve:largest-bandwidth", 1);
  return 0;
}
