/// @file carve/sim/workload.hpp
/// Workgroups and the seeded distributions they are drawn from.
///
/// A workload is a list of workgroups in queue order. Each has a size in slots, a run time in
/// cycles, the cycle it arrives at the dispatcher, and optionally the run time it is *expected*
/// to take (a trace's `expected` column, or the run time with noise), the kernel it belongs to,
/// and the launch it is part of. Which run time a hinted policy is told is the dispatcher's choice
/// (HintMode in dispatcher.hpp), not the workload's.
///
/// Two kinds of generated workload: the seed's experiment (every workgroup with its own random
/// size and run time) and kernel-structured ones (KernelMix): launches of kernel types whose
/// workgroups share a size and scatter around the kernel's mean run time, issued from streams.
///
/// Distributions are written as text, the same on the command line, in a config file and in
/// reports: words separated by spaces or colons.
/// @code{.unparsed}
/// uniform LO HI                    every integer in [LO, HI] equally likely
/// bimodal LO HI LO2 HI2 P          uniform in [LO2, HI2] with probability P, else in [LO, HI]
/// geometric MEAN [MAX]             1, 2, 3, ... with P(k) falling geometrically, mean MEAN
///                                  (draws above MAX are redrawn)
/// fixed V                          always V
/// @endcode
#pragma once

#include <carve/sim/input_error.hpp>
#include <carve/sim/random.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
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

/// A distribution of whole numbers (sizes, run times), in the text form above.
class Distribution {
public:
  /// Which of the forms above.
  enum class Kind { uniform, bimodal, geometric, fixed };

  /// Every integer in [lo, hi] equally likely.
  static Distribution uniform(std::uint32_t lo, std::uint32_t hi) { return {Kind::uniform, lo, hi, 0, 0, 0.0}; }
  /// Uniform in [lo2, hi2] with probability p, else in [lo, hi].
  static Distribution bimodal(std::uint32_t lo, std::uint32_t hi, std::uint32_t lo2, std::uint32_t hi2, double p) {
    return {Kind::bimodal, lo, hi, lo2, hi2, p};
  }
  /// 1, 2, 3, ... falling geometrically with the given mean; draws above `max` are redrawn.
  static Distribution geometric(double mean, std::uint32_t max = std::numeric_limits<std::uint32_t>::max()) {
    return {Kind::geometric, 1, max, 0, 0, mean};
  }
  /// Always v.
  static Distribution fixed(std::uint32_t v) { return {Kind::fixed, v, v, 0, 0, 0.0}; }

  /// Parses the text form above. `where` names the source for errors ("--sizes", "sim.conf");
  /// bad text throws input_error.
  static Distribution parse(std::string_view text, const std::string& where, std::size_t line = 0);

  /// The text form; parse(to_string()) gives the same distribution.
  std::string to_string() const;

  /// One value drawn with `rng`.
  std::uint32_t draw(Rng& rng) const {
    switch (kind_) {
    case Kind::uniform:
    case Kind::fixed:
      return static_cast<std::uint32_t>(rng.uniform(lo_, hi_));
    case Kind::bimodal:
      return rng.unit() < p_ ? static_cast<std::uint32_t>(rng.uniform(lo2_, hi2_))
                             : static_cast<std::uint32_t>(rng.uniform(lo_, hi_));
    case Kind::geometric:
      for (;;) {
        // Inverse CDF of the geometric distribution on 1, 2, ... with success probability 1/mean.
        const double q = 1.0 - 1.0 / p_;
        const double k = q <= 0.0 ? 1.0 : std::ceil(std::log(1.0 - rng.unit()) / std::log(q));
        if (k >= 1.0 && k <= static_cast<double>(hi_)) {
          return static_cast<std::uint32_t>(k);
        }
      }
    }
    return lo_;
  }

  /// The mean of a draw (for geometric: of the untruncated distribution).
  double mean() const {
    switch (kind_) {
    case Kind::uniform:
    case Kind::fixed:
      return (lo_ + static_cast<double>(hi_)) / 2;
    case Kind::bimodal:
      return (1 - p_) * (lo_ + static_cast<double>(hi_)) / 2 + p_ * (lo2_ + static_cast<double>(hi2_)) / 2;
    case Kind::geometric:
      return p_;
    }
    return 0;
  }

  /// The smallest value a draw can return.
  std::uint32_t min() const { return kind_ == Kind::bimodal ? std::min(lo_, lo2_) : lo_; }
  /// The largest value a draw can return.
  std::uint32_t max() const { return kind_ == Kind::bimodal ? std::max(hi_, hi2_) : hi_; }
  /// Which form it is.
  Kind kind() const { return kind_; }

  /// Equal when the same form with the same parameters.
  friend bool operator==(const Distribution&, const Distribution&) = default;

private:
  Distribution(Kind kind, std::uint32_t lo, std::uint32_t hi, std::uint32_t lo2, std::uint32_t hi2, double p)
      : kind_(kind), lo_(lo), hi_(hi), lo2_(lo2), hi2_(hi2), p_(p) {}

  Kind kind_;
  std::uint32_t lo_, hi_, lo2_, hi2_;
  double p_; ///< bimodal: probability of the second mode; geometric: the mean
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

/// A kernel type of a KernelMix: every workgroup of one launch asks for the same slots, and its
/// run time scatters around the kernel's mean.
///
/// Text form (words in any order after the name; DIST in the colon form, e.g. uniform:64:256):
/// @code{.unparsed}
/// NAME size=SLOTS launch=DIST mean=CYCLES spread=CV weight=W
/// @endcode
struct KernelType {
  std::string name = "kernel";                   ///< shown in reports
  std::uint32_t size = 1;                        ///< slots per workgroup
  Distribution launch = Distribution::fixed(64); ///< workgroups per launch
  double mean = 100;                             ///< mean run time in cycles
  double spread = 0.1;                           ///< coefficient of variation of the run time (log-normal)
  double weight = 1;                             ///< relative share of the launches

  /// Parses the text form; bad text throws input_error naming `where` and `line`.
  static KernelType parse(std::string_view text, const std::string& where, std::size_t line = 0);
  /// The text form parse reads back.
  std::string to_string() const;
  /// A run time drawn with `rng`: log-normal with this mean and spread, rounded, at least 1.
  std::uint32_t draw_run_time(Rng& rng) const {
    if (spread <= 0.0) {
      return static_cast<std::uint32_t>(std::clamp(std::round(mean), 1.0, 4.0e9));
    }
    const double s2 = std::log1p(spread * spread);
    const double t = std::exp(std::log(mean) - s2 / 2 + std::sqrt(s2) * rng.normal());
    return static_cast<std::uint32_t>(std::clamp(std::round(t), 1.0, 4.0e9));
  }
  /// Equal when every field is.
  friend bool operator==(const KernelType&, const KernelType&) = default;
};

/// Kernel-structured workloads: launches of kernel types issued round-robin from `streams`
/// streams. Each launch picks its kernel type at random by weight. With `stream_waits` a stream's
/// next launch arrives only when its previous launch's last workgroup finished (as on a CUDA
/// stream), else launches arrive as WorkloadSpec::arrivals says (per launch).
struct KernelMix {
  std::string name;                ///< a built-in mix's name, empty for one given kernel by kernel
  std::vector<KernelType> kernels; ///< empty: not kernel-structured
  std::uint32_t streams = 8;       ///< streams launches are issued from
  bool stream_waits = true;        ///< a stream's launch waits for its previous one

  /// Whether there are kernels at all.
  bool empty() const { return kernels.empty(); }
  /// Equal when every field is.
  friend bool operator==(const KernelMix&, const KernelMix&) = default;
};

/// The names of the built-in mixes: "inference", "long-tail", "training".
inline const std::vector<std::string>& builtin_mix_names() {
  static const std::vector<std::string> names = {"inference", "long-tail", "training"};
  return names;
}

/// A built-in mix for compute units of 128 slots of 0.5 KiB (64 KiB); throws input_error naming
/// `where` for an unknown name.
///
/// Workgroups per launch are the share of a launch's grid that lands on this compute unit (a
/// grid of a few hundred workgroups over ~100 compute units gives a few each).
///
/// - **inference**: one transformer decoder layer at inference (prefill): GEMMs (QKV, MLP and
///   smaller projections; fp16 tiles in pipelined stages of 12, 24 and 32 KiB = 24, 48 and 64
///   slots), attention (a FlashAttention-style forward tile, 40 KiB = 80 slots, its run time
///   spread by sequence length), RMSNorm and softmax-style reductions (1-4 KiB) and element-wise
///   kernels (a scratch slot). Shared-memory sizes follow common tile configurations; run times
///   are relative (cycles of this simulator), not measured on hardware.
/// - **long-tail**: many short kernels of 4..20 slots and two rare kernels of 28 and 40 slots
///   that run 20-40 times longer (a few long kernels among many short ones).
/// - **training**: forward, backward and weight-gradient GEMMs, the attention backward pass
///   (48 KiB, long, widely spread), normalisation backward, optimizer and element-wise kernels.
KernelMix builtin_mix(std::string_view name, const std::string& where, std::size_t line = 0);

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

namespace detail {

inline std::vector<std::string_view> split_words(std::string_view text) {
  std::vector<std::string_view> words;
  std::size_t i = 0;
  while (i < text.size()) {
    const std::size_t start = text.find_first_not_of(" \t:", i);
    if (start == std::string_view::npos) {
      break;
    }
    const std::size_t end = std::min(text.find_first_of(" \t:", start), text.size());
    words.push_back(text.substr(start, end - start));
    i = end;
  }
  return words;
}

// A whole non-negative integer that fits 32 bits; the error says what is wrong with it.
inline std::uint32_t parse_count(std::string_view word, std::string_view what, const std::string& where,
                                 std::size_t line) {
  if (!word.empty() && word.front() == '-') {
    throw input_error(where, line, std::string(what) + " " + std::string(word) + " is negative");
  }
  std::uint64_t value = 0;
  const auto [end, ec] = std::from_chars(word.data(), word.data() + word.size(), value);
  if (word.empty() || ec != std::errc{} || end != word.data() + word.size()) {
    throw input_error(where, line, std::string(what) + " '" + std::string(word) + "' is not a whole number");
  }
  if (value > std::numeric_limits<std::uint32_t>::max()) {
    throw input_error(where, line, std::string(what) + " " + std::string(word) + " is too large");
  }
  return static_cast<std::uint32_t>(value);
}

inline double parse_real(std::string_view word, std::string_view what, const std::string& where, std::size_t line) {
  double value = 0.0;
  const auto [end, ec] = std::from_chars(word.data(), word.data() + word.size(), value);
  if (word.empty() || ec != std::errc{} || end != word.data() + word.size() || !std::isfinite(value)) {
    throw input_error(where, line, std::string(what) + " '" + std::string(word) + "' is not a number");
  }
  return value;
}

inline std::string format_real(double v) {
  char buf[32];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, ec == std::errc{} ? end : buf);
}

} // namespace detail

inline Distribution Distribution::parse(std::string_view text, const std::string& where, std::size_t line) {
  const auto words = detail::split_words(text);
  const auto need = [&](std::size_t lo, std::size_t hi, const char* form) {
    if (words.size() < lo || words.size() > hi) {
      throw input_error(where, line, "'" + std::string(text) + "': expected " + form);
    }
  };
  const auto value = [&](std::size_t k) {
    const std::uint32_t v = detail::parse_count(words[k], "value", where, line);
    if (v == 0) {
      throw input_error(where, line, "'" + std::string(text) + "': values must be at least 1");
    }
    return v;
  };
  const auto range = [&](std::size_t k) {
    const std::uint32_t lo = value(k);
    const std::uint32_t hi = value(k + 1);
    if (hi < lo) {
      throw input_error(where, line,
                        "'" + std::string(text) + "': range " + std::to_string(lo) + ".." + std::to_string(hi) +
                            " is empty");
    }
    return std::pair{lo, hi};
  };
  if (words.empty()) {
    throw input_error(where, line, "empty distribution: expected uniform, bimodal, geometric or fixed");
  }
  if (words[0] == "uniform") {
    need(3, 3, "'uniform LO HI'");
    const auto [lo, hi] = range(1);
    return uniform(lo, hi);
  }
  if (words[0] == "bimodal") {
    need(6, 6, "'bimodal LO HI LO2 HI2 P'");
    const auto [lo, hi] = range(1);
    const auto [lo2, hi2] = range(3);
    const double p = detail::parse_real(words[5], "probability", where, line);
    if (p < 0.0 || p > 1.0) {
      throw input_error(where, line, "'" + std::string(text) + "': probability must lie in [0, 1]");
    }
    return bimodal(lo, hi, lo2, hi2, p);
  }
  if (words[0] == "geometric") {
    need(2, 3, "'geometric MEAN [MAX]'");
    const double mean = detail::parse_real(words[1], "mean", where, line);
    if (mean < 1.0) {
      throw input_error(where, line, "'" + std::string(text) + "': the mean must be at least 1");
    }
    return words.size() == 3 ? geometric(mean, value(2)) : geometric(mean);
  }
  if (words[0] == "fixed") {
    need(2, 2, "'fixed V'");
    return fixed(value(1));
  }
  throw input_error(where, line,
                    "unknown distribution '" + std::string(words[0]) +
                        "': expected uniform, bimodal, geometric or fixed");
}

inline std::string Distribution::to_string() const {
  // Appended word by word: GCC 12 misreports chains of std::string operator+ (-Wrestrict).
  std::string out;
  const auto word = [&out](const std::string& w) {
    if (!out.empty()) {
      out += ' ';
    }
    out += w;
  };
  switch (kind_) {
  case Kind::uniform:
    word("uniform");
    word(std::to_string(lo_));
    word(std::to_string(hi_));
    break;
  case Kind::bimodal:
    word("bimodal");
    for (const std::uint32_t v : {lo_, hi_, lo2_, hi2_}) {
      word(std::to_string(v));
    }
    word(detail::format_real(p_));
    break;
  case Kind::geometric:
    word("geometric");
    word(detail::format_real(p_));
    if (hi_ != std::numeric_limits<std::uint32_t>::max()) {
      word(std::to_string(hi_));
    }
    break;
  case Kind::fixed:
    word("fixed");
    word(std::to_string(lo_));
    break;
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

inline KernelType KernelType::parse(std::string_view text, const std::string& where, std::size_t line) {
  const std::string form = "'NAME size=SLOTS launch=DIST mean=CYCLES spread=CV weight=W'";
  std::vector<std::string_view> words;
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t a = text.find_first_not_of(" \t", i);
    if (a == std::string_view::npos) {
      break;
    }
    const std::size_t b = std::min(text.find_first_of(" \t", a), text.size());
    words.push_back(text.substr(a, b - a));
    i = b;
  }
  if (words.empty() || words[0].find('=') != std::string_view::npos) {
    throw input_error(where, line, "'" + std::string(text) + "': expected " + form);
  }
  KernelType k;
  k.name = std::string(words[0]);
  bool has_size = false;
  bool has_mean = false;
  for (std::size_t i = 1; i < words.size(); ++i) {
    const std::size_t eq = words[i].find('=');
    const std::string_view key = words[i].substr(0, eq);
    const std::string_view value = eq == std::string_view::npos ? std::string_view{} : words[i].substr(eq + 1);
    if (key == "size") {
      k.size = detail::parse_count(value, "size", where, line);
      if (k.size == 0) {
        throw input_error(where, line, "kernel " + k.name + ": size must be at least 1");
      }
      has_size = true;
    } else if (key == "launch") {
      k.launch = Distribution::parse(value, where, line);
    } else if (key == "mean") {
      k.mean = detail::parse_real(value, "mean", where, line);
      if (k.mean < 1) {
        throw input_error(where, line, "kernel " + k.name + ": mean must be at least 1 cycle");
      }
      has_mean = true;
    } else if (key == "spread") {
      k.spread = detail::parse_real(value, "spread", where, line);
      if (k.spread < 0 || k.spread > 10) {
        throw input_error(where, line, "kernel " + k.name + ": spread must lie in [0, 10]");
      }
    } else if (key == "weight") {
      k.weight = detail::parse_real(value, "weight", where, line);
      if (k.weight <= 0) {
        throw input_error(where, line, "kernel " + k.name + ": weight must be positive");
      }
    } else {
      throw input_error(where, line,
                        "kernel " + k.name + ": unknown word '" + std::string(words[i]) + "'; expected " + form);
    }
  }
  if (!has_size || !has_mean) {
    throw input_error(where, line, "kernel " + k.name + ": size= and mean= are required; expected " + form);
  }
  return k;
}

inline std::string KernelType::to_string() const {
  std::string dist = launch.to_string();
  std::replace(dist.begin(), dist.end(), ' ', ':');
  std::string out = name;
  out += " size=" + std::to_string(size);
  out += " launch=" + dist;
  out += " mean=" + detail::format_real(mean);
  out += " spread=" + detail::format_real(spread);
  out += " weight=" + detail::format_real(weight);
  return out;
}

inline KernelMix builtin_mix(std::string_view name, const std::string& where, std::size_t line) {
  KernelMix mix;
  mix.name = std::string(name);
  const auto k = [&mix](const char* text) { mix.kernels.push_back(KernelType::parse(text, "builtin_mix")); };
  if (name == "inference") {
    k("gemm-qkv size=48 launch=uniform:2:8 mean=400 spread=0.1 weight=2");
    k("gemm-mlp size=64 launch=uniform:2:8 mean=600 spread=0.1 weight=2");
    k("gemm-small size=24 launch=uniform:2:8 mean=250 spread=0.1 weight=1");
    k("attention size=80 launch=uniform:1:4 mean=900 spread=0.35 weight=1");
    k("rmsnorm size=2 launch=uniform:2:8 mean=60 spread=0.1 weight=2");
    k("softmax size=8 launch=uniform:2:8 mean=90 spread=0.2 weight=1");
    k("elementwise size=1 launch=uniform:4:16 mean=30 spread=0.1 weight=2");
  } else if (name == "long-tail") {
    k("short-a size=4 launch=uniform:2:8 mean=40 spread=0.2 weight=4");
    k("short-b size=12 launch=uniform:2:8 mean=60 spread=0.2 weight=4");
    k("short-c size=20 launch=uniform:2:8 mean=80 spread=0.3 weight=3");
    k("long-a size=28 launch=uniform:1:4 mean=1600 spread=0.2 weight=0.5");
    k("long-b size=40 launch=uniform:1:4 mean=2400 spread=0.3 weight=0.3");
  } else if (name == "training") {
    k("gemm-fwd size=48 launch=uniform:2:8 mean=400 spread=0.1 weight=3");
    k("gemm-bwd size=64 launch=uniform:2:8 mean=700 spread=0.15 weight=3");
    k("gemm-wgrad size=32 launch=uniform:2:8 mean=500 spread=0.15 weight=2");
    k("attention-bwd size=96 launch=uniform:1:4 mean=1500 spread=0.4 weight=1");
    k("layernorm-bwd size=6 launch=uniform:2:8 mean=90 spread=0.2 weight=2");
    k("optimizer size=2 launch=uniform:4:16 mean=50 spread=0.3 weight=1");
    k("elementwise size=1 launch=uniform:4:16 mean=30 spread=0.2 weight=2");
  } else {
    std::string list;
    for (const std::string& n : builtin_mix_names()) {
      list += (list.empty() ? "" : ", ") + n;
    }
    throw input_error(where, line, "unknown kernel mix '" + std::string(name) + "' (built in: " + list + ")");
  }
  return mix;
}

inline std::string Arrivals::to_string() const {
  return per_cycle > 0.0 ? "poisson " + detail::format_real(per_cycle) : "at-once";
}

} // namespace carve::sim
