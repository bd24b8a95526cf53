/// @file carve/sim/workload.hpp
/// Workgroups and the seeded distributions they are drawn from.
///
/// A workload is a list of workgroups in queue order. Each has a size in slots, a run time in
/// cycles, the cycle it arrives at the dispatcher, and the run time the dispatcher *expects*
/// (what a hinted policy is told; equal to the real run time unless noise is asked for).
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

/// One workgroup of a workload.
struct Workgroup {
  std::uint32_t arrival = 0;  ///< cycle at which it joins the back of the queue
  std::uint32_t size = 1;     ///< contiguous slots, 1..N
  std::uint32_t duration = 1; ///< cycles from dispatch to release, >= 1
  std::uint32_t expected = 1; ///< the run time the dispatcher believes (the hint), >= 1

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

/// What generate() draws a workload from.
struct WorkloadSpec {
  std::uint32_t count = 1000;                              ///< workgroups
  Distribution sizes = Distribution::uniform(1, 32);       ///< slots per workgroup
  Distribution durations = Distribution::uniform(10, 100); ///< run time in cycles
  Arrivals arrivals{};                                     ///< when they arrive
  /// The expected run time is the real one times exp(hint_noise * Z), Z standard normal: 0 gives
  /// exact hints, 0.5 gives hints that are typically 40% off.
  double hint_noise = 0.0;
};

/// The workload for one seed. The same (spec, seed) gives the same workgroups everywhere.
inline std::vector<Workgroup> generate(const WorkloadSpec& spec, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<Workgroup> out;
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
    if (spec.hint_noise > 0.0) {
      const double e = std::round(w.duration * std::exp(spec.hint_noise * rng.normal()));
      w.expected = static_cast<std::uint32_t>(std::clamp(e, 1.0, 4.0e9));
    }
    out.push_back(w);
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

inline std::string Arrivals::to_string() const {
  return per_cycle > 0.0 ? "poisson " + detail::format_real(per_cycle) : "at-once";
}

} // namespace carve::sim
