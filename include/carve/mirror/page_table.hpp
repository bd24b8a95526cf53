/// @file carve/mirror/page_table.hpp
/// Which device page stands behind each host page of a mirror.
///
/// One 8-byte entry per host page in a LazyArray, so a table for 1 TiB of 4 KiB pages (2 GiB of
/// entries) costs memory only where allocations have mapped pages. An all-zero entry means
/// "unmapped", which is what untouched memory reads as. Not synchronised: PagedMirror changes it
/// under its own lock.
#pragma once

#include <carve/mirror/reserved_memory.hpp>
#include <carve/slot/storage/slot_range.hpp>

#include <cstdint>
#include <optional>

namespace carve {

/// Where a host page lives: a page of one device.
struct PageLocation {
  std::uint32_t device = 0; ///< the device's index in the backend
  std::uint32_t page = 0;   ///< page index within the device's mirror memory
  /// Equal when both fields are.
  friend bool operator==(const PageLocation&, const PageLocation&) = default;
};

/// Host page -> PageLocation, for `host_pages` pages; every page unmapped at first. One owner.
class PageTable {
public:
  /// Entries reserved, not committed. Throws carve::Exception (no_space) when the
  /// kernel refuses the reservation.
  explicit PageTable(std::uint32_t host_pages) : entries_(host_pages) {}

  /// Host pages covered.
  std::uint32_t size() const noexcept { return static_cast<std::uint32_t>(entries_.size()); }

  /// Host page `host_page` (< size()) now lives at `at`.
  void map(std::uint32_t host_page, PageLocation at) noexcept {
    entries_[host_page] = (std::uint64_t{at.device} + 1) << 32 | at.page;
  }
  /// Host pages in the range (within size()) live nowhere.
  void unmap(SlotRange host_pages) noexcept {
    for (std::uint64_t p = host_pages.first; p < host_pages.end(); ++p) {
      entries_[p] = 0;
    }
  }
  /// Where host page `host_page` (< size()) lives; nothing when unmapped.
  std::optional<PageLocation> find(std::uint32_t host_page) const noexcept {
    const std::uint64_t e = entries_[host_page];
    if (e == 0) {
      return std::nullopt;
    }
    return PageLocation{static_cast<std::uint32_t>((e >> 32) - 1), static_cast<std::uint32_t>(e)};
  }

private:
  LazyArray<std::uint64_t> entries_;
};

} // namespace carve
