// libcarve_torch_oom.so: carve_torch_malloc for PyTorch, whose refusals are PyTorch's own
// out-of-memory error. PyTorch's CUDAPluggableAllocator wraps whatever pointer its malloc returns
// (a NULL becomes a tensor whose first kernel faults), but lets a C++ exception through to the
// Python call that allocated, and there turns c10::OutOfMemoryError, and only it, into
// torch.OutOfMemoryError. This library holds no pool: it links libcarve_torch.so, whose pools
// CuPy's hook shares, and c10, which PyTorch has already loaded when it loads this.
// carve_gpu.torch installs it with carve_torch_free, which PyTorch finds through it.
#include "carve_torch.h"

#include <c10/util/Exception.h>

#include <string>

extern "C" void* carve_torch_malloc_or_raise(ssize_t size, int device, cudaStream_t stream) {
  void* p = carve_torch_malloc(size, device, stream);
  if (p == nullptr && size > 0) {
    const char* why = carve_torch_last_refusal();
    const std::string text = why != nullptr ? why : "CUDA out of memory (libcarve_torch gave no reason)";
    // Out of memory is PyTorch's OutOfMemoryError; anything else (a capture carve cannot serve) a RuntimeError.
    TORCH_CHECK_WITH(OutOfMemoryError, text.rfind("CUDA out of memory", 0) != 0, text);
    TORCH_CHECK(false, text);
  }
  return p;
}
