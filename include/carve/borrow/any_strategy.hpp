/// @file carve/borrow/any_strategy.hpp
/// One of the built-in pick strategies, chosen at run time.
///
/// @code
/// carve::AnyStrategy s = carve::parse_strategy("weighted-score:free=1,bandwidth=2,history=0.5");
/// carve::BandwidthWeightedPicker<carve::AnyStrategy> picker(topology, s);
/// @endcode
///
/// A program that reads its strategy from a configuration (a server, a command-line tool) cannot
/// name the strategy type at compile time. AnyStrategy holds one of LargestBandwidth,
/// ThresholdMostFree and WeightedScore and forwards to it, so it is itself a PickStrategy; its
/// decisions are exactly those of the strategy it holds. A strategy of your own still plugs in
/// as a template argument, which costs nothing per pick.
///
/// Text form (parse_strategy / to_string):
/// @code{.unparsed}
/// largest-bandwidth
/// threshold-most-free[:threshold=GBPS][,strict]          (default threshold 48)
/// weighted-score[:free=W][,bandwidth=W][,history=W]      (defaults 1, 1, 0.5)
/// @endcode
/// Bad text throws carve::Exception (invalid_argument) naming the offending part.
#pragma once

#include <carve/borrow/pick_strategy.hpp>
#include <carve/borrow/strategies.hpp>
#include <carve/core/error.hpp>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>

namespace carve {

/// One of the built-in strategies, chosen at run time; a PickStrategy that forwards to it.
class AnyStrategy {
public:
  /// The strategies it can hold.
  using variant_type = std::variant<LargestBandwidth, ThresholdMostFree, WeightedScore>;

  /// LargestBandwidth.
  AnyStrategy() = default;
  /// Holds `strategy`; implicit, so each built-in strategy is an AnyStrategy.
  template <class S>
  requires std::is_constructible_v<variant_type, S> AnyStrategy(S strategy) : strategy_(strategy) {}

  /// The held strategy's eligible.
  bool eligible(const Candidate& c) const noexcept {
    return std::visit([&](const auto& s) { return s.eligible(c); }, strategy_);
  }
  /// The held strategy's score.
  PickScore score(const Candidate& c) const noexcept {
    return std::visit([&](const auto& s) { return s.score(c); }, strategy_);
  }
  /// The held strategy's name.
  const char* name() const noexcept {
    return std::visit([](const auto& s) { return strategy_name<std::decay_t<decltype(s)>>(); }, strategy_);
  }
  /// The held strategy.
  const variant_type& get() const noexcept { return strategy_; }

private:
  variant_type strategy_;
};

static_assert(PickStrategy<AnyStrategy>);

namespace detail {

inline double parse_weight(std::string_view strategy, std::string_view key, std::string_view value) {
  double v = 0.0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc{} || end != value.data() + value.size() || !std::isfinite(v) || v < 0.0) {
    throw Exception(Errc::invalid_argument, "strategy " + std::string(strategy) + ": " + std::string(key) + "=" +
                                                std::string(value) + " is not a non-negative number");
  }
  return v;
}

} // namespace detail

/// The strategy `text` names in the text form above; throws carve::Exception (invalid_argument)
/// for text that is not in it.
inline AnyStrategy parse_strategy(std::string_view text) {
  const std::size_t colon = text.find(':');
  const std::string_view name = text.substr(0, colon);
  std::string_view rest = colon == std::string_view::npos ? std::string_view{} : text.substr(colon + 1);
  LargestBandwidth largest;
  ThresholdMostFree threshold;
  WeightedScore weighted;
  if (name != strategy_name<LargestBandwidth>() && name != strategy_name<ThresholdMostFree>() &&
      name != strategy_name<WeightedScore>()) {
    throw Exception(Errc::invalid_argument, "unknown strategy '" + std::string(name) +
                                                "' (use largest-bandwidth, threshold-most-free or weighted-score)");
  }
  while (!rest.empty()) {
    const std::size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    const std::size_t eq = item.find('=');
    const std::string_view key = item.substr(0, eq);
    const std::string_view value = eq == std::string_view::npos ? std::string_view{} : item.substr(eq + 1);
    const bool has_value = eq != std::string_view::npos;
    if (name == strategy_name<ThresholdMostFree>() && key == "threshold" && has_value) {
      threshold.threshold_gbps = detail::parse_weight(name, key, value);
    } else if (name == strategy_name<ThresholdMostFree>() && key == "strict" && !has_value) {
      threshold.strict = true;
    } else if (name == strategy_name<WeightedScore>() && key == "free" && has_value) {
      weighted.free_weight = detail::parse_weight(name, key, value);
    } else if (name == strategy_name<WeightedScore>() && key == "bandwidth" && has_value) {
      weighted.bandwidth_weight = detail::parse_weight(name, key, value);
    } else if (name == strategy_name<WeightedScore>() && key == "history" && has_value) {
      weighted.history_weight = detail::parse_weight(name, key, value);
    } else {
      throw Exception(Errc::invalid_argument,
                      "strategy " + std::string(name) + " has no setting '" + std::string(item) + "'");
    }
  }
  if (name == strategy_name<ThresholdMostFree>()) {
    return threshold;
  }
  if (name == strategy_name<WeightedScore>()) {
    return weighted;
  }
  return largest;
}

/// The text parse_strategy reads back to the same strategy.
inline std::string to_string(const AnyStrategy& strategy) {
  const auto number = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    return std::string(buf);
  };
  struct Print {
    decltype(number)& num;
    std::string operator()(const LargestBandwidth&) const { return strategy_name<LargestBandwidth>(); }
    std::string operator()(const ThresholdMostFree& s) const {
      return std::string(strategy_name<ThresholdMostFree>()) + ":threshold=" + num(s.threshold_gbps) +
             (s.strict ? ",strict" : "");
    }
    std::string operator()(const WeightedScore& s) const {
      return std::string(strategy_name<WeightedScore>()) + ":free=" + num(s.free_weight) +
             ",bandwidth=" + num(s.bandwidth_weight) + ",history=" + num(s.history_weight);
    }
  };
  return std::visit(Print{number}, strategy.get());
}

} // namespace carve
