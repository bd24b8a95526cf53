/// @file carve/queue/drain_policy.hpp
/// The concept every drain policy models: which tier the next pop
/// of a SizeTieredQueue serves.
///
/// @code
/// struct MyDrain {
///   static constexpr const char* name = "mine";                 // optional, for reports
///   template <class Clock>
///   CARVE_HOST_DEVICE cuda::std::expected<void, carve::Errc> prepare(std::uint32_t tiers);
///   template <class View>
///   CARVE_HOST_DEVICE cuda::std::optional<std::uint32_t> pick(const View& view);
///   template <class View>
///   CARVE_HOST_DEVICE void served(const View& view, std::uint32_t tier, std::uint64_t size);
/// };
/// @endcode
///
/// prepare() runs once when the queue is built: it checks the policy's parameters against the
/// tier count (Errc::invalid_argument when, say, a weight list has the wrong length) and turns
/// nanosecond bounds into the clock's ticks. For every pop the queue calls pick() until a tier it
/// names yields a request, then served() with that tier and the request's size. The View is:
/// @code
/// static constexpr cuda::thread_scope scope;      // for the policy's own atomics
/// std::uint32_t tier_count() const;
/// bool known_empty(std::uint32_t tier) const;     // this pop already found the tier empty
/// cuda::std::optional<std::uint64_t> head_stamp(std::uint32_t tier) const;  // oldest request's stamp
/// std::uint64_t now() const;                      // clock ticks, read once per pop, when first asked
/// @endcode
/// pick() returns a tier that is not known_empty, or nullopt when every tier is; the queue tries
/// at most one pop per tier per call, so a pop costs at most tier_count() picks.
///
/// Many threads pop at once, so pick() and served() may run concurrently on one policy object:
/// a policy keeps its mutable state in members accessed only through cuda::atomic_ref at
/// View::scope (which also lets the whole queue live in device memory). With one consumer the
/// order is exactly the policy's; with several, each pop is valid and the shares hold on average.
///
/// Optional traits: `static constexpr bool needs_head_stamps = true` (the queue then requires a
/// PeekableLane), `static constexpr bool shared_capacity = true` (one bound for all tiers), and
/// `bool reads_stamps() const`, asked once the policy is prepared: whether pick() compares the
/// values of head_stamp() and now() (StrictPriority only with aging). Where it says false, the
/// queue reads the clock only for the requests whose waits it samples, and head_stamp() values
/// are meaningless (0 for most requests) though still present for every visible head. Without
/// it, a policy reads stamps iff it needs head stamps.
#pragma once

#include <carve/core/config.hpp>
#include <carve/core/errc.hpp>
#include <carve/queue/force_inline.hpp>
#include <carve/queue/queue_clock.hpp>
#include <carve/queue/tier_thresholds.hpp>

#include <cuda/atomic>
#include <cuda/std/concepts>
#include <cuda/std/cstdint>
#include <cuda/std/expected>
#include <cuda/std/optional>
#include <cuda/std/span>

namespace carve {

namespace detail {
// The smallest View a policy may rely on; only used to check the concept.
struct DrainViewArchetype {
  static constexpr cuda::thread_scope scope = cuda::thread_scope_system;
  CARVE_HOST_DEVICE std::uint32_t tier_count() const noexcept { return 1; }
  CARVE_HOST_DEVICE bool known_empty(std::uint32_t) const noexcept { return false; }
  CARVE_HOST_DEVICE cuda::std::optional<std::uint64_t> head_stamp(std::uint32_t) const noexcept { return {}; }
  CARVE_HOST_DEVICE std::uint64_t now() const noexcept { return 0; }
};

// The tier after `tier` (< n), wrapping to 0. A compare, not a division: pops call it each time.
CARVE_HOST_DEVICE CARVE_QUEUE_INLINE constexpr std::uint32_t tier_after(std::uint32_t tier, std::uint32_t n) noexcept {
  return tier + 1 == n ? 0 : tier + 1;
}

// What a pick that found no tier holds in a plain number. Policies compute with plain numbers
// and build the optional only as they return it: GCC copies a cuda::std::optional through
// memory, in pieces that a whole read then has to wait for (see force_inline.hpp).
inline constexpr std::uint32_t no_tier = ~std::uint32_t{0};

CARVE_HOST_DEVICE CARVE_QUEUE_INLINE cuda::std::optional<std::uint32_t> as_pick(std::uint32_t tier) noexcept {
  return tier == no_tier ? cuda::std::optional<std::uint32_t>() : cuda::std::optional<std::uint32_t>(tier);
}

// The first tier at or after `from` (cyclically; any `from`, taken modulo the tier count) that
// the view has not found empty, or no_tier.
template <class View>
CARVE_HOST_DEVICE CARVE_QUEUE_INLINE std::uint32_t first_untried(const View& view, std::uint32_t from) noexcept {
  const std::uint32_t n = view.tier_count();
  if (n == 0) {
    return no_tier;
  }
  std::uint32_t t = from < n ? from : from % n;
  for (std::uint32_t i = 0; i < n; ++i, t = tier_after(t, n)) {
    if (!view.known_empty(t)) {
      return t;
    }
  }
  return no_tier;
}

// view.head_stamp(tier) into `stamp`, or false; without an optional where the view offers
// head_stamp_into (SizeTieredQueue's does).
template <class View>
CARVE_HOST_DEVICE CARVE_QUEUE_INLINE bool head_stamp_into(const View& view, std::uint32_t tier,
                                                          std::uint64_t& stamp) noexcept {
  if constexpr (requires { view.head_stamp_into(tier, stamp); }) {
    return view.head_stamp_into(tier, stamp);
  } else {
    const cuda::std::optional<std::uint64_t> s = view.head_stamp(tier);
    stamp = s.value_or(0);
    return s.has_value();
  }
}

// The same as a pick.
template <class View>
CARVE_HOST_DEVICE CARVE_QUEUE_INLINE cuda::std::optional<std::uint32_t> next_untried(const View& view,
                                                                                     std::uint32_t from) noexcept {
  return as_pick(first_untried(view, from));
}

// A policy's list of one value per tier (weights, quanta, tags), as its constructor is given it:
// the first max_tiers values kept with the count given, so that prepare() refuses a list that
// does not fit the tiers rather than the constructor, which device code cannot fail.
template <class V>
struct TierValues {
  V values[max_tiers]{};
  std::uint32_t count = 0;

  constexpr TierValues() noexcept = default;
  CARVE_HOST_DEVICE constexpr explicit TierValues(cuda::std::span<const V> given) noexcept
      : count(static_cast<std::uint32_t>(given.size())) {
    for (std::uint32_t t = 0; t < count && t < max_tiers; ++t) {
      values[t] = given[t];
    }
  }
  // One value per tier of `tiers`, each in [lo, hi].
  CARVE_HOST_DEVICE constexpr bool fit(std::uint32_t tiers, V lo, V hi) const noexcept {
    if (count != tiers) {
      return false;
    }
    for (std::uint32_t t = 0; t < tiers; ++t) {
      if (values[t] < lo || values[t] > hi) {
        return false;
      }
    }
    return true;
  }
  CARVE_HOST_DEVICE constexpr V operator[](std::uint32_t tier) const noexcept { return values[tier]; }
  // The values as given (at most max_tiers).
  CARVE_HOST_DEVICE constexpr cuda::std::span<const V> given() const noexcept {
    return {values, count < max_tiers ? count : max_tiers};
  }
};
} // namespace detail

/// Which tier the next pop serves: prepare(), pick() and served() as the file's description says;
/// copyable, since the queue keeps its own copy.
template <class D>
concept DrainPolicy = cuda::std::copy_constructible<D> &&
    requires(D& drain, const detail::DrainViewArchetype& view, std::uint32_t tier, std::uint64_t size) {
  { drain.template prepare<QueueClock>(tier) } -> cuda::std::same_as<cuda::std::expected<void, Errc>>;
  { drain.pick(view) } -> cuda::std::same_as<cuda::std::optional<std::uint32_t>>;
  { drain.served(view, tier, size) } -> cuda::std::same_as<void>;
};

/// `D::needs_head_stamps`, or false: whether the queue's lanes must be PeekableLanes.
template <class D>
inline constexpr bool drain_needs_head_stamps = [] {
  if constexpr (requires { D::needs_head_stamps; }) {
    return D::needs_head_stamps;
  } else {
    return false;
  }
}();

/// `D::shared_capacity`, or false: whether one capacity bounds the whole queue.
template <class D>
inline constexpr bool drain_shares_capacity = [] {
  if constexpr (requires { D::shared_capacity; }) {
    return D::shared_capacity;
  } else {
    return false;
  }
}();

/// Whether `drain` (prepared) compares stamps: every request must then be stamped.
/// `drain.reads_stamps()` where it has one, else drain_needs_head_stamps.
template <class D>
CARVE_HOST_DEVICE constexpr bool drain_reads_stamps(const D& drain) noexcept {
  if constexpr (requires { drain.reads_stamps(); }) {
    return drain.reads_stamps();
  } else {
    return drain_needs_head_stamps<D>;
  }
}

/// The policy's display name (`D::name`), or "custom".
template <class D>
CARVE_HOST_DEVICE constexpr const char* drain_name() noexcept {
  if constexpr (requires { D::name; }) {
    return D::name;
  } else {
    return "custom";
  }
}

} // namespace carve
