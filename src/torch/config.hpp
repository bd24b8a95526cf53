// src/torch/config.hpp — libcarve_torch's settings from the CARVE_TORCH_* environment variables
// (carve_torch.h lists them), parsed once; a bad value becomes a message, not a guess.
#pragma once

#include "pool_stacks.hpp"

#include <carve/core/checked_math.hpp>

#include <cstddef>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace carve::torch {

enum class BackendKind { cuda, host };

struct Config {
  BackendKind backend = BackendKind::cuda;
  StackOptions stack;
  std::string error; // empty when every variable is good
};

// `text` as bytes: digits, then an optional binary suffix (K, M, G, T, with or without "iB"/"B").
inline std::optional<std::size_t> parse_bytes(std::string_view text) {
  std::size_t i = 0;
  std::size_t value = 0;
  for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) {
    const auto times_ten = checked_mul<std::size_t>(value, 10);
    if (!times_ten) {
      return std::nullopt;
    }
    const auto next = checked_add<std::size_t>(*times_ten, static_cast<std::size_t>(text[i] - '0'));
    if (!next) {
      return std::nullopt;
    }
    value = *next;
  }
  if (i == 0) {
    return std::nullopt;
  }
  const std::string_view suffix = text.substr(i);
  int shift = -1;
  for (const auto& [unit, bits] : {std::pair{"", 0}, {"B", 0}, {"K", 10}, {"M", 20}, {"G", 30}, {"T", 40}}) {
    const std::string u(unit);
    if (suffix == u || (!u.empty() && u != "B" && (suffix == u + "B" || suffix == u + "iB"))) {
      shift = bits;
    }
  }
  if (shift < 0) {
    return std::nullopt;
  }
  const auto scaled = checked_mul<std::size_t>(value, std::size_t{1} << shift);
  if (!scaled) {
    return std::nullopt;
  }
  return *scaled;
}

// The settings the environment names now.
inline Config read_config() {
  Config c;
  const auto var = [](const char* name) -> std::optional<std::string> {
    const char* v = std::getenv(name);
    return v == nullptr ? std::nullopt : std::optional<std::string>(v);
  };
  const auto bad = [&](const std::string& message) {
    if (c.error.empty()) {
      c.error = "libcarve_torch: " + message;
    }
  };
  if (const auto pool = var("CARVE_TORCH_POOL")) {
    if (*pool == "expandable") {
      c.stack.pool = PoolKind::expandable;
    } else if (*pool == "stream-ordered") {
      c.stack.pool = PoolKind::stream_ordered;
    } else if (*pool == "caching") {
      c.stack.pool = PoolKind::caching;
    } else {
      bad("CARVE_TORCH_POOL=" + *pool + " is no pool: expandable, stream-ordered or caching");
    }
  }
  if (const auto backend = var("CARVE_TORCH_BACKEND")) {
    if (*backend == "host") {
      c.backend = BackendKind::host;
    } else if (*backend == "cuda") {
      c.backend = BackendKind::cuda;
    } else {
      bad("CARVE_TORCH_BACKEND=" + *backend + " is no backend: cuda or host");
    }
  }
#ifndef CARVE_TORCH_HAS_CUDA
  if (c.backend == BackendKind::cuda) {
    bad("this libcarve_torch was built without the CUDA toolkit: only CARVE_TORCH_BACKEND=host works");
  }
#endif
  if (const auto home = var("CARVE_TORCH_HOLES_HOME")) {
    if (*home == "0" || *home == "1") {
      c.stack.holes_home = *home == "1";
    } else {
      bad("CARVE_TORCH_HOLES_HOME=" + *home + " is not 0 or 1");
    }
  }
  for (const auto& [name, field] :
       {std::pair{"CARVE_TORCH_MAX_RESERVED", &c.stack.max_reserved},
        std::pair{"CARVE_TORCH_IDLE_THRESHOLD", &c.stack.idle_threshold},
        std::pair{"CARVE_TORCH_MAX_CHUNK", &c.stack.max_chunk}, std::pair{"CARVE_TORCH_LEND_MIN", &c.stack.lend_min}}) {
    if (const auto text = var(name)) {
      if (const auto bytes = parse_bytes(*text)) {
        *field = *bytes;
      } else {
        bad(std::string(name) + "=" + *text + " is not a size in bytes (digits, then optionally K, M, G or T)");
      }
    }
  }
  return c;
}

} // namespace carve::torch
