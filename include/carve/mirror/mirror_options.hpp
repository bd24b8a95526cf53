/// @file carve/mirror/mirror_options.hpp
/// What a PagedMirror is built with and told per allocation, and how it describes where memory is.
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
};

/// Where an allocation's pages should go: its priority (higher syncs first) and the device that
/// will use it (placement policies that care put its pages there or close).
struct MirrorHint {
  int priority = 0;                                 ///< higher syncs first
  std::optional<std::uint32_t> near = std::nullopt; ///< the device that will use the memory
};

/// A piece of mirror memory that lives in one run of one device's pages.
struct MirrorSegment {
  std::uint32_t device = 0;      ///< the device's index in the backend
  std::size_t device_offset = 0; ///< into the backend's memory for the mirror on that device
  std::byte* host = nullptr;     ///< the piece's host address
  std::size_t bytes = 0;         ///< the piece's size
};

} // namespace carve
