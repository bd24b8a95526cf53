// carve_replay: how much memory would a program need with each allocator? Replays a recorded
// allocation trace (a PyTorch memory snapshot, RMM's log, or carve's own CSV) through carve's pools
// and through PyTorch's allocator, side by side, in one process.
//
//   carve_replay snapshot.pickle                    the table, with the goals checked
//   carve_replay snapshot.pickle --json             one JSON object (for other tools)
//   carve_replay snapshot.pickle --svg plot.svg     reserved and live bytes over the trace
//   carve_replay snapshot.pickle --capacity 16GiB   on a 16 GiB card: the first request each fails
//   carve_replay snapshot.pickle --scale 2          every block twice as large: would a larger batch fit?
//   carve_replay snapshot.pickle --allocators expandable-pool:growth=16:release=1GiB,pytorch-model
//   carve_replay --allocators list                  every allocator it knows
//
// Exit status: 0 when the replay ran (whatever it found), 2 for bad input: a bad flag, or a trace
// that cannot be read, with one message naming the file, the event and what is wrong; 3 for a
// trace that reads but holds no allocation or free to replay (a PyTorch snapshot dumped without
// recording its history, or with it cleared: only the blocks live at the end), said in one message
// with what the trace does hold.
#include "contenders.hpp"
#include "replay.hpp"
#include "report.hpp"

#include <carve/tier/byte_size.hpp>
#include <carve/trace/trace_file.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace {

using carve::replay::Contender;

struct Options {
  std::string trace;
  std::vector<std::string> allocators; // empty: the default set
  std::optional<std::uint64_t> device;
  std::optional<std::uint64_t> capacity;
  std::string svg;
  bool json = false;
  bool smallest_card = true;
  double scale = 1.0; // every block's size times this: what if the batch were larger?
  int repeat = 5;
  int again = 0; // runs of the requests after the first (carve::replay::replay_again)
};

struct BadInput {
  std::string message;
};

// A trace that reads, with nothing to replay: exit status 3, not 2, since nothing in it is wrong,
// and not 0, since no figure was computed for a script to read.
struct NothingToReplay {
  std::string message;
};

std::uint64_t whole_number(const std::string& flag, const std::string& text) {
  std::uint64_t v = 0;
  std::size_t used = 0;
  try {
    v = std::stoull(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || text[0] == '-') {
    throw BadInput{flag + " '" + text + "': expected a whole number"};
  }
  return v;
}

Options parse(int argc, char** argv) {
  Options o;
  const auto value = [&](int& i, const std::string& flag) -> std::string {
    if (i + 1 >= argc) {
      throw BadInput{flag + " needs a value"};
    }
    return argv[++i];
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json") {
      o.json = true;
    } else if (a == "--svg") {
      o.svg = value(i, a);
    } else if (a == "--device") {
      o.device = whole_number(a, value(i, a));
    } else if (a == "--repeat") {
      o.repeat = static_cast<int>(std::clamp<std::uint64_t>(whole_number(a, value(i, a)), 1, 1000));
    } else if (a == "--again") {
      o.again = static_cast<int>(std::clamp<std::uint64_t>(whole_number(a, value(i, a)), 0, 1000));
    } else if (a == "--scale") {
      const std::string text = value(i, a);
      std::size_t used = 0;
      try {
        o.scale = std::stod(text, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != text.size() || !(o.scale > 0) || o.scale > 1e6) {
        throw BadInput{"--scale '" + text + "': expected a number above 0"};
      }
    } else if (a == "--no-smallest-card") {
      o.smallest_card = false;
    } else if (a == "--capacity") {
      const std::string text = value(i, a);
      try {
        o.capacity = carve::parse_bytes(text);
      } catch (const carve::Exception& e) {
        throw BadInput{"--capacity: " + std::string(e.what())};
      }
      if (*o.capacity == 0) {
        throw BadInput{"--capacity '" + text + "': a card holds at least one byte"};
      }
    } else if (a == "--allocators") {
      std::stringstream list(value(i, a));
      for (std::string name; std::getline(list, name, ',');) {
        o.allocators.push_back(name);
      }
    } else if (a == "--help" || a == "-h") {
      throw BadInput{"usage: carve_replay TRACE [--allocators a,b,...|list] [--device N] [--capacity BYTES] "
                     "[--scale F] [--svg FILE] [--json] [--repeat N] [--again N] [--no-smallest-card]"};
    } else if (a.rfind("--", 0) == 0) {
      throw BadInput{"unknown flag '" + a + "'"};
    } else if (o.trace.empty()) {
      o.trace = a;
    } else {
      throw BadInput{"one trace at a time: '" + o.trace + "' and '" + a + "'"};
    }
  }
  return o;
}

// Every block `factor` times as large (at least a byte); the recorded reserve, which belongs to
// the sizes recorded, is dropped. Throws BadInput for a block that would pass 2^62 bytes.
void scale(carve::trace::AllocationTrace& t, double factor) {
  for (carve::trace::TraceBlock& b : t.blocks) {
    const double bytes = std::ceil(static_cast<double>(b.bytes) * factor);
    if (bytes > static_cast<double>(carve::trace::max_block_bytes)) {
      throw BadInput{"--scale: a block of " + std::to_string(b.bytes) + " bytes would pass 2^62"};
    }
    b.bytes = std::max<std::uint64_t>(1, static_cast<std::uint64_t>(bytes));
  }
  t.recorded.reset();
  t.source += " (sizes x" + fmt::format("{:g}", factor) + ")";
}

std::vector<Contender> chosen(const Options& o) {
  auto all = carve::replay::all_contenders();
  if (o.allocators.empty()) {
    all.resize(carve::replay::default_contenders);
    return all;
  }
  std::vector<Contender> out;
  for (const std::string& name : o.allocators) {
    if (name.find(':') != std::string::npos) {
      try {
        out.push_back(carve::replay::configured(name));
      } catch (const std::invalid_argument& e) {
        throw BadInput{std::string("--allocators: ") + e.what()};
      }
      continue;
    }
    const auto it = std::find_if(all.begin(), all.end(), [&](const Contender& c) { return c.name == name; });
    if (it == all.end()) {
      std::string names;
      for (const Contender& c : all) {
        names += (names.empty() ? "" : ", ") + c.name;
      }
      throw BadInput{"--allocators: no allocator '" + name + "' (known: " + names + ")"};
    }
    out.push_back(*it);
  }
  return out;
}

int run(const Options& o) {
  if (o.allocators.size() == 1 && o.allocators[0] == "list") {
    for (const Contender& c : carve::replay::all_contenders()) {
      fmt::print("{:<28} {}\n", c.name, c.description);
    }
    return 0;
  }
  if (o.json && o.again > 0) {
    throw BadInput{"--again prints in the table only (without --json)"};
  }
  if (o.trace.empty()) {
    throw BadInput{"no trace given (usage: carve_replay TRACE [options]; --help)"};
  }
  const auto contenders = chosen(o);
  auto t = carve::trace::read_trace_file(o.trace, o.device);
  if (!t) {
    throw BadInput{t.error().describe()};
  }
  if (t->requests.empty()) {
    std::string held;
    if (t->recorded) {
      held = " in " + fmt::format("{:.3f}", static_cast<double>(t->recorded->start_bytes) / (1 << 20)) +
             " MiB of PyTorch's segments";
    }
    throw NothingToReplay{t->source + ": nothing to replay: no allocation or free was recorded, only " +
                          std::to_string(t->start_blocks) + (t->start_blocks == 1 ? " block" : " blocks") + " live (" +
                          std::to_string(t->start_live_bytes()) + " bytes)" + held +
                          " (for a PyTorch snapshot, call torch.cuda.memory._record_memory_history() before the "
                          "work and dump it after)"};
  }
  if (o.scale != 1.0) {
    scale(*t, o.scale);
  }
  const auto streams = carve::replay::number_streams(*t);
  carve::replay::Report rep;
  rep.trace = &*t;
  rep.peak_live = t->peak_live_bytes();
  rep.start_live = t->start_live_bytes();
  rep.streams = streams.count;
  rep.capacity = o.capacity;
  rep.again = o.again;

  // A card no allocator can outgrow on this trace, unless it fails even there.
  const std::uint64_t roomy = std::max<std::uint64_t>(4 * rep.peak_live, std::uint64_t{1} << 30);
  const std::uint64_t card = o.capacity.value_or(roomy);
  rep.rows.push_back({"peak-live",
                      "the floor: the most bytes live at once",
                      rep.peak_live,
                      std::nullopt,
                      std::nullopt,
                      std::nullopt,
                      rep.peak_live,
                      true,
                      std::nullopt,
                      {},
                      {},
                      std::nullopt});
  if (t->recorded) {
    carve::replay::Row r{"pytorch-recorded",
                         "what PyTorch's allocator reserved when the trace was recorded",
                         t->recorded->peak_bytes,
                         t->recorded->device_calls,
                         std::nullopt,
                         std::nullopt,
                         std::nullopt,
                         true,
                         std::nullopt,
                         {},
                         {},
                         std::nullopt};
    if (!o.svg.empty()) {
      std::uint64_t now = t->recorded->start_bytes;
      std::size_t step = 0;
      r.reserved_after.resize(t->requests.size());
      for (std::size_t q = 0; q < t->requests.size(); ++q) {
        while (step < t->recorded->steps.size() && t->recorded->steps[step].first <= q + 1) {
          now = t->recorded->steps[step++].second;
        }
        r.reserved_after[q] = now;
      }
    }
    rep.rows.push_back(std::move(r));
  }

  // The model checked: started from the segments PyTorch held when recording began, it should
  // reserve what PyTorch did.
  if (t->recorded && !t->start_segments.empty() && !o.capacity) {
    for (const Contender& c : carve::replay::all_contenders()) {
      if (c.name == "pytorch-model") {
        const auto subject = c.make(card, streams.count);
        const auto run = carve::replay::replay(*t, streams, *subject, false, true);
        if (!run.from_recorded_start) {
          break; // the recorded segments do not hold the start blocks: nothing to check against
        }
        rep.seeded_model = carve::replay::Row{"pytorch-model",
                                              c.description,
                                              run.peak_reserved,
                                              run.device_calls,
                                              run.start_device_calls,
                                              std::nullopt,
                                              std::nullopt,
                                              run.completed,
                                              run.failed_request,
                                              {},
                                              {},
                                              std::nullopt};
      }
    }
  }

  // An allocator whose options its constructor refuses (a segment size of 0, say) is bad input.
  for (const Contender& c : contenders) {
    try {
      (void)c.make(card, streams.count);
    } catch (const carve::Exception& e) {
      throw BadInput{"--allocators: " + c.name + ": " + e.what()};
    }
  }

  // Timing: every allocator in turn, `repeat` rounds, the median per allocator.
  std::vector<carve::replay::Run> first(contenders.size());
  std::vector<std::vector<double>> ns(contenders.size());
  for (int round = 0; round < o.repeat; ++round) {
    for (std::size_t i = 0; i < contenders.size(); ++i) {
      const auto subject = contenders[i].make(card, streams.count);
      auto run = carve::replay::replay(*t, streams, *subject, false, false, round == 0 ? o.again : 0);
      ns[i].push_back(run.ns_per_op);
      if (round == 0) {
        first[i] = std::move(run);
      }
    }
  }
  for (std::size_t i = 0; i < contenders.size(); ++i) {
    const Contender& c = contenders[i];
    std::sort(ns[i].begin(), ns[i].end());
    carve::replay::Row r{c.name,
                         c.description,
                         first[i].peak_reserved,
                         first[i].device_calls,
                         first[i].start_device_calls,
                         ns[i][ns[i].size() / 2],
                         std::nullopt,
                         first[i].completed,
                         first[i].failed_request,
                         {},
                         first[i].again,
                         std::nullopt};
    if (o.smallest_card && first[i].completed && !o.capacity) {
      r.smallest_card = carve::replay::smallest_card(*t, streams, c, rep.peak_live, first[i].peak_reserved, card,
                                                     carve::replay::device_granule);
      if (o.again > 0 && !first[i].again.empty() && first[i].again.back().completed) {
        std::uint64_t worst = first[i].peak_reserved;
        for (const carve::replay::AgainRun& a : first[i].again) {
          worst = std::max(worst, a.peak_reserved);
        }
        r.smallest_card_again = carve::replay::smallest_card(*t, streams, c, rep.peak_live, worst, card,
                                                             carve::replay::device_granule, o.again);
      }
    }
    if (!o.svg.empty()) {
      const auto subject = c.make(card, streams.count);
      r.reserved_after = carve::replay::replay(*t, streams, *subject, true).reserved_after;
    }
    rep.rows.push_back(std::move(r));
  }

  // How expandable-pool's reserve and device calls move with its headroom, its lending and, over a
  // driver that maps whole allocations only, the size of its allocations, on this trace.
  if (rep.find("expandable-pool") != nullptr && !o.capacity) {
    const auto sweep = [&](const auto& settings, auto&& contender, std::vector<carve::replay::SettingPoint>& out) {
      for (const std::size_t value : settings) {
        const auto run = carve::replay::replay(*t, streams, *contender(value).make(card, streams.count));
        out.push_back({value, run.peak_reserved, run.device_calls, run.completed});
      }
    };
    sweep(carve::replay::headroom_settings, carve::replay::expandable_with_headroom, rep.headroom);
    sweep(carve::replay::lending_settings, carve::replay::expandable_lending, rep.lending);
    sweep(carve::replay::whole_allocation_settings, carve::replay::expandable_whole_allocations, rep.whole_allocations);
  }

  if (!o.svg.empty()) {
    try {
      carve::replay::write_plot(rep, o.svg);
    } catch (const std::exception& e) {
      throw BadInput{"--svg " + o.svg + ": " + e.what()};
    }
  }
  if (o.json) {
    carve::replay::print_json(rep);
  } else {
    carve::replay::print_table(rep);
  }
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const BadInput& bad) {
    std::fprintf(stderr, "carve_replay: %s\n", bad.message.c_str());
    return 2;
  } catch (const NothingToReplay& none) {
    std::fprintf(stderr, "carve_replay: %s\n", none.message.c_str());
    return 3;
  }
}
