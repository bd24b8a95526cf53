/// @file carve/mirror/priority_dispatcher.hpp
/// Compute resources handed to requests in priority order.
///
/// @code
/// carve::PriorityDispatcher dispatcher(backend.devices());        // advisory: a ledger of SMs
/// auto t = dispatcher.submit({.priority = 10, .compute_units = 32});   // 32 SMs on one device
/// for (const carve::ComputeGrant& g : dispatcher.dispatch()) {
///   dispatcher.run(g, [&](auto stream) { launch(g, stream); });  // green contexts: on g.units only
/// }                                     // each grant's SMs come back once its work has run
/// @endcode
///
/// The compute side of the virtual device: each device's compute units (SMs, CUs) are
/// slots, and a request takes a contiguous partition of them on one device (compute_units = 0: a
/// whole device). Requests wait in a queue ordered by priority (higher first; equal priorities in
/// submission order). dispatch() serves them from the front: each goes to the device where it fits
/// with the most units free (least loaded; ties to the lower device), placed in the device's units by
/// BoundaryNearestFit, so partitions pack against both ends and large ones still find room. With
/// DispatchOrder::strict_priority (the default) a request that cannot be served yet stops the pass,
/// so nothing of lower priority overtakes it; DispatchOrder::backfill lets smaller, lower-priority
/// requests use what the head leaves idle. Host-only; not synchronised (PagedMirror locks it).
///
/// Who enforces a grant is the SmPartitioner's business (carve/mirror/sm_partitioner.hpp).
/// AdvisorySmLedger, the default, enforces nothing: ComputeGrant::enforced is false and the grant
/// is a promise between the callers. CudaGreenContexts backs each grant with a green context
/// holding exactly its SMs; then the slots are the driver's SM groups (2, 4 or 8 SMs), requests are
/// rounded up to whole groups, and units are reported in SMs. Release follows completion: release()
/// only says no more work comes, and the units return when the grant's stream is idle, checked by
/// reclaim() (which dispatch() runs first), so a new grant never gets SMs old work still runs on.
#pragma once

#include <carve/core/errc.hpp>
#include <carve/core/error.hpp>
#include <carve/mirror/device_info.hpp>
#include <carve/mirror/sm_partitioner.hpp>
#include <carve/slot/allocator/dynamic_slot_allocator.hpp>
#include <carve/slot/policy/boundary_nearest_fit.hpp>
#include <carve/slot/storage/slot_range.hpp>

#include <cuda/std/expected>

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <utility>
#include <vector>

namespace carve {

/// What a dispatch pass does with a request it cannot serve yet.
enum class DispatchOrder {
  strict_priority, ///< stops the pass: nothing of lower priority overtakes it
  backfill         ///< goes on: later requests may use what it leaves idle
};

/// Compute units wanted on one device.
struct ComputeRequest {
  int priority = 0; ///< higher is served first (real-time work above batch work)
  /// Contiguous units on one device, rounded up to whole groups of its granule (see
  /// SmPartitioner); 0 for a whole device.
  std::uint32_t compute_units = 0;
};

/// The compute resource a request received: `units` of `device`. `ticket` names the request.
struct ComputeGrant {
  std::uint64_t ticket = 0; ///< what submit() returned
  std::uint32_t device = 0; ///< the device's index
  SlotRange units{0, 0};    ///< the partition of its compute units (whole groups of the device's granule)
  int priority = 0;         ///< the request's priority
  /// true: work on the grant's stream runs on `units` only (a green context); false: advisory, a
  /// ledger entry the hardware does not know of.
  bool enforced = false;
};

/// A priority queue of ComputeRequests over the devices' compute units, each grant backed by
/// `Partitioner` (see carve/mirror/sm_partitioner.hpp). One owner; not synchronised; not copyable.
template <SmPartitioner Partitioner = AdvisorySmLedger>
class PriorityDispatcher {
public:
  using partitioner_type = Partitioner;                  ///< how grants are backed
  using stream_type = typename Partitioner::stream_type; ///< where a grant's work goes

  /// The usable devices' SMs, cut into groups as `partitioner` lays each device out (once, here;
  /// devices without units, unavailable ones and ones the partitioner gives no group get no work).
  explicit PriorityDispatcher(std::span<const DeviceInfo> devices, DispatchOrder order = DispatchOrder::strict_priority,
                              Partitioner partitioner = {})
      : order_(order), partitioner_(std::move(partitioner)) {
    for (std::uint32_t d = 0; d < devices.size(); ++d) {
      const DeviceInfo& info = devices[d];
      std::optional<Device> device;
      if (info.available && info.compute_units != 0) {
        SmLayout layout = partitioner_.layout(d, info.compute_units);
        if (layout.granule != 0 && info.compute_units / layout.granule < layout.groups) {
          layout.groups = info.compute_units / layout.granule; // never more SMs than the device has
        }
        if (layout.granule != 0 && layout.groups != 0) {
          device.emplace(Device{DynamicSlotAllocator<BoundaryNearestFit>(layout.groups), layout});
        }
      }
      devices_.push_back(std::move(device));
    }
  }
  PriorityDispatcher(const PriorityDispatcher&) = delete;
  PriorityDispatcher& operator=(const PriorityDispatcher&) = delete;
  /// Ends every partition still held (the partitioner waits for their work first).
  ~PriorityDispatcher() {
    for (auto& [ticket, h] : held_) {
      partitioner_.destroy(h.partition);
    }
  }

  /// Queues a request and returns its ticket. Errors: no_space when no usable device has that
  /// many compute units in whole groups (it could never be served).
  [[nodiscard]] cuda::std::expected<std::uint64_t, Errc> submit(ComputeRequest r) {
    if (!could_ever_fit(r)) {
      return cuda::std::unexpected(Errc::no_space);
    }
    const std::uint64_t ticket = next_ticket_++;
    queue_.emplace(Key{-static_cast<long long>(r.priority), ticket}, r);
    return ticket;
  }

  /// Removes a queued request. Errors: not_allocated when the ticket is not queued.
  [[nodiscard]] cuda::std::expected<void, Errc> cancel(std::uint64_t ticket) {
    for (auto it = queue_.begin(); it != queue_.end(); ++it) {
      if (it->first.ticket == ticket) {
        queue_.erase(it);
        return {};
      }
    }
    return cuda::std::unexpected(Errc::not_allocated);
  }

  /// Takes back what finished grants held (reclaim()), then serves queued requests in priority
  /// order. Each is rounded up to whole groups, placed, and backed by the partitioner; the
  /// candidate grant is then offered to admit(grant): when it returns false the grant is taken
  /// back and the request stays queued (as if it did not fit), e.g. because its memory could not
  /// be placed. A partition the partitioner cannot create counts as not fitting too (last_error()
  /// says why). Each grant taken back first is passed to reclaimed(grant), so that whatever the
  /// caller tied to it (PagedMirror: its memory) goes with it. Returns the accepted grants, in order.
  template <class Admit, class Reclaimed>
  std::vector<ComputeGrant> dispatch(Admit&& admit, Reclaimed&& reclaimed) {
    for (const ComputeGrant& g : reclaim()) {
      reclaimed(g);
    }
    std::vector<ComputeGrant> granted;
    for (auto it = queue_.begin(); it != queue_.end();) {
      const ComputeRequest r = it->second;
      std::optional<Held> h = place(r, it->first.ticket);
      if (h && !admit(static_cast<const ComputeGrant&>(h->grant))) {
        give_back(*h);
        h.reset();
      }
      if (!h) {
        if (order_ == DispatchOrder::strict_priority) {
          break;
        }
        ++it;
        continue;
      }
      granted.push_back(h->grant);
      held_.emplace(h->grant.ticket, std::move(*h));
      it = queue_.erase(it);
    }
    return granted;
  }
  /// dispatch(admit, reclaimed) for a caller that ties nothing to its grants.
  template <class Admit>
  std::vector<ComputeGrant> dispatch(Admit&& admit) {
    return dispatch(std::forward<Admit>(admit), [](const ComputeGrant&) {});
  }
  /// dispatch(admit) admitting every grant.
  std::vector<ComputeGrant> dispatch() {
    return dispatch([](const ComputeGrant&) { return true; });
  }

  /// Where work for grant `g` goes: a stream inside its partition. Errors: not_allocated when `g`
  /// is not held or was released.
  [[nodiscard]] cuda::std::expected<stream_type, Errc> stream(const ComputeGrant& g) const {
    const Held* h = find(g);
    if (h == nullptr || h->released) {
      return cuda::std::unexpected(Errc::not_allocated);
    }
    return partitioner_.stream(h->partition);
  }

  /// Hands a grant back: nothing more will be queued for it. Its units return once the work
  /// queued on its stream has run (at once for advisory grants), found by the next reclaim() or
  /// dispatch(); never earlier, so no later grant shares SMs with work still running. Errors:
  /// not_allocated when it is not held or was released already.
  [[nodiscard]] cuda::std::expected<void, Errc> release(const ComputeGrant& g) {
    const auto it = held_.find(g.ticket);
    if (it == held_.end() || !same(it->second.grant, g) || it->second.released) {
      return cuda::std::unexpected(Errc::not_allocated);
    }
    it->second.released = true;
    return {};
  }

  /// Queues the grant's work, `work(stream)` with the grant's stream, and hands the grant back in
  /// the same step: its units return once that work has run, with no release() to call. Errors:
  /// not_allocated when `g` is not held or was released (work is not called then).
  template <class Work>
  [[nodiscard]] cuda::std::expected<void, Errc> run(const ComputeGrant& g, Work&& work) {
    const auto s = stream(g);
    if (!s) {
      return cuda::std::unexpected(s.error());
    }
    std::forward<Work>(work)(*s);
    return release(g);
  }

  /// Takes back every released grant whose work has run: its partition ends and its units are
  /// free again. Returns those grants (PagedMirror frees their memory). Asks without waiting.
  std::vector<ComputeGrant> reclaim() {
    std::vector<ComputeGrant> done;
    for (auto it = held_.begin(); it != held_.end();) {
      if (it->second.released && partitioner_.idle(it->second.partition)) {
        done.push_back(it->second.grant);
        give_back(it->second);
        it = held_.erase(it);
      } else {
        ++it;
      }
    }
    return done;
  }

  /// Requests waiting.
  std::size_t queued() const noexcept { return queue_.size(); }
  /// Grants not yet taken back (released ones whose work is still running included).
  std::size_t held() const noexcept { return held_.size(); }
  /// Free compute units of `device`; 0 for an unknown or unusable one.
  std::uint32_t free_units(std::uint32_t device) const {
    return usable(device) ? devices_[device]->groups.free_count() * devices_[device]->layout.granule : 0;
  }
  /// Compute units the dispatcher hands out on `device`: its groups times the granule (SMs in no
  /// group are never handed out); 0 for an unknown or unusable one.
  std::uint32_t total_units(std::uint32_t device) const {
    return usable(device) ? devices_[device]->groups.size() * devices_[device]->layout.granule : 0;
  }
  /// SMs per group on `device`: every grant there is a multiple of it; 0 for an unknown or
  /// unusable one.
  std::uint32_t granule(std::uint32_t device) const { return usable(device) ? devices_[device]->layout.granule : 0; }
  /// Whether grants on `device` are enforced by the hardware (false: advisory, or unusable).
  bool enforced(std::uint32_t device) const { return usable(device) && devices_[device]->layout.enforced; }
  /// What a pass does with a request it cannot serve.
  DispatchOrder order() const noexcept { return order_; }
  /// The partitioner (SimulatedGreenContexts: to queue and complete work in tests).
  Partitioner& partitioner() noexcept { return partitioner_; }
  /// Why the partitioner last failed to back a grant; empty when it never has.
  const std::optional<Error>& last_error() const noexcept { return last_error_; }

private:
  struct Key {
    long long neg_priority;
    std::uint64_t ticket;
    friend bool operator<(const Key& a, const Key& b) noexcept {
      return a.neg_priority != b.neg_priority ? a.neg_priority < b.neg_priority : a.ticket < b.ticket;
    }
  };
  struct Device {
    DynamicSlotAllocator<BoundaryNearestFit> groups; // the ledger: one slot per group of SMs
    SmLayout layout;
  };
  struct Held {
    ComputeGrant grant;
    SlotRange groups;
    typename Partitioner::partition_type partition;
    bool released = false;
  };

  static bool same(const ComputeGrant& a, const ComputeGrant& b) noexcept {
    return a.ticket == b.ticket && a.device == b.device && a.units == b.units;
  }
  const Held* find(const ComputeGrant& g) const {
    const auto it = held_.find(g.ticket);
    return it != held_.end() && same(it->second.grant, g) ? &it->second : nullptr;
  }
  bool usable(std::uint32_t device) const noexcept { return device < devices_.size() && devices_[device]; }
  // Groups a request needs on `device`: its units rounded up to whole groups; 0 units: all.
  std::uint32_t wanted(const ComputeRequest& r, std::uint32_t device) const {
    const Device& d = *devices_[device];
    const std::uint32_t g = d.layout.granule;
    return r.compute_units != 0 ? r.compute_units / g + (r.compute_units % g != 0 ? 1U : 0U) : d.groups.size();
  }
  bool could_ever_fit(const ComputeRequest& r) const {
    for (std::uint32_t d = 0; d < devices_.size(); ++d) {
      if (devices_[d] && wanted(r, d) <= devices_[d]->groups.size()) {
        return true;
      }
    }
    return false;
  }
  std::optional<Held> place(const ComputeRequest& r, std::uint64_t ticket) {
    std::optional<std::uint32_t> best;
    for (std::uint32_t d = 0; d < devices_.size(); ++d) {
      if (devices_[d] && devices_[d]->groups.largest_free_run() >= wanted(r, d) &&
          (!best || free_units(d) > free_units(*best))) {
        best = d;
      }
    }
    if (!best) {
      return std::nullopt;
    }
    Device& device = *devices_[*best];
    const auto groups = device.groups.allocate(wanted(r, *best));
    if (!groups) {
      return std::nullopt;
    }
    auto partition = partitioner_.create(*best, *groups);
    if (!partition) {
      (void)device.groups.deallocate(*groups);
      last_error_ = partition.error();
      return std::nullopt;
    }
    const std::uint32_t granule = device.layout.granule;
    const ComputeGrant g{ticket, *best, SlotRange{groups->first * granule, groups->count * granule}, r.priority,
                         device.layout.enforced};
    return Held{g, *groups, std::move(*partition), false};
  }
  void give_back(const Held& h) noexcept {
    partitioner_.destroy(h.partition);
    (void)devices_[h.grant.device]->groups.deallocate(h.groups);
  }

  DispatchOrder order_;
  Partitioner partitioner_;
  std::vector<std::optional<Device>> devices_;
  std::map<Key, ComputeRequest> queue_;
  std::map<std::uint64_t, Held> held_;
  std::optional<Error> last_error_;
  std::uint64_t next_ticket_ = 1;
};

} // namespace carve
