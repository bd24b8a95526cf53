/// @file carve/mr/cuda_device_resource.hpp
/// `cudaMalloc` / `cudaFree` on one device, as a pool upstream.
///
/// @code
/// carve::CudaDeviceResource gpu3(3);
/// carve::CachingPool pool(gpu3);
/// @endcode
///
/// Needs the CUDA runtime: compiled only where `<cuda_runtime_api.h>` is on the include path (nvcc,
/// or a target linked to CUDA::cudart); elsewhere this header declares nothing, so `<carve/carve.hpp>`
/// still compiles with a plain host compiler. Link CUDA::cudart (or cudart_static) to use it.
/// Each call makes `device` current and restores the caller's device afterwards.
#pragma once

#if __has_include(<cuda_runtime_api.h>)
#include <carve/mr/cuda_current_device.hpp>
#include <carve/mr/cuda_mr.hpp>
#include <carve/mr/device_uuid.hpp>
#include <carve/mr/memory_resource.hpp>
#include <carve/mr/segment_export.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <optional>
#include <string>
#include <utility>

namespace carve {

/// Device memory of one CUDA device (cudaMalloc / cudaFree): an ExportableResource. Thread-safe
/// as the CUDA runtime is.
class CudaDeviceResource : public CcclSpellings<CudaDeviceResource> {
public:
  /// Segments leave the process as CUDA IPC handles.
  static constexpr ExportKind export_kind = ExportKind::cuda_ipc;
  static constexpr bool release_while_mapped = false; ///< cudaFree before the importer closes is undefined

  /// Throws carve::Exception (invalid_argument) when there is no such CUDA device.
  explicit CudaDeviceResource(int device) : device_(device) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || device < 0 || device >= count) {
      cudaGetLastError();
      throw Exception(Errc::invalid_argument, "carve::CudaDeviceResource: no CUDA device " + std::to_string(device));
    }
  }

  /// The CUDA ordinal.
  int device() const noexcept { return device_; }
  /// The device's UUID, which names it in other processes too (cuda_device_uuid's errors).
  [[nodiscard]] Result<DeviceUuid> device_uuid() const { return cuda_device_uuid(device_); }

  /// Errors: invalid_size (check_request); no_space when cudaMalloc fails (the error is cleared, so
  /// it does not leak into later calls) or its address is not aligned as asked. cudaMalloc promises
  /// 256 bytes; in practice its addresses are aligned to 512 bytes or more (2 MiB for large
  /// allocations), so a pool that keeps 512-byte blocks asks for 512 and gets it, and a request
  /// whose alignment the address misses is given back and refused rather than served misaligned.
  [[nodiscard]] cuda::std::expected<void*, Errc> try_allocate(std::size_t bytes, std::size_t alignment) noexcept {
    if (const auto ok = check_request(bytes, alignment); !ok) {
      return cuda::std::unexpected(ok.error());
    }
    const detail::CudaCurrentDevice current(device_);
    void* p = nullptr;
    if (!current.ok() || cudaMalloc(&p, bytes) != cudaSuccess) {
      cudaGetLastError();
      return cuda::std::unexpected(Errc::no_space);
    }
    if (reinterpret_cast<std::uintptr_t>(p) % alignment != 0) {
      cudaFree(p);
      cudaGetLastError();
      return cuda::std::unexpected(Errc::no_space);
    }
    return p;
  }

  /// cudaFree on the resource's device (errors are cleared, not reported).
  void deallocate(void* p, std::size_t, std::size_t) noexcept {
    const detail::CudaCurrentDevice current(device_);
    cudaFree(p);
    cudaGetLastError();
  }

  /// The device's free memory (cudaMemGetInfo); 0 if the query fails.
  std::size_t free_bytes() const noexcept { return info().first; }
  /// The device's total memory (cudaMemGetInfo); 0 if the query fails.
  std::size_t capacity() const noexcept { return info().second; }

  /// A CUDA IPC handle for an allocation of this resource (`bytes` as allocated), for a server
  /// that lends it to other processes (carve/service/); nullopt when the runtime refuses.
  std::optional<SegmentExport> export_segment(void* base, std::size_t bytes) const {
    static_assert(sizeof(cudaIpcMemHandle_t) == SegmentExport::handle_bytes);
    const detail::CudaCurrentDevice current(device_);
    cudaIpcMemHandle_t handle{};
    if (!current.ok() || cudaIpcGetMemHandle(&handle, base) != cudaSuccess) {
      cudaGetLastError();
      return std::nullopt;
    }
    SegmentExport e;
    e.kind = ExportKind::cuda_ipc;
    e.size = bytes;
    e.device = device_;
    std::memcpy(e.handle.data(), &handle, sizeof handle);
    return e;
  }

  /// Equal when on the same device.
  friend bool operator==(const CudaDeviceResource& a, const CudaDeviceResource& b) noexcept {
    return a.device_ == b.device_;
  }

#if defined(CARVE_HAS_CUDA_MR)
  /// Its memory is device memory.
  friend constexpr void get_property(const CudaDeviceResource&, cuda::mr::device_accessible) noexcept {}
#endif

private:
  std::pair<std::size_t, std::size_t> info() const noexcept {
    const detail::CudaCurrentDevice current(device_);
    std::size_t free = 0;
    std::size_t total = 0;
    if (!current.ok() || cudaMemGetInfo(&free, &total) != cudaSuccess) {
      cudaGetLastError();
      return {0, 0};
    }
    return {free, total};
  }

  int device_;
};

static_assert(UpstreamResource<CudaDeviceResource> && ExportableResource<CudaDeviceResource>);
static_assert(SynchronousResource<CudaDeviceResource> && KnowsItsDevice<CudaDeviceResource>);
static_assert(detail::cccl_accepts<CudaDeviceResource>());
#if defined(CARVE_HAS_CUDA_MR)
static_assert(SynchronousResourceWith<CudaDeviceResource, cuda::mr::device_accessible>);
#endif

} // namespace carve
#endif
