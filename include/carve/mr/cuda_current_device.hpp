/// @file carve/mr/cuda_current_device.hpp
/// Makes a CUDA device current for one scope and puts the
/// caller's context back afterwards, so carve's calls never change which device, or which
/// context, the program works on.
///
/// The caller's context is saved and restored through the driver (cuCtxGetCurrent,
/// cuCtxSetCurrent), not with cudaSetDevice(previous): a thread with no context yet (a Python
/// thread that frees a tensor, say) would have device 0's primary context made for it, hundreds
/// of MiB on a GPU the process may never use, and a thread working in a green context, or one of
/// its own, would be left in the primary one. carve's own calls run in the device's primary
/// context, whose memory the primary context's streams and its green contexts' can use; where that
/// context is current already (the usual case, on every allocation and free), nothing is switched.
/// (A thread that had no context keeps `device` as the runtime's choice for it, which makes no
/// context until it calls CUDA itself.)
///
/// Needs the CUDA runtime: declares something only where `<cuda_runtime_api.h>` is on the include path.
#pragma once

#if __has_include(<cuda_runtime_api.h>)
#include <cuda_runtime_api.h>

#include <atomic>

struct CUctx_st; // the driver's context: CUcontext is a CUctx_st* (cuda.h, which this does not need)

namespace carve::detail {

// cuCtxGetCurrent and cuCtxSetCurrent, found once through the runtime (carve links no libcuda).
// Declared here with the driver's ABI (a CUresult is an int-sized enum, 0 for success).
struct CudaContextCalls {
  using Context = CUctx_st*;
  int (*get)(Context*) = nullptr;
  int (*set)(Context) = nullptr;

  static const CudaContextCalls& instance() noexcept {
    static const CudaContextCalls calls{reinterpret_cast<int (*)(Context*)>(entry_point("cuCtxGetCurrent")),
                                        reinterpret_cast<int (*)(Context)>(entry_point("cuCtxSetCurrent"))};
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
    const CudaContextCalls& calls = CudaContextCalls::instance();
    CudaContextCalls::Context saved = nullptr;
    if (calls.usable() && calls.get(&saved) == 0) {
      if (saved != nullptr && saved == known_primary(device)) {
        return; // in it already (every allocation and free asks): nothing to switch
      }
      context_ = saved; // null when the thread has none: it gets none back
      restore_context_ = true;
    } else if (cudaGetDevice(&previous_) == cudaSuccess) {
      restore_device_ = true; // a driver without the entry points: the device, at least
    }
    error_ = cudaSetDevice(device); // the device's primary context, which carve's memory belongs to
    if (error_ != cudaSuccess) {
      cudaGetLastError();
    } else if (CudaContextCalls::Context now = nullptr; restore_context_ && calls.get(&now) == 0) {
      remember_primary(device, now);
    }
  }
  ~CudaCurrentDevice() {
    if (restore_context_) {
      CudaContextCalls::instance().set(context_);
    } else if (restore_device_ && error_ == cudaSuccess) {
      cudaSetDevice(previous_);
    }
  }
  CudaCurrentDevice(const CudaCurrentDevice&) = delete;
  CudaCurrentDevice& operator=(const CudaCurrentDevice&) = delete;

  // False when the device could not be made current (the calls that follow would go elsewhere).
  bool ok() const noexcept { return error_ == cudaSuccess; }
  // Why not: cudaSetDevice's error (a device that fails every call, say).
  cudaError_t error() const noexcept { return error_; }

private:
  // The primary context of each device as seen current after cudaSetDevice (null: not yet; the
  // devices from 64 on are not kept, and so are always switched).
  static std::atomic<CudaContextCalls::Context>* primaries() noexcept {
    static std::atomic<CudaContextCalls::Context> seen[64];
    return seen;
  }
  static CudaContextCalls::Context known_primary(int device) noexcept {
    return device >= 0 && device < 64 ? primaries()[device].load(std::memory_order_relaxed) : nullptr;
  }
  static void remember_primary(int device, CudaContextCalls::Context c) noexcept {
    if (device >= 0 && device < 64) {
      primaries()[device].store(c, std::memory_order_relaxed);
    }
  }

  CudaContextCalls::Context context_ = nullptr;
  int previous_ = 0;
  cudaError_t error_ = cudaSuccess;
  bool restore_context_ = false;
  bool restore_device_ = false;
};

} // namespace carve::detail
#endif
