// slot_sim's settings: from the command line (--key value or --key=value) and from config
// files (`key = value` lines, '#' comments), which take the same keys. Later settings win.
// Every bad value throws carve::Exception (sim::input_error) naming the option or the file and line.
#pragma once

#include "policies.hpp"

#include <carve/sim.hpp>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

namespace slot_sim {

using carve::sim::input_error;
using carve::sim::KernelMix;

struct Shard {
  std::uint32_t index = 1; // 1-based
  std::uint32_t count = 1;
};

// The largest settings one process accepts (memory grows with each).
inline constexpr std::uint32_t max_workgroups = 1'000'000; // per run, ~100 bytes each per thread
inline constexpr std::uint32_t max_cus = 4096;             // up to ~8 KiB each per run
inline constexpr std::uint32_t max_seeds = 100'000;        // per process (per shard): a table row each
inline constexpr std::uint32_t max_threads = 256;

// One source of hints for the hinted policies, as --hints names it.
struct HintChoice {
  carve::sim::HintMode mode = carve::sim::HintMode::exact;
  double noise = 0; // "noisy S": given hints from run times with noise S
  std::string label() const {
    if (noise > 0) {
      return "noisy " + carve::sim::detail::format_real(noise);
    }
    return to_string(mode);
  }
};

struct Config {
  std::uint32_t slots = 128;
  std::vector<HintChoice> hints; // empty: chosen by finish() from the workload
  carve::RunTimePredictorSettings predictor{};
  carve::sim::WorkloadSpec workload{};
  std::string trace; // replay this CSV trace instead of generating workloads
  carve::sim::DispatchOptions dispatch{};
  std::uint32_t seeds = 200;
  std::uint64_t first_seed = 1;
  std::vector<std::string> policies; // empty: all
  std::string out = "slot_sim_out";
  unsigned threads = 0;
  Shard shard{};
  bool cost = true;
  std::string write_trace; // write the first seed's workload as a trace and stop

  // Where each setting came from ("--sizes", or a config file and line), for errors that
  // involve several settings.
  std::map<std::string, std::pair<std::string, std::size_t>> origin;
  carve::Exception error(const std::string& key, const std::string& what) const {
    const auto it = origin.find(key);
    return it == origin.end() ? input_error("--" + key, 0, what)
                              : input_error(it->second.first, it->second.second, what);
  }

  // The seeds this process runs: every seed of the sweep, or this shard's share (seeds are dealt
  // round-robin, so shards take equal time).
  std::vector<std::uint64_t> shard_seeds() const {
    std::vector<std::uint64_t> out_seeds;
    for (std::uint32_t k = shard.index - 1; k < seeds; k += shard.count) {
      out_seeds.push_back(first_seed + k);
    }
    return out_seeds;
  }
};

inline const std::vector<std::uint32_t>& supported_slots() {
  static const std::vector<std::uint32_t> n = {64, 128, 256, 512};
  return n;
}

namespace detail {

inline std::string trim(const std::string& s) {
  const std::size_t a = s.find_first_not_of(" \t\r");
  const std::size_t b = s.find_last_not_of(" \t\r");
  return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
}

// `max` is what one process can hold: larger values would end in an allocation failure, so they
// are refused here with the option's name.
inline std::uint32_t count_value(const std::string& v, const std::string& key, const std::string& where,
                                 std::size_t line, std::uint32_t min,
                                 std::uint32_t max = std::numeric_limits<std::uint32_t>::max()) {
  const std::uint32_t n = carve::sim::detail::parse_count(v, key, where, line);
  if (n < min) {
    throw input_error(where, line, key + " must be at least " + std::to_string(min));
  }
  if (n > max) {
    throw input_error(where, line,
                      key + " " + v + " is more than one run can hold (at most " + std::to_string(max) + ")");
  }
  return n;
}

} // namespace detail

class ConfigParser {
public:
  explicit ConfigParser(Config& config) : c_(config) {
    using carve::sim::Arrivals;
    using carve::sim::Distribution;
    using detail::count_value;
    set_["slots"] = [this](const std::string& v, const std::string& w, std::size_t l) {
      const std::uint32_t n = count_value(v, "slots", w, l, 1);
      const auto& ok = supported_slots();
      if (std::find(ok.begin(), ok.end(), n) == ok.end()) {
        throw input_error(w, l, "slots must be one of 64, 128, 256, 512 (got " + v + ")");
      }
      c_.slots = n;
    };
    set_["cus"] = [this](auto& v, auto& w, auto l) { c_.dispatch.cus = count_value(v, "cus", w, l, 1, max_cus); };
    set_["window"] = [this](auto& v, auto& w, auto l) { c_.dispatch.window = count_value(v, "window", w, l, 1); };
    set_["width"] = [this](auto& v, auto& w, auto l) { c_.dispatch.width = count_value(v, "width", w, l, 0); };
    set_["cu-choice"] = [this](const std::string& v, const std::string& w, std::size_t l) {
      using carve::sim::CuChoice;
      for (const CuChoice c : {CuChoice::first, CuChoice::least_loaded, CuChoice::nearest_boundary}) {
        if (v == to_string(c)) {
          c_.dispatch.choice = c;
          return;
        }
      }
      throw input_error(w, l, "cu-choice must be first, least-loaded or nearest-boundary (got '" + v + "')");
    };
    set_["sample-every"] = [this](auto& v, auto& w, auto l) {
      c_.dispatch.sample_every = count_value(v, "sample-every", w, l, 0);
    };
    set_["workgroups"] = [this](auto& v, auto& w, auto l) {
      c_.workload.count = count_value(v, "workgroups", w, l, 1, max_workgroups);
    };
    set_["sizes"] = [this](auto& v, auto& w, auto l) { c_.workload.sizes = Distribution::parse(v, w, l); };
    set_["durations"] = [this](auto& v, auto& w, auto l) { c_.workload.durations = Distribution::parse(v, w, l); };
    set_["arrivals"] = [this](auto& v, auto& w, auto l) { c_.workload.arrivals = Arrivals::parse(v, w, l); };
    set_["hint-noise"] = [this](const std::string& v, const std::string& w, std::size_t l) {
      const double x = carve::sim::detail::parse_real(v, "hint-noise", w, l);
      if (x < 0 || x > 5) {
        throw input_error(w, l, "hint-noise must lie in [0, 5] (got " + v + ")");
      }
      c_.workload.hint_noise = x;
      for (HintChoice& h : c_.hints) {
        h.noise = h.noise > 0 ? x : h.noise; // one noise level for the sweep
      }
    };
    set_["hints"] = [this](const std::string& v, const std::string& w, std::size_t l) {
      c_.hints.clear();
      std::size_t start = 0;
      while (start <= v.size()) {
        const std::size_t comma = std::min(v.find(',', start), v.size());
        const auto words = carve::sim::detail::split_words(detail::trim(v.substr(start, comma - start)));
        HintChoice h;
        using carve::sim::HintMode;
        if (words.size() == 2 && words[0] == "noisy") {
          h.mode = HintMode::given;
          h.noise = carve::sim::detail::parse_real(words[1], "noise", w, l);
          if (h.noise <= 0 || h.noise > 5) {
            throw input_error(w, l, "noisy S: S must lie in (0, 5] (got " + std::string(words[1]) + ")");
          }
          c_.workload.hint_noise = h.noise;
        } else if (words.size() == 1 && (words[0] == "exact" || words[0] == "given" || words[0] == "per-kernel" ||
                                         words[0] == "constant" || words[0] == "learned")) {
          h.mode = words[0] == "exact"        ? HintMode::exact
                   : words[0] == "given"      ? HintMode::given
                   : words[0] == "per-kernel" ? HintMode::per_kernel
                   : words[0] == "constant"   ? HintMode::constant
                                              : HintMode::learned;
        } else {
          throw input_error(w, l,
                            "'" + detail::trim(v.substr(start, comma - start)) +
                                "': expected exact, noisy S, given, per-kernel, constant or learned (comma-separated)");
        }
        for (const HintChoice& other : c_.hints) {
          if (other.label() == h.label() || (other.noise > 0 && h.noise > 0)) {
            throw input_error(w, l, "'" + h.label() + "' is named twice (or two noise levels at once)");
          }
        }
        c_.hints.push_back(h);
        start = comma + 1;
      }
    };
    set_["predictor"] = [this](const std::string& v, const std::string& w, std::size_t l) {
      const auto words = carve::sim::detail::split_words(v);
      const auto real = [&](std::size_t k, const char* what, double lo, double hi) {
        const double x = carve::sim::detail::parse_real(words[k], what, w, l);
        if (!(x > lo && x <= hi)) {
          throw input_error(w, l,
                            std::string(what) + " must lie in (" + carve::sim::detail::format_real(lo) + ", " +
                                carve::sim::detail::format_real(hi) + "] (got " + std::string(words[k]) + ")");
        }
        return static_cast<float>(x);
      };
      carve::RunTimePredictorSettings p;
      if (!words.empty() && words[0] == "mean" && words.size() <= 2) {
        p.estimate = carve::RunTimeEstimate::mean;
        p.weight = words.size() == 2 ? real(1, "weight", 0, 1) : p.weight;
      } else if (!words.empty() && words[0] == "quantile" && words.size() >= 2 && words.size() <= 3) {
        p.estimate = carve::RunTimeEstimate::quantile;
        p.quantile = real(1, "quantile", 0, 0.999);
        p.weight = words.size() == 3 ? real(2, "weight", 0, 1) : p.weight;
      } else {
        throw input_error(w, l, "'" + v + "': expected 'mean [WEIGHT]' or 'quantile Q [WEIGHT]'");
      }
      c_.predictor = p;
    };
    set_["kernels"] = [this](const std::string& v, const std::string& w, std::size_t l) {
      const KernelMix keep = c_.workload.mix;
      c_.workload.mix = carve::sim::builtin_mix(v, w, l);
      c_.workload.mix.streams = keep.streams;
      c_.workload.mix.stream_waits = keep.stream_waits;
    };
    set_["kernel"] = [this](const std::string& v, const std::string& w, std::size_t l) {
      if (!c_.workload.mix.name.empty()) {
        c_.workload.mix.kernels.clear(); // kernels given one by one replace a built-in mix
        c_.workload.mix.name.clear();
      }
      c_.workload.mix.kernels.push_back(carve::sim::KernelType::parse(v, w, l));
    };
    set_["streams"] = [this](auto& v, auto& w, auto l) {
      c_.workload.mix.streams = count_value(v, "streams", w, l, 1, 4096);
    };
    set_["stream-wait"] = [this](const std::string& v, const std::string& w, std::size_t l) {
      if (v != "on" && v != "off") {
        throw input_error(w, l, "stream-wait must be on or off (got '" + v + "')");
      }
      c_.workload.mix.stream_waits = v == "on";
    };
    set_["trace"] = [this](auto& v, auto&, auto) { c_.trace = v; };
    set_["seeds"] = [this](auto& v, auto& w, auto l) { c_.seeds = count_value(v, "seeds", w, l, 1); };
    set_["seed"] = [this](auto& v, auto& w, auto l) { c_.first_seed = count_value(v, "seed", w, l, 0); };
    set_["policies"] = [this](const std::string& v, const std::string& w, std::size_t l) {
      c_.policies.clear();
      const auto known = policy_names();
      std::size_t start = 0;
      while (start <= v.size()) {
        const std::size_t comma = std::min(v.find(',', start), v.size());
        const std::string name = detail::trim(v.substr(start, comma - start));
        if (std::find(known.begin(), known.end(), name) == known.end()) {
          std::string list;
          for (const auto& k : known) {
            list += (list.empty() ? "" : ", ") + k;
          }
          throw input_error(w, l, "unknown policy '" + name + "' (known: " + list + ")");
        }
        c_.policies.push_back(name);
        start = comma + 1;
      }
    };
    set_["out"] = [this](auto& v, auto&, auto) { c_.out = v; };
    set_["threads"] = [this](auto& v, auto& w, auto l) {
      c_.threads = count_value(v, "threads", w, l, 0, max_threads);
    };
    set_["shard"] = [this](const std::string& v, const std::string& w, std::size_t l) {
      const std::size_t slash = v.find('/');
      if (slash == std::string::npos) {
        throw input_error(w, l, "shard must be I/N, e.g. 3/8 for the third of eight (got '" + v + "')");
      }
      const std::uint32_t i = count_value(v.substr(0, slash), "shard index", w, l, 1);
      const std::uint32_t n = count_value(v.substr(slash + 1), "shard count", w, l, 1);
      if (i > n) {
        throw input_error(w, l, "shard " + v + ": the index must lie in 1.." + std::to_string(n));
      }
      c_.shard = {i, n};
    };
    set_["cost"] = [this](const std::string& v, const std::string& w, std::size_t l) {
      if (v != "on" && v != "off") {
        throw input_error(w, l, "cost must be on or off (got '" + v + "')");
      }
      c_.cost = v == "on";
    };
    set_["write-trace"] = [this](auto& v, auto&, auto) { c_.write_trace = v; };
    set_["config"] = [this](auto& v, auto&, auto) { read_file(v); };
  }

  void set(const std::string& key, const std::string& value, const std::string& where, std::size_t line = 0) {
    const auto it = set_.find(key);
    if (it == set_.end()) {
      throw input_error(where, line, "unknown setting '" + key + "' (see --help)");
    }
    it->second(detail::trim(value), where, line);
    c_.origin[key] = {where, line};
  }

  void read_file(const std::string& path) {
    std::ifstream in(path);
    if (!in) {
      throw input_error(path, 0, "cannot open the config file");
    }
    std::string text;
    for (std::size_t line = 1; std::getline(in, text); ++line) {
      const std::string t = detail::trim(text.substr(0, text.find('#')));
      if (t.empty()) {
        continue;
      }
      const std::size_t eq = t.find('=');
      if (eq == std::string::npos) {
        throw input_error(path, line, "expected 'key = value', found '" + t + "'");
      }
      set(detail::trim(t.substr(0, eq)), t.substr(eq + 1), path, line);
    }
  }

  // argv without the program name. Returns false when --help was asked for.
  bool parse_args(const std::vector<std::string>& args) {
    for (std::size_t i = 0; i < args.size(); ++i) {
      const std::string& a = args[i];
      if (a == "--help" || a == "-h") {
        return false;
      }
      if (a.rfind("--", 0) != 0) {
        throw input_error(a, 0, "expected an option (--key value); see --help");
      }
      const std::size_t eq = a.find('=');
      const std::string key = a.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
      if (eq != std::string::npos) {
        set(key, a.substr(eq + 1), "--" + key);
      } else if (i + 1 < args.size()) {
        set(key, args[++i], "--" + key);
      } else {
        throw input_error("--" + key, 0, "needs a value");
      }
    }
    return true;
  }

private:
  Config& c_;
  std::map<std::string, std::function<void(const std::string&, const std::string&, std::size_t)>> set_;
};

// Checks that need several settings at once, and fills in the automatic ones. `trace` is the
// loaded trace when there is one.
inline void finish(Config& c, const std::vector<carve::sim::Workgroup>& trace) {
  using carve::sim::HintMode;
  const KernelMix& mix = c.workload.mix;
  const bool kernels =
      c.trace.empty() ? !mix.empty() : std::any_of(trace.begin(), trace.end(), [](const carve::sim::Workgroup& w) {
        return w.kernel != carve::sim::none;
      });
  const bool expected =
      !c.trace.empty() && std::all_of(trace.begin(), trace.end(), [](const auto& w) { return w.expected != 0; });
  for (const carve::sim::KernelType& k : mix.kernels) {
    if (c.trace.empty() && k.size > c.slots) {
      throw c.error(mix.name.empty() ? "kernel" : "kernels", "kernel " + k.name + " asks for " +
                                                                 std::to_string(k.size) + " slots, more than the " +
                                                                 std::to_string(c.slots) + " slots of a compute unit");
    }
  }
  if (c.hints.empty()) {
    // Learned hints whenever workgroups have kernels; a trace's own column when it has one; the
    // seed's workloads keep exact hints, which every report labels as the oracle they are.
    HintChoice h;
    h.mode = kernels                     ? HintMode::learned
             : expected                  ? HintMode::given
             : !c.trace.empty()          ? HintMode::learned
             : c.workload.hint_noise > 0 ? HintMode::given
                                         : HintMode::exact;
    h.noise = c.trace.empty() && !kernels ? c.workload.hint_noise : 0.0;
    c.hints.push_back(h);
  }
  for (HintChoice& h : c.hints) {
    if (h.mode == HintMode::per_kernel && !kernels) {
      throw c.error("hints", "per-kernel hints need workgroups with kernels (--kernels, --kernel or a trace's "
                             "kernel column)");
    }
    if (h.mode == HintMode::given && h.noise == 0 && !expected) {
      throw c.error("hints", c.trace.empty() ? "given hints come from a trace's expected column; use exact or noisy S"
                                             : "given hints need the trace's expected column on every line");
    }
  }
  if (c.trace.empty() && mix.empty() && c.workload.sizes.max() > c.slots) {
    throw c.error("sizes", "'" + c.workload.sizes.to_string() + "' can draw " + std::to_string(c.workload.sizes.max()) +
                               " slots, more than the " + std::to_string(c.slots) + " slots of a compute unit");
  }
  if (!c.trace.empty()) {
    c.seeds = 1; // a trace is one workload
  }
  if (c.shard.count > c.seeds) {
    throw c.error("shard", std::to_string(c.shard.count) + " shards for " + std::to_string(c.seeds) +
                               " seeds: some would be empty");
  }
  if (const std::uint64_t mine = (std::uint64_t{c.seeds} + c.shard.count - 1) / c.shard.count; mine > max_seeds) {
    throw c.error("seeds", std::to_string(c.seeds) + " seeds give " + std::to_string(mine) +
                               " runs per policy in one process, more than it can hold (at most " +
                               std::to_string(max_seeds) + "); split the sweep with --shard I/N");
  }
  if (c.out.empty()) {
    throw c.error("out", "the output folder is empty");
  }
  if (c.dispatch.sample_every == 0) {
    // About 400 samples over a typical run: busy slot-cycles over the slots, at ~80% use.
    // Arrivals may spread a run far beyond its work: the span of the arrivals counts too.
    double work = c.workload.count * c.workload.sizes.mean() * c.workload.durations.mean();
    if (!mix.empty()) {
      double per_workgroup = 0;
      double workgroups = 0;
      for (const carve::sim::KernelType& k : mix.kernels) {
        per_workgroup += k.weight * k.launch.mean() * k.size * k.mean;
        workgroups += k.weight * k.launch.mean();
      }
      work = c.workload.count * per_workgroup / workgroups;
    }
    double span = c.workload.arrivals.per_cycle > 0 ? c.workload.count / c.workload.arrivals.per_cycle : 0.0;
    if (!trace.empty()) {
      work = 0;
      span = 0;
      for (const carve::sim::Workgroup& w : trace) {
        work += static_cast<double>(w.size) * w.duration;
        span = std::max(span, static_cast<double>(w.arrival));
      }
    }
    const double cycles = std::max(work / (0.8 * c.slots * c.dispatch.cus), span);
    c.dispatch.sample_every = static_cast<std::uint32_t>(std::clamp(cycles / 400, 1.0, 1e9));
  }
}

// The settings as a config file: read back with --config, it gives the same run.
inline std::string to_text(const Config& c) {
  std::string policies;
  for (const auto& p : c.policies) {
    policies += (policies.empty() ? "" : ",") + p;
  }
  std::string s;
  const auto line = [&s](const std::string& k, const std::string& v) { s += k + " = " + v + "\n"; };
  line("slots", std::to_string(c.slots));
  line("cus", std::to_string(c.dispatch.cus));
  line("window", std::to_string(c.dispatch.window));
  line("width", std::to_string(c.dispatch.width));
  line("cu-choice", to_string(c.dispatch.choice));
  line("sample-every", std::to_string(c.dispatch.sample_every));
  if (c.trace.empty()) {
    line("workgroups", std::to_string(c.workload.count));
    line("sizes", c.workload.sizes.to_string());
    line("durations", c.workload.durations.to_string());
    line("arrivals", c.workload.arrivals.to_string());
    line("hint-noise", carve::sim::detail::format_real(c.workload.hint_noise));
    if (!c.workload.mix.name.empty()) {
      line("kernels", c.workload.mix.name);
    } else {
      for (const carve::sim::KernelType& k : c.workload.mix.kernels) {
        line("kernel", k.to_string());
      }
    }
    line("streams", std::to_string(c.workload.mix.streams));
    line("stream-wait", c.workload.mix.stream_waits ? "on" : "off");
  } else {
    line("trace", c.trace);
  }
  std::string hints;
  for (const HintChoice& h : c.hints) {
    hints += (hints.empty() ? "" : ",") + h.label();
  }
  if (!hints.empty()) {
    line("hints", hints);
  }
  line("predictor", c.predictor.estimate == carve::RunTimeEstimate::mean
                        ? "mean " + carve::sim::detail::format_real(c.predictor.weight)
                        : "quantile " + carve::sim::detail::format_real(c.predictor.quantile) + " " +
                              carve::sim::detail::format_real(c.predictor.weight));
  line("seeds", std::to_string(c.seeds));
  line("seed", std::to_string(c.first_seed));
  if (!policies.empty()) {
    line("policies", policies);
  }
  line("cost", c.cost ? "on" : "off");
  line("shard", std::to_string(c.shard.index) + "/" + std::to_string(c.shard.count));
  return s;
}

inline const char* usage() {
  return R"(slot_sim: the workgroup-queue experiment (random sizes and run times on one compute unit),
on any workload.

usage: slot_sim [--key value]...        run a sweep and write its results to --out
       slot_sim merge OUT DIR...        combine the results of shards run with --shard

Workload (one per seed, the same for every policy):
  --workgroups N       workgroups per run                          [1000]
  --sizes DIST         slots per workgroup                         [uniform 1 32]
  --durations DIST     cycles per workgroup                        [uniform 10 100]
                       DIST: uniform LO HI | bimodal LO HI LO2 HI2 P | geometric MEAN [MAX] | fixed V
  --arrivals A         at-once | poisson RATE (workgroups/cycle)   [at-once]
  --kernels MIX        kernel-structured workgroups from a built-in mix:
                       inference | long-tail | training            [none: the seed's workload]
  --kernel K           add a kernel type (repeat): NAME size=SLOTS launch=DIST mean=CYCLES
                       spread=CV weight=W   (DIST with colons, e.g. uniform:64:256)
  --streams N          streams issuing the launches, round-robin   [8]
  --stream-wait on|off a stream's launch waits for its previous one [on]
  --trace FILE         replay a CSV trace instead; an optional header names its columns:
                       arrival,size,duration[,expected][,kernel] in any order
  --write-trace FILE   write the first seed's workload as a trace and stop
Hints (what release-aligned is told about run times; several, comma-separated, run side by side):
  --hints H,...        learned: learned online per kernel from completions (a RunTimePredictor)
                       exact: the real run times, an oracle (the upper reference)
                       noisy S: real * exp(S * N(0,1)) from a random stream of its own
                       given: a trace's expected column    per-kernel / constant: offline means
                       [learned with kernels; given for a trace with expected; else exact]
  --hint-noise S       the same as --hints "noisy S"
  --predictor P        mean [WEIGHT] | quantile Q [WEIGHT]         [mean 0.125]
Machine and dispatcher:
  --slots N            slots per compute unit: 64, 128, 256, 512   [128]
  --cus N              compute units                               [1]
  --window N           workgroups the dispatcher looks at (1 = strict FIFO)   [1]
  --width N            dispatches per cycle (0 = no limit)         [1]
  --cu-choice C        first | least-loaded | nearest-boundary     [first]
Sweep and output:
  --seeds N  --seed S  runs on seeds S..S+N-1                      [200, 1]
  --policies P,P,...   first-fit, last-fit, best-fit, boundary-nearest,
                       split-by-size, release-aligned              [all]
  --out DIR            CSV and SVG results                         [slot_sim_out]
  --threads N          worker threads (0 = one per core)           [0]
  --shard I/N          run only the I-th of N shares of the seeds; combine with merge
  --cost on|off        time the allocator's decisions              [on]
  --sample-every N     cycles between time-series samples          [automatic]
  --config FILE        read settings from FILE (key = value lines, same keys)
)";
}

} // namespace slot_sim
