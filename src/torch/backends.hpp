// src/torch/backends.hpp — where libcarve_torch's memory and streams come from: the CUDA device
// (CudaMemoryMapper, cudaMalloc, CUDA streams and events) or, with CARVE_TORCH_BACKEND=host, the
// host twins (HostMemoryMapper, host memory, streams whose work the test hooks complete). The
// stacks in pool_stacks.hpp are templates over one of these.
#pragma once

#include "host_streams.hpp"

#include <carve/mr/simulated_card.hpp>
#include <carve/vmm/host_memory_mapper.hpp>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>

#if __has_include(<cuda_runtime_api.h>)
#include <carve/mr/cuda_current_device.hpp>
#include <carve/mr/cuda_device_resource.hpp>
#include <carve/mr/cuda_stream_events.hpp>
#include <carve/vmm/cuda_memory_mapper.hpp>

#include <cuda_runtime_api.h>
#define CARVE_TORCH_HAS_CUDA 1
#else
// The stream type of PyTorch's allocator interface, for a build without the CUDA toolkit (the
// host backend only).
using cudaStream_t = struct CUstream_st*;
#endif

namespace carve::torch {

// Devices 0 to 63: what the C functions serve.
inline constexpr int max_devices = 64;

// The host twin: memory is host memory, so a test can write every byte it is given.
struct HostBackend {
  static constexpr const char* name = "host";
  using Streams = HostStreams;
  using Mapper = HostMemoryMapper;
  using Upstream = SimulatedCard;

  static HostStream stream(cudaStream_t s) noexcept { return HostStream{reinterpret_cast<std::uintptr_t>(s)}; }
  // The CPU plays every device, with the granularity of today's GPUs.
  static Mapper mapper(int) {
    return HostMemoryMapper(
        HostMapperOptions{.granularity = std::size_t{2} << 20, .device_count = max_devices, .cpu_device = -1});
  }
  // Every device the CPU plays reaches every other's memory.
  static bool can_access_peer(int, int) noexcept { return true; }
  // Host memory without a limit of its own (Books::cap is the cap).
  static Upstream upstream(int) { return SimulatedCard(std::size_t{1} << 50); }
  // Only the test completes host work: nothing to wait for (the device's synchronisations are
  // counted, for the tests).
  static void synchronize(int) noexcept { HostStreamTable::instance().synchronized(); }
  // Whether a graph capture is under way on `s`: as the test hook set it.
  static bool capturing(cudaStream_t s) noexcept {
    try {
      return HostStreamTable::instance().capturing(reinterpret_cast<std::uintptr_t>(s));
    } catch (const std::exception&) {
      return false;
    }
  }
  // Whether `s` is in a capture not yet ended: under way, or invalidated by an error.
  static bool in_capture(cudaStream_t s) noexcept {
    try {
      return HostStreamTable::instance().capture(reinterpret_cast<std::uintptr_t>(s)) != HostStreamTable::Capture::none;
    } catch (const std::exception&) {
      return false;
    }
  }
  // Why the devices cannot serve anything: what the test hook says (carve_torch_host_device_fault).
  static std::string fault(int) {
    const std::lock_guard lock(simulated_fault_mutex());
    return simulated_fault();
  }
  static void set_fault(std::string why) {
    const std::lock_guard lock(simulated_fault_mutex());
    simulated_fault() = std::move(why);
  }
  // Nothing on the host forbids a call during a capture.
  struct RelaxedCapture {
    explicit RelaxedCapture(bool) noexcept {}
  };
  // Nothing is current on the host.
  struct DeviceScope {
    explicit DeviceScope(int) noexcept {}
  };

private:
  static std::string& simulated_fault() {
    static std::string why;
    return why;
  }
  static std::mutex& simulated_fault_mutex() {
    static std::mutex m;
    return m;
  }
};

#ifdef CARVE_TORCH_HAS_CUDA
// A CUDA device.
struct CudaBackend {
  static constexpr const char* name = "cuda";
  using Streams = CudaStreams;
  using Mapper = CudaMemoryMapper;
  using Upstream = CudaDeviceResource;

  static cuda::stream_ref stream(cudaStream_t s) noexcept { return cuda::stream_ref(s); }
  static Mapper mapper(int) { return CudaMemoryMapper{}; }
  // Whether `device`'s kernels and copy engines can reach `peer`'s memory directly (NVLink or PCIe
  // peer to peer).
  static bool can_access_peer(int device, int peer) noexcept {
    int can = 0;
    if (cudaDeviceCanAccessPeer(&can, device, peer) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return can != 0;
  }
  static Upstream upstream(int device) { return CudaDeviceResource(device); }
  // What PyTorch does before it empties its cache: the work on blocks freed so far has run.
  static void synchronize(int device) noexcept {
    const DeviceScope scope(device);
    if (cudaDeviceSynchronize() != cudaSuccess) {
      cudaGetLastError();
    }
  }
  // Why `device` cannot serve anything, when its context is broken (after a kernel faulted, every
  // CUDA call fails with that kernel's error); empty while it answers. Asked after a refusal, so
  // that a broken device is not reported as out of memory. cudaMemGetInfo is no stream work:
  // allowed, under RelaxedCapture, while a capture is under way (read in CUDA's documentation;
  // the host backend's simulated fault is what the tests check).
  static std::string fault(int device) {
    const DeviceScope scope(device);
    cudaError_t e = scope.error();
    if (e == cudaSuccess) {
      const RelaxedCapture relaxed(true);
      std::size_t free = 0;
      std::size_t total = 0;
      e = cudaMemGetInfo(&free, &total);
      if (e != cudaSuccess) {
        cudaGetLastError();
      }
    }
    // Out of memory for the context itself is a shortage like any other.
    if (e == cudaSuccess || e == cudaErrorMemoryAllocation) {
      return {};
    }
    return std::string("CUDA error: ") + cudaGetErrorString(e) + " (" + cudaGetErrorName(e) + ")";
  }
  // Whether a graph capture is under way on `s` (a capturing stream's work is recorded, not run).
  static bool capturing(cudaStream_t s) noexcept { return capture_status(s) == cudaStreamCaptureStatusActive; }
  // Whether `s` is in a capture not yet ended: under way, or invalidated by an error (the driver's
  // capture ends only at cudaStreamEndCapture). Never asked of the null stream, which cannot
  // capture and whose question is itself an error while another stream captures.
  static bool in_capture(cudaStream_t s) noexcept {
    return s != nullptr && capture_status(s) != cudaStreamCaptureStatusNone;
  }
  // What the driver says of `s`'s capture (none when it cannot say).
  static cudaStreamCaptureStatus capture_status(cudaStream_t s) noexcept {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(s, &status) != cudaSuccess) {
      cudaGetLastError();
      return cudaStreamCaptureStatusNone;
    }
    return status;
  }
  // While a capture is under way (`active`), lets this thread make the calls a capture in the
  // global or thread-local mode forbids (cudaMalloc, cuMemMap, cudaFree), as PyTorch's own
  // allocator does around its cudaMalloc: they are not stream work, and carve records no event on
  // a capturing stream meanwhile.
  class RelaxedCapture {
  public:
    explicit RelaxedCapture(bool active) noexcept : active_(active) {
      if (active_ && cudaThreadExchangeStreamCaptureMode(&mode_) != cudaSuccess) {
        cudaGetLastError();
        active_ = false;
      }
    }
    ~RelaxedCapture() {
      if (active_) {
        cudaThreadExchangeStreamCaptureMode(&mode_);
      }
    }
    RelaxedCapture(const RelaxedCapture&) = delete;
    RelaxedCapture& operator=(const RelaxedCapture&) = delete;

  private:
    cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
    bool active_;
  };
  // Makes `device` current for the events and memory calls of one request, when it is not already
  // (PyTorch frees from threads whose current device may be another, or that have no context),
  // and gives the thread its own context back after (CudaCurrentDevice).
  using DeviceScope = carve::detail::CudaCurrentDevice;
};
#endif

} // namespace carve::torch
