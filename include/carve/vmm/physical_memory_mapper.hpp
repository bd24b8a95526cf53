/// @file carve/vmm/physical_memory_mapper.hpp
/// Physical memory and the addresses it is mapped at, kept apart: the protocol of CUDA's virtual
/// memory management API, as a concept with two models.
///
/// @code
/// auto g = *mapper.granularity(device);                  // 2 MiB on today's GPUs
/// auto h = *mapper.create(device, bytes);                // bytes: a multiple of g
/// int fd = *mapper.export_fd(h);                         // send it with SCM_RIGHTS
/// // another process:
/// auto h2 = *mapper.import_fd(fd);
/// void* va = *mapper.reserve(bytes, g);                  // addresses, no memory yet
/// mapper.map(va, bytes, h2);                             // memory at them, nobody may touch it
/// mapper.map(va2, g, h2, g);                             // its second granule again, at va2
/// mapper.set_access(va, bytes, device, carve::Access::read_write);
/// mapper.release(h2);                                    // the mapping keeps the memory
/// ...
/// mapper.unmap(va, bytes);
/// mapper.free_reservation(va, bytes);
/// @endcode
///
/// Why this shape: legacy CUDA IPC exports a whole cudaMalloc allocation at a 1 MiB-aligned
/// granularity with one all-or-nothing access right (every peer that opens it may read and write);
/// the VMM API exports physical allocations as POSIX file descriptors (so they travel with
/// SCM_RIGHTS like any descriptor and are closed like one), works at the device's granularity, and
/// gives each device its own right on each range. carve ships CudaMemoryMapper (the driver API)
/// and HostMemoryMapper (a host twin that runs the same protocol on memfds and mmap, with the same
/// error rules, so the code above runs in every test).
///
/// The rules both models follow (the twin checks every one of them itself; CudaMemoryMapper leaves
/// most to the driver, which reports them as CUDA_ERROR_INVALID_VALUE):
/// - sizes given to create, reserve, map, unmap and set_access are non-zero multiples of the
///   device's granularity, and addresses given to map, unmap and set_access are aligned to it;
/// - map places `bytes` of a physical allocation, from `offset` (0 unless given; a multiple of the
///   granularity), at `va`, inside one reservation and over no other mapping; no device may touch
///   it until set_access says so. The same memory may be mapped at several addresses at once
///   (each is a mapping of its own, and writes through one are seen through the others). Part of
///   an allocation (an offset other than 0, or fewer bytes than it holds) is the exception a
///   driver may refuse: CUDA documents that cuMemMap's offset must be 0, and a mapper that knows
///   what its driver does says so through maps_partial_allocations (TellsPartialMaps);
/// - unmap and set_access name whole mappings of one reservation (the twin refuses a range that
///   cuts a mapping; CUDA may accept some of those, so code tested on the twin runs on CUDA);
/// - release may come while the allocation is mapped (here or in another process): the memory
///   lives until its last mapping is unmapped and its last handle and descriptor are gone;
/// - free_reservation takes a whole reservation with nothing mapped in it (the twin refuses
///   otherwise; CUDA leaves it undefined).
///
/// Errors are carve::Error (a host path; the message names the call and, for CUDA, the driver's
/// error name). The twin says invalid_size for a size that is zero, not a multiple of the
/// granularity or beyond the allocation; invalid_argument for a misaligned address, a range outside
/// one reservation, a double map, or a reservation freed while mapped; not_allocated for an unknown
/// handle or a range that is not whole mappings; out_of_range for an unknown device; no_space when
/// the system refuses memory or addresses. CudaMemoryMapper says invalid_size where it checks
/// sizes itself (create), invalid_argument for the driver's CUDA_ERROR_INVALID_VALUE, out_of_range
/// for an unknown device, no_space when memory runs out, unsupported when there is no driver, and
/// device_error for any other driver failure. A refusal leaves nothing changed in either model.
#pragma once

#include <carve/core/checked_math.hpp>
#include <carve/core/error.hpp>
#include <carve/mr/segment_export.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>

namespace carve {

/// What a device may do with a mapped range.
enum class Access : std::uint8_t {
  none = 0,       ///< nothing: a touch faults
  read = 1,       ///< loads only
  read_write = 2, ///< loads and stores
};

/// The enumerator's name ("none", "read", "read_write"); never null.
constexpr const char* to_string(Access a) noexcept {
  switch (a) {
  case Access::none:
    return "none";
  case Access::read:
    return "read";
  case Access::read_write:
    return "read_write";
  }
  return "unknown";
}

/// Physical allocations, address reservations, mappings and per-device rights (see the file's
/// description for the rules). `physical_handle` names an allocation in this process;
/// `export_kind` is how a SegmentExport of its memory is labelled, so the importing side knows
/// which mapper to use.
template <class M>
concept PhysicalMemoryMapper = std::copy_constructible<typename M::physical_handle> &&
    requires(M& m, const M& cm, int device, std::size_t bytes, std::size_t alignment, typename M::physical_handle h,
             int fd, void* va, Access access) {
  { M::export_kind } -> std::convertible_to<ExportKind>;
  { cm.granularity(device) } -> std::same_as<Result<std::size_t>>;
  { m.create(device, bytes) } -> std::same_as<Result<typename M::physical_handle>>;
  { m.export_fd(h) } -> std::same_as<Result<int>>;
  { m.import_fd(fd) } -> std::same_as<Result<typename M::physical_handle>>;
  { m.release(h) } -> std::same_as<Result<void>>;
  { m.reserve(bytes, alignment) } -> std::same_as<Result<void*>>;
  { m.free_reservation(va, bytes) } -> std::same_as<Result<void>>;
  { m.map(va, bytes, h) } -> std::same_as<Result<void>>;
  { m.map(va, bytes, h, alignment) } -> std::same_as<Result<void>>;
  { m.unmap(va, bytes) } -> std::same_as<Result<void>>;
  { m.set_access(va, bytes, device, access) } -> std::same_as<Result<void>>;
  { cm.access(va, device) } -> std::same_as<Result<Access>>;
};

/// A mapper that tells, before anything is mapped, whether map() places part of a physical
/// allocation on `device`: from an offset other than 0, or fewer bytes than the allocation holds.
/// CUDA documents that cuMemMap's offset "currently must be zero", so code that maps parts (an
/// ExpandablePool lending a hole) asks first instead of meeting a refusal in the middle of a
/// request. Result<bool>: the answer, or the mapper's error where it could not find out.
template <class M>
concept TellsPartialMaps = PhysicalMemoryMapper<M> && requires(M& m, int device) {
  { m.maps_partial_allocations(device) } -> std::same_as<Result<bool>>;
};

/// Whether `mapper` may map part of an allocation on `device`: false only where it says it does
/// not; true where it cannot tell or could not find out (then the caller learns it from the first
/// refusal).
template <PhysicalMemoryMapper M>
[[nodiscard]] bool may_map_partial_allocations(M& mapper, int device) {
  if constexpr (TellsPartialMaps<M>) {
    const auto answer = mapper.maps_partial_allocations(device);
    return !answer || *answer;
  } else {
    (void)mapper;
    (void)device;
    return true;
  }
}

/// `bytes` rounded up to a multiple of `granularity` (a power of two or not); nullopt when that
/// does not fit in a size_t or either is 0.
constexpr cuda::std::optional<std::size_t> round_up_to_granularity(std::size_t bytes,
                                                                   std::size_t granularity) noexcept {
  if (bytes == 0 || granularity == 0) {
    return cuda::std::nullopt;
  }
  const auto padded = checked_add(bytes, granularity - 1);
  if (!padded) {
    return cuda::std::nullopt;
  }
  return *padded / granularity * granularity;
}

/// A physical allocation placed at addresses of its own: the reservation, the mapping and the
/// device's right, which is what both a VmmCard's allocation and an imported segment are.
struct PlacedMemory {
  void* base = nullptr;  ///< the reservation's start, where the memory is mapped
  std::size_t bytes = 0; ///< granularity-rounded: reserved, mapped and accessible
};

/// Reserves `bytes` (a multiple of the device's granularity) aligned to the granularity, or to
/// `alignment` where that is larger (memory made on another device is mapped at its granularity),
/// maps `h` there and gives `device` the right `access`. On failure nothing stays reserved or
/// mapped (`h` is the caller's either way).
template <PhysicalMemoryMapper M>
[[nodiscard]] Result<PlacedMemory> place_physical(M& mapper, typename M::physical_handle h, std::size_t bytes,
                                                  int device, Access access, std::size_t alignment = 0) {
  const auto g = mapper.granularity(device);
  if (!g) {
    return cuda::std::unexpected(g.error());
  }
  auto va = mapper.reserve(bytes, alignment > *g ? alignment : *g);
  if (!va) {
    return cuda::std::unexpected(va.error());
  }
  if (auto mapped = mapper.map(*va, bytes, h); !mapped) {
    (void)mapper.free_reservation(*va, bytes);
    return cuda::std::unexpected(mapped.error());
  }
  if (auto allowed = mapper.set_access(*va, bytes, device, access); !allowed) {
    (void)mapper.unmap(*va, bytes);
    (void)mapper.free_reservation(*va, bytes);
    return cuda::std::unexpected(allowed.error());
  }
  return PlacedMemory{*va, bytes};
}

/// Undoes place_physical: unmaps and frees the reservation. The first error, if any (the
/// reservation is freed only once nothing is mapped in it).
template <PhysicalMemoryMapper M>
[[nodiscard]] Result<void> unplace_physical(M& mapper, const PlacedMemory& placed) {
  if (auto unmapped = mapper.unmap(placed.base, placed.bytes); !unmapped) {
    return unmapped;
  }
  return mapper.free_reservation(placed.base, placed.bytes);
}

} // namespace carve
