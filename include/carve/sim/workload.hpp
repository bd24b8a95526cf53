/// @file carve/sim/workload.hpp
/// Workgroups, and the workloads generate() draws from a WorkloadSpec and a seed.
///
/// A workload is a list of workgroups in queue order. Each has a size in slots, a run time in
/// cycles, the cycle it arrives at the dispatcher, and optionally the run time it is *expected*
/// to take (a trace's `expected` column, or the run time with noise), the kernel it belongs to,
/// and the launch it is part of. Which run time a hinted policy is told is the dispatcher's choice
/// (HintMode in dispatcher.hpp), not the workload's.
///
/// Two kinds of generated workload: independent workgroups, each with its own size and run time
/// drawn from WorkloadSpec::sizes and WorkloadSpec::durations (distribution.hpp), and kernel-structured ones
/// (KernelMix, kernel_mix.hpp): launches of kernel types whose workgroups share a size and
/// scatter around the kernel's mean run time, issued from streams.
#pragma once

#include <carve/sim/distribution.hpp>
#include <carve/sim/input_error.hpp>
#include <carve/sim/kernel_mix.hpp>
#include <carve/sim/random.hpp>
#include <carve/sim/text_words.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace carve::sim {

/// Marks a Workgroup without a kernel, or without a launch.
inline constexpr std::uint32_t none = 0xffff'ffffu;

/// One workgroup of a workload.
struct Workgroup {
  std::uint32_t arrival =
      0; ///< cycle it joins the back of the queue (after `after`, if set: cycles after that launch finished)
  std::uint32_t size = 1;      ///< contiguous slots, 1..N
  std::uint32_t duration = 1;  ///< cycles from dispatch to release, >= 1
  std::uint32_t expected = 1;  ///< the run time it is expected to take (HintMode::given); 0: none given
  std::uint32_t kernel = none; ///< its kernel type, or none
  std::uint32_t launch = none; ///< the launch it belongs to, or none
  std::uint32_t after = none; ///< a launch (below `launch`) whose last workgroup must finish before it arrives, or none

  /// Equal when every field is.
  friend bool operator==(const Workgroup&, const Workgroup&) = default;
};

/// How workgroups arrive: all queued at cycle 0 (a batch drained as fast as it can be), or a
/// Poisson stream.
struct Arrivals {
  double per_cycle = 0.0; ///< 0: everything at cycle 0; else the mean arrivals per cycle

  /// Parses "at-once" or "poisson RATE"; bad text throws input_error naming `where` and `line`.
  static Arrivals parse(std::string_view text, const std::string& where, std::size_t line = 0);
  /// The text form parse reads back.
  std::string to_string() const;
  /// Equal at the same rate.
  friend bool operator==(const Arrivals&, const Arrivals&) = default;
};

/// What generate() draws a workload from.
struct WorkloadSpec {
  std::uint32_t count = 1000;                              ///< workgroups
  Distribution sizes = Distribution::uniform(1, 32);       ///< slots per workgroup (without kernels)
  Distribution durations = Distribution::uniform(10, 100); ///< run time in cycles (without kernels)
  Arrivals arrivals{};                                     ///< when they (or, with kernels, launches) arrive
  /// The expected run time is the real one times exp(hint_noise * Z), Z standard normal, drawn
  /// from a stream of its own (add_hint_noise): 0 gives the real run times, 0.5 run times
  /// typically 40% off; any noise leaves the workload itself unchanged.
  double hint_noise = 0.0;
  KernelMix mix{}; ///< when not empty, a kernel-structured workload (sizes and durations unused)
};

/// Sets each workgroup's expected run time to its real one times exp(noise * Z), Z standard
/// normal from a random stream of its own for `seed`: the same workgroups get the same noise,
/// and the workload's own draws are untouched.
inline void add_hint_noise(std::vector<Workgroup>& workgroups, double noise, std::uint64_t seed) {
  Rng rng(seed ^ 0x6869'6e74'6e6f'6973ull); // its own stream
  for (Workgroup& w : workgroups) {
    const double e = std::round(w.duration * std::exp(noise * rng.normal()));
    w.expected = static_cast<std::uint32_t>(std::clamp(e, 1.0, 4.0e9));
  }
}

namespace detail {

inline std::vector<Workgroup> generate_kernels(const WorkloadSpec& spec, Rng& rng) {
  const KernelMix& mix = spec.mix;
  double total_weight = 0;
  for (const KernelType& k : mix.kernels) {
    total_weight += k.weight;
  }
  std::vector<Workgroup> out;
  out.reserve(spec.count);
  const std::uint32_t streams = std::max(1u, mix.streams);
  std::vector<std::uint32_t> last_launch(streams, none);
  double clock = 0.0;
  for (std::uint32_t launch = 0; out.size() < spec.count; ++launch) {
    double pick = rng.unit() * total_weight;
    std::uint32_t k = 0;
    while (k + 1 < mix.kernels.size() && pick >= mix.kernels[k].weight) {
      pick -= mix.kernels[k].weight;
      ++k;
    }
    const KernelType& type = mix.kernels[k];
    const std::uint32_t stream = launch % streams;
    Workgroup w;
    w.kernel = k;
    w.launch = launch;
    w.size = type.size;
    if (mix.stream_waits) {
      w.after = last_launch[stream];
    } else if (spec.arrivals.per_cycle > 0.0) {
      clock += -std::log(1.0 - rng.unit()) / spec.arrivals.per_cycle;
      w.arrival = static_cast<std::uint32_t>(std::min(clock, 4.0e9));
    }
    last_launch[stream] = launch;
    const auto n = static_cast<std::uint32_t>(std::min<std::uint64_t>(type.launch.draw(rng), spec.count - out.size()));
    for (std::uint32_t i = 0; i < n; ++i) {
      w.duration = type.draw_run_time(rng);
      w.expected = w.duration;
      out.push_back(w);
    }
  }
  return out;
}

} // namespace detail

/// The workload for one seed. The same (spec, seed) gives the same workgroups everywhere.
inline std::vector<Workgroup> generate(const WorkloadSpec& spec, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<Workgroup> out;
  if (!spec.mix.empty()) {
    out = detail::generate_kernels(spec, rng);
  } else {
    out.reserve(spec.count);
    double clock = 0.0;
    for (std::uint32_t i = 0; i < spec.count; ++i) {
      Workgroup w;
      if (spec.arrivals.per_cycle > 0.0) {
        clock += -std::log(1.0 - rng.unit()) / spec.arrivals.per_cycle;
        w.arrival = static_cast<std::uint32_t>(std::min(clock, 4.0e9));
      }
      w.size = spec.sizes.draw(rng);
      w.duration = spec.durations.draw(rng);
      w.expected = w.duration;
      out.push_back(w);
    }
  }
  if (spec.hint_noise > 0.0) {
    add_hint_noise(out, spec.hint_noise, seed);
  }
  return out;
}

inline Arrivals Arrivals::parse(std::string_view text, const std::string& where, std::size_t line) {
  const auto words = detail::split_words(text);
  if (words.size() == 1 && words[0] == "at-once") {
    return {};
  }
  if (words.size() == 2 && words[0] == "poisson") {
    const double rate = detail::parse_real(words[1], "rate", where, line);
    if (rate <= 0.0) {
      throw input_error(where, line, "'" + std::string(text) + "': the rate must be positive");
    }
    return {rate};
  }
  throw input_error(where, line, "'" + std::string(text) + "': expected 'at-once' or 'poisson RATE'");
}

inline std::string Arrivals::to_string() const {
  return per_cycle > 0.0 ? "poisson " + detail::format_real(per_cycle) : "at-once";
}

} // namespace carve::sim
