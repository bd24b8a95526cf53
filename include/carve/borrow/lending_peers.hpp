/// @file carve/borrow/lending_peers.hpp
/// Which cards may lend to which when the borrower maps the memory in its own process: the
/// PeerAccess policy of a BorrowingAllocator that lends to other processes (the allocation
/// service's).
///
/// @code
/// using Peers = carve::LendingPeers<carve::VmmCard<carve::CudaMemoryMapper>>;  // CudaPeerCapability
/// using Twin = carve::LendingPeers<carve::SharedMemoryCard>;                      // AlwaysMapped
/// @endcode
///
/// A borrowed block is used by the requester's kernels where it lies, so a lender counts only if
/// the requester's GPU can map its memory. In one process CudaPeerAccess asks the driver and
/// switches the pair on. A server that lends to other processes must only ask: each client gives
/// its own mapping the rights (cuMemSetAccess, or cudaIpcOpenMemHandle's lazy peer access), and
/// peer access switched on in the server would change nothing for them. CudaPeerCapability is
/// that half. Cards that are CUDA devices naming themselves (KnowsItsDevice, a CUDA export kind)
/// get it; memory of the host twins maps everywhere (AlwaysMapped).
#pragma once

#include <carve/borrow/cuda_peer_access.hpp>
#include <carve/borrow/peer_access.hpp>
#include <carve/core/error.hpp>
#include <carve/mr/device_uuid.hpp>
#include <carve/mr/segment_export.hpp>

#include <string>

namespace carve {

#if __has_include(<cuda_runtime_api.h>)
/// The CUDA devices that can map each other's memory (the driver's answer, asked once), for
/// borrowers that switch access on themselves: enable() changes nothing in this process. Card i
/// is CUDA device i. Throws as CudaPeerAccess does.
class CudaPeerCapability {
public:
  /// Whether device `requester` can map memory of device `lender`.
  bool can_access(int requester, int lender) const noexcept { return peers_.can_access(requester, lender); }
  /// Nothing to switch on here. Errors: unsupported for a pair that cannot map each other.
  [[nodiscard]] Result<void> enable(int requester, int lender) const {
    if (!can_access(requester, lender)) {
      return fail(Errc::unsupported, "GPU" + std::to_string(requester) + " cannot map GPU" + std::to_string(lender) +
                                         "'s memory (the driver reports no peer access between them)");
    }
    return {};
  }

private:
  CudaPeerAccess peers_;
};
static_assert(PeerAccess<CudaPeerCapability>);
#endif

namespace detail {
template <class Card>
struct LendingPeersOf {
  using type = AlwaysMapped;
};
#if __has_include(<cuda_runtime_api.h>)
template <class Card>
requires(KnowsItsDevice<Card>&& Card::export_kind != ExportKind::shared_memory &&
         Card::export_kind != ExportKind::host_vmm) struct LendingPeersOf<Card> {
  using type = CudaPeerCapability;
};
#endif
} // namespace detail

/// The PeerAccess policy for lending `Card`s to other processes (see the file's description).
template <class Card>
using LendingPeers = typename detail::LendingPeersOf<Card>::type;

} // namespace carve
