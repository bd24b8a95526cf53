// carve/mr/detail/block_lookup.hpp — the block that holds an address, in a map of blocks keyed by
// their start: how the host resources that keep such a map answer owns(p) and find interior
// pointers.
#pragma once

#include <cstdint>
#include <iterator>

namespace carve::detail {

// The entry of `blocks` (start address -> block) whose [start, start + size_of(block)) holds
// `p`; blocks.end() when none does.
template <class Map, class SizeOf>
auto block_containing(Map& blocks, const void* p, SizeOf size_of) {
  const auto addr = reinterpret_cast<std::uintptr_t>(p);
  auto it = blocks.upper_bound(addr);
  if (it == blocks.begin()) {
    return blocks.end();
  }
  --it;
  return addr - it->first < static_cast<std::uintptr_t>(size_of(it->second)) ? it : blocks.end();
}

} // namespace carve::detail
