/// @file carve/vmm/detail/partial_map_probe.hpp
/// Asks a mapper's driver whether it maps part of a physical allocation, the way ExpandablePool
/// lends a hole, and checks that the part it maps holds the allocation's bytes from the offset.
///
/// CUDA documents that cuMemMap's offset "currently must be zero". A driver may refuse a part
/// (the answer is no), take it (yes), or take the call and map something else: a pool that lent
/// holes there would hand out memory live blocks use. So the probe writes each granule of a
/// three-granule allocation through its whole mapping and reads it back through the parts: its
/// last two granules (offset one granule) and its first (offset 0, fewer bytes than it holds).
#pragma once

#include <carve/core/error.hpp>
#include <carve/vmm/physical_memory_mapper.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace carve::detail {

/// What a driver said about mapping part of an allocation.
struct PartialMapAnswer {
  bool maps = false; ///< a part maps, opens to the device and shows the allocation's bytes
  std::string why;   ///< for a no: the call refused (with the driver's message) or what the part showed
};

/// Asks `mapper` about `device` (see the file's description). `fill(va, byte, bytes)` sets
/// device memory and `read(va, out, bytes)` copies it to the host; both return Result<void>.
/// A part's map or opening refused for any reason but out of memory is the answer no. Errors
/// (no answer): the mapper's where the question could not be put (out of memory, the whole
/// allocation not mapped or opened, a fill or read that failed) or a mapping would not unmap
/// (then the reservation is left, not freed under the mapping). The handle is always released.
template <PhysicalMemoryMapper Mapper, class Fill, class Read>
[[nodiscard]] Result<PartialMapAnswer> probe_partial_maps(Mapper& mapper, int device, Fill fill, Read read) {
  const auto g = mapper.granularity(device);
  if (!g) {
    return cuda::std::unexpected(g.error());
  }
  const std::size_t granule = *g;
  const auto h = mapper.create(device, 3 * granule);
  if (!h) {
    return cuda::std::unexpected(h.error());
  }
  const auto va = mapper.reserve(6 * granule, granule);
  if (!va) {
    (void)mapper.release(*h);
    return cuda::std::unexpected(va.error());
  }
  const auto at = [&](std::size_t granules) {
    return static_cast<void*>(static_cast<char*>(*va) + granules * granule);
  };
  const auto pattern = [](std::size_t granule_index) { return static_cast<std::uint8_t>(0xa0 + granule_index); };
  // Where each part goes, and which granules of the allocation it holds.
  struct Part {
    std::size_t at, first, granules;
  };
  constexpr std::array<Part, 2> parts{{{3, 1, 2}, {5, 0, 1}}};
  // The answer, or the error that kept it from being found; `mapped` says which parts to unmap.
  Result<PartialMapAnswer> answer = PartialMapAnswer{true, {}};
  std::array<bool, 2> mapped{};
  const auto no = [&](const Error& e) {
    answer = e.code == Errc::no_space ? Result<PartialMapAnswer>(cuda::std::unexpect, e)
                                      : Result<PartialMapAnswer>(PartialMapAnswer{false, e.message});
  };
  const auto whole = mapper.map(at(0), 3 * granule, *h, 0);
  if (!whole) {
    answer = cuda::std::unexpected(whole.error());
  } else if (auto opened = mapper.set_access(at(0), 3 * granule, device, Access::read_write); !opened) {
    answer = cuda::std::unexpected(opened.error());
  } else {
    for (std::size_t i = 0; i < 3 && answer; ++i) {
      if (Result<void> filled = fill(at(i), pattern(i), granule); !filled) {
        answer = cuda::std::unexpected(filled.error());
      }
    }
    for (std::size_t k = 0; k < parts.size() && answer && answer->maps; ++k) {
      const Part& p = parts[k];
      if (auto m = mapper.map(at(p.at), p.granules * granule, *h, p.first * granule); !m) {
        no(m.error());
        break;
      }
      mapped[k] = true;
      if (auto open = mapper.set_access(at(p.at), p.granules * granule, device, Access::read_write); !open) {
        no(open.error());
        break;
      }
      for (std::size_t i = 0; i < p.granules && answer; ++i) {
        std::array<std::uint8_t, 2> ends{}; // the granule's first and last byte
        const auto* base = static_cast<const char*>(at(p.at + i));
        const Result<void> first = read(base, &ends[0], 1);
        const Result<void> last = first ? Result<void>(read(base + granule - 1, &ends[1], 1)) : first;
        if (!last) {
          answer = cuda::std::unexpected(last.error());
        } else if (ends[0] != pattern(p.first + i) || ends[1] != pattern(p.first + i)) {
          answer = PartialMapAnswer{false, "map: " + std::to_string(p.granules * granule) + " bytes from offset " +
                                               std::to_string(p.first * granule) +
                                               " mapped, but they do not show the allocation's bytes there"};
        }
      }
    }
  }
  // Unmap the parts, then the whole; a mapping that stays keeps its reservation.
  Result<void> unmapped{};
  for (std::size_t k = 0; k < parts.size(); ++k) {
    if (mapped[k]) {
      if (auto u = mapper.unmap(at(parts[k].at), parts[k].granules * granule); !u && unmapped) {
        unmapped = u;
      }
    }
  }
  if (whole) {
    if (auto u = mapper.unmap(at(0), 3 * granule); !u && unmapped) {
      unmapped = u;
    }
  }
  if (unmapped) {
    (void)mapper.free_reservation(*va, 6 * granule);
  }
  (void)mapper.release(*h); // a handle may go while it is mapped: its memory goes with the last mapping
  if (!unmapped) {
    return cuda::std::unexpected(unmapped.error());
  }
  return answer;
}

} // namespace carve::detail
