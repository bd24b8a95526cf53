/// @file carve/topology/text_lines.hpp
/// Line and token splitting shared by the topology readers.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace carve::detail {

struct TextLine {
  std::size_t number; // 1-based
  std::string text;   // without the line break, carriage return or terminal colour codes
};

// Splits text into lines. nvidia-smi underlines its header with ANSI escapes when it writes to a
// terminal (ESC [ ... letter), and text copied from Windows ends lines with CR; both go here.
inline std::vector<TextLine> split_lines(std::string_view text) {
  std::vector<TextLine> lines;
  std::size_t number = 1;
  std::string current;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\n') {
      lines.push_back({number++, std::move(current)});
      current.clear();
    } else if (c == '\x1b' && i + 1 < text.size() && text[i + 1] == '[') {
      i += 2;
      while (i < text.size() && text[i] != '\n' &&
             !((text[i] >= 'A' && text[i] <= 'Z') || (text[i] >= 'a' && text[i] <= 'z'))) {
        ++i;
      }
      i -= i < text.size() && text[i] == '\n' ? 1U : 0U; // an escape left open ends at its line's end
    } else if (c != '\r') {
      current.push_back(c);
    }
  }
  if (!current.empty()) {
    lines.push_back({number, std::move(current)});
  }
  return lines;
}

constexpr bool is_space(char c) noexcept { return c == ' ' || c == '\t' || c == '\v' || c == '\f'; }

// Whitespace-separated tokens (tabs and runs of spaces alike).
inline std::vector<std::string_view> split_tokens(std::string_view line) {
  std::vector<std::string_view> tokens;
  std::size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && is_space(line[i])) {
      ++i;
    }
    const std::size_t start = i;
    while (i < line.size() && !is_space(line[i])) {
      ++i;
    }
    if (i > start) {
      tokens.push_back(line.substr(start, i - start));
    }
  }
  return tokens;
}

inline bool is_blank(std::string_view line) {
  for (const char c : line) {
    if (!is_space(c)) {
      return false;
    }
  }
  return true;
}

// A non-negative decimal integer of at most 9 digits (enough for ordinals, counts and NUMA ids),
// or -1.
inline int parse_small_uint(std::string_view s) {
  if (s.empty() || s.size() > 9) {
    return -1;
  }
  int value = 0;
  for (const char c : s) {
    if (c < '0' || c > '9') {
      return -1;
    }
    value = value * 10 + (c - '0');
  }
  return value;
}

// "PREFIX<n>" with a decimal n; -1 otherwise.
inline int numbered(std::string_view token, std::string_view prefix) {
  if (token.size() <= prefix.size() || token.substr(0, prefix.size()) != prefix) {
    return -1;
  }
  return parse_small_uint(token.substr(prefix.size()));
}

inline std::string quoted(std::string_view s) {
  constexpr std::size_t shown = 40;
  std::string q = "'";
  for (std::size_t i = 0; i < s.size() && i < shown; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    q += (c >= 0x20 && c < 0x7f) ? static_cast<char>(c) : '?';
  }
  if (s.size() > shown) {
    q += "...";
  }
  return q + "'";
}

} // namespace carve::detail
