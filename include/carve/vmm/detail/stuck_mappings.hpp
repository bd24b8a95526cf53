// carve/vmm/detail/stuck_mappings.hpp — mappings an OnDemandReservation made and could not undo:
// the device refused to open a new mapping, then the mapper refused to unmap it. Kept out of the
// reservation's tables, so no block is placed on them, and unmapped (their memory released) once
// the mapper lets them go.
#pragma once

#include <carve/vmm/mapping_counts.hpp>

#include <cstddef>
#include <optional>
#include <vector>

namespace carve::detail {

// Not thread-safe: the reservation's owner holds its lock around every call.
template <class Mapper>
class StuckMappings {
public:
  using handle_type = typename Mapper::physical_handle;

  // Room for one more, made before the driver calls that might leave one. Throws std::bad_alloc.
  void make_room() { stuck_.reserve(stuck_.size() + 1); }

  // Keeps the mapping of `bytes` at `va`; `memory`: its own allocation, released with it (nullopt
  // for a second mapping of another chunk's memory). After make_room(): cannot fail.
  void keep(void* va, std::size_t bytes, std::optional<handle_type> memory) noexcept {
    stuck_.push_back(Stuck{va, bytes, memory});
    held_ += memory ? bytes : 0;
  }

  // The bytes of their own memory held now.
  std::size_t held_bytes() const noexcept { return held_; }

  // Unmaps those the mapper now lets go, releasing their own memory; returns the bytes released.
  std::size_t unmap(Mapper& mapper, MappingCounts& counts) noexcept {
    std::size_t released = 0;
    for (auto it = stuck_.begin(); it != stuck_.end();) {
      ++counts.unmaps;
      if (!mapper.unmap(it->va, it->bytes)) {
        ++counts.failures;
        ++it;
        continue;
      }
      if (it->memory) {
        ++counts.releases;
        (void)mapper.release(*it->memory);
        released += it->bytes;
        held_ -= it->bytes;
      }
      it = stuck_.erase(it);
    }
    return released;
  }

private:
  struct Stuck {
    void* va;
    std::size_t bytes;
    std::optional<handle_type> memory;
  };
  std::vector<Stuck> stuck_;
  std::size_t held_ = 0;
};

} // namespace carve::detail
