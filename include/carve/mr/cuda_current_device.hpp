/// @file carve/mr/cuda_current_device.hpp
/// Makes a CUDA device current for one scope and puts the
/// caller's back afterwards, so carve's calls never change which device the program works on.
///
/// Needs the CUDA runtime: declares something only where `<cuda_runtime_api.h>` is on the include path.
#pragma once

#if __has_include(<cuda_runtime_api.h>)
#include <cuda_runtime_api.h>

namespace carve::detail {

class CudaCurrentDevice {
public:
  explicit CudaCurrentDevice(int device) noexcept {
    ok_ = cudaGetDevice(&previous_) == cudaSuccess && cudaSetDevice(device) == cudaSuccess;
    if (!ok_) {
      cudaGetLastError();
    }
  }
  ~CudaCurrentDevice() {
    if (ok_) {
      cudaSetDevice(previous_);
    }
  }
  CudaCurrentDevice(const CudaCurrentDevice&) = delete;
  CudaCurrentDevice& operator=(const CudaCurrentDevice&) = delete;

  // False when the device could not be made current (the calls that follow would go elsewhere).
  bool ok() const noexcept { return ok_; }

private:
  int previous_ = 0;
  bool ok_ = false;
};

} // namespace carve::detail
#endif
