// The cooperative searches (RunSegment reductions by a warp or a block) against brute force.
// HostWarp and HostBlock run the same reduction trees the device runs, with the device's shuffle
// semantics (what moves between lanes and what a lane past the warp keeps).
#include "reference.hpp"
#include "support/sanitizers.hpp"

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

// Every policy the cooperative searches run (BoundsFitPolicy), by warp and by block, for one
// bitmap and one m, against brute force. Returns the number of disagreements.
template <class Fit>
int disagreements(const Slots& s, const Span words, std::uint32_t m, std::vector<RunSegment>& scratch,
                  std::initializer_list<std::uint32_t> block_warps) {
  const auto n = static_cast<std::uint32_t>(s.size());
  const auto want = ref_find<Fit>(s, m);
  int bad = 0;
  const auto got_warp = to_std(carve::warp_find(Fit{}, carve::HostWarp{}, words, n, m));
  if (got_warp != want) {
    ++bad;
  }
  for (const std::uint32_t warps : block_warps) {
    const auto got_block = to_std(carve::block_find(Fit{}, carve::HostBlock{warps}, scratch.data(), words, n, m));
    if (got_block != want) {
      ++bad;
    }
  }
  return bad;
}

Slots slots_of(std::uint64_t mask, std::uint32_t n) {
  Slots s(n);
  for (std::uint32_t i = 0; i < n; ++i) {
    s[i] = (mask >> i & 1) != 0;
  }
  return s;
}

} // namespace

TEST_CASE("the host warp shuffles like __shfl_down_sync and __shfl_sync") {
  carve::HostWarp::lanes<std::uint32_t> v{};
  for (std::uint32_t lane = 0; lane < carve::warp_lanes; ++lane) {
    v[lane] = 100 + lane;
  }
  for (const std::uint32_t delta : {1u, 2u, 4u, 8u, 16u, 31u}) {
    const auto got = carve::HostWarp::shfl_down(v, delta);
    for (std::uint32_t lane = 0; lane < carve::warp_lanes; ++lane) {
      CHECK(got[lane] == (lane + delta < carve::warp_lanes ? 100 + lane + delta : 100 + lane));
    }
  }
  CHECK(carve::HostWarp::shfl(v, 0) == 100);
  CHECK(carve::HostWarp::shfl(v, 7) == 107);
}

TEST_CASE("a segment moves between lanes whole, its length included") {
  // Segments of different lengths, as a block's reduction sees them (empty ones past its warps).
  carve::HostWarp::lanes<RunSegment> seg{};
  for (std::uint32_t lane = 0; lane < carve::warp_lanes; ++lane) {
    seg[lane] = lane < 3 ? RunSegment{2048, lane, 2 * lane, 10 + lane, 20 + lane} : carve::empty_segment();
  }
  for (const std::uint32_t delta : {1u, 2u, 4u, 8u, 16u}) {
    const auto moved = carve::shuffle_down(carve::HostWarp{}, seg, delta);
    for (std::uint32_t lane = 0; lane < carve::warp_lanes; ++lane) {
      CHECK(moved[lane] == seg[lane + delta < carve::warp_lanes ? lane + delta : lane]);
    }
  }
  CHECK(carve::from_first_lane(carve::HostWarp{}, seg) == seg[0]);
  // Lane 0 of the reduction covers three warps' worth of slots, not 32 times one.
  const RunSegment all = carve::warp_reduce(carve::HostWarp{}, seg, 5);
  CHECK(all.length == 3 * 2048);
}

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

TEST_CASE("warp and block searches: every bitmap of up to 12 slots, every m, every bounds policy") {
  std::vector<RunSegment> scratch(33);
  const auto blocks = {1u, 3u}; // lanes 1..31, or 3..31, of the block's reduction are empty
  int bad = 0;
  for (std::uint32_t n = 1; n <= exhaustive_slots; ++n) {
    for (std::uint64_t mask = 0; mask < (1ull << n); ++mask) {
      const Slots s = slots_of(mask, n);
      const std::uint64_t word = mask;
      const Span words(&word, 1);
      // Every m from 1 to n, and the invalid ones: 0, just past n, past a word, the largest.
      std::vector<std::uint32_t> ms = {0, n + 1, n + 2, 64, 65, 0xffff'ffffu};
      for (std::uint32_t m = 1; m <= n; ++m) {
        ms.push_back(m);
      }
      for (const std::uint32_t m : ms) {
        const int here = disagreements<carve::FirstFit>(s, words, m, scratch, blocks) +
                         disagreements<carve::LastFit>(s, words, m, scratch, blocks) +
                         disagreements<carve::BoundaryNearestFit>(s, words, m, scratch, blocks);
        if (here != 0 && bad == 0) {
          FAIL_CHECK("first disagreement: n = " << n << ", mask = " << mask << ", m = " << m);
        }
        bad += here;
      }
    }
  }
  CHECK(bad == 0);
}

namespace {

// Bitmaps for blocks whose warps do not fill the first warp's lanes, over several rounds
// (a round is warps x 2048 slots): runs that end a round, start the next, straddle the border
// between two rounds, or are the only run in the last, partial round.
std::vector<Slots> round_border_cases(std::uint32_t n, std::uint32_t warps, std::mt19937_64& rng) {
  const std::uint32_t round = warps * 2048;
  std::vector<Slots> cases;
  const auto with_runs = [&](std::initializer_list<std::pair<std::uint32_t, std::uint32_t>> runs) {
    Slots s(n, false);
    for (const auto& [first, count] : runs) {
      for (std::uint32_t i = first; i < first + count && i < n; ++i) {
        s[i] = true;
      }
    }
    cases.push_back(s);
  };
  // The first border between rounds and the last one.
  const std::uint32_t last = (n - 1) / round * round;
  for (const std::uint32_t r : {round, last}) {
    with_runs({{r - 40, 80}});                     // straddles the border
    with_runs({{r, 100}});                         // starts a round
    with_runs({{r - 100, 100}});                   // ends a round
    with_runs({{3, 5}, {r + 7, 300}, {n - 9, 9}}); // small first, big later, one at the end
    with_runs({{r - 2048, 4096}});                 // a long run over the border
  }
  with_runs({{n - 70, 70}});     // only the last, partial chunk
  with_runs({{last, n - last}}); // the whole last round
  with_runs({});                 // all taken
  with_runs({{0, n}});           // all free
  for (const std::uint32_t scale : {8u, 128u, 2048u}) {
    cases.push_back(random_runs(n, scale, rng));
  }
  return cases;
}

} // namespace

TEST_CASE("a block of fewer than 32 warps over several rounds places every start right") {
  // N > warps x 2048: the first warp's lanes past the block's warps hold empty segments, and a
  // reduction that lost their lengths would shift every later round (as a device warp would if
  // a shuffle left `length` behind).
  std::mt19937_64 rng(31);
  std::vector<RunSegment> scratch(33);
  for (const std::uint32_t warps : {1u, 3u, 8u}) {
    for (const std::uint32_t n : {16448u, 20000u, 70000u}) {
      REQUIRE(n > warps * 2048);
      CAPTURE(warps);
      CAPTURE(n);
      const carve::HostBlock block{warps};
      for (const Slots& s : round_border_cases(n, warps, rng)) {
        const auto w = to_words(s);
        const Span words(w.data(), w.size());
        std::uint32_t largest = 0;
        for (const auto r : ref_free_runs(s)) {
          largest = std::max(largest, r.count);
        }
        const std::vector<std::uint32_t> ms = {1,   2,    9,    40,      64,          65, 80,   100,
                                               300, 2049, 4096, largest, largest + 1, n,  n + 1};
        for (const std::uint32_t m : ms) {
          CAPTURE(m);
          const RunSegment seg =
              carve::block_summarize(block, scratch.data(), words, static_cast<std::uint32_t>(w.size()), m);
          check_segment(seg, s, m);
          // Whole rounds of warps x 32 words, the words past the bitmap counted as taken.
          const std::size_t round_words = std::size_t{warps} * 32;
          CHECK(seg.length == (w.size() + round_words - 1) / round_words * round_words * 64);
          CHECK(to_std(carve::block_find(carve::FirstFit{}, block, scratch.data(), words, n, m)) ==
                ref_find<carve::FirstFit>(s, m));
          CHECK(to_std(carve::block_find(carve::LastFit{}, block, scratch.data(), words, n, m)) ==
                ref_find<carve::LastFit>(s, m));
          CHECK(to_std(carve::block_find(carve::BoundaryNearestFit{}, block, scratch.data(), words, n, m)) ==
                ref_find<carve::BoundaryNearestFit>(s, m));
        }
      }
    }
  }
}

TEST_CASE("a simulated block has 1 to 32 warps, as a device block does") {
  CHECK_THROWS_AS(carve::HostBlock{0}, carve::Exception);
  CHECK_THROWS_AS(carve::HostBlock{33}, carve::Exception);
  CHECK(carve::HostBlock{32}.warps() == 32);
}
