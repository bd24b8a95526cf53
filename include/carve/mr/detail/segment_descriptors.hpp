/// @file carve/mr/detail/segment_descriptors.hpp
/// What the exporting cards (SharedMemoryCard, VmmCard) do alike with their segment tables: a
/// table maps a segment's start address to a record with the segment's exported descriptor
/// (`int fd`, -1 once handed over), and the card hands that descriptor over and answers owns()
/// from it. Callers hold the table's lock.
#pragma once

#include <carve/mr/detail/block_lookup.hpp>

#include <cstdint>
#include <optional>
#include <utility>

namespace carve::detail {

/// Hands the descriptor of the segment starting at `base` over to the caller, who closes it:
/// the record keeps -1. nullopt for an unknown segment or one whose descriptor is gone already.
template <class Segments>
std::optional<int> release_segment_descriptor(Segments& segments, const void* base) noexcept {
  const auto it = segments.find(reinterpret_cast<std::uintptr_t>(base));
  if (it == segments.end() || it->second.fd < 0) {
    return std::nullopt;
  }
  return std::exchange(it->second.fd, -1);
}

/// Whether `p` lies in a segment of `segments`, each `size_of(record)` bytes long.
template <class Segments, class SizeOf>
bool segment_holds(const Segments& segments, const void* p, SizeOf size_of) noexcept {
  return block_containing(segments, p, size_of) != segments.end();
}

} // namespace carve::detail
