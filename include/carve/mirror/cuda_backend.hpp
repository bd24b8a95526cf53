/// @file carve/mirror/cuda_backend.hpp
/// PagedMirror over the CUDA devices of this machine.
///
/// @code
/// carve::CudaMirrorBackend gpus({.bytes_per_device = 8ull << 30});   // 8 GiB of every GPU
/// carve::PagedMirror mirror(gpus, {.page_size = 2 << 20, .device_view = true});
/// auto* x = static_cast<float*>(*mirror.try_allocate(n * sizeof(float), 1));
/// ...                                                                   // host stores, then
/// mirror.sync();
/// kernel<<<grid, block>>>(static_cast<float*>(*mirror.device_pointer(x)), n);   // one pointer
/// @endcode
///
/// Construction queries each device (cudaGetDeviceCount, cudaMemGetInfo, the SM count and compute
/// mode), takes its share of device memory through the VMM mapping layer (DeviceGranules over
/// CudaMemoryMapper: one cuMemCreate per `view_granule` bytes, mapped back to back into a
/// reservation of its own and made read/write for that device with cuMemSetAccess; the share is
/// rounded down to whole granules, at least 2 MiB), and creates one non-blocking stream and one
/// event per device. Because each granule is its own physical allocation, a device view
/// (map_view, PagedMirror::device_pointer) can map an allocation's granules from their owners at
/// consecutive addresses and give every device that reaches every owner access
/// (cudaDeviceCanAccessPeer, cudaDeviceEnablePeerAccess once per pair through CudaPeerAccess).
/// Per-segment use stays available (segments(), device_pointer(d, offset), stream(d)). Copies
/// are cudaMemcpyAsync on the device's stream; wait(d) records the event and waits for it. Mirror
/// memory is pinned with cudaHostRegister as allocations appear, so copies are real DMA that
/// overlap across devices (when pinning fails the copies still work, staged by the driver). A
/// device whose compute mode is "prohibited" or whose memory cannot be had is reported
/// unavailable, and the mirror leaves it alone.
///
/// Needs the CUDA runtime: declared only where `<cuda_runtime_api.h>` and `<cuda.h>` are on the
/// include path (nvcc, or a target linked to CUDA::cudart; the driver's VMM calls are found through
/// the runtime, never by linking libcuda), so `<carve/carve.hpp>` compiles without them. The
/// device view runs on a GPU in tests/mirror/test_cuda_mirror.cu, and its host twin
/// (VmmMirrorBackend over HostMemoryMapper) in the host tests. Construction
/// throws carve::Exception (device_error) when there is no CUDA device; the copy calls report
/// Errc::device_error.
#pragma once

#include <carve/core/error.hpp>
#if __has_include(<cuda_runtime_api.h>) && __has_include(<cuda.h>)
#include <carve/borrow/cuda_peer_access.hpp>
#include <carve/core/errc.hpp>
#include <carve/mirror/device_info.hpp>
#include <carve/mirror/mirror_backend.hpp>
#include <carve/mirror/peer_views.hpp>
#include <carve/mr/cuda_current_device.hpp>
#include <carve/vmm/cuda_memory_mapper.hpp>
#include <carve/vmm/device_granules.hpp>
#include <carve/vmm/physical_memory_mapper.hpp>

#include <cuda/std/expected>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace carve {

/// Which devices a CudaMirrorBackend uses, and how much of each.
struct CudaMirrorOptions {
  std::vector<int> devices{};       ///< CUDA ordinals to use; empty: every device
  std::size_t bytes_per_device = 0; ///< 0: free_fraction of what each device has free (whole granules)
  double free_fraction = 0.5;       ///< used when bytes_per_device is 0
  bool pin_host_memory = true;      ///< cudaHostRegister mirror memory as allocations appear
  /// Bytes per physical allocation (cuMemCreate): a multiple of the driver's granularity, 2 MiB on
  /// today's GPUs. A device view maps whole ones, so a mirror with views needs pages that are
  /// multiples of it; larger ones mean fewer driver calls when the backend is built.
  std::size_t view_granule = std::size_t{2} << 20;
};

/// A MirrorBackend over CUDA devices: one VMM mapping, stream and event per device. Not copyable.
class CudaMirrorBackend {
public:
  /// Opens every device in `options`. Throws carve::Exception (device_error) when there is no
  /// CUDA device, an ordinal is unknown, or a device cannot be queried or given a stream; what was
  /// opened before is closed.
  explicit CudaMirrorBackend(CudaMirrorOptions options = {}) : pin_(options.pin_host_memory) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
      cudaGetLastError();
      throw Exception(Errc::device_error, "carve::CudaMirrorBackend: no CUDA device");
    }
    if (options.devices.empty()) {
      for (int d = 0; d < count; ++d) {
        options.devices.push_back(d);
      }
    }
    views_.emplace(CudaPeerAccess());
    devices_.reserve(options.devices.size());
    try {
      for (const int ordinal : options.devices) {
        if (ordinal < 0 || ordinal >= count) {
          throw Exception(Errc::device_error, "carve::CudaMirrorBackend: no CUDA device " + std::to_string(ordinal));
        }
        devices_.push_back(open(ordinal, options));
      }
    } catch (...) {
      close_all();
      throw;
    }
  }
  /// Frees every device's memory, stream and event.
  ~CudaMirrorBackend() { close_all(); }
  CudaMirrorBackend(const CudaMirrorBackend&) = delete;
  CudaMirrorBackend& operator=(const CudaMirrorBackend&) = delete;

  /// The devices, in the order of `options.devices`.
  std::vector<DeviceInfo> devices() const {
    std::vector<DeviceInfo> out;
    for (const Device& d : devices_) {
      out.push_back(d.info);
    }
    return out;
  }

  /// cudaMemcpyAsync from the host on device d's stream. Errors: out_of_range for an unknown
  /// device or a range past its memory; device_error when CUDA fails.
  [[nodiscard]] cuda::std::expected<void, Errc> copy_to_device(std::size_t d, std::size_t offset, const void* src,
                                                               std::size_t bytes) noexcept {
    if (!fits(d, offset, bytes)) {
      return cuda::std::unexpected(Errc::out_of_range);
    }
    const detail::CudaCurrentDevice current(devices_[d].ordinal);
    return check(current.ok() ? cudaMemcpyAsync(devices_[d].memory + offset, src, bytes, cudaMemcpyHostToDevice,
                                                devices_[d].stream)
                              : cudaErrorInvalidDevice);
  }
  /// cudaMemcpyAsync to the host on device d's stream. Errors as copy_to_device.
  [[nodiscard]] cuda::std::expected<void, Errc> copy_to_host(std::size_t d, void* dst, std::size_t offset,
                                                             std::size_t bytes) noexcept {
    if (!fits(d, offset, bytes)) {
      return cuda::std::unexpected(Errc::out_of_range);
    }
    const detail::CudaCurrentDevice current(devices_[d].ordinal);
    return check(current.ok() ? cudaMemcpyAsync(dst, devices_[d].memory + offset, bytes, cudaMemcpyDeviceToHost,
                                                devices_[d].stream)
                              : cudaErrorInvalidDevice);
  }
  /// cudaMemsetAsync on device d's stream. Errors as copy_to_device.
  [[nodiscard]] cuda::std::expected<void, Errc> zero(std::size_t d, std::size_t offset, std::size_t bytes) noexcept {
    if (!fits(d, offset, bytes)) {
      return cuda::std::unexpected(Errc::out_of_range);
    }
    const detail::CudaCurrentDevice current(devices_[d].ordinal);
    return check(current.ok() ? cudaMemsetAsync(devices_[d].memory + offset, 0, bytes, devices_[d].stream)
                              : cudaErrorInvalidDevice);
  }
  /// Waits for everything queued on device d. Errors: out_of_range for an unknown or unavailable
  /// device; device_error when CUDA reports a failure.
  [[nodiscard]] cuda::std::expected<void, Errc> wait(std::size_t d) noexcept {
    if (d >= devices_.size() || devices_[d].memory == nullptr) {
      return cuda::std::unexpected(Errc::out_of_range);
    }
    const detail::CudaCurrentDevice current(devices_[d].ordinal);
    if (!current.ok()) {
      return cuda::std::unexpected(Errc::device_error);
    }
    if (auto r = check(cudaEventRecord(devices_[d].done, devices_[d].stream)); !r) {
      return r;
    }
    return check(cudaEventSynchronize(devices_[d].done));
  }

  /// Pins new mirror memory (when pin_host_memory); a failure leaves it pageable.
  void host_committed(void* p, std::size_t bytes) noexcept {
    if (pin_ && cudaHostRegister(p, bytes, cudaHostRegisterDefault) != cudaSuccess) {
      cudaGetLastError(); // pageable memory still copies, only slower
    }
  }
  /// Unpins mirror memory before it goes.
  void host_released(void* p, std::size_t) noexcept {
    if (pin_ && cudaHostUnregister(p) != cudaSuccess) {
      cudaGetLastError(); // it was never pinned
    }
  }

  /// Device memory behind a mirror segment, for kernels. Throws carve::Exception (out_of_range)
  /// for an unknown device, as the next two do.
  void* device_pointer(std::size_t d, std::size_t offset) const { return known(d).memory + offset; }
  /// Device d's stream, to order kernels after its copies.
  cudaStream_t stream(std::size_t d) const { return known(d).stream; }
  /// Device d's CUDA ordinal.
  int cuda_ordinal(std::size_t d) const { return known(d).ordinal; }

  /// Bytes per physical allocation on device d (CudaMirrorOptions::view_granule); 0 for an
  /// unknown or unavailable device.
  std::size_t granularity(std::size_t d) const noexcept {
    return d < devices_.size() && devices_[d].granules ? devices_[d].granules->granularity() : 0;
  }
  /// Whether device `from` can reach device `to`'s memory (cudaDeviceCanAccessPeer).
  bool reaches(std::size_t from, std::size_t to) const { return views_->reaches(memories(), from, to); }
  /// `runs` back to back in a new range (cuMemAddressReserve, cuMemMap of each granule from its
  /// owner), read/write (cuMemSetAccess) for every device that reaches every owner, peer access
  /// switched on once per pair (CudaPeerAccess). Errors (nothing stays mapped): out_of_range for an
  /// unknown device or a run past its memory; invalid_size; the driver's, as CudaMemoryMapper.
  [[nodiscard]] Result<PlacedMemory> map_view(std::span<const MirrorViewRun> runs) {
    return views_->map(mapper_, memories(), runs);
  }
  /// Undoes map_view.
  [[nodiscard]] Result<void> unmap_view(const PlacedMemory& view) { return views_->unmap(mapper_, view); }

private:
  struct Device {
    int ordinal = 0;
    DeviceInfo info;
    std::unique_ptr<DeviceGranules<CudaMemoryMapper>> granules; // null: unavailable
    std::byte* memory = nullptr;                                // granules->base()
    cudaStream_t stream = nullptr;
    cudaEvent_t done = nullptr;
  };

  const Device& known(std::size_t d) const {
    if (d >= devices_.size()) {
      throw Exception(Errc::out_of_range, "carve::CudaMirrorBackend: no device " + std::to_string(d) + " (" +
                                              std::to_string(devices_.size()) + " in use)");
    }
    return devices_[d];
  }

  static Device open(int ordinal, const CudaMirrorOptions& options) {
    Device d;
    d.ordinal = ordinal;
    const detail::CudaCurrentDevice current(ordinal);
    cudaDeviceProp prop{};
    int sms = 0;
    int mode = 0;
    std::size_t free = 0;
    std::size_t total = 0;
    if (!current.ok() || cudaGetDeviceProperties(&prop, ordinal) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ordinal) != cudaSuccess ||
        cudaDeviceGetAttribute(&mode, cudaDevAttrComputeMode, ordinal) != cudaSuccess) {
      cudaGetLastError();
      throw Exception(Errc::device_error,
                      "carve::CudaMirrorBackend: cannot query CUDA device " + std::to_string(ordinal));
    }
    d.info.name = "GPU" + std::to_string(ordinal) + " (" + prop.name + ")";
    d.info.compute_units = static_cast<std::uint32_t>(sms);
    d.info.available = false;
    if (mode == cudaComputeModeProhibited || cudaMemGetInfo(&free, &total) != cudaSuccess) {
      cudaGetLastError();
      return d;
    }
    std::size_t bytes = options.bytes_per_device != 0
                            ? options.bytes_per_device
                            : static_cast<std::size_t>(static_cast<double>(free) * options.free_fraction);
    d.granules = take_device_memory(ordinal, bytes, options.view_granule);
    if (!d.granules) {
      return d; // unavailable: the mirror leaves the device alone
    }
    bytes = d.granules->bytes();
    if (cudaStreamCreateWithFlags(&d.stream, cudaStreamNonBlocking) != cudaSuccess ||
        cudaEventCreateWithFlags(&d.done, cudaEventDisableTiming) != cudaSuccess) {
      cudaGetLastError();
      if (d.stream != nullptr) {
        cudaStreamDestroy(d.stream);
      }
      d.granules.reset();
      throw Exception(Errc::device_error,
                      "carve::CudaMirrorBackend: cannot create a stream on CUDA device " + std::to_string(ordinal));
    }
    d.memory = d.granules->base();
    d.info.capacity = bytes;
    d.info.available = true;
    return d;
  }

  // `bytes` (rounded down to whole granules of `granule` bytes, at least 2 MiB: the largest page
  // a mirror takes) of device memory, one physical allocation per granule, mapped read/write for
  // that device; null when the device cannot give it.
  static std::unique_ptr<DeviceGranules<CudaMemoryMapper>> take_device_memory(int ordinal, std::size_t bytes,
                                                                              std::size_t granule) {
    const std::size_t round = std::max(granule, std::size_t{2} << 20);
    if (bytes / round == 0) {
      return nullptr;
    }
    try {
      return std::make_unique<DeviceGranules<CudaMemoryMapper>>(CudaMemoryMapper{}, ordinal, bytes / round * round,
                                                                granule);
    } catch (const Exception&) {
      return nullptr;
    } catch (const std::bad_alloc&) {
      return nullptr;
    }
  }

  void close_all() noexcept {
    for (Device& d : devices_) {
      if (d.memory == nullptr) {
        continue;
      }
      const detail::CudaCurrentDevice current(d.ordinal);
      cudaStreamSynchronize(d.stream);
      cudaEventDestroy(d.done);
      cudaStreamDestroy(d.stream);
      d.granules.reset();
      d.memory = nullptr;
    }
    cudaGetLastError();
  }

  bool fits(std::size_t d, std::size_t offset, std::size_t bytes) const noexcept {
    return d < devices_.size() && devices_[d].memory != nullptr && offset <= devices_[d].info.capacity &&
           bytes <= devices_[d].info.capacity - offset;
  }
  [[nodiscard]] static cuda::std::expected<void, Errc> check(cudaError_t e) noexcept {
    if (e != cudaSuccess) {
      cudaGetLastError();
      return cuda::std::unexpected(Errc::device_error);
    }
    return {};
  }

  std::vector<typename PeerViews<CudaMemoryMapper, CudaPeerAccess>::Memory> memories() const {
    std::vector<typename PeerViews<CudaMemoryMapper, CudaPeerAccess>::Memory> out;
    for (const Device& d : devices_) {
      out.push_back(d.granules.get());
    }
    return out;
  }

  std::vector<Device> devices_;
  bool pin_;
  CudaMemoryMapper mapper_;
  std::optional<PeerViews<CudaMemoryMapper, CudaPeerAccess>> views_; // once the devices are counted
};

static_assert(DeviceViewBackend<CudaMirrorBackend>);
static_assert(HostMemoryObserver<CudaMirrorBackend>);

} // namespace carve
#endif
