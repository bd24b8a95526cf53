/// @file carve/sim/distribution.hpp
/// Distributions of whole numbers (workgroup sizes, run times, workgroups per launch), seeded
/// through Rng so that a seed draws the same values everywhere.
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
#include <carve/sim/text_words.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>

namespace carve::sim {

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
        // log1p: log(1 - 1/mean) without 1 - 1/mean rounding to 1 for a large mean.
        const double k = p_ <= 1.0 ? 1.0 : std::ceil(std::log(1.0 - rng.unit()) / std::log1p(-1.0 / p_));
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
    const auto max = words.size() == 3 ? value(2) : std::numeric_limits<std::uint32_t>::max();
    // Draws above MAX are redrawn: past 1000 times MAX, fewer than 1 in 1000 draws would be kept.
    if (mean > 1000.0 * max) {
      throw input_error(where, line, "'" + std::string(text) + "': the mean must be at most 1000 times MAX");
    }
    return geometric(mean, max);
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

} // namespace carve::sim
