/// @file carve/mr/segment_export.hpp
/// What another process needs to map one of a resource's
/// allocations: the concept of a resource whose memory can leave the process.
///
/// @code
/// struct MyCard {   // a carve::UpstreamResource, plus:
///   static constexpr carve::ExportKind export_kind = carve::ExportKind::shared_memory;
///   static constexpr bool release_while_mapped = true;
///   std::optional<carve::SegmentExport> export_segment(void* base, std::size_t bytes) const;
/// };
/// @endcode
///
/// `base` and `bytes` are a live allocation as try_allocate made it; the answer describes that
/// whole allocation (a "segment"), nullopt when the resource does not know it or the system
/// refuses to export it. Semantic requirements: the export stays valid
/// until the segment is deallocated; a descriptor in it is owned by the resource (the receiver
/// gets its own copy, e.g. through SCM_RIGHTS, and must not close the resource's).
/// `release_while_mapped` says whether a segment may be deallocated while another process still
/// maps it: true for shared memory (a mapping holds its pages by itself), false for CUDA IPC
/// (freeing exported memory before the importer's cudaIpcCloseMemHandle is undefined).
///
/// carve ships two: SharedMemoryCard (kind shared_memory: a memfd, mapped with mmap) and, where
/// the CUDA runtime is available, CudaDeviceResource (kind cuda_ipc: a cudaIpcMemHandle_t, opened
/// with cudaIpcOpenMemHandle), plus VmmCard over a PhysicalMemoryMapper (carve/vmm/): kind cuda_vmm
/// on GPUs, host_vmm over the host twin. cuda_ipc remains only for memory that came from
/// cudaMalloc; the VMM kinds are the way to export device memory (per-device access rights, the
/// device's granularity, and descriptors that are closed like any other).
#pragma once

#include <carve/mr/memory_resource.hpp>

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>

namespace carve {

/// How a segment leaves the process.
enum class ExportKind : std::uint8_t {
  shared_memory = 1, ///< a file descriptor of shared memory; the segment is its first `size` bytes
  cuda_ipc = 2,      ///< a CUDA IPC memory handle of the segment's device allocation
  /// a POSIX file descriptor of a CUDA VMM physical allocation (cuMemCreate), imported with
  /// cuMemImportFromShareableHandle and mapped with cuMemMap (CudaMemoryMapper)
  cuda_vmm = 3,
  /// a memfd of HostMemoryMapper, the VMM protocol's host twin: imported, reserved, mapped and
  /// given access the way cuda_vmm is, with mmap and mprotect
  host_vmm = 4,
  /// a CUDA fabric handle (CU_MEM_HANDLE_TYPE_FABRIC) of a VMM physical allocation, in `handle`:
  /// imported with cuMemImportFromShareableHandle on any node of the same NVLink domain (the
  /// driver's IMEX service does the exchange) and mapped as cuda_vmm is
  cuda_fabric = 5,
};

/// The enumerator's name ("shared_memory", "cuda_ipc"); never null.
constexpr const char* to_string(ExportKind k) noexcept {
  switch (k) {
  case ExportKind::shared_memory:
    return "shared_memory";
  case ExportKind::cuda_ipc:
    return "cuda_ipc";
  case ExportKind::cuda_vmm:
    return "cuda_vmm";
  case ExportKind::host_vmm:
    return "host_vmm";
  case ExportKind::cuda_fabric:
    return "cuda_fabric";
  }
  return "unknown";
}

/// Whether a segment of kind `k` travels as a file descriptor (SCM_RIGHTS) rather than a handle
/// inside the message: shared_memory and the two VMM kinds do; cuda_ipc and cuda_fabric do not.
constexpr bool travels_as_descriptor(ExportKind k) noexcept {
  return k != ExportKind::cuda_ipc && k != ExportKind::cuda_fabric;
}

/// One exported segment: what another process needs to map it.
struct SegmentExport {
  static constexpr std::size_t handle_bytes = 64; ///< CUDA_IPC_HANDLE_SIZE

  ExportKind kind = ExportKind::shared_memory; ///< which of the fields below apply
  std::size_t size = 0;                        ///< bytes of the whole segment
  int fd = -1;     ///< shared_memory and the VMM kinds: the resource's descriptor (borrowed, do not close)
  int device = -1; ///< cuda_ipc and the VMM kinds: the device that holds the memory
  std::array<std::uint8_t, handle_bytes> handle{}; ///< cuda_ipc: cudaIpcMemHandle_t; cuda_fabric: CUmemFabricHandle
};

/// An UpstreamResource whose allocations another process can map: `export_kind`,
/// `release_while_mapped` and `export_segment(base, bytes)` as above.
template <class R>
concept ExportableResource = UpstreamResource<R> && requires(const R& r, void* base, std::size_t bytes) {
  { R::export_kind } -> std::convertible_to<ExportKind>;
  { R::release_while_mapped } -> std::convertible_to<bool>;
  { r.export_segment(base, bytes) } -> std::same_as<std::optional<SegmentExport>>;
};

/// An ExportableResource that can hand a segment's descriptor over to the caller once the segment
/// will not be exported again, so that it holds no descriptor for it any longer
/// (`release_descriptor(base)`: the descriptor, which the caller closes; nullopt when there is none).
template <class R>
concept HandsOverDescriptors = ExportableResource<R> && requires(R& r, void* base) {
  { r.release_descriptor(base) } -> std::same_as<std::optional<int>>;
};

} // namespace carve
