/// @file carve/mirror/page_copies.hpp
/// How a PagedMirror's pages travel: dirty host pages to the devices behind them (sync), device
/// pages back to the host (fetch).
///
/// Both walk the page table in runs of host pages that are contiguous on one device
/// (for_each_device_segment), one backend copy per run, queued on each device's stream so devices
/// copy in parallel; then wait for the devices involved. A copy that fails leaves its pages dirty,
/// so a later sync retries them. The caller holds the mirror's locks.
#pragma once

#include <carve/core/errc.hpp>
#include <carve/mirror/device_segments.hpp>
#include <carve/mirror/mirror_backend.hpp>
#include <carve/mirror/page_table.hpp>
#include <carve/mirror/sync_report.hpp>
#include <carve/mirror/write_tracker.hpp>
#include <carve/slot/storage/slot_range.hpp>

#include <cuda/std/expected>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace carve {

namespace detail {
inline std::size_t bytes_of(const WriteTracker& tracker, std::uint64_t pages) noexcept {
  return static_cast<std::size_t>(pages) * tracker.page_size();
}
inline std::byte* host_address(const WriteTracker& tracker, std::uint32_t page) noexcept {
  return tracker.base() + bytes_of(tracker, page);
}
// A mirror keeps each device's pages at offset page * page_size of the backend's memory there.
inline std::size_t device_offset(const WriteTracker& tracker, std::uint32_t page) noexcept {
  return bytes_of(tracker, page);
}
} // namespace detail

/// An allocation's host pages and its priority.
struct PrioritisedPages {
  int priority = 0; ///< higher syncs first
  SlotRange pages;  ///< the allocation's host pages
};

/// Copies the dirty pages of each of `allocations` to their devices, higher priority first (so
/// their copies land first on every stream), every page when `everything`, and waits for each
/// device of `wait_for`; the report covers `device_count` devices. Errors: device_error (the
/// pages whose copies failed are dirty).
template <MirrorBackend Backend>
[[nodiscard]] cuda::std::expected<SyncReport, Errc>
copy_pages_to_devices(Backend& backend, WriteTracker& tracker, const PageTable& table,
                      std::vector<PrioritisedPages> allocations, bool everything,
                      std::span<const std::uint32_t> wait_for, std::size_t device_count) {
  using detail::bytes_of, detail::device_offset, detail::host_address;
  std::stable_sort(allocations.begin(), allocations.end(),
                   [](const PrioritisedPages& x, const PrioritisedPages& y) { return x.priority > y.priority; });
  SyncReport report;
  report.mechanism = tracker.mechanism();
  report.device_count = static_cast<std::uint32_t>(device_count);
  std::vector<std::vector<SlotRange>> queued(report.device_count); // host pages per device, to redo on failure
  cuda::std::expected<void, Errc> result;
  std::chrono::nanoseconds collect{};
  const auto start = std::chrono::steady_clock::now();
  const auto copy = [&](SlotRange run) {
    for_each_device_segment(table, run, [&](const DeviceSegment& s) {
      const SlotRange host{s.host_page, s.pages};
      auto r = backend.copy_to_device(s.device, device_offset(tracker, s.device_page),
                                      host_address(tracker, s.host_page), bytes_of(tracker, s.pages));
      if (!r) {
        tracker.mark_dirty(host);
        result = r;
        return;
      }
      queued[s.device].push_back(host);
      report.add(s.device, s.pages, bytes_of(tracker, s.pages));
    });
  };
  for (const PrioritisedPages& allocation : allocations) {
    const auto t0 = std::chrono::steady_clock::now();
    if (everything) {
      tracker.harvest(allocation.pages, [](SlotRange) {});
      collect += std::chrono::steady_clock::now() - t0;
      copy(allocation.pages);
    } else {
      std::vector<SlotRange> runs;
      tracker.harvest(allocation.pages, [&](SlotRange run) { runs.push_back(run); });
      collect += std::chrono::steady_clock::now() - t0;
      for (const SlotRange run : runs) {
        copy(run);
      }
    }
  }
  // Every device, not only those copied to now: earlier work on a stream (an allocation's
  // zeroing) must be finished too when sync() says the devices hold what the host holds.
  for (const std::uint32_t d : wait_for) {
    if (auto w = backend.wait(d); !w) {
      for (const SlotRange host : queued[d]) {
        tracker.mark_dirty(host);
      }
      result = w;
    }
  }
  report.collect_time = collect;
  report.copy_time = std::chrono::steady_clock::now() - start - collect;
  if (!result) {
    return cuda::std::unexpected(result.error());
  }
  return report;
}

/// Replaces the host copy of `pages` (mapped; none for an empty range) with what their devices
/// hold and marks them clean; the report covers `device_count` devices. Errors: device_error (the
/// host copy may be partly updated; the pages are dirty).
template <MirrorBackend Backend>
[[nodiscard]] cuda::std::expected<FetchReport, Errc> copy_pages_to_host(Backend& backend, WriteTracker& tracker,
                                                                        const PageTable& table, SlotRange pages,
                                                                        std::size_t device_count) {
  using detail::bytes_of, detail::device_offset, detail::host_address;
  FetchReport report;
  report.mechanism = tracker.mechanism();
  report.device_count = static_cast<std::uint32_t>(device_count);
  if (pages.count == 0) {
    return report;
  }
  report.discarded_dirty_pages = tracker.dirty_count(pages);
  const bool mixed = report.discarded_dirty_pages != 0 && report.discarded_dirty_pages != pages.count;
  const std::vector<bool> was_dirty = mixed ? tracker.dirty_pages(pages) : std::vector<bool>();
  const auto start = std::chrono::steady_clock::now();
  tracker.prepare_host_write(pages);
  cuda::std::expected<void, Errc> result;
  std::vector<bool> used(report.device_count, false);
  for_each_device_segment(table, pages, [&](const DeviceSegment& s) {
    if (!result) {
      return;
    }
    result = backend.copy_to_host(s.device, host_address(tracker, s.host_page), device_offset(tracker, s.device_page),
                                  bytes_of(tracker, s.pages));
    used[s.device] = true;
    report.add(s.device, s.pages, bytes_of(tracker, s.pages));
  });
  for (std::uint32_t d = 0; d < report.device_count; ++d) {
    if (used[d]) {
      if (auto w = backend.wait(d); !w && result) {
        result = w;
      }
    }
  }
  report.copy_time = std::chrono::steady_clock::now() - start;
  if (!result) {
    // A page that was clean stays clean, however much of it was copied: the devices hold its
    // data, and a sync must never push a half-fetched page over them. A dirty one stays dirty.
    if (!mixed) {
      report.discarded_dirty_pages != 0 ? tracker.mark_dirty(pages) : tracker.mark_clean(pages);
    }
    for (std::uint32_t i = 0; mixed && i < pages.count; ++i) { // page by page: a failure's path only
      was_dirty[i] ? tracker.mark_dirty({pages.first + i, 1}) : tracker.mark_clean({pages.first + i, 1});
    }
    return cuda::std::unexpected(result.error());
  }
  tracker.mark_clean(pages);
  return report;
}

} // namespace carve
