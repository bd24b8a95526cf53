/// @file carve/sim/text_words.hpp
/// The words of the simulator's text forms (distributions, arrivals, kernel types), and the
/// numbers in them: parsed with the error naming the source, written so that parsing gives them
/// back.
#pragma once

#include <carve/sim/input_error.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace carve::sim {

namespace detail {

// The words of `text` between any of `separators`: spaces, tabs and colons for a distribution
// ("uniform:64:256" inside a kernel type), spaces and tabs for a kernel type, whose DIST keeps its
// colons.
inline std::vector<std::string_view> split_words(std::string_view text, std::string_view separators = " \t:") {
  std::vector<std::string_view> words;
  std::size_t i = 0;
  while (i < text.size()) {
    const std::size_t start = text.find_first_not_of(separators, i);
    if (start == std::string_view::npos) {
      break;
    }
    const std::size_t end = std::min(text.find_first_of(separators, start), text.size());
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

} // namespace carve::sim
