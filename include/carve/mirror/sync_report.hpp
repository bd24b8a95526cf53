// carve/mirror/sync_report.hpp — what a sync() or fetch() moved, per device.
#pragma once

#include <carve/mirror/write_tracking.hpp>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>

namespace carve {

// The most devices one PagedMirror spans (reports keep a fixed slot per device, so that they are
// plain values: no allocation when a sync reports).
inline constexpr std::size_t max_mirror_devices = 64;

struct DeviceTransferStats {
  std::uint64_t pages = 0;
  std::uint64_t bytes = 0;
  std::uint64_t copies = 0; // after coalescing: one per run of pages contiguous on both sides
};

struct SyncReport {
  std::uint64_t pages = 0;
  std::uint64_t bytes = 0; // always pages x page size: only whole dirty pages move
  std::uint64_t copies = 0;
  std::chrono::nanoseconds collect_time{}; // finding the dirty pages and write-protecting them again
  std::chrono::nanoseconds copy_time{};    // queuing the copies and waiting for every device
  TrackingMechanism mechanism = TrackingMechanism::explicit_calls;
  std::uint32_t device_count = 0;
  std::array<DeviceTransferStats, max_mirror_devices> devices{}; // the first device_count are used

  std::span<const DeviceTransferStats> per_device() const noexcept { return {devices.data(), device_count}; }

  void add(std::uint32_t device, std::uint64_t page_count, std::uint64_t byte_count) noexcept {
    devices[device].pages += page_count;
    devices[device].bytes += byte_count;
    devices[device].copies += 1;
    pages += page_count;
    bytes += byte_count;
    copies += 1;
  }
};

struct FetchReport : SyncReport {
  // Pages in the range that were dirty: their host writes since the last sync were replaced by
  // the device's contents.
  std::uint64_t discarded_dirty_pages = 0;
};

} // namespace carve
