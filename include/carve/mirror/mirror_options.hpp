/// @file carve/mirror/mirror_options.hpp
/// What a PagedMirror is built with and told per allocation.
#pragma once

#include <carve/mirror/priority_dispatcher.hpp>
#include <carve/mirror/write_tracking.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>

namespace carve {

/// How a PagedMirror is built.
struct MirrorOptions {
  /// A power of two, a multiple of the OS page, at most 1 GiB: 4 KiB, 64 KiB, 2 MiB.
  std::size_t page_size = std::size_t{64} << 10;
  /// Plain stores are seen unless asked otherwise: userfaultfd write-protection where the kernel
  /// has it (Linux >= 6.7), else mprotect (see write_tracking.hpp). explicit_calls is cheaper but
  /// syncs only what write() and mark_dirty() name.
  WriteTracking tracking = WriteTracking::automatic;
  DispatchOrder dispatch_order = DispatchOrder::strict_priority; ///< for submit / dispatch
  /// true: every allocation also gets a device view, one device pointer over all its pages
  /// (device_pointer; see carve/mirror/device_view.hpp). The backend must be a DeviceViewBackend
  /// and page_size a multiple of every device's granularity (2 MiB on today's GPUs), else
  /// construction throws carve::Exception (unsupported, invalid_argument).
  bool device_view = false;
};

/// Where an allocation's pages should go: its priority (higher syncs first) and the device that
/// will use it (placement policies that care put its pages there or close).
struct MirrorHint {
  int priority = 0; ///< higher syncs first
  /// The device that will use the memory: with a device view, the one that runs the kernel over
  /// device_pointer (PickerPlacement puts the pages there first, then on the peers its loads read
  /// fastest from).
  std::optional<std::uint32_t> near = std::nullopt;
};

} // namespace carve
