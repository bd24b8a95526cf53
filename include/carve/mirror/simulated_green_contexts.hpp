/// @file carve/mirror/simulated_green_contexts.hpp
/// Green contexts on the host: `SimulatedGreenContexts`, the host twin of CudaGreenContexts, and
/// `green_context_granule`, the driver's partition rule per architecture.
///
/// @code
/// carve::SimulatedGreenContexts gpus({{.sm_count = 132, .cc_major = 9}, {.sm_count = 108, .cc_major = 8}});
/// carve::PriorityDispatcher dispatcher(devices, carve::DispatchOrder::strict_priority, std::move(gpus));
/// auto& sim = dispatcher.partitioner();
/// const carve::ComputeGrant g = dispatcher.dispatch().at(0);
/// sim.enqueue(*dispatcher.stream(g));   // a kernel for the grant
/// dispatcher.release(g);                // its SMs return once that kernel has run:
/// sim.complete(*dispatcher.stream(g));  // now, at the next reclaim() or dispatch()
/// @endcode
///
/// The same partition rules as the driver (CUDA driver API, "Green Contexts"): compute capability
/// 6.x and 7.x split into groups of 2 SMs, 8.x into groups of 4 (at least 4, a multiple of 2),
/// 9.0 and later into groups of 8; each device is split once, into as many whole groups as its SMs
/// allow, and a partition holds a run of them. Before 6.0, or where a simulated driver lacks green
/// contexts, a device is advisory: groups of one SM, nothing enforced, yet every grant still has
/// a stream of its own, as CudaGreenContexts gives it one. What the twin checks that the driver
/// would not: create() refuses a group that a live partition holds, so a dispatcher that handed
/// out overlapping grants fails here. Each partition has a simulated stream whose work a test
/// queues and completes by hand, in order, like SimulatedStreams. Thread-safe: a test thread may
/// complete work while the dispatcher's owner polls.
#pragma once

#include <carve/core/error.hpp>
#include <carve/mirror/sm_partitioner.hpp>
#include <carve/mr/stream_events.hpp>
#include <carve/slot/storage/slot_range.hpp>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace carve {

/// SMs per green-context group on compute capability `major`.`minor`: 2 (6.x, 7.x), 4 (8.x),
/// 8 (9.0 and later); 0 where green contexts do not exist (before 6.0). The driver's minimum
/// partition size rounded up to its alignment, as the CUDA driver API documents them.
constexpr std::uint32_t green_context_granule(int major, int /*minor*/) noexcept {
  if (major < 6) {
    return 0;
  }
  if (major < 8) {
    return 2;
  }
  return major == 8 ? 4 : 8;
}

/// A GPU as SimulatedGreenContexts plays it.
struct SimulatedGpu {
  std::uint32_t sm_count = 0;            ///< SMs on the device
  int cc_major = 9;                      ///< compute capability, major
  int cc_minor = 0;                      ///< compute capability, minor
  bool driver_has_green_contexts = true; ///< false: a driver before 12.5 (the device is advisory)
};

/// Green contexts and their streams, simulated: the partition rules of the driver and ordered
/// completion per stream (see the file's description). Copies share nothing; movable.
class SimulatedGreenContexts {
public:
  /// A partition's stream.
  using stream_type = SimulatedStream;
  /// A simulated green context (or, on an advisory device, a plain stream).
  struct partition_type {
    std::uint32_t id = 0;     ///< also its stream's id
    std::uint32_t device = 0; ///< which GPU
    SlotRange groups{0, 0};   ///< which groups of that GPU's split it holds
    bool enforced = false;    ///< a green context (true) or a plain stream (false)
  };

  /// The GPUs, by the dispatcher's device index.
  explicit SimulatedGreenContexts(std::vector<SimulatedGpu> gpus) : gpus_(std::move(gpus)), owner_(gpus_.size()) {}
  /// Takes over the other's GPUs and partitions (not thread-safe: nothing else may use `other`).
  SimulatedGreenContexts(SimulatedGreenContexts&& other) noexcept
      : gpus_(std::move(other.gpus_)), owner_(std::move(other.owner_)), streams_(std::move(other.streams_)),
        next_id_(other.next_id_) {}
  SimulatedGreenContexts& operator=(SimulatedGreenContexts&&) = delete;

  /// Splits `device` once: as many whole groups as its SMs (at most `units`) allow; granule 1 and
  /// not enforced where green contexts are missing. A device the twin does not know is advisory.
  SmLayout layout(std::uint32_t device, std::uint32_t units) {
    const std::lock_guard lock(mutex_);
    if (device >= owner_.size()) {
      owner_.resize(std::size_t{device} + 1);
    }
    if (device >= gpus_.size()) {
      owner_[device].assign(units, 0);
      return {1, units, false};
    }
    const SimulatedGpu& g = gpus_[device];
    const std::uint32_t granule = green_context_granule(g.cc_major, g.cc_minor);
    const std::uint32_t sms = units < g.sm_count ? units : g.sm_count;
    if (granule == 0 || !g.driver_has_green_contexts) {
      owner_[device].assign(sms, 0);
      return {1, sms, false};
    }
    owner_[device].assign(sms / granule, 0);
    return {granule, sms / granule, true};
  }

  /// A green context over `groups` of `device`'s split, with a stream. Errors: out_of_range for
  /// an unknown device or groups past its split; invalid_argument for an empty range or a group
  /// that a live partition holds (partitions must be disjoint).
  [[nodiscard]] Result<partition_type> create(std::uint32_t device, SlotRange groups) {
    const std::lock_guard lock(mutex_);
    if (device >= owner_.size() || groups.end() > owner_[device].size()) {
      return fail(Errc::out_of_range, "no SM groups [" + std::to_string(groups.first) + ", " +
                                          std::to_string(groups.end()) + ") on simulated GPU " +
                                          std::to_string(device));
    }
    if (groups.count == 0) {
      return fail(Errc::invalid_argument, "a green context needs at least one SM group");
    }
    for (std::uint32_t i = groups.first; i < groups.end(); ++i) {
      if (owner_[device][i] != 0) {
        return fail(Errc::invalid_argument, "SM group " + std::to_string(i) + " of simulated GPU " +
                                                std::to_string(device) + " already belongs to green context " +
                                                std::to_string(owner_[device][i]));
      }
    }
    const std::uint32_t id = ++next_id_;
    streams_.emplace(id, Queue{});
    for (std::uint32_t i = groups.first; i < groups.end(); ++i) {
      owner_[device][i] = id;
    }
    return partition_type{id, device, groups, enforced_locked(device)};
  }
  /// The partition's stream.
  SimulatedStream stream(const partition_type& p) const noexcept { return {p.id}; }
  /// Whether everything queued on the partition's stream has run.
  bool idle(const partition_type& p) const { return pending(stream(p)) == 0; }
  /// Ends the partition: its groups are free for another. Work still queued is dropped (the
  /// dispatcher destroys only idle partitions while it runs).
  void destroy(const partition_type& p) noexcept {
    const std::lock_guard lock(mutex_);
    streams_.erase(p.id);
    if (p.device < owner_.size()) {
      for (std::uint32_t i = p.groups.first; i < p.groups.end() && i < owner_[p.device].size(); ++i) {
        if (owner_[p.device][i] == p.id) {
          owner_[p.device][i] = 0;
        }
      }
    }
  }

  /// Queues one piece of work (a kernel) on `s`. Errors: out_of_range when `s` is no live
  /// partition's stream.
  [[nodiscard]] Result<void> enqueue(SimulatedStream s) {
    const std::lock_guard lock(mutex_);
    const auto it = streams_.find(s.id);
    if (it == streams_.end()) {
      return fail(Errc::out_of_range, "no live simulated green-context stream " + std::to_string(s.id));
    }
    ++it->second.queued;
    return {};
  }
  /// Runs the oldest `n` pieces of work queued on `s` (all when fewer are queued); nothing for a
  /// stream that is gone.
  void complete(SimulatedStream s, std::uint64_t n = ~std::uint64_t{0}) {
    const std::lock_guard lock(mutex_);
    if (const auto it = streams_.find(s.id); it != streams_.end()) {
      const std::uint64_t left = it->second.queued - it->second.done;
      it->second.done += n < left ? n : left;
    }
  }
  /// Work queued on `s` that has not run (0 for a stream that is gone).
  std::uint64_t pending(SimulatedStream s) const {
    const std::lock_guard lock(mutex_);
    const auto it = streams_.find(s.id);
    return it == streams_.end() ? 0 : it->second.queued - it->second.done;
  }
  /// Live partitions.
  std::size_t live() const {
    const std::lock_guard lock(mutex_);
    return streams_.size();
  }
  /// Which partition holds group `group` of `device` (0: none).
  std::uint32_t owner(std::uint32_t device, std::uint32_t group) const {
    const std::lock_guard lock(mutex_);
    return device < owner_.size() && group < owner_[device].size() ? owner_[device][group] : 0;
  }

private:
  struct Queue {
    std::uint64_t queued = 0;
    std::uint64_t done = 0;
  };
  bool enforced_locked(std::uint32_t device) const noexcept {
    return device < gpus_.size() && gpus_[device].driver_has_green_contexts &&
           green_context_granule(gpus_[device].cc_major, gpus_[device].cc_minor) != 0;
  }

  mutable std::mutex mutex_;
  std::vector<SimulatedGpu> gpus_;
  std::vector<std::vector<std::uint32_t>> owner_; // per device, per group: the partition holding it
  std::map<std::uint32_t, Queue> streams_;        // live partitions' streams
  std::uint32_t next_id_ = 0;
};

static_assert(SmPartitioner<SimulatedGreenContexts>);

} // namespace carve
