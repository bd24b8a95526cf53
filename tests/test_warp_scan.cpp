// The cooperative searches (RunSegment reductions by a warp or a block) against brute force.
// HostWarp and HostBlock run the same reduction trees the device runs.
#include "reference.hpp"

#include <carve/carve.hpp>

#include <doctest/doctest.h>

#include <random>
#include <vector>

using carve::RunSegment;
using namespace carve::test;

namespace {

std::vector<std::uint64_t> to_words(const Slots& s) {
  std::vector<std::uint64_t> words((s.size() + 63) / 64, 0);
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i]) {
      words[i / 64] |= std::uint64_t{1} << (i % 64);
    }
  }
  return words;
}

using Span = cuda::std::span<const std::uint64_t>;

void check_segment(const RunSegment& seg, const Slots& s, std::uint32_t m) {
  const auto starts = ref_run_starts(s, m);
  CAPTURE(m);
  CHECK(carve::bounds_of(seg).found == !starts.empty());
  if (!starts.empty()) {
    CHECK(seg.lowest == starts.front());
    CHECK(seg.highest == starts.back());
  }
}

// Reduces words [lo, hi) in a random binary tree: associativity means any shape gives the fold.
RunSegment random_tree(const std::vector<std::uint64_t>& w, std::size_t lo, std::size_t hi, std::uint32_t m,
                       std::mt19937_64& rng) {
  if (hi - lo == 1) {
    return carve::word_segment(w[lo], m);
  }
  const std::size_t mid = lo + 1 + rng() % (hi - lo - 1);
  return carve::combine(random_tree(w, lo, mid, m, rng), random_tree(w, mid, hi, m, rng), m);
}

std::vector<std::uint32_t> sizes_for(const Slots& s, std::mt19937_64& rng) {
  const auto n = static_cast<std::uint32_t>(s.size());
  std::uint32_t largest = 0;
  for (const auto r : ref_free_runs(s)) {
    largest = std::max(largest, r.count);
  }
  std::vector<std::uint32_t> ms = {0,   1,   2,    5,    33,   63, 64,    65,      127,
                                   128, 129, 2047, 2048, 2049, n,  n + 1, largest, largest + 1};
  if (largest > 1) {
    ms.push_back(largest - 1);
  }
  for (int k = 0; k < 4; ++k) {
    ms.push_back(1 + static_cast<std::uint32_t>(rng() % n));
  }
  return ms;
}

} // namespace

TEST_CASE("a word's segment: every word of up to 12 slots, every m") {
  for (std::uint32_t n = 1; n <= 12; ++n) {
    for (std::uint64_t mask = 0; mask < (1ull << n); ++mask) {
      Slots s(n);
      for (std::uint32_t i = 0; i < n; ++i) {
        s[i] = (mask >> i & 1) != 0;
      }
      for (std::uint32_t m = 0; m <= n + 1; ++m) {
        check_segment(carve::word_segment(mask, m), s, m);
      }
    }
  }
}

TEST_CASE("combining is associative: a fold and random trees agree with brute force") {
  std::mt19937_64 rng(17);
  for (const std::uint32_t n : {64u, 65u, 128u, 200u, 640u, 3000u}) {
    for (int t = 0; t < 60; ++t) {
      const Slots s = random_runs(n, 1u << (t % 10), rng);
      const auto w = to_words(s);
      for (const std::uint32_t m : sizes_for(s, rng)) {
        const RunSegment fold = carve::fold_segments(w.data(), static_cast<std::uint32_t>(w.size()), m);
        check_segment(fold, s, m);
        REQUIRE(random_tree(w, 0, w.size(), m, rng) == fold);
      }
    }
  }
}

TEST_CASE("a warp's search matches brute force, across lanes and 2048-slot chunks") {
  std::mt19937_64 rng(23);
  for (const std::uint32_t n : {1u, 64u, 100u, 2048u, 2049u, 3000u, 6000u, 9000u}) {
    CAPTURE(n);
    for (int t = 0; t < 40; ++t) {
      const Slots s = random_runs(n, 1u << (t % 12), rng);
      const auto w = to_words(s);
      const Span words(w.data(), w.size());
      for (const std::uint32_t m : sizes_for(s, rng)) {
        check_segment(carve::warp_summarize(carve::HostWarp{}, words, static_cast<std::uint32_t>(w.size()), m), s, m);
        CHECK(to_std(carve::warp_find(carve::BoundaryNearestFit{}, carve::HostWarp{}, words, n, m)) ==
              ref_find<carve::BoundaryNearestFit>(s, m));
        CHECK(to_std(carve::warp_find(carve::FirstFit{}, carve::HostWarp{}, words, n, m)) ==
              ref_find<carve::FirstFit>(s, m));
        CHECK(to_std(carve::warp_find(carve::LastFit{}, carve::HostWarp{}, words, n, m)) ==
              ref_find<carve::LastFit>(s, m));
      }
    }
  }
}

TEST_CASE("a block's search matches brute force for 1 to 32 warps") {
  std::mt19937_64 rng(29);
  std::vector<RunSegment> scratch(33);
  for (const std::uint32_t warps : {1u, 2u, 3u, 8u, 32u}) {
    for (const std::uint32_t n : {64u, 4096u, 20000u, 65536u, 70000u}) {
      CAPTURE(warps);
      CAPTURE(n);
      for (int t = 0; t < 6; ++t) {
        const Slots s = random_runs(n, 1u << (2 * t + 1), rng);
        const auto w = to_words(s);
        const Span words(w.data(), w.size());
        const carve::HostBlock block{warps};
        for (const std::uint32_t m : sizes_for(s, rng)) {
          check_segment(carve::block_summarize(block, scratch.data(), words, static_cast<std::uint32_t>(w.size()), m),
                        s, m);
          CHECK(to_std(carve::block_find(carve::BoundaryNearestFit{}, block, scratch.data(), words, n, m)) ==
                ref_find<carve::BoundaryNearestFit>(s, m));
        }
      }
    }
  }
}
