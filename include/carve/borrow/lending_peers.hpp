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
/// get it; memory of the host twins maps everywhere (AlwaysMapped). What the clients' calls do for
/// a peer GPU is read from CUDA's documentation: two GPUs have not run it yet.
#pragma once

#include <carve/borrow/cuda_peer_access.hpp>
#include <carve/borrow/peer_access.hpp>
#include <carve/core/error.hpp>
#include <carve/mr/device_uuid.hpp>
#include <carve/mr/segment_export.hpp>

#include <concepts>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace carve {

#if __has_include(<cuda_runtime_api.h>)
/// The CUDA devices that can map each other's memory (the driver's answer, asked once), for
/// borrowers that switch access on themselves: enable() changes nothing in this process. Card c
/// is CUDA device `devices[c]` (by default card c is device c). Throws as CudaPeerAccess does.
class CudaPeerCapability {
public:
  /// Card c is CUDA device c.
  CudaPeerCapability() = default;
  /// Card c is CUDA device `devices[c]`.
  explicit CudaPeerCapability(std::vector<int> devices) : devices_(std::move(devices)) {}

  /// Whether card `requester`'s GPU can map memory of card `lender`'s.
  bool can_access(int requester, int lender) const noexcept {
    return peers_.can_access(device(requester), device(lender));
  }
  /// Nothing to switch on here. Errors: unsupported for a pair that cannot map each other.
  [[nodiscard]] Result<void> enable(int requester, int lender) const {
    if (!can_access(requester, lender)) {
      return fail(Errc::unsupported, "GPU" + std::to_string(device(requester)) + " cannot map GPU" +
                                         std::to_string(device(lender)) +
                                         "'s memory (the driver reports no peer access between them)");
    }
    return {};
  }

private:
  int device(int card) const noexcept {
    if (devices_.empty()) {
      return card;
    }
    return card >= 0 && static_cast<std::size_t>(card) < devices_.size() ? devices_[static_cast<std::size_t>(card)]
                                                                         : -1;
  }

  CudaPeerAccess peers_;
  std::vector<int> devices_;
};
static_assert(PeerAccess<CudaPeerCapability>);
#endif

/// Whether segments of kind `k` are CUDA device memory (cuda_ipc, cuda_vmm, cuda_fabric), not a
/// host twin's.
constexpr bool is_cuda_memory(ExportKind k) noexcept {
  return k != ExportKind::shared_memory && k != ExportKind::host_vmm;
}

namespace detail {
template <class Card>
struct LendingPeersOf {
  using type = AlwaysMapped;
};
template <class>
inline constexpr bool needs_the_cuda_runtime = false;
// A card on a CUDA device (it names the device and exports CUDA memory).
template <class Card>
concept OnCudaDevice = KnowsItsDevice<Card> && is_cuda_memory(Card::export_kind) && requires(const Card& c) {
  { c.device() } -> std::convertible_to<int>;
};
template <OnCudaDevice Card>
struct LendingPeersOf<Card> {
#if __has_include(<cuda_runtime_api.h>)
  using type = CudaPeerCapability;
#else // one policy for the card in every file, or none: never AlwaysMapped here and the driver's there
  static_assert(needs_the_cuda_runtime<Card>, "lending a CUDA card needs <cuda_runtime_api.h> (link CUDA::cudart)");
#endif
};
} // namespace detail

/// The PeerAccess policy for lending `Card`s to other processes (see the file's description).
template <class Card>
using LendingPeers = typename detail::LendingPeersOf<Card>::type;

/// The policy `Peers` for lending `cards` (card c is `cards[c]`): `given` where there is one;
/// else over the cards' own devices where `Peers` takes them (CudaPeerCapability), or
/// default-constructed. Throws carve::Exception (invalid_argument) for a policy that is none of
/// these and was not given (SimulatedPeerAccess needs its matrix).
template <class Peers, class Card>
[[nodiscard]] Peers lending_peers(const std::vector<Card>& cards, std::optional<Peers> given = std::nullopt) {
  if (given) {
    return std::move(*given);
  }
  if constexpr (std::constructible_from<Peers, std::vector<int>> && detail::OnCudaDevice<Card>) {
    std::vector<int> devices;
    for (const Card& c : cards) {
      devices.push_back(c.device());
    }
    return Peers(std::move(devices));
  } else if constexpr (std::default_initializable<Peers>) {
    return Peers{};
  } else {
    throw Exception(Errc::invalid_argument, "carve::lending_peers: this PeerAccess policy must be given");
  }
}

} // namespace carve
