/// @file carve/mirror/device_segments.hpp
/// A run of host pages cut into pieces that are contiguous on one device; a range of mirror
/// memory cut the same way (MirrorSegment).
///
/// Adjacent host pages become one copy when the page table puts them on the same device at
/// consecutive device pages; that is all coalescing needs, and why the placement policies and the
/// device page allocator try to give an allocation long runs.
#pragma once

#include <carve/mirror/page_table.hpp>
#include <carve/slot/storage/slot_range.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace carve {

/// Host pages [host_page, host_page + pages) held at device pages [device_page, ...) of `device`.
struct DeviceSegment {
  std::uint32_t device = 0;      ///< the device's index in the backend
  std::uint32_t host_page = 0;   ///< first host page
  std::uint32_t device_page = 0; ///< its page in the device's mirror memory
  std::uint32_t pages = 0;       ///< pages in the piece
  /// Equal when every field is.
  friend bool operator==(const DeviceSegment&, const DeviceSegment&) = default;
};

/// Calls f(DeviceSegment) for each maximal piece of `host_pages` in address order; unmapped
/// pages are skipped (callers pass mapped ranges).
template <class F>
void for_each_device_segment(const PageTable& table, SlotRange host_pages, F&& f) {
  DeviceSegment seg;
  for (std::uint32_t p = host_pages.first; p < host_pages.end(); ++p) {
    const auto at = table.find(p);
    if (!at) {
      continue; // unmapped: not part of any allocation (callers pass mapped ranges)
    }
    if (seg.pages != 0 && at->device == seg.device && at->page == seg.device_page + seg.pages &&
        p == seg.host_page + seg.pages) {
      ++seg.pages;
      continue;
    }
    if (seg.pages != 0) {
      f(seg);
    }
    seg = {at->device, p, at->page, 1};
  }
  if (seg.pages != 0) {
    f(seg);
  }
}

/// A piece of mirror memory that lives in one run of one device's pages.
struct MirrorSegment {
  std::uint32_t device = 0;      ///< the device's index in the backend
  std::size_t device_offset = 0; ///< into the backend's memory for the mirror on that device
  std::byte* host = nullptr;     ///< the piece's host address
  std::size_t bytes = 0;         ///< the piece's size
};

/// The pieces of [begin, begin + n) (inside host pages `pages` of a mirror whose host range
/// starts at `host_base`) that are contiguous on one device, in address order.
inline std::vector<MirrorSegment> clip_segments(const PageTable& table, SlotRange pages, std::byte* host_base,
                                                std::size_t page_size, const std::byte* begin, std::size_t n) {
  std::vector<MirrorSegment> out;
  const std::byte* end = begin + n;
  for_each_device_segment(table, pages, [&](const DeviceSegment& s) {
    std::byte* host = host_base + std::size_t{s.host_page} * page_size;
    const std::byte* lo = std::max<const std::byte*>(host, begin);
    const std::byte* hi = std::min<const std::byte*>(host + std::size_t{s.pages} * page_size, end);
    if (lo < hi) {
      out.push_back({s.device, std::size_t{s.device_page} * page_size + static_cast<std::size_t>(lo - host),
                     host + (lo - host), static_cast<std::size_t>(hi - lo)});
    }
  });
  return out;
}

} // namespace carve
