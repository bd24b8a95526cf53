/// @file carve/tier/tier_report.hpp
/// A TierPlan as a table, as JSON, and how fair it is.
#pragma once

#include <carve/core/format_bytes.hpp>
#include <carve/tier/tier_planner.hpp>

#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

namespace carve {

/// The plan as text: its method, then one row per GPU: capacity, demand, extra, then per tier
/// "used / reserved", then unmet.
inline std::string format_table(const TierPlan& plan) {
  std::string out = plan.method + (plan.options.hand_back_unused ? " (unused shares handed back)" : "") + "\n";
  char cell[128];
  std::snprintf(cell, sizeof cell, "%-5s %11s %11s %11s", "GPU", "capacity", "demand", "extra");
  out += cell;
  for (const SpillTier& t : plan.tiers) {
    std::snprintf(cell, sizeof cell, "  %23s", (t.name + " used/reserved").c_str());
    out += cell;
  }
  out += "  unmet\n";
  for (const GpuPlan& g : plan.gpus) {
    std::snprintf(cell, sizeof cell, "%-5d %11s %11s %11s", g.ordinal, format_bytes(g.capacity).c_str(),
                  format_bytes(g.demand).c_str(), format_bytes(g.extra).c_str());
    out += cell;
    for (const GpuTierUse& u : g.tiers) {
      std::snprintf(cell, sizeof cell, "  %11s/%11s", format_bytes(u.used).c_str(), format_bytes(u.reserved).c_str());
      out += cell;
    }
    out += "  " + format_bytes(g.unmet) + "\n";
  }
  return out;
}

namespace detail {
// Just enough JSON writing for plans: objects, arrays, numbers, booleans and escaped strings,
// with the commas placed for the caller.
class JsonWriter {
public:
  JsonWriter& open(char bracket) {
    separate();
    out_ += bracket;
    first_ = true;
    return *this;
  }
  JsonWriter& close(char bracket) {
    out_ += bracket;
    first_ = false;
    return *this;
  }
  JsonWriter& key(const char* name) {
    separate();
    string(name);
    out_ += ':';
    first_ = true; // the value follows without a comma
    return *this;
  }
  JsonWriter& value(std::uint64_t v) { return raw(std::to_string(v)); }
  JsonWriter& value(int v) { return raw(std::to_string(v)); }
  JsonWriter& value(bool v) { return raw(v ? "true" : "false"); }
  JsonWriter& value(double v) { // finite values only: JSON has no infinity
    char text[32];
    std::snprintf(text, sizeof text, "%.17g", v);
    return raw(text);
  }
  JsonWriter& value(const std::string& v) {
    separate();
    string(v);
    return *this;
  }
  std::string take() { return std::move(out_); }

private:
  void separate() {
    if (!first_) {
      out_ += ',';
    }
    first_ = false;
  }
  JsonWriter& raw(const std::string& text) {
    separate();
    out_ += text;
    return *this;
  }
  void string(const std::string& s) {
    out_ += '"';
    for (const char c : s) {
      if (c == '"' || c == '\\') {
        out_ += '\\';
        out_ += c;
      } else if (static_cast<unsigned char>(c) < 0x20) {
        char escaped[8];
        std::snprintf(escaped, sizeof escaped, "\\u%04x", static_cast<unsigned>(c));
        out_ += escaped;
      } else {
        out_ += c;
      }
    }
    out_ += '"';
  }

  std::string out_;
  bool first_ = true;
};
} // namespace detail

/// The plan as one JSON object: method, hand_back_unused, tiers, gpus (with their use of every
/// tier) and placements (GPUs named by ordinal).
inline std::string to_json(const TierPlan& plan) {
  detail::JsonWriter json;
  json.open('{');
  json.key("method").value(plan.method).key("hand_back_unused").value(plan.options.hand_back_unused);
  json.key("tiers").open('[');
  for (const SpillTier& tier : plan.tiers) {
    json.open('{').key("name").value(tier.name).key("priority").value(tier.priority);
    json.key("capacity").value(tier.capacity).key("bandwidth_gbps").value(tier.bandwidth_gbps);
    json.key("numa_nodes").open('[');
    for (const int node : tier.numa_nodes) {
      json.value(node);
    }
    json.close(']').key("directory").value(tier.directory).close('}');
  }
  json.close(']').key("gpus").open('[');
  for (const GpuPlan& g : plan.gpus) {
    json.open('{').key("ordinal").value(g.ordinal).key("capacity").value(g.capacity);
    json.key("demand").value(g.demand).key("extra").value(g.extra).key("tiers").open('[');
    for (std::size_t t = 0; t < g.tiers.size(); ++t) {
      json.open('{').key("name").value(plan.tiers[t].name).key("share").value(g.tiers[t].share);
      json.key("used").value(g.tiers[t].used).key("reserved").value(g.tiers[t].reserved).close('}');
    }
    json.close(']').key("unmet").value(g.unmet).close('}');
  }
  json.close(']').key("placements").open('[');
  for (const SubtaskPlacement& s : plan.placements) {
    json.open('{').key("task").value(std::uint64_t{s.task}).key("subtask").value(std::uint64_t{s.subtask});
    json.key("gpu").value(plan.gpus[s.gpu].ordinal).key("bytes").value(s.bytes).close('}');
  }
  json.close(']').close('}');
  return json.take();
}

/// How evenly a plan treats the GPUs that spill (extra > 0). A GPU's share of a tier is its
/// reservation there over the tier's capacity. A tier's bandwidth is split among the GPUs holding
/// reservations on it, in proportion to those reservations, so a GPU's share of tier-1 bandwidth
/// is its reservation over all reservations on tier 1 (the two shares differ when part of the
/// tier is left unreserved). The worst values are 0 when no GPU spills.
struct TierFairness {
  int spilling_gpus = 0;                  ///< GPUs with extra > 0
  double worst_tier1_share = 0;           ///< the smallest share of tier 1's capacity among spilling GPUs
  int worst_tier1_gpu = -1;               ///< its ordinal
  double worst_tier1_bandwidth_share = 0; ///< the smallest share of tier 1's bandwidth among spilling GPUs
  int worst_tier1_bandwidth_gpu = -1;     ///< its ordinal
  double worst_tier1_coverage = 0;        ///< the smallest fraction of a spilling GPU's extra on tier 1
  /// With bandwidths known: the longest time a spilling GPU needs to read its spill once, all
  /// GPUs reading at the same time. 0 when bandwidths are unknown; infinite with unmet demand.
  double worst_spill_read_seconds = 0;
};

/// The plan's fairness figures (TierFairness).
inline TierFairness fairness(const TierPlan& plan) {
  TierFairness f;
  f.worst_tier1_share = std::numeric_limits<double>::infinity();
  f.worst_tier1_bandwidth_share = std::numeric_limits<double>::infinity();
  f.worst_tier1_coverage = std::numeric_limits<double>::infinity();
  bool bandwidth_known = true;
  std::vector<double> reserved_on(plan.tiers.size(), 0.0);
  for (std::size_t t = 0; t < plan.tiers.size(); ++t) {
    bandwidth_known &= plan.tiers[t].bandwidth_gbps > 0;
    for (const GpuPlan& g : plan.gpus) {
      reserved_on[t] += static_cast<double>(g.tiers[t].reserved);
    }
  }
  for (const GpuPlan& g : plan.gpus) {
    if (g.extra == 0) {
      continue;
    }
    ++f.spilling_gpus;
    const double share = static_cast<double>(g.tiers[0].reserved) / static_cast<double>(plan.tiers[0].capacity);
    if (share < f.worst_tier1_share) {
      f.worst_tier1_share = share;
      f.worst_tier1_gpu = g.ordinal;
    }
    const double bandwidth_share = reserved_on[0] > 0 ? static_cast<double>(g.tiers[0].reserved) / reserved_on[0] : 0;
    if (bandwidth_share < f.worst_tier1_bandwidth_share) {
      f.worst_tier1_bandwidth_share = bandwidth_share;
      f.worst_tier1_bandwidth_gpu = g.ordinal;
    }
    const double coverage = static_cast<double>(g.tiers[0].used) / static_cast<double>(g.extra);
    f.worst_tier1_coverage = coverage < f.worst_tier1_coverage ? coverage : f.worst_tier1_coverage;
    if (bandwidth_known) {
      double seconds = g.unmet > 0 ? std::numeric_limits<double>::infinity() : 0;
      for (std::size_t t = 0; t < plan.tiers.size(); ++t) {
        if (g.tiers[t].used == 0) {
          continue;
        }
        const double fraction = static_cast<double>(g.tiers[t].reserved) / reserved_on[t];
        seconds += static_cast<double>(g.tiers[t].used) / (plan.tiers[t].bandwidth_gbps * 1e9 * fraction);
      }
      f.worst_spill_read_seconds = seconds > f.worst_spill_read_seconds ? seconds : f.worst_spill_read_seconds;
    }
  }
  if (f.spilling_gpus == 0) {
    f.worst_tier1_share = 0;
    f.worst_tier1_bandwidth_share = 0;
    f.worst_tier1_coverage = 0;
  }
  return f;
}

} // namespace carve
