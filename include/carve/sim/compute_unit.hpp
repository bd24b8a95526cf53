/// @file carve/sim/compute_unit.hpp
/// The compute units the dispatcher places workgroups on.
///
/// ContiguousCu<N, Fit> is a compute unit whose N slots are managed by carve's own
/// SlotAllocator<N, Fit>: the simulator drives the real library code, so what it measures is what
/// a user gets. PooledCu<N> is the bound: the same N slots without the need to be contiguous (a
/// workgroup fits whenever enough slots are free), which no contiguous policy can beat.
///
/// Both model the ComputeUnit concept the dispatcher needs:
/// - `probe(request)`: where the unit would put the request (its start), without placing it;
/// - `place(request)`: place it, or nullopt when it does not fit;
/// - `release(range)`: return a placement;
/// - `free_count()`, `largest_free_run()`, `free_run_count()`.
#pragma once

#include <carve/core/error.hpp>
#include <carve/slot/allocator/slot_allocator.hpp>
#include <carve/slot/policy/fit_policy.hpp>
#include <carve/slot/policy/hinted_fit_policy.hpp>
#include <carve/slot/policy/release_aligned_fit.hpp>
#include <carve/slot/storage/slot_range.hpp>

#include <array>
#include <concepts>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

namespace carve::sim {

/// What the dispatcher asks a compute unit to place.
struct Request {
  std::uint32_t size;                  ///< slots
  std::uint64_t now;                   ///< the current cycle
  std::uint32_t expected;              ///< the run time the dispatcher expects, in cycles; 0: it has no estimate
  std::uint32_t kernel = 0xffff'ffffu; ///< the workgroup's kernel type, or 0xffffffff for none
};

/// The hint a hinted policy is given for a request. ExpectedRelease is built in (the cycle the
/// workgroup is expected back, modulo 2^32); a user's hint type joins by being constructible from
/// a Request.
template <class Hint>
Hint make_hint(const Request& r) {
  if constexpr (std::same_as<Hint, ExpectedRelease>) {
    return ExpectedRelease{static_cast<std::uint32_t>(r.now + r.expected)};
  } else {
    static_assert(std::constructible_from<Hint, const Request&>,
                  "a hinted policy's hint_type must be constructible from carve::sim::Request");
    return Hint(r);
  }
}

/// A compute unit the dispatcher can place on: `slots`, `contiguous`, and the calls above.
template <class Cu>
concept ComputeUnit = requires(Cu& cu, const Cu& ccu, const Request& r, SlotRange range) {
  { Cu::slots } -> std::convertible_to<std::uint32_t>;
  { Cu::contiguous } -> std::convertible_to<bool>;
  { ccu.probe(r) } -> std::same_as<std::optional<std::uint32_t>>;
  { cu.place(r) } -> std::same_as<std::optional<SlotRange>>;
  cu.release(range);
  { ccu.free_count() } -> std::same_as<std::uint32_t>;
  { ccu.largest_free_run() } -> std::same_as<std::uint32_t>;
  { ccu.free_run_count() } -> std::same_as<std::uint32_t>;
};

/// A compute unit of N slots managed by carve's SlotAllocator<N, Fit>.
template <std::uint32_t N, class Fit>
requires FitPolicyFor<sized_fit_t<Fit, N>, N>
class ContiguousCu {
public:
  static constexpr std::uint32_t slots = N;                          ///< slots on the unit
  static constexpr bool contiguous = true;                           ///< placements are contiguous runs
  using allocator_type = SlotAllocator<N, Fit>;                      ///< the allocator behind the unit
  using policy_type = typename allocator_type::policy_type;          ///< its policy object
  static constexpr bool hinted = HintedFitPolicyFor<policy_type, N>; ///< whether requests carry a hint

  /// All slots free, default policy object.
  ContiguousCu() = default;
  /// All slots free, with policy object `fit`.
  explicit ContiguousCu(policy_type fit) : allocator_(fit) {}

  /// The allocator's call for a request: with a hint when the policy takes one and the
  /// dispatcher has an estimate (expected != 0), else the plain call.
  [[nodiscard]] static cuda::std::expected<SlotRange, Errc> allocate(allocator_type& a, const Request& r) {
    if constexpr (hinted) {
      if (r.expected != 0) {
        return a.allocate(r.size, make_hint<typename policy_type::hint_type>(r));
      }
    }
    return a.allocate(r.size);
  }
  /// Where the policy would place `r` in `a`, without placing it.
  static cuda::std::optional<std::uint32_t> find(const allocator_type& a, const Request& r) {
    if constexpr (hinted) {
      if (r.expected != 0) {
        return a.policy().find(a.bitmap(), r.size, make_hint<typename policy_type::hint_type>(r));
      }
    }
    return a.policy().find(a.bitmap(), r.size);
  }

  /// Where the unit would put `r` (its start), or nullopt when it does not fit.
  std::optional<std::uint32_t> probe(const Request& r) const {
    const auto start = find(allocator_, r);
    return start ? std::optional<std::uint32_t>(*start) : std::nullopt;
  }

  /// Places `r`, or nullopt when it does not fit. Throws carve::Exception (invalid_placement)
  /// when the allocator reports anything but no_space (a policy bug).
  std::optional<SlotRange> place(const Request& r) {
    const auto range = allocate(allocator_, r);
    if (!range) {
      if (range.error() != Errc::no_space) {
        throw Exception(Errc::invalid_placement,
                        std::string("policy ") + policy_name<Fit>() + ": " + to_string(range.error()));
      }
      return std::nullopt;
    }
    for (std::uint32_t s = range->first; s < range->end(); ++s) {
      ++wear_[s];
    }
    return *range;
  }

  /// Returns a placement; throws carve::Exception (invalid_placement) for one that is not taken.
  void release(SlotRange range) {
    if (const auto done = allocator_.deallocate(range); !done) {
      throw Exception(Errc::invalid_placement, std::string("release: ") + to_string(done.error()));
    }
  }

  /// Free slots.
  std::uint32_t free_count() const { return allocator_.free_count(); }
  /// The largest request that fits now.
  std::uint32_t largest_free_run() const { return allocator_.largest_free_run(); }
  /// Maximal runs of free slots: how fragmented the unit is.
  std::uint32_t free_run_count() const {
    std::uint32_t n = 0;
    for ([[maybe_unused]] const SlotRange run : allocator_.bitmap().free_runs()) {
      ++n;
    }
    return n;
  }

  /// How many placements covered each slot: its wear (even wear means both ends are used alike).
  const std::array<std::uint64_t, N>& wear() const { return wear_; }
  /// The allocator behind the unit.
  const allocator_type& allocator() const { return allocator_; }

private:
  allocator_type allocator_{};
  std::array<std::uint64_t, N> wear_{};
};

/// N slots without contiguity: the bound no contiguous policy can beat.
template <std::uint32_t N>
class PooledCu {
public:
  static constexpr std::uint32_t slots = N; ///< slots on the unit
  static constexpr bool contiguous = false; ///< placements are counts, not runs

  /// Any m <= free slots fits; the "start" is meaningless, so every fit reports 0.
  std::optional<std::uint32_t> probe(const Request& r) const {
    return r.size <= free_ ? std::optional<std::uint32_t>(0) : std::nullopt;
  }
  /// Takes r.size slots, or nullopt when fewer are free; the range's `first` is always 0.
  std::optional<SlotRange> place(const Request& r) {
    if (r.size > free_) {
      return std::nullopt;
    }
    free_ -= r.size;
    return SlotRange{0, r.size}; // m slots somewhere: only the count matters
  }
  /// Gives range.count slots back; throws carve::Exception (invalid_placement) for more than are taken.
  void release(SlotRange range) {
    if (range.count > N - free_) {
      throw Exception(Errc::invalid_placement, "release: more slots than are taken");
    }
    free_ += range.count;
  }
  /// Free slots.
  std::uint32_t free_count() const { return free_; }
  /// Free slots: as good as one run.
  std::uint32_t largest_free_run() const { return free_; }
  /// 1 while any slot is free, else 0.
  std::uint32_t free_run_count() const { return free_ != 0 ? 1 : 0; }

private:
  std::uint32_t free_ = N;
};

static_assert(ComputeUnit<ContiguousCu<128, BoundaryNearestFit>>);
static_assert(ComputeUnit<ContiguousCu<128, ReleaseAlignedFit>>);
static_assert(ComputeUnit<PooledCu<128>>);

} // namespace carve::sim
