/// @file carve/mirror/peer_views.hpp
/// Device views over several devices' granules, with peer access switched on once per pair: the
/// part of a DeviceViewBackend that does not depend on how copies are made.
///
/// A backend keeps each device's memory as DeviceGranules and hands them to PeerViews::map with an
/// allocation's runs; PeerViews decides which devices may use the view (those that reach every
/// run's owner, by the `Peer` policy: AlwaysMapped, SimulatedPeerAccess, CudaPeerAccess), switches
/// each (user, owner) pair on through the policy the first time it is needed, and maps the view
/// (map_granule_view). A pair the policy refuses stays refused for this object's life, even where
/// the refusal might pass (a driver out of peer slots): no later view opens to it, so reaches()
/// can say no for it and be right about every view, old and new. Thread-safe: every call
/// serialises on an internal lock.
#pragma once

#include <carve/borrow/peer_access.hpp>
#include <carve/core/errc.hpp>
#include <carve/core/error.hpp>
#include <carve/mirror/mirror_backend.hpp>
#include <carve/vmm/device_granules.hpp>
#include <carve/vmm/physical_memory_mapper.hpp>

#include <cstddef>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace carve {

/// Views over devices' granules (see the file's description). Devices are named by the backend's
/// indices; `devices[i]` is device i's memory (null: unavailable).
template <PhysicalMemoryMapper Mapper, PeerAccess Peer>
class PeerViews {
public:
  /// Memory of one backend device; null for an unavailable one.
  using Memory = const DeviceGranules<Mapper>*;

  /// No pair switched on yet.
  explicit PeerViews(Peer peer) : peer_(std::move(peer)) {}

  /// Whether `from` reaches `to`'s memory (a device always reaches its own; an unavailable one
  /// nothing; a pair whose enable() the policy refused, never).
  bool reaches(std::span<const Memory> devices, std::size_t from, std::size_t to) const {
    const std::lock_guard lock(mutex_);
    return reaches_locked(devices, from, to);
  }

  /// `runs` back to back in a new range, read/write for every device that reaches every run's
  /// owner (pairs switched on first; a pair the policy refuses leaves that device out). Errors
  /// (nothing stays mapped): out_of_range for an unknown or unavailable device or a run past its
  /// memory; invalid_size and the mapper's, as map_granule_view.
  [[nodiscard]] Result<PlacedMemory> map(Mapper& mapper, std::span<const Memory> devices,
                                         std::span<const MirrorViewRun> runs) {
    const std::lock_guard lock(mutex_);
    std::vector<GranuleRun<Mapper>> granules;
    granules.reserve(runs.size());
    std::vector<bool> owner(devices.size(), false);
    for (const MirrorViewRun& r : runs) {
      if (r.device >= devices.size() || devices[r.device] == nullptr || r.offset > devices[r.device]->bytes() ||
          r.bytes > devices[r.device]->bytes() - r.offset) {
        return fail(Errc::out_of_range,
                    "carve::PeerViews: a run past device " + std::to_string(r.device) + "'s memory");
      }
      granules.push_back({devices[r.device], r.offset, r.bytes});
      owner[r.device] = true;
    }
    grow(devices.size());
    std::vector<int> access;
    for (std::size_t d = 0; d < devices.size(); ++d) {
      if (reaches_all(devices, d, owner) && enable_pairs(devices, d, owner)) {
        access.push_back(devices[d]->device());
      }
    }
    return map_granule_view<Mapper>(mapper, granules, access);
  }

  /// Undoes map. Errors: the mapper's (not_allocated for a range map did not return).
  [[nodiscard]] Result<void> unmap(Mapper& mapper, const PlacedMemory& view) {
    const std::lock_guard lock(mutex_);
    return unplace_physical(mapper, view);
  }

  /// The policy (with any state it keeps).
  const Peer& peer() const noexcept { return peer_; }

private:
  enum class Pair : unsigned char { untried, enabled, refused };

  bool reaches_locked(std::span<const Memory> devices, std::size_t from, std::size_t to) const noexcept {
    return from < devices.size() && to < devices.size() && devices[from] != nullptr && devices[to] != nullptr &&
           (from == to ||
            (pair(from, to) != Pair::refused && peer_.can_access(devices[from]->device(), devices[to]->device())));
  }
  Pair pair(std::size_t user, std::size_t owner) const noexcept {
    return user < pairs_.size() && owner < pairs_.size() ? pairs_[user][owner] : Pair::untried;
  }
  void grow(std::size_t n) {
    if (pairs_.size() < n) {
      for (auto& row : pairs_) {
        row.resize(n, Pair::untried);
      }
      pairs_.resize(n, std::vector<Pair>(n, Pair::untried));
    }
  }
  bool reaches_all(std::span<const Memory> devices, std::size_t d, const std::vector<bool>& owner) const noexcept {
    for (std::size_t o = 0; o < owner.size(); ++o) {
      if (owner[o] && !reaches_locked(devices, d, o)) {
        return false;
      }
    }
    return devices[d] != nullptr;
  }
  // Switches on every (d, owner) pair not on yet; false when the policy refuses one (which is
  // then never asked again: reaches_locked says no for it from now on).
  bool enable_pairs(std::span<const Memory> devices, std::size_t d, const std::vector<bool>& owner) {
    for (std::size_t o = 0; o < owner.size(); ++o) {
      if (!owner[o] || o == d || pairs_[d][o] == Pair::enabled) {
        continue;
      }
      if (!peer_.enable(devices[d]->device(), devices[o]->device())) {
        pairs_[d][o] = Pair::refused;
        return false;
      }
      pairs_[d][o] = Pair::enabled;
    }
    return true;
  }

  Peer peer_;
  mutable std::mutex mutex_;
  std::vector<std::vector<Pair>> pairs_; // [user][owner]: what peer_.enable answered
};

} // namespace carve
