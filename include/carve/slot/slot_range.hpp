// carve/slot/slot_range.hpp — a run of contiguous slots: what an allocation hands out.
#pragma once

#include <carve/core/config.hpp>

#include <cuda/std/cstdint>

namespace carve {

struct SlotRange {
  std::uint32_t first;
  std::uint32_t count;

  // One past the last slot, widened so that a range reaching past 2^32 does not wrap.
  CARVE_HOST_DEVICE constexpr std::uint64_t end() const noexcept { return std::uint64_t{first} + count; }

  friend CARVE_HOST_DEVICE constexpr bool operator==(const SlotRange& a, const SlotRange& b) noexcept {
    return a.first == b.first && a.count == b.count;
  }
};

} // namespace carve
