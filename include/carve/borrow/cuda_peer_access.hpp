/// @file carve/borrow/cuda_peer_access.hpp
/// Peer access between CUDA devices as BorrowingAllocator's PeerAccess policy: which devices can
/// map which (cudaDeviceCanAccessPeer, asked once), and switching a pair on the first time a
/// borrow needs it (cudaDeviceEnablePeerAccess on the requester, "already enabled" accepted).
///
/// @code
/// using Pool = carve::CachingPool<carve::CudaDeviceResource>;
/// carve::BorrowingAllocator<Pool, carve::LargestBandwidth, carve::CudaPeerAccess> borrower(
///     topology, [](int d) { return Pool(carve::CudaDeviceResource(d)); }, {}, 1024, carve::CudaPeerAccess());
/// @endcode
///
/// Needs the CUDA runtime: declares something only where `<cuda_runtime_api.h>` is on the include
/// path (link CUDA::cudart). Card i is CUDA device i, as in a Topology read from the same machine.
/// Not synchronised itself: the allocator calls it under its lock.
#pragma once

#if __has_include(<cuda_runtime_api.h>)
#include <carve/borrow/peer_access.hpp>
#include <carve/core/error.hpp>
#include <carve/mr/cuda_current_device.hpp>

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

namespace carve {

/// Peer access between the CUDA devices this process sees.
class CudaPeerAccess {
public:
  /// Asks the driver which pairs can map each other. Throws carve::Exception (unsupported) when
  /// the CUDA runtime cannot count the devices.
  CudaPeerAccess() {
    int n = 0;
    if (const cudaError_t e = cudaGetDeviceCount(&n); e != cudaSuccess) {
      cudaGetLastError();
      throw Exception(Errc::unsupported, std::string("CudaPeerAccess: cudaGetDeviceCount: ") + cudaGetErrorString(e));
    }
    devices_ = n;
    can_.assign(static_cast<std::size_t>(n) * static_cast<std::size_t>(n), false);
    enabled_.assign(can_.size(), false);
    for (int r = 0; r < n; ++r) {
      for (int l = 0; l < n; ++l) {
        int ok = 0;
        can_[index(r, l)] = r == l || (cudaDeviceCanAccessPeer(&ok, r, l) == cudaSuccess && ok != 0);
      }
    }
    cudaGetLastError();
  }

  /// Whether device `requester` can map memory of device `lender` (the driver's answer).
  bool can_access(int requester, int lender) const noexcept {
    return known(requester) && known(lender) && can_[index(requester, lender)];
  }

  /// Switches `requester`'s access to `lender`'s memory on, once. Errors: unsupported when the
  /// pair cannot map each other or the driver refuses (its message included).
  [[nodiscard]] Result<void> enable(int requester, int lender) {
    const std::string pair = "GPU" + std::to_string(requester) + " -> GPU" + std::to_string(lender);
    if (!can_access(requester, lender)) {
      return fail(Errc::unsupported, "peer access " + pair + ": the driver says the pair cannot map each other");
    }
    if (requester == lender || enabled_[index(requester, lender)]) {
      return {};
    }
    const detail::CudaCurrentDevice on(requester); // peer access is switched on from the requester
    if (!on.ok()) {
      return fail(Errc::unsupported,
                  "peer access " + pair + ": cannot make GPU" + std::to_string(requester) + " current");
    }
    const cudaError_t e = cudaDeviceEnablePeerAccess(lender, 0);
    if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) {
      cudaGetLastError();
      return fail(Errc::unsupported, "cudaDeviceEnablePeerAccess " + pair + ": " + cudaGetErrorString(e));
    }
    cudaGetLastError(); // "already enabled" is sticky otherwise
    enabled_[index(requester, lender)] = true;
    return {};
  }

private:
  bool known(int d) const noexcept { return d >= 0 && d < devices_; }
  std::size_t index(int r, int l) const noexcept {
    return static_cast<std::size_t>(r) * static_cast<std::size_t>(devices_) + static_cast<std::size_t>(l);
  }

  int devices_ = 0;
  std::vector<bool> can_;
  std::vector<bool> enabled_;
};

static_assert(PeerAccess<CudaPeerAccess>);

} // namespace carve
#endif
