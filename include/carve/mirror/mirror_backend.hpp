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
#include <carve/core/error.hpp>
#include <carve/mirror/device_info.hpp>
#include <carve/vmm/physical_memory_mapper.hpp>

#include <cuda/std/expected>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
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

/// Bytes [offset, offset + bytes) of backend device `device`'s memory, as a device view maps them.
struct MirrorViewRun {
  std::uint32_t device = 0; ///< the backend's device index
  std::size_t offset = 0;   ///< into the device's memory for the mirror
  std::size_t bytes = 0;    ///< whole granules of that device
};

/// A MirrorBackend that can give device code one pointer over several devices' memory
/// (MirrorOptions::device_view): `granularity(d)` is device d's mapping granule (0: unknown);
/// `map_view(runs)` maps the runs back to back in a new range that every device reaching every
/// run's owner may read and write, `unmap_view` undoes it; `reaches(from, to)` says whether device
/// `from` can reach device `to`'s memory. VmmMirrorBackend is one.
template <class B>
concept DeviceViewBackend = MirrorBackend<B> &&
    requires(B& b, const B& cb, std::size_t d, std::span<const MirrorViewRun> runs, PlacedMemory view) {
  { cb.granularity(d) } -> std::convertible_to<std::size_t>;
  { b.map_view(runs) } -> std::same_as<Result<PlacedMemory>>;
  { b.unmap_view(view) } -> std::same_as<Result<void>>;
  { cb.reaches(d, d) } -> std::convertible_to<bool>;
};

} // namespace carve
