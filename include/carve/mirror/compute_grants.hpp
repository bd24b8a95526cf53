/// @file carve/mirror/compute_grants.hpp
/// The compute side of a PagedMirror: requests for compute and memory together, granted in
/// priority order.
///
/// @code
/// auto ticket = mirror.submit({.bytes = 64 << 20, .priority = 3, .compute_units = 32});
/// for (const carve::ResourceGrant& g : mirror.dispatch()) {           // SMs, then memory near them
///   (void)mirror.run(g, [&](auto stream) { launch(g.address, stream); }); // returned once it has run
/// }
/// @endcode
///
/// submit / dispatch / release hand devices or SM partitions to requests in priority order
/// (PriorityDispatcher) and answer with a pair: a compute resource and memory the mirror placed
/// near it. The `Partitioner` decides whether a partition binds: AdvisorySmLedger (the default)
/// keeps a ledger only; CudaGreenContexts backs each grant with a green context, whose stream
/// (compute_stream) runs on the granted SMs only. A released grant's SMs and memory return when the
/// work on its stream has run (see carve/mirror/sm_partitioner.hpp).
///
/// MirrorComputeGrants is a base of PagedMirror (CRTP): the grants share the mirror's lock and
/// take their memory through it, so a grant's memory is ordinary mirror memory (sync, fetch and
/// segments work on it). Kept apart from the memory side so that each can be read alone.
#pragma once

#include <carve/core/errc.hpp>
#include <carve/mirror/device_info.hpp>
#include <carve/mirror/priority_dispatcher.hpp>
#include <carve/mirror/sm_partitioner.hpp>

#include <cuda/std/expected>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

namespace carve {

/// A request for compute and memory together.
struct ResourceRequest {
  std::size_t bytes = 0;           ///< memory wanted
  int priority = 0;                ///< higher is served first
  std::uint32_t compute_units = 0; ///< contiguous units on one device, rounded up to whole groups; 0: a whole device
};

/// What a request received: compute units and memory near them.
struct ResourceGrant {
  ComputeGrant compute{};  ///< the compute resource: device and unit range
  void* address = nullptr; ///< the memory, placed near compute.device by the placement policy
  std::size_t bytes = 0;   ///< as requested
};

/// The compute-grant scheduler of a PagedMirror `Mirror` (its CRTP base). `Mirror` gives it, as a
/// friend: `control_` (the mirror's lock), `could_ever_hold(bytes)`,
/// `allocate_locked(bytes, priority, device)` and `free_granted(p)`, the last two under that lock.
template <class Mirror, SmPartitioner Partitioner>
class MirrorComputeGrants {
public:
  using partitioner_type = Partitioner;                  ///< how compute grants are backed
  using stream_type = typename Partitioner::stream_type; ///< where a grant's work goes

  /// Queues a request for compute and memory. Errors: invalid_size (0 bytes), no_space (more
  /// compute units than any device has, or more memory than the mirror holds: it could never be
  /// granted, and in strict priority order it would hold back every request behind it for good).
  [[nodiscard]] cuda::std::expected<std::uint64_t, Errc> submit(const ResourceRequest& r) {
    const std::lock_guard control(self().control_);
    if (r.bytes == 0) {
      return cuda::std::unexpected(Errc::invalid_size);
    }
    if (!self().could_ever_hold(r.bytes)) {
      return cuda::std::unexpected(Errc::no_space);
    }
    const auto ticket = dispatcher_.submit({r.priority, r.compute_units});
    if (ticket) {
      pending_bytes_.emplace(*ticket, r.bytes);
    }
    return ticket;
  }

  /// Takes back grants whose work has run (reclaim()), then grants queued requests in priority
  /// order: each gets a compute resource, then its memory near that device. A request whose memory
  /// does not fit now stays queued (and, in strict priority order, holds back the ones behind it).
  std::vector<ResourceGrant> dispatch() {
    const std::lock_guard control(self().control_);
    std::vector<ResourceGrant> out;
    const auto admit = [&](const ComputeGrant& g) {
      const auto pending = pending_bytes_.find(g.ticket);
      if (pending == pending_bytes_.end()) {
        return false; // every queued ticket has its bytes: submit() records them together
      }
      const std::size_t bytes = pending->second;
      const auto memory = self().allocate_locked(bytes, g.priority, g.device);
      if (!memory) {
        return false;
      }
      pending_bytes_.erase(pending);
      granted_memory_.emplace(g.ticket, *memory);
      out.push_back({g, *memory, bytes});
      return true;
    };
    // The dispatcher takes back finished grants before it serves: their memory goes with them.
    dispatcher_.dispatch(admit, [&](const ComputeGrant& g) { free_memory_of(g); });
    return out;
  }

  /// Where the grant's work goes: a stream on its SMs (see PriorityDispatcher::stream). Errors:
  /// not_allocated when the grant is not held or was released.
  [[nodiscard]] cuda::std::expected<stream_type, Errc> compute_stream(const ResourceGrant& g) const {
    const std::lock_guard control(self().control_);
    return dispatcher_.stream(g.compute);
  }

  /// Hands a grant back: nothing more will be queued on its stream. Its compute units and its
  /// memory return together once that work has run: at once when it has (always, for advisory
  /// grants), else at a later reclaim() or dispatch(). Errors: not_allocated when the grant is not
  /// held or was released already.
  [[nodiscard]] cuda::std::expected<void, Errc> release(const ResourceGrant& g) {
    const std::lock_guard control(self().control_);
    const auto held = granted_memory_.find(g.compute.ticket);
    if (held == granted_memory_.end() || held->second != g.address) {
      return cuda::std::unexpected(Errc::not_allocated);
    }
    if (auto r = dispatcher_.release(g.compute); !r) {
      return r;
    }
    reclaim_locked();
    return {};
  }

  /// Queues the grant's work, `work(stream)` with its compute stream, then hands the grant back:
  /// its units and memory return once that work has run, with no release() to call. `work` runs
  /// outside the mirror's lock (it may call segments() for device pointers); no other thread may
  /// release the grant meanwhile. Errors: not_allocated when the grant is not held or was
  /// released (work is not called then).
  template <class Work>
  [[nodiscard]] cuda::std::expected<void, Errc> run(const ResourceGrant& g, Work&& work) {
    const auto s = compute_stream(g);
    if (!s) {
      return cuda::std::unexpected(s.error());
    }
    std::forward<Work>(work)(*s);
    return release(g);
  }

  /// Takes back every released grant whose work has run (compute units and memory) and returns
  /// how many. Asks the streams without waiting.
  std::size_t reclaim() {
    const std::lock_guard control(self().control_);
    return reclaim_locked();
  }

  /// Grants handed out and not yet taken back (released ones still running included).
  std::size_t held_grants() const {
    const std::lock_guard control(self().control_);
    return dispatcher_.held();
  }

  /// The partitioner behind the grants (SimulatedGreenContexts: where a test queues and completes
  /// the grants' work; it synchronises itself).
  Partitioner& partitioner() noexcept { return dispatcher_.partitioner(); }

  /// Whether grants on `device` are enforced by the hardware (see ComputeGrant::enforced).
  bool compute_enforced(std::uint32_t device) const {
    const std::lock_guard control(self().control_);
    return dispatcher_.enforced(device);
  }

  /// Withdraws a queued request. Errors: not_allocated when it is not queued.
  [[nodiscard]] cuda::std::expected<void, Errc> cancel(std::uint64_t ticket) {
    const std::lock_guard control(self().control_);
    auto r = dispatcher_.cancel(ticket);
    if (r) {
      pending_bytes_.erase(ticket);
    }
    return r;
  }

  /// Requests submitted and not yet granted or cancelled.
  std::size_t queued_requests() const {
    const std::lock_guard control(self().control_);
    return dispatcher_.queued();
  }

protected:
  /// Whether `p` is the memory of a grant held now (it goes back with the grant, not through the
  /// mirror's try_deallocate). Under the mirror's lock.
  bool holds_grant_memory(const void* p) const noexcept {
    return std::any_of(granted_memory_.begin(), granted_memory_.end(), [p](const auto& g) { return g.second == p; });
  }

  /// The scheduler over `devices`' compute units, grants served in `order` and backed by `partitioner`.
  MirrorComputeGrants(const std::vector<DeviceInfo>& devices, DispatchOrder order, Partitioner partitioner)
      : dispatcher_(devices, order, std::move(partitioner)) {}
  ~MirrorComputeGrants() = default;
  MirrorComputeGrants(const MirrorComputeGrants&) = delete;
  MirrorComputeGrants& operator=(const MirrorComputeGrants&) = delete;

private:
  Mirror& self() noexcept { return static_cast<Mirror&>(*this); }
  const Mirror& self() const noexcept { return static_cast<const Mirror&>(*this); }

  std::size_t reclaim_locked() {
    const std::vector<ComputeGrant> done = dispatcher_.reclaim();
    for (const ComputeGrant& g : done) {
      free_memory_of(g);
    }
    return done.size();
  }

  // A grant taken back: its memory returns to the mirror. Under the lock.
  void free_memory_of(const ComputeGrant& g) {
    const auto it = granted_memory_.find(g.ticket);
    if (it != granted_memory_.end()) {
      self().free_granted(it->second);
      granted_memory_.erase(it);
    }
  }

  PriorityDispatcher<Partitioner> dispatcher_;
  std::map<std::uint64_t, std::size_t> pending_bytes_; // queued requests' memory
  std::map<std::uint64_t, void*> granted_memory_;      // held grants' memory, by ticket
};

} // namespace carve
