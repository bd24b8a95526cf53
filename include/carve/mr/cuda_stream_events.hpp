/// @file carve/mr/cuda_stream_events.hpp
/// CUDA streams and events as StreamOrderedPool's StreamEvents: `cuda::stream_ref` streams, and
/// events recorded with cudaEventRecord and asked with cudaEventQuery; waited on
/// (cudaEventSynchronize) only where a pool must unmap memory the stream may still use.
///
/// @code
/// carve::StreamOrderedPool<carve::CudaDeviceResource, carve::CudaStreams> pool(carve::CudaDeviceResource(0));
/// @endcode
///
/// Needs the CUDA runtime: declares something only where `<cuda_runtime_api.h>` is on the include
/// path (link CUDA::cudart). Events are created without timing (cudaEventDisableTiming, the cheap
/// kind) and reused. Not synchronised itself: the pool calls it under its lock. Record events on
/// streams of the device that is current when the pool is used.
#pragma once

#if __has_include(<cuda_runtime_api.h>)
#include <carve/core/error.hpp>
#include <carve/mr/stream_events.hpp>

#include <cuda/stream_ref>
#include <cuda_runtime_api.h>

#include <string>
#include <vector>

namespace carve {

/// CUDA streams and events for StreamOrderedPool.
class CudaStreams {
public:
  /// A CUDA stream (cudaStream_t wrapped, as CCCL's resources take it).
  using stream_type = cuda::stream_ref;
  /// A CUDA event.
  using event_type = cudaEvent_t;

  CudaStreams() = default;
  /// Takes over the other's spare events.
  CudaStreams(CudaStreams&& other) noexcept : spare_(std::move(other.spare_)) { other.spare_.clear(); }
  CudaStreams& operator=(CudaStreams&&) = delete;
  ~CudaStreams() {
    for (cudaEvent_t e : spare_) {
      cudaEventDestroy(e);
    }
  }

  /// An event recorded on `stream` now. Errors: unsupported when CUDA cannot create or record it
  /// (its message included).
  [[nodiscard]] Result<cudaEvent_t> record(cuda::stream_ref stream) {
    cudaEvent_t e = nullptr;
    if (!spare_.empty()) {
      e = spare_.back();
      spare_.pop_back();
    } else if (const cudaError_t c = cudaEventCreateWithFlags(&e, cudaEventDisableTiming); c != cudaSuccess) {
      cudaGetLastError();
      return fail(Errc::unsupported, std::string("cudaEventCreateWithFlags: ") + cudaGetErrorString(c));
    }
    if (const cudaError_t r = cudaEventRecord(e, stream.get()); r != cudaSuccess) {
      cudaGetLastError();
      release(e); // kept, or destroyed where there is no room to keep it
      return fail(Errc::unsupported, std::string("cudaEventRecord: ") + cudaGetErrorString(r));
    }
    return e;
  }
  /// Whether the work before the event has run (cudaEventQuery; an error counts as not yet, so a
  /// block is never reused on the strength of a failed query).
  bool completed(cudaEvent_t e) const noexcept {
    const cudaError_t q = cudaEventQuery(e);
    if (q != cudaSuccess) {
      cudaGetLastError();
    }
    return q == cudaSuccess;
  }
  /// Blocks until the work before the event has run (cudaEventSynchronize; an error is cleared and
  /// leaves completed() false).
  void wait(cudaEvent_t e) const noexcept {
    if (cudaEventSynchronize(e) != cudaSuccess) {
      cudaGetLastError();
    }
  }
  /// Blocks until the work queued on `stream` so far has run (cudaStreamSynchronize, any device's
  /// stream; an error is cleared). StreamUsesPool's fallback; not yet run on a GPU.
  void synchronize(cuda::stream_ref stream) const noexcept {
    if (cudaStreamSynchronize(stream.get()) != cudaSuccess) {
      cudaGetLastError();
    }
  }
  /// Keeps the event for the next record().
  void release(cudaEvent_t e) noexcept {
    try {
      spare_.push_back(e);
    } catch (...) {
      cudaEventDestroy(e);
    }
  }

private:
  std::vector<cudaEvent_t> spare_;
};

static_assert(StreamEventsThatWait<CudaStreams> && StreamEventsThatSynchronize<CudaStreams>);

} // namespace carve
#endif
