/// @file carve/mirror/priority_dispatcher.hpp
/// Compute resources handed to requests in priority order.
///
/// @code
/// carve::PriorityDispatcher dispatcher(backend.devices());
/// auto t = dispatcher.submit({.priority = 10, .compute_units = 32});   // 32 SMs on one device
/// for (const carve::ComputeGrant& g : dispatcher.dispatch()) launch(g.device, g.units);
/// dispatcher.release(g);
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
#pragma once

#include <carve/core/errc.hpp>
#include <carve/mirror/device_info.hpp>
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
  int priority = 0;                ///< higher is served first (real-time work above batch work)
  std::uint32_t compute_units = 0; ///< contiguous units on one device; 0 for a whole device
};

/// The compute resource a request received: `units` of `device`. `ticket` names the request.
struct ComputeGrant {
  std::uint64_t ticket = 0; ///< what submit() returned
  std::uint32_t device = 0; ///< the device's index
  SlotRange units{0, 0};    ///< the partition of its compute units
  int priority = 0;         ///< the request's priority
};

/// A priority queue of ComputeRequests over the devices' compute units. One owner; not
/// synchronised.
class PriorityDispatcher {
public:
  /// One slot per compute unit of every available device (devices without units get no work).
  explicit PriorityDispatcher(std::span<const DeviceInfo> devices, DispatchOrder order = DispatchOrder::strict_priority)
      : order_(order) {
    for (const DeviceInfo& d : devices) {
      if (d.available && d.compute_units != 0) {
        units_.emplace_back(DynamicSlotAllocator<BoundaryNearestFit>(d.compute_units));
      } else {
        units_.emplace_back(std::nullopt);
      }
    }
  }

  /// Queues a request and returns its ticket. Errors: invalid_size when no usable device has that
  /// many compute units (it could never be served).
  cuda::std::expected<std::uint64_t, Errc> submit(ComputeRequest r) {
    if (!could_ever_fit(r)) {
      return cuda::std::unexpected(Errc::invalid_size);
    }
    const std::uint64_t ticket = next_ticket_++;
    queue_.emplace(Key{-static_cast<long long>(r.priority), ticket}, r);
    return ticket;
  }

  /// Removes a queued request. Errors: not_allocated when the ticket is not queued.
  cuda::std::expected<void, Errc> cancel(std::uint64_t ticket) {
    for (auto it = queue_.begin(); it != queue_.end(); ++it) {
      if (it->first.ticket == ticket) {
        queue_.erase(it);
        return {};
      }
    }
    return cuda::std::unexpected(Errc::not_allocated);
  }

  /// Serves queued requests in priority order. Each candidate grant is offered to admit(grant); when
  /// it returns false the grant is taken back and the request stays queued (as if it did not fit),
  /// e.g. because its memory could not be placed. Returns the accepted grants, in order.
  template <class Admit>
  std::vector<ComputeGrant> dispatch(Admit&& admit) {
    std::vector<ComputeGrant> granted;
    for (auto it = queue_.begin(); it != queue_.end();) {
      const ComputeRequest r = it->second;
      std::optional<ComputeGrant> g = place(r, it->first.ticket);
      if (g && !admit(static_cast<const ComputeGrant&>(*g))) {
        (void)units_[g->device]->deallocate(g->units);
        g.reset();
      }
      if (!g) {
        if (order_ == DispatchOrder::strict_priority) {
          break;
        }
        ++it;
        continue;
      }
      held_.emplace(g->ticket, *g);
      granted.push_back(*g);
      it = queue_.erase(it);
    }
    return granted;
  }
  /// dispatch(admit) admitting every grant.
  std::vector<ComputeGrant> dispatch() {
    return dispatch([](const ComputeGrant&) { return true; });
  }

  /// Gives a grant's units back. Errors: not_allocated when it is not held (released already).
  cuda::std::expected<void, Errc> release(const ComputeGrant& g) {
    const auto it = held_.find(g.ticket);
    if (it == held_.end() || it->second.device != g.device || !(it->second.units == g.units)) {
      return cuda::std::unexpected(Errc::not_allocated);
    }
    (void)units_[g.device]->deallocate(g.units);
    held_.erase(it);
    return {};
  }

  /// Requests waiting.
  std::size_t queued() const noexcept { return queue_.size(); }
  /// Grants not yet released.
  std::size_t held() const noexcept { return held_.size(); }
  /// Free compute units of `device`; 0 for an unknown or unusable one.
  std::uint32_t free_units(std::uint32_t device) const {
    return device < units_.size() && units_[device] ? units_[device]->free_count() : 0;
  }
  /// What a pass does with a request it cannot serve.
  DispatchOrder order() const noexcept { return order_; }

private:
  struct Key {
    long long neg_priority;
    std::uint64_t ticket;
    friend bool operator<(const Key& a, const Key& b) noexcept {
      return a.neg_priority != b.neg_priority ? a.neg_priority < b.neg_priority : a.ticket < b.ticket;
    }
  };

  std::uint32_t wanted(const ComputeRequest& r, std::uint32_t device) const {
    return r.compute_units != 0 ? r.compute_units : units_[device]->size();
  }
  bool could_ever_fit(const ComputeRequest& r) const {
    for (std::uint32_t d = 0; d < units_.size(); ++d) {
      if (units_[d] && wanted(r, d) <= units_[d]->size()) {
        return true;
      }
    }
    return false;
  }
  std::optional<ComputeGrant> place(const ComputeRequest& r, std::uint64_t ticket) {
    std::optional<std::uint32_t> best;
    for (std::uint32_t d = 0; d < units_.size(); ++d) {
      if (units_[d] && units_[d]->largest_free_run() >= wanted(r, d) &&
          (!best || units_[d]->free_count() > units_[*best]->free_count())) {
        best = d;
      }
    }
    if (!best) {
      return std::nullopt;
    }
    const auto units = units_[*best]->allocate(wanted(r, *best));
    if (!units) {
      return std::nullopt;
    }
    return ComputeGrant{ticket, *best, *units, r.priority};
  }

  DispatchOrder order_;
  std::vector<std::optional<DynamicSlotAllocator<BoundaryNearestFit>>> units_;
  std::map<Key, ComputeRequest> queue_;
  std::map<std::uint64_t, ComputeGrant> held_;
  std::uint64_t next_ticket_ = 1;
};

} // namespace carve
