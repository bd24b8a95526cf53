// Brute-force models of carve's slot algorithms, written for obviousness rather than speed.
// Every test compares carve against these.
#pragma once

#include <carve/slot.hpp>

#include <cstdint>
#include <optional>
#include <random>
#include <vector>

namespace carve::test {

// free[s] is true when slot s is free.
using Slots = std::vector<bool>;

template <std::uint32_t N>
Slots to_slots(const SlotBitmap<N>& b) {
  Slots s(N);
  for (std::uint32_t i = 0; i < N; ++i) {
    s[i] = b.is_free(i);
  }
  return s;
}

template <std::uint32_t N>
SlotBitmap<N> to_bitmap(const Slots& s) {
  SlotBitmap<N> b;
  for (std::uint32_t i = 0; i < N; ++i) {
    if (!s[i]) {
      b.occupy({i, 1});
    }
  }
  return b;
}

// Every start i with slots [i, i + m) free, by checking each start slot by slot: the per-start
// AND of m slot bits done literally. O(N * m), so only for small bitmaps.
inline std::vector<std::uint32_t> literal_run_starts(const Slots& s, std::uint32_t m) {
  std::vector<std::uint32_t> starts;
  const auto n = static_cast<std::uint32_t>(s.size());
  for (std::uint32_t i = 0; m != 0 && i + m <= n; ++i) {
    bool all = true;
    for (std::uint32_t k = i; k < i + m && all; ++k) {
      all = s[k];
    }
    if (all) {
      starts.push_back(i);
    }
  }
  return starts;
}

// The same set in O(N): a start is a slot whose free run (counted from the top down) holds m.
inline std::vector<std::uint32_t> ref_run_starts(const Slots& s, std::uint32_t m) {
  const auto n = static_cast<std::uint32_t>(s.size());
  std::vector<std::uint32_t> free_from(n + 1, 0);
  for (std::uint32_t i = n; i-- > 0;) {
    free_from[i] = s[i] ? free_from[i + 1] + 1 : 0;
  }
  std::vector<std::uint32_t> starts;
  for (std::uint32_t i = 0; m != 0 && i + m <= n; ++i) {
    if (free_from[i] >= m) {
      starts.push_back(i);
    }
  }
  return starts;
}

// The maximal free runs, lowest first.
inline std::vector<SlotRange> ref_free_runs(const Slots& s) {
  std::vector<SlotRange> runs;
  const auto n = static_cast<std::uint32_t>(s.size());
  for (std::uint32_t i = 0; i < n;) {
    if (!s[i]) {
      ++i;
      continue;
    }
    std::uint32_t j = i;
    while (j < n && s[j]) {
      ++j;
    }
    runs.push_back({i, j - i});
    i = j;
  }
  return runs;
}

inline std::optional<std::uint32_t> ref_first(const std::vector<std::uint32_t>& starts) {
  if (starts.empty()) {
    return std::nullopt;
  }
  return starts.front();
}

inline std::optional<std::uint32_t> ref_last(const std::vector<std::uint32_t>& starts) {
  if (starts.empty()) {
    return std::nullopt;
  }
  return starts.back();
}

inline std::optional<std::uint32_t> ref_best(const Slots& s, std::uint32_t m) {
  std::optional<SlotRange> best;
  for (const SlotRange run : ref_free_runs(s)) {
    if (m != 0 && run.count >= m && (!best || run.count < best->count)) {
      best = run;
    }
  }
  if (!best) {
    return std::nullopt;
  }
  return best->first;
}

// The boundary-nearest rule, literally: i the lowest start, j the highest; i if i + j <= N - m, so whichever
// of the two lies nearer its own end of the slot space wins, ties going low.
inline std::optional<std::uint32_t> ref_boundary_nearest(const std::vector<std::uint32_t>& starts, std::uint32_t n,
                                                         std::uint32_t m) {
  if (starts.empty()) {
    return std::nullopt;
  }
  const std::uint32_t i = starts.front();
  const std::uint32_t j = starts.back();
  return i + j <= n - m ? i : j;
}

// What each carve policy must answer, by policy type.
template <class Fit>
std::optional<std::uint32_t> ref_find(const Slots& s, std::uint32_t m) {
  const auto starts = ref_run_starts(s, m);
  if constexpr (std::is_same_v<Fit, FirstFit>) {
    return ref_first(starts);
  } else if constexpr (std::is_same_v<Fit, LastFit>) {
    return ref_last(starts);
  } else if constexpr (std::is_same_v<Fit, BestFit>) {
    return ref_best(s, m);
  } else {
    static_assert(std::is_same_v<Fit, BoundaryNearestFit>);
    return ref_boundary_nearest(starts, static_cast<std::uint32_t>(s.size()), m);
  }
}

template <class T>
std::optional<T> to_std(cuda::std::optional<T> v) {
  if (!v) {
    return std::nullopt;
  }
  return *v;
}

// A bitmap of alternating free and taken runs whose lengths are drawn around `scale`, so that
// tests see both short fragments and runs that span several words.
inline Slots random_runs(std::uint32_t n, std::uint32_t scale, std::mt19937_64& rng) {
  Slots s(n);
  std::geometric_distribution<std::uint32_t> len(1.0 / (scale + 1.0));
  bool free = std::bernoulli_distribution(0.5)(rng);
  for (std::uint32_t i = 0; i < n;) {
    const std::uint32_t run = 1 + len(rng);
    for (std::uint32_t k = i; k < n && k < i + run; ++k) {
      s[k] = free;
    }
    i += run;
    free = !free;
  }
  return s;
}

} // namespace carve::test
