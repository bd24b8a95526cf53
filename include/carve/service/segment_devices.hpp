/// @file carve/service/segment_devices.hpp
/// Which of this process's devices a lent segment is mapped for, and which card of a server is
/// this process's GPU.
///
/// @code
/// // A worker started with CUDA_VISIBLE_DEVICES=3 finds its card among the server's:
/// int card = *carve::service::card_of(*client.cards(), *carve::cuda_device_uuid(0));  // 3
/// auto r = client.lease(bytes, card, 256);  // mapped for this process's device 0
/// @endcode
///
/// A server numbers its GPUs its own way and a client its own (CUDA_VISIBLE_DEVICES,
/// CUDA_DEVICE_ORDER), so Allocated names the device holding a segment and the card that asked
/// for it by UUID, and segment_devices turns both into this process's ordinals. A borrowed segment
/// lies on one GPU and is used by another (the requester's kernels reach it over the link), so
/// the client maps it for both wherever it sees them: the requester's device first (its mapping,
/// or the context a CUDA IPC handle is opened in), the owner's as well. Host-twin segments carry
/// no UUIDs; their devices are numbered alike in every process, so the server's numbers hold.
/// The numbering is checked on the host twin with simulated device directories; one GPU has run
/// it (an H200, 2026-11-29), two GPUs or another CUDA_VISIBLE_DEVICES not yet.
#pragma once

#include <carve/core/error.hpp>
#include <carve/mr/device_uuid.hpp>
#include <carve/service/protocol_messages.hpp>

#include <concepts>
#include <string>
#include <utility>
#include <vector>

namespace carve::service {

/// This process's devices by UUID: `d.ordinal_of(uuid)`, a Result<int> that fails with
/// out_of_range for a device this process does not see (any other error is passed on).
template <class D>
concept DeviceDirectory = requires(const D& d, const DeviceUuid& u) {
  { d.ordinal_of(u) } -> std::same_as<Result<int>>;
};

/// The CUDA devices this process sees (cuda_device_of); without the CUDA runtime's header, or
/// with CARVE_SERVICE_NO_CUDA defined, it sees none and says why.
struct ProcessDevices {
  /// This process's ordinal of `uuid`.
  [[nodiscard]] Result<int> ordinal_of(const DeviceUuid& uuid) const {
#if __has_include(<cuda_runtime_api.h>) && !defined(CARVE_SERVICE_NO_CUDA)
    return cuda_device_of(uuid);
#else
    return fail(Errc::unsupported_version,
                "this program was built without the CUDA runtime, so it cannot find " + to_string(uuid));
#endif
  }
};
static_assert(DeviceDirectory<ProcessDevices>);

/// A segment's devices as this process numbers them; -1 for one it does not see.
struct SegmentDevices {
  int owner = -1;     ///< the device holding the memory
  int requester = -1; ///< the device of the card that asked (owner's, unless the memory is borrowed)

  /// The device to map the segment on (or open its CUDA IPC handle in): the requester's, where
  /// the memory is used, when this process sees it; the owner's otherwise.
  constexpr int primary() const noexcept { return requester >= 0 ? requester : owner; }
  /// The other device that gets access too, or -1 (not seen here, or the same device).
  constexpr int secondary() const noexcept { return requester >= 0 && owner != requester ? owner : -1; }
};

/// The devices of `a`'s segment in this process (`here`). Errors (from a reply that names GPUs):
/// out_of_range when this process sees neither the device holding the memory nor the
/// requester's, saying which by UUID; bad_message when one UUID is missing; `here`'s other errors.
template <DeviceDirectory Directory>
[[nodiscard]] Result<SegmentDevices> segment_devices(const Allocated& a, const Directory& here) {
  const bool owner_named = names_a_device(a.device_uuid);
  if (owner_named != names_a_device(a.requester_uuid)) {
    return fail(Errc::bad_message, "the server named one of a segment's two devices by UUID but not the other");
  }
  if (!owner_named) { // host-twin memory: the server's numbers are this process's
    return SegmentDevices{a.device, a.region.requester};
  }
  SegmentDevices d;
  for (auto [uuid, ordinal] : {std::pair{&a.device_uuid, &d.owner}, std::pair{&a.requester_uuid, &d.requester}}) {
    auto found = here.ordinal_of(*uuid);
    if (found) {
      *ordinal = *found;
    } else if (found.error().code != Errc::out_of_range) {
      return cuda::std::unexpected(std::move(found.error()));
    }
  }
  if (d.primary() < 0) {
    return fail(Errc::out_of_range, "card " + std::to_string(a.region.requester) + " was lent memory on " +
                                        to_string(a.device_uuid) + " for " + to_string(a.requester_uuid) +
                                        ", and this process sees neither GPU (CUDA_VISIBLE_DEVICES?)");
  }
  return d;
}

/// The card among a server's `cards` (AllocationClient::cards()) whose GPU is `uuid`: how a
/// process finds its own GPU's card whatever the two sides' numbering. Errors: invalid_argument
/// for no_device_uuid; out_of_range when no card is that GPU (a host-twin server's cards are none).
[[nodiscard]] inline Result<int> card_of(const std::vector<CardInfo>& cards, const DeviceUuid& uuid) {
  if (!names_a_device(uuid)) {
    return fail(Errc::invalid_argument, "card_of needs a device's UUID, not no_device_uuid");
  }
  for (const CardInfo& c : cards) {
    if (c.uuid == uuid) {
      return c.card;
    }
  }
  return fail(Errc::out_of_range, "the server has no card on " + to_string(uuid) + " (its " +
                                      std::to_string(cards.size()) + " cards are other GPUs or host twins)");
}

} // namespace carve::service
