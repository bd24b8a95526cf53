// The ways a slot search is written when a library like carve is not at hand. They are fit
// policies too (they satisfy carve::FitPolicy), so the benchmark drives them exactly like
// carve's own and checks that all give the same answers before timing anything.
#pragma once

#include <carve/slot.hpp>

#include <cstdint>
#include <optional>

namespace carve::bench {

// Run walking, the shape of Linux's bitmap_find_next_zero_area(): jump to the next free slot,
// look for a taken slot in the next m, and if one is there restart after it. Word-at-a-time
// with count-trailing/leading-zeros, one step per free run visited.
struct RunWalk {
  template <std::uint32_t N>
  static std::uint32_t bit(const SlotBitmap<N>& b, std::uint32_t s) {
    return static_cast<std::uint32_t>(b.words()[s / 64] >> (s % 64)) & 1u;
  }
  // First slot >= from whose bit equals `want` (1 free, 0 taken); N if none.
  template <std::uint32_t N>
  static std::uint32_t next(const SlotBitmap<N>& b, std::uint32_t from, bool want) {
    while (from < N) {
      std::uint64_t w = b.words()[from / 64];
      w = (want ? w : ~w) >> (from % 64);
      if (w != 0) {
        const std::uint32_t s = from + static_cast<std::uint32_t>(__builtin_ctzll(w));
        return s < N ? s : N;
      }
      from = (from / 64 + 1) * 64;
    }
    return N;
  }
  // Last slot <= from whose bit equals `want`; -1 (as int64) if none.
  template <std::uint32_t N>
  static std::int64_t prev(const SlotBitmap<N>& b, std::int64_t from, bool want) {
    while (from >= 0) {
      std::uint64_t w = b.words()[static_cast<std::size_t>(from / 64)];
      w = (want ? w : ~w) << (63 - from % 64);
      if (w != 0) {
        return from - __builtin_clzll(w);
      }
      from = (from / 64) * 64 - 1;
    }
    return -1;
  }

  template <std::uint32_t N>
  static cuda::std::optional<std::uint32_t> lowest(const SlotBitmap<N>& b, std::uint32_t m) {
    std::uint32_t from = 0;
    for (;;) {
      const std::uint32_t start = next(b, from, true);
      if (std::uint64_t{start} + m > N) {
        return cuda::std::nullopt;
      }
      const std::uint32_t taken = next(b, start, false);
      if (taken >= start + m) {
        return start;
      }
      from = taken + 1;
    }
  }

  template <std::uint32_t N>
  static cuda::std::optional<std::uint32_t> highest(const SlotBitmap<N>& b, std::uint32_t m) {
    std::int64_t from = N - 1;
    for (;;) {
      const std::int64_t last = prev(b, from, true);
      if (last + 1 < m) {
        return cuda::std::nullopt;
      }
      const std::int64_t taken = prev(b, last, false);
      if (taken <= last - m) {
        return static_cast<std::uint32_t>(last + 1 - m);
      }
      from = taken - 1;
    }
  }
};

struct RunWalkFirstFit {
  template <std::uint32_t N>
  cuda::std::optional<std::uint32_t> find(const SlotBitmap<N>& b, std::uint32_t m) const {
    if (m == 0 || m > N) {
      return cuda::std::nullopt;
    }
    return RunWalk::lowest(b, m);
  }
};

struct RunWalkBoundaryNearest {
  template <std::uint32_t N>
  cuda::std::optional<std::uint32_t> find(const SlotBitmap<N>& b, std::uint32_t m) const {
    if (m == 0 || m > N) {
      return cuda::std::nullopt;
    }
    const auto i = RunWalk::lowest(b, m);
    if (!i) {
      return cuda::std::nullopt;
    }
    const std::uint32_t j = *RunWalk::highest(b, m);
    return *i + j <= N - m ? *i : j;
  }
};

// The per-start search done literally in software: for every start, AND the m slot bits to get
// that start's avail bit, then take the lowest and highest avail bits. O(N * m).
struct LiteralBoundaryNearest {
  template <std::uint32_t N>
  cuda::std::optional<std::uint32_t> find(const SlotBitmap<N>& b, std::uint32_t m) const {
    if (m == 0 || m > N) {
      return cuda::std::nullopt;
    }
    std::int64_t lowest = -1;
    std::int64_t highest = -1;
    for (std::uint32_t i = 0; i + m <= N; ++i) {
      std::uint32_t avail = 1;
      for (std::uint32_t k = 0; k < m; ++k) {
        avail &= RunWalk::bit(b, i + k);
      }
      if (avail != 0) {
        lowest = lowest < 0 ? i : lowest;
        highest = i;
      }
    }
    if (lowest < 0) {
      return cuda::std::nullopt;
    }
    const auto i = static_cast<std::uint32_t>(lowest);
    const auto j = static_cast<std::uint32_t>(highest);
    return i + j <= N - m ? i : j;
  }
};

static_assert(FitPolicy<RunWalkFirstFit> && FitPolicy<RunWalkBoundaryNearest> && FitPolicy<LiteralBoundaryNearest>);

} // namespace carve::bench
