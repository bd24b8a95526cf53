// slot_sim: the workgroup-queue experiment (random sizes and run times on one compute unit), on
// the built-in workload or your own.
//
//   slot_sim                                  200 seeds x every policy, results in slot_sim_out/
//   slot_sim --sizes "bimodal 1 8 32 64 0.25" --cus 4 --cu-choice least-loaded
//   slot_sim --trace my_kernels.csv
//   slot_sim --seeds 10000 --shard 3/8 --out part3 ...   then   slot_sim merge all part1 ... part8
#include "options.hpp"
#include "policies.hpp"
#include "report.hpp"
#include "results.hpp"

#include <carve/sim.hpp>

#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

namespace slot_sim {
namespace {

using Clock = std::chrono::steady_clock;

// A progress bar on stderr, shown only once a sweep has taken a second. On a terminal it
// redraws one line; into a file it writes a line every 10%.
class ProgressBar {
public:
  void operator()(std::size_t done, std::size_t total) {
    const double elapsed = std::chrono::duration<double>(Clock::now() - start_).count();
    if (elapsed < 1.0 || total == 0) {
      return;
    }
    const double share = static_cast<double>(done) / static_cast<double>(total);
    const double eta = done == 0 ? 0.0 : elapsed * (1 - share) / share;
    if (tty_) {
      const auto filled = static_cast<std::size_t>(share * 30);
      fmt::print(stderr, "\r[{}{}] {:3.0f}%  {}/{} runs  {:.0f} s left ", std::string(filled, '#'),
                 std::string(30 - filled, ' '), 100 * share, done, total, eta);
      shown_ = true;
    } else if (const int decile = static_cast<int>(share * 10); decile > last_decile_) {
      last_decile_ = decile;
      fmt::print(stderr, "{:3.0f}%  {}/{} runs  {:.1f} s\n", 100 * share, done, total, elapsed);
    }
    std::fflush(stderr);
  }
  ~ProgressBar() {
    if (shown_) {
      fmt::print(stderr, "\n");
    }
  }

private:
  Clock::time_point start_ = Clock::now();
  bool tty_ = isatty(STDERR_FILENO) != 0;
  bool shown_ = false;
  int last_decile_ = -1;
};

// Creates `dir` (and its parents) for results. A path that is empty, lies under a file or cannot
// be created is bad input: `fail(message)` builds the error naming what gave the folder.
template <class Fail>
void make_output_folder(const std::string& dir, Fail fail) {
  if (dir.empty()) {
    throw fail("the output folder is empty");
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir)) {
    throw fail("cannot create the output folder '" + dir +
               "': " + (ec ? ec.message() : std::string("a file of that name exists")));
  }
}

std::string describe_workload(const Config& c) {
  std::string s;
  const auto& mix = c.workload.mix;
  if (!c.trace.empty()) {
    s = "trace " + c.trace;
  } else if (!mix.empty()) {
    s = fmt::format("{} workgroups of kernel mix {} ({} kernel types), {} stream{}{}", c.workload.count,
                    mix.name.empty() ? std::string("given by --kernel") : "'" + mix.name + "'", mix.kernels.size(),
                    mix.streams, mix.streams == 1 ? "" : "s",
                    mix.stream_waits ? ", each launch waiting for its stream's previous one" : "");
    if (!mix.stream_waits && c.workload.arrivals.per_cycle > 0) {
      s += ", launches arrive " + c.workload.arrivals.to_string();
    }
  } else {
    s = fmt::format("{} workgroups: sizes {}, durations {}", c.workload.count, c.workload.sizes.to_string(),
                    c.workload.durations.to_string());
    if (c.workload.arrivals.per_cycle > 0) {
      s += ", arrivals " + c.workload.arrivals.to_string();
    }
  }
  std::string hints;
  for (const HintChoice& h : c.hints) {
    hints += (hints.empty() ? "" : ", ") + h.label();
  }
  return s + "; hints " + hints;
}

// What each hint source means, for the lines under the tables.
std::string describe_hints(const Config& c) {
  std::string s;
  for (const HintChoice& h : c.hints) {
    using carve::sim::HintMode;
    std::string what;
    if (h.noise > 0) {
      what = fmt::format("the real run times times exp({} N(0,1))", h.noise);
    } else if (h.mode == HintMode::exact) {
      what = "the real run times: an oracle no scheduler has, the upper reference";
    } else if (h.mode == HintMode::learned) {
      what =
          c.predictor.estimate == carve::RunTimeEstimate::mean
              ? fmt::format("learned online per kernel from completions (weighted mean, weight {})", c.predictor.weight)
              : fmt::format("learned online per kernel from completions (running {} quantile, weight {})",
                            c.predictor.quantile, c.predictor.weight);
    } else if (h.mode == HintMode::per_kernel) {
      what = "each kernel's mean run time over the workload (an offline profile)";
    } else if (h.mode == HintMode::constant) {
      what = "the workload's mean run time, one value for all";
    } else {
      what = "the trace's expected column";
    }
    s += fmt::format("{}[{}]: {}\n", s.empty() ? "hints " : "      ", h.label(), what);
  }
  return s;
}

std::string describe_machine(const Config& c) {
  return fmt::format("{} CU{} x {} slots, window {}, {} dispatch{}/cycle{}", c.dispatch.cus,
                     c.dispatch.cus == 1 ? "" : "s", c.slots, c.dispatch.window,
                     c.dispatch.width == 0 ? std::string("unlimited") : std::to_string(c.dispatch.width),
                     c.dispatch.width == 1 ? "" : "es",
                     c.dispatch.cus > 1 ? std::string(", CU choice ") + to_string(c.dispatch.choice) : "");
}

template <std::uint32_t N>
Results run_sweep(const Config& c, const std::vector<carve::sim::Workgroup>& trace) {
  std::vector<carve::sim::PolicyRunner> policies;
  for (auto& p : all_policies<N>()) {
    const bool wanted = c.policies.empty() || policies.empty() || // the reference always runs
                        std::find(c.policies.begin(), c.policies.end(), p.name) != c.policies.end();
    if (!wanted) {
      continue;
    }
    if (p.name != carve::ReleaseAlignedFit::name) {
      policies.push_back(std::move(p));
      continue;
    }
    // The hinted policy once per hint source, its name saying which.
    for (const HintChoice& h : c.hints) {
      policies.push_back(
          carve::sim::with_hints(p, carve::sim::HintOptions{h.mode, c.predictor}, p.name + "[" + h.label() + "]"));
    }
  }
  policies.push_back(carve::sim::bound<N>());

  ProgressBar bar;
  carve::sim::SweepOptions o;
  o.dispatch = c.dispatch;
  o.threads = c.threads;
  o.measure_cost = c.cost;
  o.progress = std::ref(bar);
  const std::vector<std::uint64_t> seeds = c.shard_seeds();
  const auto workload = [&](std::uint64_t seed) {
    if (trace.empty()) {
      return carve::sim::generate(c.workload, seed);
    }
    auto w = trace;
    if (c.workload.hint_noise > 0) {
      carve::sim::add_hint_noise(w, c.workload.hint_noise, seed);
    }
    return w;
  };
  const auto table = carve::sim::sweep(policies, seeds, workload, o);

  Results res;
  res.sample_every = c.dispatch.sample_every;
  res.slots = N;
  res.bound_name = policies.back().name;
  for (const auto& p : policies) {
    res.policies.push_back(p.name);
    res.series[p.name];
  }
  for (std::size_t s = 0; s < seeds.size(); ++s) {
    for (std::size_t p = 0; p < policies.size(); ++p) {
      const carve::sim::SweepCell& cell = table[s][p];
      res.rows.push_back(to_row(seeds[s], policies[p].name, cell));
      res.series[policies[p].name].add(cell.result.series);
      if (!cell.result.wear.empty()) {
        auto& w = res.wear[policies[p].name];
        w.resize(N, 0.0);
        for (std::size_t slot = 0; slot < N; ++slot) {
          w[slot] += static_cast<double>(cell.result.wear[slot]);
        }
      }
    }
  }
  return res;
}

void report(const Results& res, const Config& c, const std::string& dir) {
  const auto summary = summarize(res);
  print_tables(summary, res.column(res.policies.front(), &RunRow::makespan).size());
  fmt::print("{}", describe_hints(c));
  write_summary_csv(summary, dir + "/summary.csv");
  write_figures(res, dir, describe_machine(c), describe_workload(c));
  fmt::print("\nWrote {0}/runs.csv (every run), {0}/summary.csv, {0}/series.csv, {0}/wear.csv and the figures "
             "{0}/fig12_remaining.svg, fig13_free_slots.svg, fig14_makespan_delta.svg, wear.svg.\n",
             dir);
}

int run(const std::vector<std::string>& args) {
  Config c;
  ConfigParser parser(c);
  if (!parser.parse_args(args)) {
    fmt::print("{}", usage());
    return 0;
  }
  if (!c.write_trace.empty()) {
    finish(c, {});
    std::ofstream out(c.write_trace);
    if (!out) {
      throw c.error("write-trace", "cannot write '" + c.write_trace + "'");
    }
    carve::sim::write_trace(out, carve::sim::generate(c.workload, c.first_seed), "--write-trace");
    fmt::print("wrote seed {}'s workload ({}) to {}\n", c.first_seed, describe_workload(c), c.write_trace);
    return 0;
  }
  std::vector<carve::sim::Workgroup> trace;
  if (!c.trace.empty()) {
    if (std::filesystem::is_directory(c.trace)) {
      throw c.error("trace", "'" + c.trace + "' is a directory, not a trace file");
    }
    trace = carve::sim::read_trace_file(c.trace, c.slots);
  }
  finish(c, trace);
  make_output_folder(c.out, [&c](const std::string& what) { return c.error("out", what); });

  const unsigned threads = c.threads != 0 ? c.threads : std::max(1u, std::thread::hardware_concurrency());
  fmt::print("slot_sim: {}\n          {}\n", describe_machine(c), describe_workload(c));
  const auto start = Clock::now();
  Results res;
  switch (c.slots) {
  case 64:
    res = run_sweep<64>(c, trace);
    break;
  case 128:
    res = run_sweep<128>(c, trace);
    break;
  case 256:
    res = run_sweep<256>(c, trace);
    break;
  default:
    res = run_sweep<512>(c, trace);
    break;
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const std::size_t seeds = c.shard_seeds().size();
  fmt::print("          {} seed{} x {} runs ({} policies + the bound) in {:.2f} s on {} thread{}\n", seeds,
             seeds == 1 ? "" : "s", res.policies.size(), res.policies.size() - 1, seconds, threads,
             threads == 1 ? "" : "s");
  write_results(res, c.out, to_text(c));
  if (c.shard.count > 1) {
    fmt::print("shard {}/{}: wrote {}; combine all shards with: slot_sim merge OUT DIR...\n", c.shard.index,
               c.shard.count, c.out);
    return 0;
  }
  report(res, c, c.out);
  return 0;
}

// The config text without its shard line: what every shard of one sweep must share.
std::string without_shard(const std::string& text) {
  std::istringstream in(text);
  std::string line, out;
  while (std::getline(in, line)) {
    if (line.rfind("shard =", 0) != 0) {
      out += line + "\n";
    }
  }
  return out;
}

int merge(const std::vector<std::string>& args) {
  if (args.size() < 3) {
    throw input_error("merge", 0, "usage: slot_sim merge OUT DIR... (the output folders of the shards)");
  }
  const std::string out = args[1];
  std::string common;
  Results all;
  std::set<std::uint64_t> seen;
  for (std::size_t i = 2; i < args.size(); ++i) {
    const std::string dir = args[i];
    std::ifstream in(dir + "/config.txt");
    if (!in) {
      throw input_error(dir + "/config.txt", 0, "cannot open (is this a slot_sim output folder?)");
    }
    std::stringstream text;
    text << in.rdbuf();
    if (i == 2) {
      common = without_shard(text.str());
    } else if (without_shard(text.str()) != common) {
      throw input_error(dir + "/config.txt", 0, "settings differ from " + args[2] + "/config.txt: not one sweep");
    }
    Results part = read_results(dir);
    for (const RunRow& r : part.rows) {
      if (r.policy == part.policies.front() && !seen.insert(r.seed).second) {
        throw input_error(dir + "/runs.csv", 0, "seed " + std::to_string(r.seed) + " appears in two shards");
      }
    }
    if (i == 2) {
      all.policies = part.policies;
    } else if (part.policies != all.policies) {
      throw input_error(dir + "/runs.csv", 0, "the policies differ from " + args[2] + "'s");
    }
    all.rows.insert(all.rows.end(), part.rows.begin(), part.rows.end());
    for (const auto& [p, s] : part.series) {
      all.series[p].add(s);
    }
    for (const auto& [p, w] : part.wear) {
      auto& sum = all.wear[p];
      sum.resize(w.size(), 0.0);
      for (std::size_t k = 0; k < w.size(); ++k) {
        sum[k] += w[k];
      }
    }
  }
  // The merged sweep is the unsharded one: same settings, shard 1/1.
  Config c;
  ConfigParser parser(c);
  const std::string config_path = args[2] + "/config.txt";
  parser.read_file(config_path);
  c.shard = {1, 1};
  if (c.dispatch.sample_every == 0) {
    throw input_error(config_path, 0, "no sample-every setting: not written by slot_sim");
  }
  if (seen.size() != c.seeds) {
    throw input_error(
        "merge", 0,
        fmt::format("the shards hold {} of the sweep's {} seeds: some shards are missing", seen.size(), c.seeds));
  }
  all.bound_name = all.policies.back();
  all.sample_every = c.dispatch.sample_every;
  all.slots = c.slots;
  make_output_folder(out, [](const std::string& what) { return input_error("merge OUT", 0, what); });
  write_results(all, out, to_text(c));
  fmt::print("slot_sim: merged {} shards: {}\n          {}\n", args.size() - 2, describe_machine(c),
             describe_workload(c));
  report(all, c, out);
  return 0;
}

} // namespace
} // namespace slot_sim

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  try {
    if (!args.empty() && args[0] == "merge") {
      return slot_sim::merge(args);
    }
    return slot_sim::run(args);
  } catch (const carve::Exception& e) {
    fmt::print(stderr, "slot_sim: error: {}\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "slot_sim: {}\n", e.what());
    return 1;
  }
}
