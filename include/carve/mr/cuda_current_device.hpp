/// @file carve/mr/cuda_current_device.hpp
/// Makes a CUDA device current for one scope and puts the
/// caller's context back afterwards, so carve's calls never change which device, or which
/// context, the program works on.
///
/// The caller's context is saved and restored through the driver (cuCtxGetCurrent,
/// cuCtxSetCurrent), not with cudaSetDevice(previous): a thread with no context yet (a Python
/// thread that frees a tensor, say) would have device 0's primary context made for it, hundreds
/// of MiB on a GPU the process may never use, and a thread working in a green context, or one of
/// its own, would be left in the primary one. Where the device is current already, nothing is
/// switched. (A thread that had no context keeps `device` as the runtime's choice for it, which
/// makes no context until it calls CUDA itself.)
///
/// Needs the CUDA runtime: declares something only where `<cuda_runtime_api.h>` is on the include path.
#pragma once

#if __has_include(<cuda_runtime_api.h>) && __has_include(<cuda.h>)
#include <cuda.h>
#include <cuda_runtime_api.h>

namespace carve::detail {

// cuCtxGetCurrent and cuCtxSetCurrent, found once through the runtime (carve links no libcuda).
struct CudaContextCalls {
  decltype(&::cuCtxGetCurrent) get = nullptr;
  decltype(&::cuCtxSetCurrent) set = nullptr;

  static const CudaContextCalls& instance() noexcept {
    static const CudaContextCalls calls{reinterpret_cast<decltype(&::cuCtxGetCurrent)>(entry_point("cuCtxGetCurrent")),
                                        reinterpret_cast<decltype(&::cuCtxSetCurrent)>(entry_point("cuCtxSetCurrent"))};
    return calls;
  }
  bool usable() const noexcept { return get != nullptr && set != nullptr; }

private:
  static void* entry_point(const char* symbol) noexcept {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
    const cudaError_t e = cudaGetDriverEntryPointByVersion(symbol, &p, 12000, cudaEnableDefault, &status);
#else // before 12.5 the runtime has only the unversioned query (deprecated since)
    const cudaError_t e = cudaGetDriverEntryPoint(symbol, &p, cudaEnableDefault, &status);
#endif
    if (e != cudaSuccess || status != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    return p;
  }
};

class CudaCurrentDevice {
public:
  explicit CudaCurrentDevice(int device) noexcept {
    int current = 0;
    if (cudaGetDevice(&current) != cudaSuccess) {
      cudaGetLastError(); // no driver: the calls that follow fail and say so
      return;
    }
    if (current == device) {
      ok_ = true;
      return;
    }
    const CudaContextCalls& calls = CudaContextCalls::instance();
    CUcontext saved = nullptr;
    const bool saved_context = calls.usable() && calls.get(&saved) == CUDA_SUCCESS;
    if (cudaSetDevice(device) != cudaSuccess) {
      cudaGetLastError();
      return;
    }
    ok_ = true;
    if (saved_context) {
      context_ = saved; // null when the thread had none: it gets none back
      restore_context_ = true;
    } else {
      previous_ = current; // a driver without the entry points: the device, at least
      restore_device_ = true;
    }
  }
  ~CudaCurrentDevice() {
    if (restore_context_) {
      CudaContextCalls::instance().set(context_);
    } else if (restore_device_) {
      cudaSetDevice(previous_);
    }
  }
  CudaCurrentDevice(const CudaCurrentDevice&) = delete;
  CudaCurrentDevice& operator=(const CudaCurrentDevice&) = delete;

  // False when the device could not be made current (the calls that follow would go elsewhere).
  bool ok() const noexcept { return ok_; }

private:
  CUcontext context_ = nullptr;
  int previous_ = 0;
  bool ok_ = false;
  bool restore_context_ = false;
  bool restore_device_ = false;
};

} // namespace carve::detail
#endif
