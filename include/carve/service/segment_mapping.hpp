/// @file carve/service/segment_mapping.hpp
/// A client's side of an exported segment: mapping what the server lent into this process, and
/// unmapping it.
///
/// shared_memory: the descriptor that came with the reply is mapped shared (read/write) and
/// closed; the mapping keeps the memory alive. cuda_ipc: the handle is opened with
/// cudaIpcOpenMemHandle on the requester's device, or the exporting one where this process does
/// not see the requester's (peer access enabled lazily), and closed with cudaIpcCloseMemHandle.
/// Devices are this process's ordinals, found from the UUIDs in the reply (segment_devices.hpp).
/// The CUDA part is compiled where `<cuda_runtime_api.h>` is on the include path (link
/// CUDA::cudart then), unless CARVE_SERVICE_NO_CUDA is defined; without it a cuda_ipc segment is
/// refused with a clear error.
///
/// cuda_vmm and host_vmm (a VmmCard's segments): the descriptor that came with the reply is
/// imported, addresses are reserved, the memory is mapped, the requester's device and the
/// segment's own (those this process sees) are given read/write access, and the handle and
/// descriptor are released at once (the mapping keeps the memory); unmapping undoes the mapping
/// and the reservation (map_vmm_segment, unmap_vmm_segment). cuda_vmm runs on CudaMemoryMapper
/// (also needs `<cuda.h>`; never libcuda), host_vmm on the process's host_vmm_mapper(): the same
/// code, so the GPU path runs in the host tests. cuda_ipc remains for servers that lend cudaMalloc
/// memory (CudaDeviceResource).
#pragma once

#include <carve/core/error.hpp>
#include <carve/mr/segment_export.hpp>
#include <carve/service/protocol.hpp>
#include <carve/service/segment_devices.hpp>
#include <carve/service/unix_socket.hpp>
#include <carve/vmm/host_memory_mapper.hpp>
#include <carve/vmm/physical_memory_mapper.hpp>

#if __has_include(<cuda_runtime_api.h>) && !defined(CARVE_SERVICE_NO_CUDA)
#include <carve/mr/cuda_current_device.hpp>

#include <cuda_runtime_api.h>
/// Defined when this build maps cuda_ipc segments (see cuda_ipc_available).
#define CARVE_SERVICE_HAS_CUDA 1
#if __has_include(<cuda.h>)
#include <carve/vmm/cuda_memory_mapper.hpp>
/// Defined when this build maps cuda_vmm segments (CudaMemoryMapper is available).
#define CARVE_SERVICE_HAS_CUDA_VMM 1
#endif
#endif

#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <string>
#include <utility>

namespace carve::service {

#if defined(CARVE_SERVICE_HAS_CUDA)
/// Whether this build maps cuda_ipc segments (the CUDA runtime's header was found and
/// CARVE_SERVICE_NO_CUDA is not defined).
inline constexpr bool cuda_ipc_available = true;
#else
inline constexpr bool cuda_ipc_available = false;
#endif

/// A segment mapped into this process.
struct MappedSegment {
  void* base = nullptr;                        ///< where it is mapped here
  std::size_t size = 0;                        ///< its bytes
  ExportKind kind = ExportKind::shared_memory; ///< how the server exported it
  int device = -1;                             ///< cuda_ipc, VMM kinds: mapped on this device here (primary)
  std::size_t mapped_bytes = 0;                ///< VMM kinds: reserved and mapped (size rounded to the granularity)
};

/// The host twin that maps host_vmm segments in this process: one per process, shared by every
/// client, with the OS page as its granularity (so it maps a segment of any exporter's
/// granularity: the exporter's physical allocation is a whole number of its granules, each a
/// whole number of pages) and the CPU standing for every device (the process touches the memory
/// for whichever simulated device it works for).
inline HostMemoryMapper& host_vmm_mapper() {
  static HostMemoryMapper mapper(HostMapperOptions{os_page_size(), max_cards, HostMemoryMapper::every_device});
  return mapper;
}

/// Imports a segment of `size` bytes with `import()` (a Result of a physical handle) and maps it
/// read/write for `devices` (the primary at its granularity, then the secondary), as `kind`.
/// Errors (nothing stays mapped): bad_message for a size that cannot be rounded, the mapper's.
template <PhysicalMemoryMapper Mapper, class Import>
[[nodiscard]] Result<MappedSegment> place_imported_segment(Mapper& mapper, std::size_t size, SegmentDevices devices,
                                                           ExportKind kind, Import&& import) {
  const int device = devices.primary();
  // Rounded as the memory was made, at its own GPU's granularity (the requester's where this
  // process does not see that GPU), and placed at the coarser of the two (powers of two), which
  // suits both.
  std::size_t g = 0;
  std::size_t alignment = 0;
  for (const int d : {device, devices.owner}) {
    if (d < 0) {
      continue;
    }
    const auto of_d = mapper.granularity(d);
    if (!of_d) {
      return cuda::std::unexpected(of_d.error());
    }
    g = *of_d; // the owner's, when seen, comes last
    alignment = std::max(alignment, *of_d);
  }
  const auto rounded = round_up_to_granularity(size, g);
  if (!rounded) {
    return fail(Errc::bad_message, "a segment of " + std::to_string(size) + " bytes cannot be mapped");
  }
  const auto h = import();
  if (!h) {
    return cuda::std::unexpected(h.error());
  }
  const auto placed = place_physical(mapper, *h, *rounded, device, Access::read_write, alignment);
  (void)mapper.release(*h); // a mapping keeps the memory; on failure this frees it
  if (!placed) {
    return cuda::std::unexpected(placed.error());
  }
  // Borrowed memory: the GPU that holds it may use it too.
  if (const int other = devices.secondary(); other >= 0) {
    if (auto shared = mapper.set_access(placed->base, placed->bytes, other, Access::read_write); !shared) {
      (void)unplace_physical(mapper, *placed);
      return cuda::std::unexpected(std::move(shared.error()));
    }
  }
  return MappedSegment{placed->base, size, kind, device, placed->bytes};
}

/// Maps a VMM segment of `size` bytes for `devices` with `mapper` (see the file's description); `fd`
/// is taken over and closed. Errors (nothing stays mapped or imported): bad_message for an empty
/// segment or no descriptor; the mapper's errors otherwise (out_of_range: a device this process
/// cannot see).
template <PhysicalMemoryMapper Mapper>
[[nodiscard]] Result<MappedSegment> map_vmm_segment(Mapper& mapper, std::size_t size, SegmentDevices devices,
                                                    UniqueFd fd) {
  if (size == 0 || !fd) {
    std::string message = to_string(Mapper::export_kind);
    message.insert(0, "the server's ");
    message.append(" segment came empty or without its descriptor");
    return fail(Errc::bad_message, std::move(message));
  }
  return place_imported_segment(mapper, size, devices, Mapper::export_kind, [&] {
    auto h = mapper.import_fd(fd.get());
    fd.reset(); // imported: the handle holds the memory now
    return h;
  });
}

#if defined(CARVE_SERVICE_HAS_CUDA_VMM)
/// Maps a segment exported as a fabric handle (ExportKind::cuda_fabric), possibly from another
/// node of the NVLink domain, read/write for `devices`; undone with unmap_vmm_segment. Errors as
/// map_vmm_segment, and the mapper's import_fabric errors.
[[nodiscard]] inline Result<MappedSegment> map_fabric_segment(CudaMemoryMapper& mapper, std::size_t size,
                                                              SegmentDevices devices, const CudaFabricHandle& handle) {
  return place_imported_segment(mapper, size, devices, ExportKind::cuda_fabric,
                                [&] { return mapper.import_fabric(handle); });
}
#endif

/// Undoes map_vmm_segment with the same mapper.
template <PhysicalMemoryMapper Mapper>
void unmap_vmm_segment(Mapper& mapper, const MappedSegment& s) noexcept {
  try {
    (void)unplace_physical(mapper, PlacedMemory{s.base, s.mapped_bytes});
  } catch (const std::bad_alloc&) {
    // only an error message could not be built
  }
}

/// Maps a segment of `size` bytes for `devices` (this process's ordinals: segment_devices). `fd` is
/// the descriptor sent with it (shared_memory and the VMM kinds), taken over and closed. Errors
/// (nothing stays mapped): bad_message when the export does not hold together (an empty segment,
/// no descriptor, or a file smaller than the segment); no_space when the system refuses the
/// mapping; out_of_range for a CUDA device this process cannot see; unsupported_version for a
/// kind this build cannot map.
[[nodiscard]] inline Result<MappedSegment>
map_segment(ExportKind kind, std::size_t size, SegmentDevices devices,
            const std::array<std::uint8_t, SegmentExport::handle_bytes>& handle, UniqueFd fd) {
  const int device = devices.primary();
  if (size == 0) {
    return fail(Errc::bad_message, "the server exported an empty segment");
  }
  if (kind == ExportKind::host_vmm) {
    return map_vmm_segment(host_vmm_mapper(), size, devices, std::move(fd));
  }
  if (kind == ExportKind::cuda_vmm) {
#if defined(CARVE_SERVICE_HAS_CUDA_VMM)
    CudaMemoryMapper gpus;
    return map_vmm_segment(gpus, size, devices, std::move(fd));
#else
    return fail(Errc::unsupported_version,
                "the server lends CUDA VMM memory (cuda_vmm) but this program was built without the CUDA headers");
#endif
  }
  if (kind == ExportKind::cuda_fabric) {
#if defined(CARVE_SERVICE_HAS_CUDA_VMM)
    CudaMemoryMapper gpus;
    return map_fabric_segment(gpus, size, devices, handle);
#else
    return fail(
        Errc::unsupported_version,
        "the server lends CUDA fabric memory (cuda_fabric) but this program was built without the CUDA headers");
#endif
  }
  if (kind == ExportKind::shared_memory) {
    struct stat st {};
    if (!fd || ::fstat(fd.get(), &st) != 0 || st.st_size < 0 || static_cast<std::size_t>(st.st_size) < size) {
      return fail(Errc::bad_message, "the server's shared-memory segment came without a usable descriptor");
    }
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (p == MAP_FAILED) {
      return fail(Errc::no_space,
                  "cannot map a " + std::to_string(size) + "-byte shared-memory segment: " + detail::errno_text(errno));
    }
    return MappedSegment{p, size, kind, device, size};
  }
  if (kind != ExportKind::cuda_ipc) {
    return fail(Errc::unsupported_version, "the server exports segments of an unknown kind");
  }
#if defined(CARVE_SERVICE_HAS_CUDA)
  cudaIpcMemHandle_t h{};
  static_assert(sizeof h == SegmentExport::handle_bytes);
  std::memcpy(&h, handle.data(), sizeof h);
  void* p = nullptr;
  cudaError_t e = cudaSuccess;
  { // opened in the requester's context where it is seen, with peer access from there as needed
    const carve::detail::CudaCurrentDevice current(device);
    if (!current.ok()) {
      return fail(Errc::out_of_range,
                  "cannot open memory of CUDA device " + std::to_string(device) + " (not visible here?)");
    }
    e = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
  }
  if (e != cudaSuccess) {
    cudaGetLastError();
    return fail(Errc::no_space, std::string("cudaIpcOpenMemHandle: ") + cudaGetErrorString(e));
  }
  return MappedSegment{p, size, kind, device, size};
#else
  (void)handle;
  return fail(Errc::unsupported_version,
              "the server lends CUDA memory (cuda_ipc) but this program was built without the CUDA runtime");
#endif
}

/// Maps the segment of Allocated reply `a` (new_mapping) with the descriptor `fd` that came with
/// it, for the devices segment_devices finds in this process (`here`). Errors: segment_devices',
/// then as above.
template <DeviceDirectory Directory = ProcessDevices>
[[nodiscard]] Result<MappedSegment> map_segment(const Allocated& a, UniqueFd fd, const Directory& here = {}) {
  SegmentDevices devices{a.device, a.region.requester};
  if (a.kind != ExportKind::shared_memory) { // shared memory is the same for every device
    auto found = segment_devices(a, here);
    if (!found) {
      return cuda::std::unexpected(std::move(found.error()));
    }
    devices = *found;
  }
  return map_segment(a.kind, static_cast<std::size_t>(a.segment_size), devices, a.handle, std::move(fd));
}

/// Undoes map_segment (munmap, unmap_vmm_segment, or cudaIpcCloseMemHandle); pointers into the
/// segment are invalid afterwards.
inline void unmap_segment(const MappedSegment& s) noexcept {
  if (s.kind == ExportKind::shared_memory) {
    ::munmap(s.base, s.size);
    return;
  }
  if (s.kind == ExportKind::host_vmm) {
    unmap_vmm_segment(host_vmm_mapper(), s);
    return;
  }
#if defined(CARVE_SERVICE_HAS_CUDA_VMM)
  if (s.kind == ExportKind::cuda_vmm || s.kind == ExportKind::cuda_fabric) {
    CudaMemoryMapper gpus;
    unmap_vmm_segment(gpus, s);
    return;
  }
#endif
#if defined(CARVE_SERVICE_HAS_CUDA)
  const carve::detail::CudaCurrentDevice current(s.device); // closed in the context it was opened in
  cudaIpcCloseMemHandle(s.base);
  cudaGetLastError();
#endif
}

} // namespace carve::service
