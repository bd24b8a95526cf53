// carve/mirror/page_table.hpp — which device page stands behind each host page of a mirror.
//
// One 8-byte entry per host page in a LazyArray, so a table for 1 TiB of 4 KiB pages (2 GiB of
// entries) costs memory only where allocations have mapped pages. An all-zero entry means
// "unmapped", which is what untouched memory reads as. Not synchronised: PagedMirror changes it
// under its own lock.
#pragma once

#include <carve/mirror/reserved_memory.hpp>
#include <carve/slot/storage/slot_range.hpp>

#include <cstdint>
#include <optional>

namespace carve {

struct PageLocation {
  std::uint32_t device = 0;
  std::uint32_t page = 0; // page index within the device's mirror memory
  friend bool operator==(const PageLocation&, const PageLocation&) = default;
};

class PageTable {
public:
  explicit PageTable(std::uint32_t host_pages) : entries_(host_pages) {}

  std::uint32_t size() const noexcept { return static_cast<std::uint32_t>(entries_.size()); }

  void map(std::uint32_t host_page, PageLocation at) noexcept {
    entries_[host_page] = (std::uint64_t{at.device} + 1) << 32 | at.page;
  }
  void unmap(SlotRange host_pages) noexcept {
    for (std::uint64_t p = host_pages.first; p < host_pages.end(); ++p) {
      entries_[p] = 0;
    }
  }
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
