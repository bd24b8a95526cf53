// Batch placement on K compute units (place_batch, evaluate_cu), the CU-choice rules and
// share_of, against brute-force loops written from the rules' descriptions. The device kernels
// (carve/slot/batch/batch_kernels.cuh) run the same steps; the order-independence the kernels rely on
// is checked here by reducing candidates the way they do.
#include "reference.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <random>
#include <vector>

// In a namespace of its own: the area's test files compile as one translation unit.
namespace test_batch_placement {

using carve::BatchPlacement;
using carve::CuCandidate;
using carve::CuPlacement;
using carve::Errc;
using carve::SlotBitmap;
using carve::SlotRange;
using namespace carve::test;

namespace {

// ---------------------------------------------------------------------------------------------
// Brute force.

struct RefCandidate {
  std::uint32_t cu;
  std::optional<std::uint32_t> start; // where the policy would put the request
  std::uint32_t free;                 // free slots before it
  std::uint32_t distance;             // from the run to the nearer end (when it fits)
};

std::uint32_t count_free(const Slots& s) { return static_cast<std::uint32_t>(std::count(s.begin(), s.end(), true)); }

template <class Fit>
RefCandidate ref_candidate(const Slots& s, std::uint32_t cu, std::uint32_t m) {
  const auto n = static_cast<std::uint32_t>(s.size());
  const auto start = ref_find<Fit>(s, m);
  const std::uint32_t distance = start ? std::min(*start, n - *start - m) : 0;
  return {cu, start, count_free(s), distance};
}

// The unit each rule picks among `all`, written as its description says, by scanning every
// fitting unit and keeping the best by an explicit key; nullopt when none fits.
template <class Rule>
std::optional<std::uint32_t> ref_choose(const std::vector<RefCandidate>& all) {
  std::optional<std::uint32_t> best;
  for (std::uint32_t i = 0; i < all.size(); ++i) {
    const RefCandidate& c = all[i];
    if (!c.start) {
      continue;
    }
    if (!best) {
      best = i;
      continue;
    }
    const RefCandidate& b = all[*best];
    bool better = false;
    if constexpr (std::is_same_v<Rule, carve::FirstFittingCu>) {
      better = c.cu < b.cu; // the lowest-numbered unit that fits
    } else if constexpr (std::is_same_v<Rule, carve::LeastLoadedCu>) {
      better = c.free > b.free || (c.free == b.free && c.cu < b.cu); // most free, then lowest index
    } else {
      static_assert(std::is_same_v<Rule, carve::NearestBoundaryCu>);
      // nearest an end, then the emptier unit, then the lowest index
      better = c.distance < b.distance || (c.distance == b.distance && c.free > b.free) ||
               (c.distance == b.distance && c.free == b.free && c.cu < b.cu);
    }
    if (better) {
      best = i;
    }
  }
  return best;
}

struct RefOutcome {
  std::optional<Errc> error;
  std::uint32_t cu = 0;
  SlotRange range{0, 0};
};

// Every request in order, each seeing the bitmaps as the ones before left them.
template <class Fit, class Rule>
std::vector<RefOutcome> ref_place_batch(std::vector<Slots>& units, const std::vector<std::uint32_t>& sizes,
                                        std::uint32_t n) {
  std::vector<RefOutcome> out;
  for (const std::uint32_t m : sizes) {
    if (m == 0 || m > n) { // more than a unit holds: no_space, a fallback's to serve
      out.push_back({m == 0 ? Errc::invalid_size : Errc::no_space});
      continue;
    }
    std::vector<RefCandidate> all;
    for (std::uint32_t u = 0; u < units.size(); ++u) {
      all.push_back(ref_candidate<Fit>(units[u], u, m));
    }
    const auto chosen = ref_choose<Rule>(all);
    if (!chosen) {
      out.push_back({Errc::no_space});
      continue;
    }
    const std::uint32_t start = *all[*chosen].start;
    for (std::uint32_t s = start; s < start + m; ++s) {
      units[*chosen][s] = false;
    }
    out.push_back({std::nullopt, *chosen, {start, m}});
  }
  return out;
}

bool same(const BatchPlacement& got, const RefOutcome& want) {
  if (want.error) {
    return !got && got.error() == *want.error;
  }
  return got && got->cu == want.cu && got->range == want.range;
}

// ---------------------------------------------------------------------------------------------
// The kernels' reduction (batch_kernels.cuh), replayed on the host: thread t folds units t,
// t + threads, ... into one candidate (a thread without a unit offers a non-fit named after
// itself), each warp reduces by xor butterfly, then the warps' winners are folded in order.

template <class Rule>
CuCandidate kernel_choice(const Rule& rule, const std::vector<CuCandidate>& units, std::uint32_t threads) {
  std::vector<CuCandidate> mine(threads);
  for (std::uint32_t t = 0; t < threads; ++t) {
    mine[t] = {t, false, 0, 0, 0};
    for (std::uint32_t cu = t; cu < units.size(); cu += threads) {
      mine[t] = cu == t || rule.better(units[cu], mine[t]) ? units[cu] : mine[t];
    }
  }
  for (std::uint32_t d = 16; d > 0; d /= 2) {
    std::vector<CuCandidate> next = mine;
    for (std::uint32_t t = 0; t < threads; ++t) {
      const CuCandidate& other = mine[(t / 32) * 32 + ((t % 32) ^ d)];
      next[t] = rule.better(other, mine[t]) ? other : mine[t];
    }
    mine = next;
  }
  CuCandidate best = mine[0];
  for (std::uint32_t w = 1; w < threads / 32; ++w) {
    best = rule.better(mine[w * 32], best) ? mine[w * 32] : best;
  }
  return best;
}

CuCandidate random_candidate(std::uint32_t cu, std::mt19937_64& rng) {
  // Few distinct values, so that ties on every key are common.
  return {cu, rng() % 3 != 0, static_cast<std::uint32_t>(rng() % 4), static_cast<std::uint32_t>(rng() % 4),
          static_cast<std::uint32_t>(rng() % 3)};
}

std::vector<RefCandidate> as_ref(const std::vector<CuCandidate>& all) {
  std::vector<RefCandidate> out;
  for (const CuCandidate& c : all) {
    out.push_back({c.cu, c.fits ? std::optional<std::uint32_t>(c.start) : std::nullopt, c.free, c.distance});
  }
  return out;
}

template <class Rule>
void check_rule(std::mt19937_64& rng) {
  CAPTURE(Rule::name);
  const Rule rule;
  // A strict weak ordering in which a fitting unit beats one that does not.
  for (int t = 0; t < 3000; ++t) {
    const CuCandidate a = random_candidate(static_cast<std::uint32_t>(rng() % 4), rng);
    const CuCandidate b = random_candidate(static_cast<std::uint32_t>(rng() % 4), rng);
    const CuCandidate c = random_candidate(static_cast<std::uint32_t>(rng() % 4), rng);
    CHECK(!rule.better(a, a));
    CHECK(!(rule.better(a, b) && rule.better(b, a)));
    if (rule.better(a, b) && rule.better(b, c)) {
      CHECK(rule.better(a, c));
    }
    if (a.fits != b.fits) {
      CHECK(rule.better(a, b) == a.fits);
    }
  }
  // The winner is the brute-force choice, whatever order the candidates are compared in.
  for (const std::uint32_t units : {1u, 2u, 3u, 31u, 32u, 33u, 100u, 132u}) {
    for (int t = 0; t < 60; ++t) {
      std::vector<CuCandidate> all;
      for (std::uint32_t u = 0; u < units; ++u) {
        all.push_back(random_candidate(u, rng));
      }
      const auto want = ref_choose<Rule>(as_ref(all));
      // In unit order, as place_batch does.
      CuCandidate best = all[0];
      for (std::uint32_t u = 1; u < units; ++u) {
        best = rule.better(all[u], best) ? all[u] : best;
      }
      CHECK(best.fits == want.has_value());
      if (want) {
        CHECK(best.cu == *want);
      }
      // In a shuffled order.
      auto shuffled = all;
      std::shuffle(shuffled.begin(), shuffled.end(), rng);
      CuCandidate any = shuffled[0];
      for (std::uint32_t u = 1; u < units; ++u) {
        any = rule.better(shuffled[u], any) ? shuffled[u] : any;
      }
      CHECK(any.fits == want.has_value());
      if (want) {
        CHECK(any.cu == *want);
      }
      // As the kernel reduces them: one thread per unit (whole warps), or fewer threads each
      // taking several units.
      const std::uint32_t whole = std::min(1024u, (units + 31) / 32 * 32);
      for (const std::uint32_t threads : {whole, 32u, 64u}) {
        const CuCandidate k = kernel_choice(rule, all, threads);
        CHECK(k.fits == want.has_value());
        if (want) {
          CHECK(k.cu == *want);
        }
      }
    }
  }
}

template <std::uint32_t N, class Fit, class Rule>
void check_batches(std::mt19937_64& rng) {
  CAPTURE(N);
  CAPTURE(carve::policy_name<Fit>());
  CAPTURE(Rule::name);
  for (const std::uint32_t unit_count : {0u, 1u, 2u, 5u, 33u}) {
    for (int t = 0; t < 8; ++t) {
      CAPTURE(unit_count);
      // Units from empty to fragmented; some identical, so ties between units are common.
      std::vector<Slots> units;
      for (std::uint32_t u = 0; u < unit_count; ++u) {
        if (u % 3 == 2) {
          const Slots twin = units[u - 1];
          units.push_back(twin);
        } else {
          units.push_back(t % 4 == 0 ? Slots(N, true) : random_runs(N, 1u << (t % 6), rng));
        }
      }
      std::vector<SlotBitmap<N>> bitmaps;
      for (const Slots& s : units) {
        bitmaps.push_back(to_bitmap<N>(s));
      }
      // Sizes include 0 and sizes past N (invalid), 1, N, and enough requests that units fill up.
      std::vector<std::uint32_t> sizes = {0, N + 1, 1, N, 0xffff'ffffu};
      for (int r = 0; r < 60; ++r) {
        sizes.push_back(static_cast<std::uint32_t>(rng() % (r % 5 == 0 ? N + 2 : N / 4 + 1)));
      }
      std::vector<BatchPlacement> got(sizes.size());
      carve::place_batch<N, Fit, Rule>(cuda::std::span<SlotBitmap<N>>(bitmaps.data(), bitmaps.size()),
                                       cuda::std::span<const std::uint32_t>(sizes.data(), sizes.size()), got.data());
      const auto want = ref_place_batch<Fit, Rule>(units, sizes, N);
      for (std::size_t r = 0; r < sizes.size(); ++r) {
        CAPTURE(r);
        CAPTURE(sizes[r]);
        CHECK(same(got[r], want[r]));
      }
      for (std::uint32_t u = 0; u < unit_count; ++u) {
        CHECK(to_slots(bitmaps[u]) == units[u]);
      }
    }
  }
}

} // namespace

namespace {
// Policies that break the FitPolicy contract, as a policy written outside carve could.
struct AlwaysFirstSlot {
  template <std::uint32_t N>
  constexpr cuda::std::optional<std::uint32_t> find(const carve::SlotBitmap<N>&, std::uint32_t) const {
    return 0u;
  }
};
struct PastTheEnd {
  template <std::uint32_t N>
  constexpr cuda::std::optional<std::uint32_t> find(const carve::SlotBitmap<N>&, std::uint32_t) const {
    return N - 1;
  }
};
} // namespace

TEST_CASE("a policy's run that is not free, or runs past the end, is invalid_placement and taken from no one") {
  carve::SlotBitmap<64> units[2];
  const std::uint32_t sizes[] = {4, 4};
  BatchPlacement out[2];
  carve::place_batch<64>(units, sizes, out, AlwaysFirstSlot{}, carve::FirstFittingCu{});
  CHECK(out[0] == BatchPlacement(CuPlacement{0, {0, 4}}));
  CHECK(out[1] == BatchPlacement(cuda::std::unexpected(Errc::invalid_placement))); // slot 0 is taken
  CHECK(units[0].free_count() == 60);
  carve::SlotBitmap<64> fresh[1];
  carve::place_batch<64>(fresh, cuda::std::span<const std::uint32_t>(sizes, 1), out, PastTheEnd{},
                         carve::FirstFittingCu{});
  CHECK(out[0] == BatchPlacement(cuda::std::unexpected(Errc::invalid_placement)));
  CHECK(fresh[0].free_count() == 64);
}

TEST_CASE("evaluate_cu reports the policy's start, the unit's free slots and the distance to an end") {
  std::mt19937_64 rng(3);
  for (int t = 0; t < 300; ++t) {
    const Slots s = random_runs(130, 1u << (t % 7), rng);
    const auto b = to_bitmap<130>(s);
    for (const std::uint32_t m : {1u, 2u, 7u, 64u, 65u, 129u, 130u}) {
      const RefCandidate want = ref_candidate<carve::BoundaryNearestFit>(s, 4, m);
      const CuCandidate got = carve::evaluate_cu(carve::BoundaryNearestFit{}, b, 4, m);
      CHECK(got.cu == 4);
      CHECK(got.fits == want.start.has_value());
      CHECK(got.free == want.free);
      if (want.start) {
        CHECK(got.start == *want.start);
        CHECK(got.distance == want.distance);
        CHECK(carve::placement_of(got, m) == BatchPlacement(CuPlacement{4, {*want.start, m}}));
      } else {
        CHECK(carve::placement_of(got, m) == BatchPlacement(cuda::std::unexpected(Errc::no_space)));
      }
    }
  }
}

TEST_CASE("the CU-choice rules: strict weak orderings whose winner does not depend on the order of comparison") {
  std::mt19937_64 rng(7);
  check_rule<carve::FirstFittingCu>(rng);
  check_rule<carve::LeastLoadedCu>(rng);
  check_rule<carve::NearestBoundaryCu>(rng);
}

TEST_CASE("the CU-choice rules on hand-made ties") {
  // Units 1 and 3 tie on everything but their index; unit 0 does not fit.
  const std::vector<CuCandidate> all = {
      {0, false, 0, 128, 0}, {1, true, 10, 50, 10}, {2, true, 0, 40, 0}, {3, true, 10, 50, 10}, {4, true, 100, 50, 27}};
  const auto pick = [&](const auto& rule) {
    CuCandidate best = all[0];
    for (const CuCandidate& c : all) {
      best = rule.better(c, best) ? c : best;
    }
    return best.cu;
  };
  CHECK(pick(carve::FirstFittingCu{}) == 1);    // the lowest index that fits, not unit 0
  CHECK(pick(carve::LeastLoadedCu{}) == 1);     // 1, 3 and 4 have 50 free: the lowest index
  CHECK(pick(carve::NearestBoundaryCu{}) == 2); // distance 0
  const std::vector<CuCandidate> none = {{0, false, 0, 9, 0}, {1, false, 0, 99, 0}};
  for (const CuCandidate& c : none) {
    CHECK(!carve::FirstFittingCu{}.better(c, c));
  }
  CHECK(!carve::placement_of(none[1], 4));
}

TEST_CASE("place_batch matches a brute-force loop over units and requests") {
  std::mt19937_64 rng(11);
  check_batches<128, carve::BoundaryNearestFit, carve::FirstFittingCu>(rng);
  check_batches<128, carve::BoundaryNearestFit, carve::LeastLoadedCu>(rng);
  check_batches<128, carve::BoundaryNearestFit, carve::NearestBoundaryCu>(rng);
  check_batches<128, carve::FirstFit, carve::LeastLoadedCu>(rng);
  check_batches<64, carve::LastFit, carve::NearestBoundaryCu>(rng);
  check_batches<130, carve::BestFit, carve::FirstFittingCu>(rng);
  check_batches<130, carve::BestFit, carve::NearestBoundaryCu>(rng);
  check_batches<7, carve::FirstFit, carve::NearestBoundaryCu>(rng);
}

TEST_CASE("place_batch: invalid sizes, no units, and a request that fits nowhere") {
  std::vector<SlotBitmap<16>> bitmaps(2);
  const std::vector<std::uint32_t> sizes = {0, 17, 16, 16, 1, 0xffff'ffffu};
  std::vector<BatchPlacement> out(sizes.size());
  carve::place_batch<16, carve::FirstFit, carve::FirstFittingCu>(
      cuda::std::span<SlotBitmap<16>>(bitmaps.data(), bitmaps.size()),
      cuda::std::span<const std::uint32_t>(sizes.data(), sizes.size()), out.data());
  CHECK(out[0].error() == Errc::invalid_size);
  CHECK(out[1].error() == Errc::no_space); // more than a unit could ever hold
  CHECK(*out[2] == CuPlacement{0, {0, 16}});
  CHECK(*out[3] == CuPlacement{1, {0, 16}}); // unit 0 is full now
  CHECK(out[4].error() == Errc::no_space);
  CHECK(out[5].error() == Errc::no_space);

  // No units: a valid size fits nowhere, an invalid one is still invalid.
  std::vector<BatchPlacement> none(sizes.size());
  carve::place_batch<16, carve::FirstFit, carve::FirstFittingCu>(
      cuda::std::span<SlotBitmap<16>>(), cuda::std::span<const std::uint32_t>(sizes.data(), sizes.size()), none.data());
  CHECK(none[0].error() == Errc::invalid_size);
  CHECK(none[2].error() == Errc::no_space);
  CHECK(none[4].error() == Errc::no_space);

  // No requests: nothing is written.
  carve::place_batch<16, carve::FirstFit, carve::FirstFittingCu>(
      cuda::std::span<SlotBitmap<16>>(bitmaps.data(), bitmaps.size()), cuda::std::span<const std::uint32_t>(),
      static_cast<BatchPlacement*>(nullptr));
}

TEST_CASE("share_of: a group's run split into one run of m per lane, in rank order") {
  for (const std::uint32_t lanes : {1u, 2u, 3u, 17u, 32u}) {
    for (const std::uint32_t m : {1u, 2u, 5u, 64u}) {
      for (const std::uint32_t first : {0u, 3u, 1000u}) {
        const SlotRange group{first, lanes * m};
        std::vector<int> owner(group.end(), -1);
        for (std::uint32_t rank = 0; rank < lanes; ++rank) {
          const SlotRange r = carve::share_of(group, m, rank);
          CHECK(r.count == m);
          CHECK(r.first == first + rank * m);
          for (std::uint32_t s = r.first; s < r.end(); ++s) {
            CHECK(owner[s] == -1);
            owner[s] = static_cast<int>(rank);
          }
        }
        // Together the lanes' runs are exactly the group's run.
        CHECK(std::count(owner.begin(), owner.begin() + first, -1) == first);
        CHECK(std::count(owner.begin() + first, owner.end(), -1) == 0);
      }
    }
  }
  static_assert(carve::share_of({10, 12}, 4, 2) == SlotRange{18, 4});
}

// ---------------------------------------------------------------------------------------------
// Releasing a batch.

namespace {

// The outcome of one release on slot-per-bool units, written from deallocate's rules.
std::optional<Errc> ref_release(std::vector<Slots>& units, std::uint32_t n, const CuPlacement& p) {
  if (p.range.count == 0) {
    return Errc::invalid_size;
  }
  if (p.cu >= units.size() || std::uint64_t{p.range.first} + p.range.count > n) {
    return Errc::out_of_range;
  }
  Slots& s = units[p.cu];
  for (std::uint32_t k = p.range.first; k < p.range.first + p.range.count; ++k) {
    if (s[k]) {
      return Errc::not_allocated;
    }
  }
  for (std::uint32_t k = p.range.first; k < p.range.first + p.range.count; ++k) {
    s[k] = true;
  }
  return std::nullopt;
}

template <std::uint32_t N>
void check_release_batch(std::mt19937_64& rng, std::uint32_t units) {
  CAPTURE(N);
  CAPTURE(units);
  std::vector<SlotBitmap<N>> bitmaps(units);
  std::vector<std::uint32_t> sizes(300);
  for (auto& m : sizes) {
    m = 1 + static_cast<std::uint32_t>(rng() % (N / 4));
  }
  std::vector<BatchPlacement> placed(sizes.size());
  carve::place_batch<N, carve::BoundaryNearestFit, carve::LeastLoadedCu>(
      cuda::std::span<SlotBitmap<N>>(bitmaps.data(), units),
      cuda::std::span<const std::uint32_t>(sizes.data(), sizes.size()), placed.data());

  // Most placements once, some twice, some in halves, and bad ones of every kind.
  std::vector<CuPlacement> releases;
  for (const BatchPlacement& p : placed) {
    if (!p || rng() % 5 == 0) {
      continue;
    }
    if (p->range.count > 1 && rng() % 4 == 0) {
      const std::uint32_t half = p->range.count / 2;
      releases.push_back({p->cu, {p->range.first, half}});
      releases.push_back({p->cu, {p->range.first + half, p->range.count - half}});
    } else {
      releases.push_back(*p);
    }
    if (rng() % 10 == 0) {
      releases.push_back(*p); // a double release within the batch
    }
  }
  std::shuffle(releases.begin(), releases.end(), rng);
  releases.push_back({units, {0, 1}});        // no such unit
  releases.push_back({0, {N - 1, 2}});        // past the end
  releases.push_back({0, {0xffff'ffffu, 2}}); // wrapping
  releases.push_back({units - 1, {3, 0}});    // empty
  std::shuffle(releases.end() - 4, releases.end(), rng);

  std::vector<Slots> model;
  for (const auto& b : bitmaps) {
    model.push_back(to_slots(b));
  }
  std::vector<std::optional<Errc>> want;
  for (const CuPlacement& p : releases) {
    want.push_back(ref_release(model, N, p));
  }
  const auto span_of = [](std::vector<SlotBitmap<N>>& b) { return cuda::std::span<SlotBitmap<N>>(b.data(), b.size()); };
  const cuda::std::span<const CuPlacement> batch(releases.data(), releases.size());

  auto sequential = bitmaps;
  std::vector<carve::BatchRelease> out(releases.size());
  carve::release_batch<N>(span_of(sequential), batch, out.data());
  for (std::size_t r = 0; r < releases.size(); ++r) {
    CAPTURE(r);
    REQUIRE(out[r].has_value() == !want[r].has_value());
    if (want[r]) {
      REQUIRE(out[r].error() == *want[r]);
    }
  }
  for (std::uint32_t u = 0; u < units; ++u) {
    REQUIRE(to_slots(sequential[u]) == model[u]);
  }

  // The kernel's split: every part, run in any order, does exactly the same.
  for (const std::uint32_t parts : {1u, 2u, 3u, 7u, 32u, 1000u}) {
    CAPTURE(parts);
    auto split = bitmaps;
    std::vector<carve::BatchRelease> split_out(releases.size(), cuda::std::unexpected(Errc::invalid_argument));
    for (std::uint32_t part = parts; part-- > 0;) {
      carve::release_batch_part<N>(span_of(split), batch, split_out.data(), part, parts);
    }
    REQUIRE(split == sequential);
    for (std::size_t r = 0; r < releases.size(); ++r) {
      REQUIRE(split_out[r] == out[r]);
    }
  }
}

} // namespace

TEST_CASE("release_batch gives placements back with deallocate's checks; its parts together do the same") {
  std::mt19937_64 rng(23);
  check_release_batch<64>(rng, 9);
  check_release_batch<128>(rng, 40);
  check_release_batch<256>(rng, 5);
  check_release_batch<512>(rng, 3);
  check_release_batch<130>(rng, 1);
}

TEST_CASE("release_batch with no units refuses every release, with none does nothing") {
  const std::vector<CuPlacement> releases = {{0, {0, 1}}, {5, {2, 2}}, {0, {0, 0}}};
  std::vector<carve::BatchRelease> out(releases.size());
  carve::release_batch<16>(cuda::std::span<SlotBitmap<16>>(),
                           cuda::std::span<const CuPlacement>(releases.data(), releases.size()), out.data());
  CHECK(out[0].error() == Errc::out_of_range);
  CHECK(out[1].error() == Errc::out_of_range);
  CHECK(out[2].error() == Errc::invalid_size);
  std::vector<SlotBitmap<16>> one(1, SlotBitmap<16>::all_taken());
  carve::release_batch<16>(cuda::std::span<SlotBitmap<16>>(one.data(), 1), cuda::std::span<const CuPlacement>(),
                           static_cast<carve::BatchRelease*>(nullptr));
  CHECK(one[0] == SlotBitmap<16>::all_taken());
}

} // namespace test_batch_placement
