/// @file carve/service/segment_mapping.hpp
/// A client's side of an exported segment: mapping what the server lent into this process, and
/// unmapping it.
///
/// shared_memory: the descriptor that came with the reply is mapped shared (read/write) and
/// closed; the mapping keeps the memory alive. cuda_ipc: the handle is opened with
/// cudaIpcOpenMemHandle on the exporting device (peer access enabled lazily), and closed with
/// cudaIpcCloseMemHandle. The CUDA part is compiled where `<cuda_runtime_api.h>` is on the include
/// path (link CUDA::cudart then), unless CARVE_SERVICE_NO_CUDA is defined; without it a
/// cuda_ipc segment is refused with a clear error.
#pragma once

#include <carve/core/error.hpp>
#include <carve/mr/segment_export.hpp>
#include <carve/service/unix_socket.hpp>

#if __has_include(<cuda_runtime_api.h>) && !defined(CARVE_SERVICE_NO_CUDA)
#include <cuda_runtime_api.h>
/// Defined when this build maps cuda_ipc segments (see cuda_ipc_available).
#define CARVE_SERVICE_HAS_CUDA 1
#endif

#include <sys/mman.h>
#include <sys/stat.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

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
  int device = -1;                             ///< cuda_ipc: the CUDA ordinal holding it
};

/// Maps a segment of `size` bytes. `fd` is the descriptor sent with it (shared_memory), taken
/// over and closed. Errors (nothing stays mapped): bad_message when the export does not hold
/// together (an empty segment, no descriptor, or a file smaller than the segment); no_space when
/// the system refuses the mapping; out_of_range for a CUDA device this process cannot see;
/// unsupported_version for a kind this build cannot map.
inline Result<MappedSegment> map_segment(ExportKind kind, std::size_t size, int device,
                                         const std::array<std::uint8_t, SegmentExport::handle_bytes>& handle,
                                         UniqueFd fd) {
  if (size == 0) {
    return fail(Errc::bad_message, "the server exported an empty segment");
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
    return MappedSegment{p, size, kind, device};
  }
#if defined(CARVE_SERVICE_HAS_CUDA)
  cudaIpcMemHandle_t h{};
  static_assert(sizeof h == SegmentExport::handle_bytes);
  std::memcpy(&h, handle.data(), sizeof h);
  int previous = 0;
  if (cudaGetDevice(&previous) != cudaSuccess || cudaSetDevice(device) != cudaSuccess) {
    cudaGetLastError();
    return fail(Errc::out_of_range,
                "cannot open memory of CUDA device " + std::to_string(device) + " (not visible here?)");
  }
  void* p = nullptr;
  const cudaError_t e = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
  cudaSetDevice(previous);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return fail(Errc::no_space, std::string("cudaIpcOpenMemHandle: ") + cudaGetErrorString(e));
  }
  return MappedSegment{p, size, kind, device};
#else
  (void)handle;
  return fail(Errc::unsupported_version,
              "the server lends CUDA memory (cuda_ipc) but this program was built without the CUDA runtime");
#endif
}

/// Undoes map_segment (munmap, or cudaIpcCloseMemHandle); pointers into the segment are invalid
/// afterwards.
inline void unmap_segment(const MappedSegment& s) noexcept {
  if (s.kind == ExportKind::shared_memory) {
    ::munmap(s.base, s.size);
    return;
  }
#if defined(CARVE_SERVICE_HAS_CUDA)
  cudaIpcCloseMemHandle(s.base);
  cudaGetLastError();
#endif
}

} // namespace carve::service
