/// @file carve/queue/drain_view.hpp
/// What a drain policy sees of a SizeTieredQueue during one pop (SizeTieredQueue::View): the
/// tiers, which of them this pop already found empty, the stamp at the head of each lane and the
/// time. drain_policy.hpp states what a policy may rely on; this is the queue's implementation.
#pragma once

#include <carve/core/config.hpp>
#include <carve/queue/force_inline.hpp>
#include <carve/queue/lane.hpp>

#include <cuda/atomic>
#include <cuda/std/cstdint>
#include <cuda/std/optional>

namespace carve::detail {

// A view over a queue's TieredLanes (`Lanes`), with stamps from `Clock`. Lives for one pop call.
template <class Lanes, class Clock>
class TieredDrainView {
  using T = typename Lanes::value_type;
  using L = typename Lanes::lane_type;

public:
  static constexpr cuda::thread_scope scope = Lanes::scope; ///< for the policy's own atomics
  /// Over `lanes`, with `tried` the bit mask of tiers this pop found empty (the pop updates it
  /// as it goes).
  CARVE_HOST_DEVICE TieredDrainView(const Lanes& lanes, const std::uint32_t& tried) noexcept
      : lanes_(lanes), tried_(tried) {}
  /// The queue's tiers.
  CARVE_HOST_DEVICE std::uint32_t tier_count() const noexcept { return lanes_.built(); }
  /// Whether this pop already found `tier` empty.
  CARVE_HOST_DEVICE bool known_empty(std::uint32_t tier) const noexcept { return ((tried_ >> tier) & 1U) != 0; }
  /// The stamp of the request `tier`'s next pop takes (a hint): the oldest put back (stamped when
  /// it was put back), else the oldest in its lane; nullopt when no head is visible or the lane
  /// cannot peek.
  CARVE_HOST_DEVICE CARVE_QUEUE_INLINE cuda::std::optional<std::uint64_t>
  head_stamp(std::uint32_t tier) const noexcept {
    if constexpr (PeekableLane<L, T>) {
      return lanes_.head_stamp(tier);
    } else {
      return cuda::std::nullopt;
    }
  }
  /// head_stamp() into `stamp`, or false (detail::head_stamp_into uses it where a view has it).
  CARVE_HOST_DEVICE CARVE_QUEUE_INLINE bool head_stamp_into(std::uint32_t tier, std::uint64_t& stamp) const noexcept {
    if constexpr (requires(const L& l, std::uint64_t& s) { l.peek_stamp(s); }) {
      return lanes_.head_stamp_into(tier, stamp);
    } else {
      const cuda::std::optional<std::uint64_t> s = head_stamp(tier);
      stamp = s.value_or(0);
      return s.has_value();
    }
  }
  /// Clock ticks, read on the first call of the pop, so that a pop nothing asks the time of
  /// does not read it.
  CARVE_HOST_DEVICE std::uint64_t now() const noexcept {
    if (!have_now_) {
      now_ = Clock::now();
      have_now_ = true;
    }
    return now_;
  }

private:
  const Lanes& lanes_;
  const std::uint32_t& tried_;
  mutable std::uint64_t now_ = 0;
  mutable bool have_now_ = false;
};

} // namespace carve::detail
