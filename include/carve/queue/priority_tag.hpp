/// @file carve/queue/priority_tag.hpp
/// PriorityTag: the single-queue variant, where a request's size
/// becomes a priority tag.
///
/// The queue behaves as one queue: one capacity bound shared by all requests (the capacity
/// given to the SizeTieredQueue is the total), and requests leave in order of (tag, arrival):
/// the lowest tag first, and among requests with equal tags the one that arrived first, whatever
/// tier it sits in. By default a tier's tag is its index (tier 0, the smallest requests, first);
/// tags of your own regroup tiers:
///
/// @code
/// carve::PriorityTag{}                  // tags 0, 1, 2: smallest first
/// carve::PriorityTag({0, 0, 1})         // small and medium by arrival, then large
/// carve::PriorityTag({0, 0, 0})         // one FIFO by arrival (up to clock resolution)
/// @endcode
///
/// Arrival order between tiers comes from the push stamps, so it needs a PeekableLane, and is
/// exact to the clock's resolution (requests stamped in the same tick go lowest tier first).
#pragma once

#include <carve/core/config.hpp>
#include <carve/queue/drain_policy.hpp>
#include <carve/queue/force_inline.hpp>
#include <carve/queue/tier_thresholds.hpp>

#include <cuda/std/cstddef>
#include <cuda/std/cstdint>
#include <cuda/std/expected>
#include <cuda/std/optional>
#include <cuda/std/span>

namespace carve {

/// A DrainPolicy that makes the queue one queue ordered by (tag, arrival), with one capacity for
/// all tiers (see the file's description). Its calls write nothing: safe to share between
/// consumers.
class PriorityTag {
public:
  static constexpr const char* name = "priority tag (one queue)"; ///< for reports
  static constexpr bool needs_head_stamps = true;                 ///< compares heads across tiers
  static constexpr bool shared_capacity = true;                   ///< one bound for the whole queue

  /// Each tier's tag is its index: smallest requests first.
  constexpr PriorityTag() noexcept = default;
  /// One tag per tier, lowest served first (at most max_tiers are kept; prepare() checks the count).
  CARVE_HOST_DEVICE constexpr explicit PriorityTag(cuda::std::span<const std::uint32_t> tags) noexcept
      : tags_(tags), custom_(true) {}
  /// `PriorityTag({0, 0, 1})`.
  template <cuda::std::size_t K>
  CARVE_HOST_DEVICE constexpr explicit PriorityTag(const std::uint32_t (&tags)[K]) noexcept
      : PriorityTag(cuda::std::span<const std::uint32_t>(tags, K)) {}

  /// Sets the default tags; Errc::invalid_argument when tags of your own are not one per tier.
  template <class Clock>
  [[nodiscard]] CARVE_HOST_DEVICE constexpr cuda::std::expected<void, Errc> prepare(std::uint32_t tiers) noexcept {
    if (!custom_) {
      for (std::uint32_t t = 0; t < tiers; ++t) {
        tags_.values[t] = t;
      }
      tags_.count = tiers;
    }
    if (!tags_.fit(tiers, 0, ~std::uint32_t{0})) {
      return cuda::std::unexpected(Errc::invalid_argument);
    }
    return {};
  }

  /// Arrival order matters only between tiers that share a tag; with distinct tags (the default)
  /// the order is by tag alone, and the queue need not stamp every request.
  CARVE_HOST_DEVICE constexpr bool reads_stamps() const noexcept {
    const cuda::std::span<const std::uint32_t> tags = tags_.given();
    for (std::uint32_t a = 0; a < tags.size(); ++a) {
      for (std::uint32_t b = a + 1; b < tags.size(); ++b) {
        if (tags_[a] == tags_[b]) {
          return true;
        }
      }
    }
    return false;
  }

  /// The tier whose visible head has the lowest (tag, stamp); with no head visible, the first
  /// tier this pop has not found empty.
  template <class View>
  CARVE_HOST_DEVICE CARVE_QUEUE_INLINE cuda::std::optional<std::uint32_t> pick(const View& view) const noexcept {
    std::uint32_t best = detail::no_tier;
    std::uint64_t best_stamp = 0;
    for (std::uint32_t t = 0; t < view.tier_count(); ++t) {
      if (view.known_empty(t)) {
        continue;
      }
      std::uint64_t stamp = 0;
      if (!detail::head_stamp_into(view, t, stamp)) {
        continue; // empty, or its head is still being written
      }
      if (best == detail::no_tier || tags_[t] < tags_[best] || (tags_[t] == tags_[best] && stamp < best_stamp)) {
        best = t;
        best_stamp = stamp;
      }
    }
    // No head visible: let the queue try the tiers in order (each try settles one of them).
    return detail::as_pick(best != detail::no_tier ? best : detail::first_untried(view, 0));
  }

  /// Nothing to record.
  template <class View>
  CARVE_HOST_DEVICE void served(const View&, std::uint32_t, std::uint64_t) const noexcept {}

  /// The tag of `tier` (< max_tiers; the defaults only once prepared).
  CARVE_HOST_DEVICE constexpr std::uint32_t tag(std::uint32_t tier) const noexcept { return tags_[tier]; }

private:
  detail::TierValues<std::uint32_t> tags_;
  bool custom_ = false;
};

static_assert(DrainPolicy<PriorityTag>);

} // namespace carve
