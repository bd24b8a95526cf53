/// @file carve/mirror/placement.hpp
/// Which devices hold a new allocation's pages: the policy concept and two policies.
///
/// @code
/// struct MyPlacement {
///   cuda::std::expected<carve::PlacementPlan, carve::Errc>
///   place(const carve::PlacementRequest& request, std::span<const carve::DevicePageState> devices);
/// };
/// @endcode
///
/// A plan is a list of (device, pages) chunks in host-address order: the allocation's first
/// chunk.pages host pages go to the first chunk's device, and so on. Semantic requirements: the
/// chunks add up to request.pages; no device gets more pages than it has free; unavailable devices
/// get none; when that is impossible, place() returns Errc::no_space. PagedMirror checks every plan
/// before using it and refuses a broken one with Errc::invalid_placement. place() may keep state
/// (a striping cursor); PagedMirror calls it under its lock.
///
/// carve ships FillPlacement (device by device), StripePlacement (round robin in stripes) and
/// PickerPlacement (carve/mirror/picker_placement.hpp: near the device that will use the memory,
/// else on the best connected one, as BandwidthWeightedPicker decides).
#pragma once

#include <carve/core/errc.hpp>

#include <cuda/std/expected>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace carve {

/// One device's pages, as a placement policy sees them.
struct DevicePageState {
  std::uint32_t free_pages = 0;  ///< pages not holding any allocation
  std::uint32_t total_pages = 0; ///< pages the mirror may use on the device
  bool available = true;         ///< false: the policy must give it no pages
};

/// A new allocation to place.
struct PlacementRequest {
  std::uint32_t pages = 0;             ///< pages to place
  std::size_t page_size = 0;           ///< the mirror's page size in bytes
  int priority = 0;                    ///< the allocation's priority (higher syncs first)
  std::optional<std::uint32_t> near{}; ///< the device that will use the memory, when known
};

/// `pages` consecutive host pages of an allocation on `device`.
struct PlacementChunk {
  std::uint32_t device = 0; ///< the device's index in the backend
  std::uint32_t pages = 0;  ///< pages in the chunk
  /// Equal when both fields are.
  friend bool operator==(const PlacementChunk&, const PlacementChunk&) = default;
};

/// Chunks in host-address order, adding up to the request's pages.
using PlacementPlan = std::vector<PlacementChunk>;

/// A policy that places an allocation's pages on devices (see the file's description for the
/// semantic requirements).
template <class P>
concept PagePlacement = requires(P& p, const PlacementRequest& r, std::span<const DevicePageState> devices) {
  { p.place(r, devices) } -> std::same_as<cuda::std::expected<PlacementPlan, Errc>>;
};

namespace detail {
inline std::uint64_t usable_pages(std::span<const DevicePageState> devices) noexcept {
  std::uint64_t n = 0;
  for (const DevicePageState& d : devices) {
    n += d.available ? d.free_pages : 0;
  }
  return n;
}
// Appends pages for a device, merging with the previous chunk when it is the same device.
inline void append(PlacementPlan& plan, std::uint32_t device, std::uint32_t pages) {
  if (!plan.empty() && plan.back().device == device) {
    plan.back().pages += pages;
  } else {
    plan.push_back({device, pages});
  }
}
} // namespace detail

/// Device 0 until it is full, then device 1, ...: an allocation spans as few devices as possible.
struct FillPlacement {
  static constexpr const char* name = "fill"; ///< for reports

  /// The plan, or no_space when the available devices' free pages cannot hold the request.
  [[nodiscard]] cuda::std::expected<PlacementPlan, Errc> place(const PlacementRequest& r,
                                                               std::span<const DevicePageState> devices) const {
    if (detail::usable_pages(devices) < r.pages) {
      return cuda::std::unexpected(Errc::no_space);
    }
    PlacementPlan plan;
    std::uint32_t left = r.pages;
    for (std::uint32_t d = 0; d < devices.size() && left != 0; ++d) {
      const std::uint32_t take = devices[d].available ? std::min(left, devices[d].free_pages) : 0;
      if (take != 0) {
        detail::append(plan, d, take);
        left -= take;
      }
    }
    return plan;
  }
};

/// Stripes of `stripe_pages` pages dealt round robin over the devices with room, starting where
/// the previous allocation stopped, so every device carries a share of every large allocation
/// (their copies run in parallel) and small allocations spread out. A stripe is contiguous in host
/// addresses and, when the device has such a run free, in device pages, so a dirty stripe is one
/// copy.
struct StripePlacement {
  static constexpr const char* name = "stripe"; ///< for reports
  std::uint32_t stripe_pages = 16;              ///< pages per stripe
  std::uint32_t next_device = 0;                ///< where the next allocation starts

  /// The plan, moving the cursor on. Errors: invalid_size for stripe_pages == 0; no_space when the
  /// available devices' free pages cannot hold the request.
  [[nodiscard]] cuda::std::expected<PlacementPlan, Errc> place(const PlacementRequest& r,
                                                               std::span<const DevicePageState> devices) {
    if (stripe_pages == 0) {
      return cuda::std::unexpected(Errc::invalid_size);
    }
    if (detail::usable_pages(devices) < r.pages) {
      return cuda::std::unexpected(Errc::no_space);
    }
    std::vector<std::uint32_t> room(devices.size());
    for (std::size_t d = 0; d < devices.size(); ++d) {
      room[d] = devices[d].available ? devices[d].free_pages : 0;
    }
    const auto n = static_cast<std::uint32_t>(devices.size());
    PlacementPlan plan;
    std::uint32_t left = r.pages;
    std::uint32_t d = n == 0 ? 0 : next_device % n;
    while (left != 0) {
      const std::uint32_t take = std::min({left, stripe_pages, room[d]});
      if (take != 0) {
        detail::append(plan, d, take);
        room[d] -= take;
        left -= take;
      }
      d = (d + 1) % n;
    }
    next_device = d;
    return plan;
  }
};

static_assert(PagePlacement<FillPlacement>);
static_assert(PagePlacement<StripePlacement>);

} // namespace carve
