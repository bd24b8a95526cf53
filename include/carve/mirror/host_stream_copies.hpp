/// @file carve/mirror/host_stream_copies.hpp
/// The MirrorBackend copy calls of a backend whose devices are host-addressable memory, each with
/// a HostCopyStream: HostMirrorBackend and VmmMirrorBackend share them.
#pragma once

#include <carve/core/errc.hpp>
#include <carve/mirror/host_copy_stream.hpp>

#include <cuda/std/expected>

#include <cstddef>

namespace carve {

/// Where device d's copies go: its memory, its size, its stream (null stream: no such device).
struct HostStreamTarget {
  std::byte* memory = nullptr;      ///< the device's memory for the mirror
  std::size_t size = 0;             ///< its bytes
  HostCopyStream* stream = nullptr; ///< the device's copy stream
};

/// copy_to_device, copy_to_host, zero and wait for `Backend` (its CRTP base), which provides
/// `HostStreamTarget stream_target(std::size_t d) noexcept`.
template <class Backend>
class HostStreamCopies {
public:
  /// Queues `bytes` from `src` to `offset` in device d. Errors: out_of_range for an unknown device
  /// or a range past its memory; device_error when the queue cannot grow.
  [[nodiscard]] cuda::std::expected<void, Errc> copy_to_device(std::size_t d, std::size_t offset, const void* src,
                                                               std::size_t bytes) noexcept {
    const HostStreamTarget t = target(d, offset, bytes);
    return t.stream == nullptr ? cuda::std::unexpected(Errc::out_of_range)
                               : queued(t.stream->copy(t.memory + offset, src, bytes));
  }
  /// Queues `bytes` from `offset` in device d to `dst`. Errors as copy_to_device.
  [[nodiscard]] cuda::std::expected<void, Errc> copy_to_host(std::size_t d, void* dst, std::size_t offset,
                                                             std::size_t bytes) noexcept {
    const HostStreamTarget t = target(d, offset, bytes);
    return t.stream == nullptr ? cuda::std::unexpected(Errc::out_of_range)
                               : queued(t.stream->copy(dst, t.memory + offset, bytes));
  }
  /// Queues zeroing `bytes` at `offset` in device d. Errors as copy_to_device.
  [[nodiscard]] cuda::std::expected<void, Errc> zero(std::size_t d, std::size_t offset, std::size_t bytes) noexcept {
    const HostStreamTarget t = target(d, offset, bytes);
    return t.stream == nullptr ? cuda::std::unexpected(Errc::out_of_range)
                               : queued(t.stream->zero(t.memory + offset, bytes));
  }
  /// Blocks until everything queued on device d has run. Errors: out_of_range for an unknown device.
  [[nodiscard]] cuda::std::expected<void, Errc> wait(std::size_t d) noexcept {
    const HostStreamTarget t = static_cast<Backend&>(*this).stream_target(d);
    if (t.stream == nullptr) {
      return cuda::std::unexpected(Errc::out_of_range);
    }
    t.stream->wait();
    return {};
  }

protected:
  HostStreamCopies() = default;
  ~HostStreamCopies() = default;
  /// Nothing to copy: the streams are the backend's.
  HostStreamCopies(const HostStreamCopies&) = default;
  /// Nothing to assign: the streams are the backend's.
  HostStreamCopies& operator=(const HostStreamCopies&) = default;

private:
  // Device d's target when [offset, offset + bytes) lies in its memory; a null stream otherwise.
  HostStreamTarget target(std::size_t d, std::size_t offset, std::size_t bytes) noexcept {
    HostStreamTarget t = static_cast<Backend&>(*this).stream_target(d);
    if (offset > t.size || bytes > t.size - offset) {
      t.stream = nullptr;
    }
    return t;
  }
  [[nodiscard]] static cuda::std::expected<void, Errc> queued(bool ok) noexcept {
    if (!ok) {
      return cuda::std::unexpected(Errc::device_error);
    }
    return {};
  }
};

} // namespace carve
