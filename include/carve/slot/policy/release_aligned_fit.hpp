/// @file carve/slot/policy/release_aligned_fit.hpp
/// Place a workgroup beside neighbours that release after it.
///
/// Contiguous slots fragment when a run is released while the runs on both sides of it stay taken:
/// a hole opens that no larger request can use. Where that happens is decided at placement time.
/// A workgroup put next to a neighbour that is released *before* it leaves a hole behind that
/// neighbour for as long as the workgroup outlives it; put next to one released *after* it, its
/// own release merges into the free run beside it and nothing is stranded.
///
/// The hint is the tick at which the request is expected to be released (now + expected run time,
/// in any clock the caller keeps: cycles, microseconds). The policy remembers the expected release
/// of every slot it placed and scores each candidate start, i.e. either end of each free run that
/// holds m (a start inside a run would split it into two holes):
/// - damage: the ticks by which the request outlives a taken neighbour, summed over its sides;
/// - slack: the ticks by which its taken neighbours outlive it, summed over its sides.
///
/// The smallest damage wins, then the smallest slack (the tightest match in time keeps neighbours
/// that live long for requests that live long), then the lowest start. The ends of the slot space,
/// and slots placed without a hint, count as neighbours that are never released.
///
/// Ticks are compared modulo 2^32, so a counter may wrap; expected releases of live workgroups must
/// lie within 2^31 ticks of each other. Without a hint (plain find) the policy is
/// BoundaryNearestFit. Cost: one walk over the free runs, O(words + runs), like BestFit; memory:
/// N ticks and N bits beside the bitmap.
///
/// Use it as SlotAllocator<N, ReleaseAlignedFit>: the allocator sizes the per-slot memory
/// (ReleaseAlignedPlacements<N>) and reports every placement to it. Or share it among threads as
/// ConcurrentSlotAllocator<N, ReleaseAlignedFit, Scope>: that allocator keeps the memory in
/// SharedReleaseAlignedPlacements<N, Scope>, whose ticks and known bits are read and written with
/// cuda::atomic_ref (see that class for why its racy reads are safe). The views that many copies
/// are made of (ShardedSlotAllocator's shards, ConcurrentSlotAllocatorRef) and DynamicSlotAllocator
/// cannot hold such memory, so they refuse this policy at compile time.
///
/// In the workgroup scheduling simulator (examples/slot_sim) this recovers 27-41% of
/// the makespan that contiguity costs on mixed-size workloads with exact hints, against 7-23% for
/// boundary-nearest; noisy hints shrink the gain, and where rare huge requests need the middle
/// kept whole boundary-nearest does better.
#pragma once

#include <carve/core/bits.hpp>
#include <carve/core/config.hpp>
#include <carve/slot/policy/boundary_nearest_fit.hpp>
#include <carve/slot/policy/hinted_fit_policy.hpp>
#include <carve/slot/search/run_search.hpp>
#include <carve/slot/storage/slot_bitmap.hpp>
#include <carve/slot/storage/slot_range.hpp>
#include <carve/slot/storage/word_source.hpp>

#include <cuda/atomic>
#include <cuda/std/cstdint>
#include <cuda/std/optional>
#include <cuda/std/type_traits>

namespace carve {

/// When a request is expected to be released, in the caller's ticks.
struct ExpectedRelease {
  std::uint32_t tick; ///< compared modulo 2^32
};

template <std::uint32_t N>
class ReleaseAlignedPlacements;
template <std::uint32_t N, cuda::thread_scope Scope>
class SharedReleaseAlignedPlacements;

/// The search both forms share, over any WordSource and any record of expected releases.
namespace release_aligned_detail {

/// Lexicographic (damage, slack); sums of at most two sides fit easily in 64 bits.
struct Score {
  std::uint64_t damage = 0; ///< ticks by which the request outlives its neighbours
  std::uint64_t slack = 0;  ///< ticks by which its neighbours outlive it

  /// Adds the other side's score.
  CARVE_HOST_DEVICE constexpr Score& operator+=(Score o) noexcept {
    damage += o.damage;
    slack += o.slack;
    return *this;
  }
  /// Less damage first, then less slack.
  friend CARVE_HOST_DEVICE constexpr bool operator<(Score a, Score b) noexcept {
    return a.damage != b.damage ? a.damage < b.damage : a.slack < b.slack;
  }
};

/// A neighbour that is never released: no damage, and the loosest possible match.
inline constexpr Score never_released{0, std::uint64_t{1} << 31};

/// The score of a request expected back at `hint` beside slot `neighbour` of `record`
/// (`known(s)` and `tick(s)`), or beside an end of the slot space when `neighbour` is `slots`.
template <class Record>
CARVE_HOST_DEVICE constexpr Score versus(const Record& record, std::uint32_t neighbour, std::uint32_t slots,
                                         ExpectedRelease hint) noexcept {
  if (neighbour >= slots || !record.known(neighbour)) {
    return never_released;
  }
  // Signed distance modulo 2^32: positive when the request outlives the neighbour.
  const auto outlives = static_cast<std::int32_t>(hint.tick - record.tick(neighbour));
  if (outlives > 0) {
    return {static_cast<std::uint64_t>(outlives), 0};
  }
  return {0, static_cast<std::uint64_t>(-static_cast<std::int64_t>(outlives))};
}

/// The run end with the least damage, then the least slack, then the lowest start, among the
/// free runs of the first `slots` slots of `words` (walked lowest first, each word read in
/// increasing order, so a LazySnapshot sees every word once per walk); nullopt when nothing fits,
/// m == 0 or m > slots.
template <WordSource Words, class Record>
CARVE_HOST_DEVICE constexpr cuda::std::optional<std::uint32_t>
find(const Words& words, std::uint32_t slots, std::uint32_t m, ExpectedRelease hint, const Record& record) noexcept {
  if (m == 0 || m > slots) {
    return cuda::std::nullopt;
  }
  cuda::std::optional<std::uint32_t> best;
  Score best_score{};
  const auto consider = [&](std::uint32_t start, Score score) {
    if (!best || score < best_score) {
      best = start;
      best_score = score;
    }
  };
  for (std::uint32_t first = runs::next_free(words, slots, 0); first < slots;) {
    const std::uint32_t end = runs::next_taken(words, slots, first);
    if (end - first >= m) {
      // At the low end: the run's lower neighbour, plus its upper one on an exact fit. (The
      // neighbour below slot 0 is the low end of the space: index `slots` stands for it.)
      Score low = versus(record, first == 0 ? slots : first - 1, slots, hint);
      if (end - first == m) {
        low += versus(record, end, slots, hint);
      }
      consider(first, low);
      if (end - first > m) {
        consider(end - m, versus(record, end, slots, hint));
      }
    }
    first = runs::next_free(words, slots, end);
  }
  return best;
}

} // namespace release_aligned_detail

/// The policy: what users name. Its state for N slots is ReleaseAlignedPlacements<N>.
struct ReleaseAlignedFit {
  /// Shown in reports and tools.
  static constexpr const char* name = "release-aligned";
  /// The hint: when the request is expected back.
  using hint_type = ExpectedRelease;
  /// The policy with its per-slot memory for N slots.
  template <std::uint32_t N>
  using for_slots = ReleaseAlignedPlacements<N>;
  /// The policy with per-slot memory for N slots that threads of `Scope` share (what
  /// ConcurrentSlotAllocator<N, ReleaseAlignedFit, Scope> holds).
  template <std::uint32_t N, cuda::thread_scope Scope>
  using for_shared_slots = SharedReleaseAlignedPlacements<N, Scope>;
};

/// The policy for N slots, with the expected release of every slot it placed.
template <std::uint32_t N>
class ReleaseAlignedPlacements {
public:
  /// Shown in reports and tools.
  static constexpr const char* name = ReleaseAlignedFit::name;
  /// The hint: when the request is expected back.
  using hint_type = ExpectedRelease;

  /// Nothing placed yet.
  constexpr ReleaseAlignedPlacements() noexcept = default;
  /// Nothing placed yet (what SlotAllocator<N, ReleaseAlignedFit> builds from its policy value).
  CARVE_HOST_DEVICE constexpr ReleaseAlignedPlacements(ReleaseAlignedFit) noexcept {}

  /// Without a hint: BoundaryNearestFit's choice.
  CARVE_HOST_DEVICE constexpr cuda::std::optional<std::uint32_t> find(const SlotBitmap<N>& bitmap,
                                                                      std::uint32_t m) const noexcept {
    return BoundaryNearestFit{}.find(bitmap, m);
  }

  /// The run end with the least damage, then the least slack, then the lowest start; nullopt
  /// when nothing fits, m == 0 or m > N.
  CARVE_HOST_DEVICE constexpr cuda::std::optional<std::uint32_t> find(const SlotBitmap<N>& bitmap, std::uint32_t m,
                                                                      ExpectedRelease hint) const noexcept {
    return release_aligned_detail::find(bitmap.words(), N, m, hint, *this);
  }

  /// Whether slot `s` was last placed with a hint (its tick is then known).
  CARVE_HOST_DEVICE constexpr bool known(std::uint32_t s) const noexcept {
    return (known_[s / bits::word_bits] >> (s % bits::word_bits) & 1) != 0;
  }
  /// When slot `s` is expected back (meaningful when known(s)).
  CARVE_HOST_DEVICE constexpr std::uint32_t tick(std::uint32_t s) const noexcept { return release_[s]; }

  /// Records when the slots of `range` are expected back.
  CARVE_HOST_DEVICE constexpr void placed(SlotRange range, ExpectedRelease hint) noexcept {
    for (std::uint32_t s = range.first; s < range.end(); ++s) {
      release_[s] = hint.tick;
      set_known(s, true);
    }
  }

  /// A placement without a hint: its slots count as never released.
  CARVE_HOST_DEVICE constexpr void placed(SlotRange range) noexcept {
    for (std::uint32_t s = range.first; s < range.end(); ++s) {
      set_known(s, false);
    }
  }

private:
  CARVE_HOST_DEVICE constexpr void set_known(std::uint32_t s, bool value) noexcept {
    const bits::word bit = bits::word{1} << (s % bits::word_bits);
    known_[s / bits::word_bits] = value ? known_[s / bits::word_bits] | bit : known_[s / bits::word_bits] & ~bit;
  }

  std::uint32_t release_[N]{};
  bits::word known_[bits::word_count(N)]{};
};

/// The policy for N slots shared by threads of `Scope`: ReleaseAlignedPlacements' choices, with
/// its memory of expected releases kept where every thread reads and writes it atomically.
///
/// What ConcurrentSlotAllocator<N, ReleaseAlignedFit, Scope> holds and feeds. The rules that keep
/// it safe without a lock:
/// - Ownership never depends on this memory. A slot is taken only by the fetch_and on the bitmap
///   that saw it free; the ticks only steer which free run a search proposes.
/// - Only the owner of a slot writes its record: placed() after its claim succeeded, released()
///   before its deallocate gives the bits back (so a later owner's placed(), which follows its
///   own claim of those bits, always comes after, and is never undone by a stale release).
/// - Searches read the record racily, with relaxed atomic loads (so there is no data race in the
///   C++ sense, and nothing for TSan to report): a stale read — a neighbour claimed a moment ago
///   and not stamped yet reads as unknown, i.e. as never released — only makes a placement
///   worse than it could have been, never wrong. The known bit is set with release order after
///   the tick is stored, and read with acquire before the tick, so a search never pairs a known
///   bit with a tick older than the placement that set it.
/// - Unknown, not "released at 0", is what a free or just-claimed slot reads as: released() and
///   forget_all() clear the known bits. A single thread therefore sees exactly the choices of
///   ReleaseAlignedPlacements (which consults only taken neighbours, so forgetting the ticks of
///   freed slots changes nothing there).
///
/// Copyable, as policies are, but a copy reads every word plainly: copy it only while no thread
/// is using it.
template <std::uint32_t N, cuda::thread_scope Scope>
class SharedReleaseAlignedPlacements {
public:
  /// Shown in reports and tools.
  static constexpr const char* name = ReleaseAlignedFit::name;
  /// The hint: when the request is expected back.
  using hint_type = ExpectedRelease;
  /// Which threads may share it.
  static constexpr cuda::thread_scope scope = Scope;

  /// Nothing placed yet; constant-initialised, like the allocator that holds it.
  constexpr SharedReleaseAlignedPlacements() noexcept = default;
  /// Nothing placed yet (what ConcurrentSlotAllocator<N, ReleaseAlignedFit, Scope> builds).
  CARVE_HOST_DEVICE constexpr SharedReleaseAlignedPlacements(ReleaseAlignedFit) noexcept {}

  /// Without a hint: BoundaryNearestFit's choice.
  CARVE_HOST_DEVICE constexpr cuda::std::optional<std::uint32_t> find(const SlotBitmap<N>& bitmap,
                                                                      std::uint32_t m) const noexcept {
    return BoundaryNearestFit{}.find(bitmap, m);
  }
  /// Without a hint, in any WordSource (a live bitmap's snapshot): BoundaryNearestFit's choice.
  template <WordSource Words>
  CARVE_HOST_DEVICE constexpr cuda::std::optional<std::uint32_t> find_in(const Words& words, std::uint32_t slots,
                                                                         std::uint32_t m) const noexcept {
    return BoundaryNearestFit{}.find_in(words, slots, m);
  }

  /// As ReleaseAlignedPlacements::find, reading the record as it is now.
  CARVE_HOST_DEVICE cuda::std::optional<std::uint32_t> find(const SlotBitmap<N>& bitmap, std::uint32_t m,
                                                            ExpectedRelease hint) const noexcept {
    return release_aligned_detail::find(bitmap.words(), N, m, hint, *this);
  }
  /// The same in any WordSource of N slots (`slots` is N; a live bitmap's snapshot).
  template <WordSource Words>
  CARVE_HOST_DEVICE cuda::std::optional<std::uint32_t> find_in(const Words& words, std::uint32_t slots, std::uint32_t m,
                                                               ExpectedRelease hint) const noexcept {
    return release_aligned_detail::find(words, slots < N ? slots : N, m, hint, *this);
  }

  /// Whether slot `s` is known to be placed with a hint, as read now.
  CARVE_HOST_DEVICE bool known(std::uint32_t s) const noexcept {
    return (known_word(s / bits::word_bits).load(cuda::std::memory_order_acquire) >> (s % bits::word_bits) & 1) != 0;
  }
  /// When slot `s` is expected back, as read now (meaningful when known(s)).
  CARVE_HOST_DEVICE std::uint32_t tick(std::uint32_t s) const noexcept {
    return cuda::atomic_ref<std::uint32_t, Scope>(release_[s]).load(cuda::std::memory_order_relaxed);
  }

  /// The caller now owns `range`, expected back at `hint`: stamps its slots. Call after the claim.
  CARVE_HOST_DEVICE void placed(SlotRange range, ExpectedRelease hint) noexcept {
    for (std::uint32_t s = range.first; s < range.end(); ++s) {
      cuda::atomic_ref<std::uint32_t, Scope>(release_[s]).store(hint.tick, cuda::std::memory_order_relaxed);
    }
    for_each_word_mask(range, [&](std::uint32_t k, bits::word mask) {
      known_word(k).fetch_or(mask, cuda::std::memory_order_release);
      return true;
    });
  }
  /// The caller now owns `range`, placed without a hint: its slots count as never released.
  CARVE_HOST_DEVICE void placed(SlotRange range) noexcept { released(range); }
  /// The caller is about to give `range` back: its slots become unknown. Call before the release.
  CARVE_HOST_DEVICE void released(SlotRange range) noexcept {
    for_each_word_mask(range, [&](std::uint32_t k, bits::word mask) {
      known_word(k).fetch_and(~mask, cuda::std::memory_order_relaxed);
      return true;
    });
  }
  /// Every slot unknown (with the allocator's reset(): not safe against concurrent calls).
  CARVE_HOST_DEVICE void forget_all() noexcept {
    for (std::uint32_t k = 0; k < bits::word_count(N); ++k) {
      known_word(k).store(0, cuda::std::memory_order_relaxed);
    }
  }

private:
  CARVE_HOST_DEVICE cuda::atomic_ref<bits::word, Scope> known_word(std::uint32_t k) const noexcept {
    return cuda::atomic_ref<bits::word, Scope>(known_[k]);
  }

  // Only ever touched through atomic_ref (which needs a non-const object, hence mutable).
  alignas(8) mutable std::uint32_t release_[N]{};
  alignas(8) mutable bits::word known_[bits::word_count(N)]{};
};

static_assert(cuda::std::is_same_v<sized_fit_t<ReleaseAlignedFit, 128>, ReleaseAlignedPlacements<128>>);
static_assert(HintedFitPolicyFor<ReleaseAlignedPlacements<128>, 128>);
static_assert(TracksPlacements<ReleaseAlignedPlacements<128>> && TracksHintedPlacements<ReleaseAlignedPlacements<128>>);
static_assert(cuda::std::is_same_v<shared_fit_t<ReleaseAlignedFit, 128, cuda::thread_scope_block>,
                                   SharedReleaseAlignedPlacements<128, cuda::thread_scope_block>>);
static_assert(SharesPlacements<SharedReleaseAlignedPlacements<128, cuda::thread_scope_device>> &&
              HintedFitPolicyFor<SharedReleaseAlignedPlacements<128, cuda::thread_scope_device>, 128>);

} // namespace carve
