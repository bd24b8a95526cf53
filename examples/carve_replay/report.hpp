// What carve_replay prints: a table of every allocator on the trace with the goals checked, the
// same as one JSON object, and the reserved bytes over the trace as an SVG plot.
#pragma once

#include "replay.hpp"
#include "svg_plot.hpp" // examples/common

#include <carve/core/format_bytes.hpp>
#include <carve/trace/allocation_trace.hpp>
#include <carve/vmm/expandable_pool_options.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace carve::replay {

// One row of the comparison.
struct Row {
  std::string name;
  std::string description;
  std::uint64_t peak_reserved = 0;
  std::optional<std::uint64_t> device_calls;
  std::optional<std::uint64_t> start_device_calls;
  std::optional<double> ns_per_op;
  std::optional<std::uint64_t> smallest_card;
  bool completed = true;                            // ran to the end on the card it was given
  std::optional<std::uint64_t> failed_request;      // with --capacity: the first request refused
  std::vector<std::uint64_t> reserved_after;        // for the plot
  std::vector<AgainRun> again;                      // with --again: the runs after the first
  std::optional<std::uint64_t> smallest_card_again; // with --again: the card the first run and the rest run on
};

// expandable-pool at one setting of a knob (headroom, lending, allocation size): what carve_replay
// prints so a user can choose it.
struct SettingPoint {
  std::size_t value = 0; // ExpandablePoolOptions::headroom_permille, lend_min_bytes or max_chunk_bytes
  std::uint64_t peak_reserved = 0;
  std::uint64_t device_calls = 0;
  bool completed = true;
};

struct Report {
  const trace::AllocationTrace* trace = nullptr;
  std::uint64_t peak_live = 0;
  std::uint64_t start_live = 0;
  std::uint32_t streams = 1;
  std::optional<std::uint64_t> capacity;
  std::vector<Row> rows;
  std::optional<Row> seeded_model;             // pytorch-model started from the recorded segments: the model checked
  std::vector<SettingPoint> headroom;          // expandable-pool's reserve against calls, when it ran
  std::vector<SettingPoint> lending;           // the same against lend_min_bytes
  std::vector<SettingPoint> whole_allocations; // against max_chunk_bytes, over a driver without partial maps
  int again = 0;                               // --again: the runs after the first

  const Row* find(const std::string& name) const {
    const auto it = std::find_if(rows.begin(), rows.end(), [&](const Row& r) { return r.name == name; });
    return it == rows.end() ? nullptr : &*it;
  }
};

// Bytes for the table: three decimals of GiB, where the allocators differ by a few percent.
inline std::string gib(std::uint64_t bytes) {
  if (bytes >= (std::uint64_t{1} << 30)) {
    return fmt::format("{:.3f} GiB", static_cast<double>(bytes) / double(1 << 30));
  }
  if (bytes >= (std::uint64_t{1} << 20)) {
    return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / double(1 << 20));
  }
  return carve::format_bytes(bytes);
}

// A request named for a person: its index, the event it came from, and what it asked.
inline std::string describe_request(const trace::AllocationTrace& t, std::uint64_t r) {
  if (r >= t.requests.size()) {
    const std::uint64_t i = r - t.requests.size();
    return fmt::format("start block {} ({} bytes, live before the first event)", i, t.blocks[i].bytes);
  }
  const trace::TraceRequest& q = t.requests[r];
  return fmt::format("request {} (event {}: allocate {} bytes)", r, q.event, t.blocks[q.block].bytes);
}

// The goals of the comparison, each met or missed with its figure.
inline std::vector<std::string> goal_lines(const Report& rep) {
  std::vector<std::string> out;
  const double live = static_cast<double>(std::max<std::uint64_t>(1, rep.peak_live));
  const Row* recorded = rep.find("pytorch-recorded");
  const Row* model = rep.find("pytorch-model");
  const auto verdict = [](bool met) { return met ? "met" : "MISSED"; };
  // A run that failed before the end has no figures to meet a goal with.
  const auto unfinished = [&](const Row& r) {
    if (!r.completed) {
      out.push_back(fmt::format("{} did not complete the trace on this card: every goal MISSED", r.name));
    }
    return !r.completed;
  };
  if (const Row* e = rep.find("expandable-pool"); e && !unfinished(*e)) {
    const double ratio = static_cast<double>(e->peak_reserved) / live;
    out.push_back(
        fmt::format("expandable-pool reserves {:.3f}x peak live (goal <= 1.01x): {}", ratio, verdict(ratio <= 1.01)));
    if (recorded) {
      out.push_back(fmt::format("expandable-pool reserves {} against pytorch-recorded's {} (goal: less): {}",
                                gib(e->peak_reserved), gib(recorded->peak_reserved),
                                verdict(e->peak_reserved < recorded->peak_reserved)));
      if (recorded->device_calls && e->device_calls) {
        const double calls = static_cast<double>(*e->device_calls) /
                             static_cast<double>(std::max<std::uint64_t>(1, *recorded->device_calls));
        out.push_back(fmt::format("expandable-pool makes {:.2f}x pytorch-recorded's device calls (goal <= 3x): {}",
                                  calls, verdict(calls <= 3.0)));
      }
    }
    if (const Row* x = rep.find("pytorch-expandable-model"); x && x->completed) {
      out.push_back(fmt::format("expandable-pool reserves {} against pytorch-expandable-model's {} (goal: less): {}",
                                gib(e->peak_reserved), gib(x->peak_reserved),
                                verdict(e->peak_reserved < x->peak_reserved)));
    }
  }
  if (const Row* c = rep.find("caching-pool"); c && recorded && c->completed) {
    out.push_back(fmt::format("caching-pool reserves {} against pytorch-recorded's {} (goal: no more): {}",
                              gib(c->peak_reserved), gib(recorded->peak_reserved),
                              verdict(c->peak_reserved <= recorded->peak_reserved)));
  }
  if (model && !unfinished(*model)) {
    for (const Row& r : rep.rows) {
      if (r.name.rfind("pytorch", 0) == 0 || r.name == "no-cache" || r.name == "peak-live") {
        continue;
      }
      if (!r.completed) {
        if (r.name != "expandable-pool") { // said above
          (void)unfinished(r);
        }
        continue;
      }
      if (r.smallest_card && model->smallest_card) {
        out.push_back(fmt::format("{} runs on a {} card, pytorch-model on {} (goal: no larger): {}", r.name,
                                  gib(*r.smallest_card), gib(*model->smallest_card),
                                  verdict(*r.smallest_card <= *model->smallest_card)));
      }
      if (r.ns_per_op && model->ns_per_op && *model->ns_per_op > 0) {
        const double cost = *r.ns_per_op / *model->ns_per_op;
        out.push_back(fmt::format("{} costs {:.2f}x pytorch-model per allocate+free on the host (goal <= 1.0x): {}",
                                  r.name, cost, verdict(cost <= 1.0)));
      }
    }
  }
  return out;
}

// The allocator column's width: the longest name, and at least 26.
inline std::size_t name_width(const Report& rep) {
  std::size_t width = 26;
  for (const Row& r : rep.rows) {
    width = std::max(width, r.name.size() + 1);
  }
  return width;
}

// With --again: the most `r` reserved in the runs after the first.
inline std::uint64_t most_reserved_again(const Row& r) {
  std::uint64_t reserved = 0;
  for (const AgainRun& a : r.again) {
    reserved = std::max(reserved, a.peak_reserved);
  }
  return reserved;
}

// With --again: each allocator over the longer run, against the most bytes live in it (what a card
// must hold), and its runs one by one: the median run's reserve against that run's live bytes, how
// many runs passed 1.01x (a worst case may be one run in many), device calls per run, and the
// smallest card the whole run fits (an allocator refused memory may do better than its worst run).
inline void print_again(const Report& rep) {
  if (rep.again == 0) {
    return;
  }
  fmt::print("\nThe same requests {} more time{} (--again: the blocks the trace allocates and frees, allocated and "
             "freed again in order; the blocks it leaves live stay): what each allocator reserves after many steps\n",
             rep.again, rep.again == 1 ? "" : "s");
  const std::size_t width = name_width(rep);
  fmt::print("{:<{}} {:>13} {:>11} {:>11} {:>12} {:>16} {:>11} {:>13} {:>13}\n", "allocator", width, "peak reserved",
             "x peak live", "median run", "runs > 1.01x", "calls, 1st again", "calls, last", "calls per run",
             "smallest card");
  for (const Row& r : rep.rows) {
    if (r.again.empty()) {
      continue;
    }
    const std::uint64_t reserved = most_reserved_again(r);
    std::uint64_t live = 1;
    std::uint64_t calls = 0;
    std::vector<double> ratios; // each run's peak reserved over its peak live
    for (const AgainRun& a : r.again) {
      live = std::max(live, a.peak_live);
      calls += a.device_calls;
      ratios.push_back(static_cast<double>(a.peak_reserved) /
                       static_cast<double>(std::max<std::uint64_t>(a.peak_live, 1)));
    }
    const auto over = std::count_if(ratios.begin(), ratios.end(), [](double x) { return x > 1.01; });
    const auto middle = ratios.begin() + static_cast<std::ptrdiff_t>(ratios.size() / 2);
    std::nth_element(ratios.begin(), middle, ratios.end());
    fmt::print("{:<{}} {:>13} {:>10.3f}x {:>10.3f}x {:>12} {:>16} {:>11} {:>13.0f} {:>13}{}\n", r.name, width,
               gib(reserved), static_cast<double>(reserved) / static_cast<double>(live), *middle, over,
               r.again.front().device_calls, r.again.back().device_calls,
               static_cast<double>(calls) / static_cast<double>(r.again.size()),
               r.smallest_card_again ? gib(*r.smallest_card_again) : "-",
               r.again.back().completed ? "" : "  did not complete on this card");
  }
  // The card a long run needs: carve's pools against PyTorch's model, and expandable-pool (at any
  // setting) against PyTorch's expandable segments; on a roomy card, the most it reserves in the
  // runs after the first against the same.
  const auto against = [&](const Row& r, const char* name) {
    const Row* other = rep.find(name);
    if (r.smallest_card_again && other && other->smallest_card_again) {
      fmt::print("{} runs them all on a {} card, {} on {} (goal: no larger): {}\n", r.name, gib(*r.smallest_card_again),
                 name, gib(*other->smallest_card_again),
                 *r.smallest_card_again <= *other->smallest_card_again ? "met" : "MISSED");
    }
  };
  const Row* segments = rep.find("pytorch-expandable-model");
  const bool roomy = !rep.capacity && segments && !segments->again.empty() && segments->again.back().completed;
  fmt::print("\n");
  for (const Row& r : rep.rows) {
    if (r.name.rfind("pytorch", 0) != 0 && r.name != "no-cache") {
      against(r, "pytorch-model");
    }
    if (r.name.rfind("expandable-pool", 0) == 0) {
      against(r, "pytorch-expandable-model");
      if (roomy && !r.again.empty() && r.again.back().completed) {
        fmt::print("{} reserves at most {} in the {} runs after the first, pytorch-expandable-model {} (goal: no "
                   "more): {}\n",
                   r.name, gib(most_reserved_again(r)), rep.again, gib(most_reserved_again(*segments)),
                   most_reserved_again(r) <= most_reserved_again(*segments) ? "met" : "MISSED");
      }
    }
  }
}

inline void print_table(const Report& rep) {
  const trace::AllocationTrace& t = *rep.trace;
  fmt::print("{}: {} allocations, {} blocks ({}) live at the start, peak live {}, {} stream{}\n", t.source,
             t.allocations(), t.start_blocks, gib(rep.start_live), gib(rep.peak_live), rep.streams,
             rep.streams == 1 ? "" : "s");
  if (rep.capacity) {
    fmt::print("on a card of {} ({} bytes)\n", gib(*rep.capacity), *rep.capacity);
  }
  const std::size_t width = name_width(rep);
  fmt::print("\n{:<{}} {:>13} {:>11} {:>13} {:>10} {:>14}\n", "allocator", width, "peak reserved", "x peak live",
             "device calls", "ns/op", "smallest card");
  const double live = static_cast<double>(std::max<std::uint64_t>(1, rep.peak_live));
  for (const Row& r : rep.rows) {
    const std::string calls = r.device_calls ? fmt::format("{}", *r.device_calls) : "-";
    const std::string ns = r.ns_per_op ? fmt::format("{:.0f}", *r.ns_per_op) : "-";
    const std::string card = r.smallest_card ? gib(*r.smallest_card) : "-";
    fmt::print("{:<{}} {:>13} {:>10.3f}x {:>13} {:>10} {:>14}{}\n", r.name, width, gib(r.peak_reserved),
               static_cast<double>(r.peak_reserved) / live, calls, ns, card,
               r.failed_request ? "  fails at " + describe_request(t, *r.failed_request) : std::string());
  }
  fmt::print("\nns/op: host time per allocate+free, device calls taken out. Device calls: those made while "
             "replaying the requests (the start state not counted).\n");
  const Row* model = rep.find("pytorch-model");
  const Row* recorded = rep.find("pytorch-recorded");
  const auto against = [&](const Row& r, const char* how) {
    fmt::print("pytorch-model {} against pytorch-recorded: peak reserved {} against {} ({:+.2f}%), segment "
               "allocations {} against {}\n",
               how, gib(r.peak_reserved), gib(recorded->peak_reserved),
               100.0 * (static_cast<double>(r.peak_reserved) / static_cast<double>(recorded->peak_reserved) - 1),
               r.device_calls.value_or(0), recorded->device_calls.value_or(0));
  };
  if (model && model->completed && recorded && recorded->peak_reserved > 0) {
    against(*model, "(start rebuilt from live blocks, as for every allocator)");
  }
  if (rep.seeded_model && rep.seeded_model->completed && recorded && recorded->peak_reserved > 0) {
    against(*rep.seeded_model, "started from the recorded segments");
  }
  const auto knob = [&](const std::vector<SettingPoint>& points, const char* what, const char* column,
                        std::size_t default_value, auto&& label) {
    if (points.empty()) {
      return;
    }
    fmt::print("\nexpandable-pool's {}: reserve against device calls on this trace\n", what);
    fmt::print("{:>19} {:>13} {:>11} {:>13}\n", column, "peak reserved", "x peak live", "device calls");
    for (const SettingPoint& h : points) {
      const bool none = h.value == std::numeric_limits<std::size_t>::max();
      const std::string setting =
          (none ? std::string("none") : label(h.value)) + (h.value == default_value ? " (default)" : "");
      fmt::print("{:>19} {:>13} {:>10.3f}x {:>13}{}\n", setting, gib(h.peak_reserved),
                 static_cast<double>(h.peak_reserved) / live, h.device_calls,
                 h.completed ? "" : "  did not complete on this card");
    }
  };
  knob(rep.headroom,
       "headroom (ExpandablePoolOptions::headroom_permille, carve_replay --allocators expandable-pool:headroom=N)",
       "headroom", ExpandablePoolOptions{}.headroom_permille,
       [](std::size_t v) { return fmt::format("{:g}%", static_cast<double>(v) / 10); });
  knob(rep.lending,
       "hole lending to blocks of at least (ExpandablePoolOptions::lend_min_bytes, carve_replay --allocators "
       "expandable-pool:lend=BYTES)",
       "lend to blocks", ExpandablePoolOptions{}.lend_min_bytes, [](std::size_t v) { return gib(v); });
  knob(rep.whole_allocations,
       "allocation size over a driver that maps whole allocations only (ExpandablePoolOptions::max_chunk_bytes, "
       "carve_replay --allocators expandable-pool:partial-maps=0:max-chunk=BYTES)",
       "max chunk", ExpandablePoolOptions{}.max_chunk_bytes, [](std::size_t v) { return gib(v); });
  print_again(rep);
  const auto goals = rep.capacity ? std::vector<std::string>{} : goal_lines(rep); // goals are for a roomy card
  if (!goals.empty()) {
    fmt::print("\n");
    for (const std::string& g : goals) {
      fmt::print("{}\n", g);
    }
  }
}

inline std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<unsigned>(static_cast<unsigned char>(c)));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

inline void print_json(const Report& rep) {
  const auto number = [](const auto& v) { return v ? fmt::format("{}", *v) : std::string("null"); };
  std::string rows;
  for (const Row& r : rep.rows) {
    rows += fmt::format("{}{{\"name\":{},\"peak_reserved_bytes\":{},\"device_calls\":{},\"ns_per_op\":{},"
                        "\"smallest_card_bytes\":{},\"completed\":{},\"failed_request\":{}}}",
                        rows.empty() ? "" : ",", json_string(r.name), r.peak_reserved, number(r.device_calls),
                        r.ns_per_op ? fmt::format("{:.1f}", *r.ns_per_op) : "null", number(r.smallest_card),
                        r.completed ? "true" : "false", number(r.failed_request));
  }
  const auto points = [](const std::vector<SettingPoint>& all, const char* key) {
    std::string out;
    for (const SettingPoint& h : all) {
      out += fmt::format(
          "{}{{\"{}\":{},\"peak_reserved_bytes\":{},\"device_calls\":{},\"completed\":{}}}", out.empty() ? "" : ",",
          key, h.value == std::numeric_limits<std::size_t>::max() ? std::string("null") : std::to_string(h.value),
          h.peak_reserved, h.device_calls, h.completed ? "true" : "false");
    }
    return out;
  };
  const std::string headroom = points(rep.headroom, "permille");
  const std::string lending = points(rep.lending, "lend_min_bytes");
  const std::string whole = points(rep.whole_allocations, "max_chunk_bytes");
  const std::string seeded = rep.seeded_model
                                 ? fmt::format("{{\"peak_reserved_bytes\":{},\"device_calls\":{}}}",
                                               rep.seeded_model->peak_reserved, number(rep.seeded_model->device_calls))
                                 : "null";
  fmt::print("{{\"trace\":{},\"peak_live_bytes\":{},\"start_live_bytes\":{},\"allocations\":{},\"streams\":{},"
             "\"capacity_bytes\":{},\"allocators\":[{}],\"pytorch_model_from_recorded_start\":{},"
             "\"expandable_pool_headroom\":[{}],\"expandable_pool_lending\":[{}],"
             "\"expandable_pool_whole_allocations\":[{}]}}\n",
             json_string(rep.trace->source), rep.peak_live, rep.start_live, rep.trace->allocations(), rep.streams,
             number(rep.capacity), rows, seeded, headroom, lending, whole);
}

// Reserved bytes over the trace for every allocator, and the live bytes beneath them.
inline void write_plot(const Report& rep, const std::string& path) {
  const trace::AllocationTrace& t = *rep.trace;
  const std::size_t n = t.requests.size();
  const std::size_t points = std::min<std::size_t>(n, 2000);
  const auto bucket_max = [&](const std::vector<std::uint64_t>& per_request, svg::PlotLine& line) {
    for (std::size_t k = 0; k < points; ++k) {
      const std::size_t from = k * n / points;
      const std::size_t to = std::max(from + 1, (k + 1) * n / points);
      std::uint64_t top = 0;
      for (std::size_t r = from; r < to && r < per_request.size(); ++r) {
        top = std::max(top, per_request[r]);
      }
      line.x.push_back(static_cast<double>(from));
      line.y.push_back(static_cast<double>(top) / double(1 << 30));
    }
  };
  std::vector<std::uint64_t> live(n);
  std::uint64_t now = rep.start_live;
  for (std::size_t r = 0; r < n; ++r) {
    const std::uint64_t b = t.blocks[t.requests[r].block].bytes;
    now = t.requests[r].allocate ? now + b : now - b;
    live[r] = now;
  }
  svg::Plot plot;
  plot.title = "Reserved and live bytes over the trace";
  plot.subtitle = {std::filesystem::path(t.source).filename().string() + ": " + std::to_string(t.allocations()) +
                   " allocations, peak live " + gib(rep.peak_live)};
  plot.x_label = "request";
  plot.y_label = "GiB";
  std::size_t colour = 0;
  for (const Row& r : rep.rows) {
    if (r.reserved_after.empty()) {
      continue;
    }
    svg::PlotLine line{r.name + " (peak " + gib(r.peak_reserved) + ")",
                       {},
                       {},
                       svg::palette()[colour++ % svg::palette().size()],
                       false};
    bucket_max(r.reserved_after, line);
    plot.lines.push_back(std::move(line));
  }
  svg::PlotLine floor{"live " + gib(rep.peak_live), {}, {}, "#000000", true};
  bucket_max(live, floor);
  plot.lines.push_back(std::move(floor));
  svg::write_svg(plot, path, 1100, 560);
}

} // namespace carve::replay
