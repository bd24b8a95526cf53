/// @file carve/mirror/mirror_backend.hpp
/// What PagedMirror needs from the devices behind it.
///
/// @code
/// struct MyBackend {
///   std::vector<carve::DeviceInfo> devices() const;        // learnt once, at mirror construction
///   // Each call is queued on device d's stream and returns at once; `offset` is a byte offset into
///   // the memory the backend holds for the mirror on d (capacity bytes, page-aligned).
///   cuda::std::expected<void, carve::Errc> copy_to_device(std::size_t d, std::size_t offset,
///                                                         const void* src, std::size_t bytes) noexcept;
///   cuda::std::expected<void, carve::Errc> copy_to_host(std::size_t d, void* dst, std::size_t offset,
///                                                       std::size_t bytes) noexcept;
///   cuda::std::expected<void, carve::Errc> zero(std::size_t d, std::size_t offset, std::size_t bytes) noexcept;
///   // Blocks until everything queued on d so far has finished; reports a failure of any of it.
///   cuda::std::expected<void, carve::Errc> wait(std::size_t d) noexcept;
/// };
/// @endcode
///
/// Optional: `void host_committed(void* p, std::size_t bytes) noexcept` and
/// `void host_released(void* p, std::size_t bytes) noexcept`, called when mirror memory becomes
/// usable and before it goes away (the CUDA backend pins it there, so copies are true DMA).
///
/// Semantic requirements: work queued on one device runs in order (a stream); devices run
/// independently of each other; a host buffer given to a copy stays valid until wait(d) returns.
/// Errors are Errc::device_error (the device failed) or Errc::out_of_range (a range past the
/// device's capacity: a bug in the caller). carve ships HostMirrorBackend (host memory in the role
/// of devices, for tests and machines without GPUs) and CudaMirrorBackend.
#pragma once

#include <carve/core/errc.hpp>
#include <carve/mirror/device_info.hpp>

#include <cuda/std/expected>

#include <concepts>
#include <cstddef>
#include <vector>

namespace carve {

/// The devices behind a PagedMirror: copies and zeroing queued per device, and a wait (see the
/// file's description for the semantic requirements).
template <class B>
concept MirrorBackend = requires(B& b, const B& cb, std::size_t d, std::size_t offset, const void* src, void* dst,
                                 std::size_t bytes) {
  { cb.devices() } -> std::convertible_to<std::vector<DeviceInfo>>;
  { b.copy_to_device(d, offset, src, bytes) }
  noexcept->std::same_as<cuda::std::expected<void, Errc>>;
  { b.copy_to_host(d, dst, offset, bytes) }
  noexcept->std::same_as<cuda::std::expected<void, Errc>>;
  { b.zero(d, offset, bytes) }
  noexcept->std::same_as<cuda::std::expected<void, Errc>>;
  { b.wait(d) }
  noexcept->std::same_as<cuda::std::expected<void, Errc>>;
};

/// Backends that want to know which host memory copies will read and write (to pin it).
template <class B>
concept HostMemoryObserver = requires(B& b, void* p, std::size_t bytes) {
  { b.host_committed(p, bytes) }
  noexcept;
  { b.host_released(p, bytes) }
  noexcept;
};

} // namespace carve
