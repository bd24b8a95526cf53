/// @file carve/mirror/sync_report.hpp
/// What a sync() or fetch() moved, per device.
#pragma once

#include <carve/mirror/write_tracking.hpp>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>

namespace carve {

/// The most devices one PagedMirror spans (reports keep a fixed slot per device, so that they are
/// plain values: no allocation when a sync reports).
inline constexpr std::size_t max_mirror_devices = 64;

/// What moved to or from one device.
struct DeviceTransferStats {
  std::uint64_t pages = 0;  ///< pages copied
  std::uint64_t bytes = 0;  ///< bytes copied
  std::uint64_t copies = 0; ///< after coalescing: one per run of pages contiguous on both sides
};

/// What one sync() moved, in all and per device.
struct SyncReport {
  std::uint64_t pages = 0;                 ///< pages copied
  std::uint64_t bytes = 0;                 ///< always pages x page size: only whole dirty pages move
  std::uint64_t copies = 0;                ///< copies queued, after coalescing
  std::chrono::nanoseconds collect_time{}; ///< finding the dirty pages and write-protecting them again
  std::chrono::nanoseconds copy_time{};    ///< queuing the copies and waiting for every device
  TrackingMechanism mechanism = TrackingMechanism::explicit_calls; ///< how dirty pages were found
  std::uint32_t device_count = 0;                                  ///< the mirror's devices
  std::array<DeviceTransferStats, max_mirror_devices> devices{};   ///< the first device_count are used

  /// The used entries of `devices`.
  std::span<const DeviceTransferStats> per_device() const noexcept { return {devices.data(), device_count}; }

  /// Counts one copy of `page_count` pages (`byte_count` bytes) on `device` (< max_mirror_devices).
  void add(std::uint32_t device, std::uint64_t page_count, std::uint64_t byte_count) noexcept {
    devices[device].pages += page_count;
    devices[device].bytes += byte_count;
    devices[device].copies += 1;
    pages += page_count;
    bytes += byte_count;
    copies += 1;
  }
};

/// What one fetch() moved, and which host writes it overwrote.
struct FetchReport : SyncReport {
  /// Pages in the range that were dirty: their host writes since the last sync were replaced by
  /// the device's contents.
  std::uint64_t discarded_dirty_pages = 0;
};

} // namespace carve
