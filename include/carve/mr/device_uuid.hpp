/// @file carve/mr/device_uuid.hpp
/// A CUDA device's identity across processes: its UUID.
///
/// @code
/// const carve::DeviceUuid mine = *carve::cuda_device_uuid(0);  // this process's device 0
/// std::puts(carve::to_string(mine).c_str());                   // "GPU-5a1f2c3e-...", as nvidia-smi -L
/// int here = *carve::cuda_device_of(mine);                     // back to this process's ordinal: 0
/// @endcode
///
/// Why not the ordinal: a device's number is the process's own. With CUDA_VISIBLE_DEVICES=3 a
/// worker calls the server's device 3 device 0, and a server's "device 3" means nothing to it (or
/// names another GPU). What crosses a process boundary to say which GPU names it by UUID, and each
/// side turns it into its own ordinal. An all-zero DeviceUuid (no_device_uuid) is "no CUDA device":
/// memory of the host twins, whose devices are numbered alike in every process.
///
/// DeviceUuid and to_string need nothing; cuda_device_uuid and cuda_device_of need the CUDA
/// runtime and are declared only where `<cuda_runtime_api.h>` is on the include path.
#pragma once

#include <carve/core/error.hpp>

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>

#if __has_include(<cuda_runtime_api.h>)
#include <cuda_runtime_api.h>

#include <cstring>
#include <mutex>
#include <vector>
#endif

namespace carve {

/// A device's UUID, byte for byte as the driver reports it (cudaDeviceProp::uuid).
using DeviceUuid = std::array<std::uint8_t, 16>;

/// No CUDA device: the identity of host-twin memory.
inline constexpr DeviceUuid no_device_uuid{};

/// Whether `u` names a device (is not no_device_uuid).
constexpr bool names_a_device(const DeviceUuid& u) noexcept { return u != no_device_uuid; }

/// "GPU-" and the UUID in 8-4-4-4-12 hex digits, as nvidia-smi -L prints a GPU's (and as
/// CUDA_VISIBLE_DEVICES accepts it; a MIG instance's UUID, which the runtime reports for a MIG
/// device, reads "MIG-" there); "no device" for no_device_uuid.
inline std::string to_string(const DeviceUuid& u) {
  if (!names_a_device(u)) {
    return "no device";
  }
  static constexpr char digits[] = "0123456789abcdef";
  std::string s = "GPU-";
  for (std::size_t i = 0; i < u.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) {
      s += '-';
    }
    s += digits[u[i] >> 4];
    s += digits[u[i] & 0xf];
  }
  return s;
}

/// A resource whose memory is on one CUDA device, which it names: `r.device_uuid()`, a
/// Result<DeviceUuid>. CudaDeviceResource and VmmCard<CudaMemoryMapper> are; cards of the host
/// twins are not (their device_identity is no_device_uuid).
template <class R>
concept KnowsItsDevice = requires(const R& r) {
  { r.device_uuid() } -> std::same_as<Result<DeviceUuid>>;
};

/// `r`'s device UUID where it KnowsItsDevice (its errors), no_device_uuid otherwise.
template <class R>
[[nodiscard]] Result<DeviceUuid> device_identity(const R& r) {
  if constexpr (KnowsItsDevice<R>) {
    return r.device_uuid();
  } else {
    return no_device_uuid;
  }
}

#if __has_include(<cuda_runtime_api.h>)
/// The UUID of this process's CUDA device `device`. Errors: out_of_range for no such device,
/// device_error when the runtime cannot say (the runtime's error is cleared).
[[nodiscard]] inline Result<DeviceUuid> cuda_device_uuid(int device) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || device < 0 || device >= count) {
    cudaGetLastError();
    return fail(Errc::out_of_range, "no CUDA device " + std::to_string(device) + " in this process");
  }
  cudaDeviceProp properties{};
  if (const cudaError_t e = cudaGetDeviceProperties(&properties, device); e != cudaSuccess) {
    cudaGetLastError();
    return fail(Errc::device_error,
                "cannot read the UUID of CUDA device " + std::to_string(device) + ": " + cudaGetErrorString(e));
  }
  static_assert(sizeof properties.uuid == sizeof(DeviceUuid));
  DeviceUuid u{};
  std::memcpy(u.data(), &properties.uuid, u.size());
  return u;
}

/// This process's ordinal of the device `uuid` names. The devices' UUIDs are read once per
/// process (they cannot change while it runs), so the lookup costs no driver call afterwards.
/// Errors: out_of_range when no device this process sees has that UUID (CUDA_VISIBLE_DEVICES
/// hides it, or it is another machine's, or the process has no CUDA device at all), with the UUID
/// in the message; device_error when the runtime cannot list the devices (tried again on the
/// next call).
[[nodiscard]] inline Result<int> cuda_device_of(const DeviceUuid& uuid) {
  static std::mutex mutex;
  static std::vector<DeviceUuid> seen; // this process's devices, by ordinal, once read
  static bool read = false;
  const std::lock_guard lock(mutex);
  if (!read) {
    int count = 0;
    if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
      cudaGetLastError();
      // No device, or no driver for one: that is an answer (none here), which stays true.
      if (e != cudaErrorNoDevice && e != cudaErrorInsufficientDriver) {
        return fail(Errc::device_error,
                    std::string("cannot list this process's CUDA devices: ") + cudaGetErrorString(e));
      }
      count = 0;
    }
    std::vector<DeviceUuid> uuids;
    for (int d = 0; d < count; ++d) {
      auto u = cuda_device_uuid(d);
      if (!u) {
        return cuda::std::unexpected(std::move(u.error()));
      }
      uuids.push_back(*u);
    }
    seen = std::move(uuids);
    read = true;
  }
  for (std::size_t d = 0; d < seen.size(); ++d) {
    if (seen[d] == uuid) {
      return static_cast<int>(d);
    }
  }
  return fail(Errc::out_of_range, to_string(uuid) + " is not among the " + std::to_string(seen.size()) +
                                      " CUDA devices this process sees (CUDA_VISIBLE_DEVICES?)");
}
#endif

} // namespace carve
