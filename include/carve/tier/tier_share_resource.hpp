/// @file carve/tier/tier_share_resource.hpp
/// One GPU's reservation on one spill tier, as a memory resource.
///
/// @code
/// const carve::TierPlan plan = planner.plan(tasks);
/// carve::SpillNodes where{.home = topology.node(topology.gpu(0)).numa_node.value_or(-1),
///                         .nodes = carve::discover_memory_nodes()};
/// carve::TierShareResource dram(plan, /*gpu*/ 0, /*tier*/ 0, where);
/// carve::CachingPool pool(dram);              // or a PagedMirror host backend's card
/// @endcode
///
/// A memory tier's share is split over the tier's NUMA nodes by split_share(): the GPU's own node
/// first (the node nearest it, nvidia-smi's "NUMA Affinity"), then the tier's other nodes, most
/// free memory first, each taking what it has free. Without free-memory figures the nodes are
/// taken in turn starting at a different node for each GPU, and the first takes the whole share.
/// A disk tier's share is one part, files in the tier's directory. Free-memory figures are a
/// snapshot: splitting several GPUs' shares against the same snapshot may promise a node's free
/// memory twice; give each GPU the figures minus what earlier splits took (subtract_parts) to
/// avoid that.
#pragma once

#include <carve/core/misuse.hpp>
#include <carve/mr/cuda_mr.hpp>
#include <carve/mr/detail/block_lookup.hpp>
#include <carve/mr/memory_resource.hpp>
#include <carve/tier/spill_tier.hpp>
#include <carve/tier/tier_discovery.hpp>
#include <carve/tier/tier_planner.hpp>
#include <carve/tier/tier_resources.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace carve {

/// What split_share knows about the machine; both fields optional.
struct SpillNodes {
  int home = -1;                 ///< the GPU's NUMA node; -1 when unknown
  std::vector<MemoryNode> nodes; ///< available memory per node (discover_memory_nodes()); empty when unknown
};

/// One piece of a share: a budget on one NUMA node or in the tier's directory.
struct SharePart {
  int node;            ///< the NUMA node; -1 for files in the tier's directory
  std::uint64_t bytes; ///< this part's budget
};

/// How `bytes` of a tier for GPU number `gpu` (its index in the plan) spread over the tier; empty
/// for 0 bytes. Throws carve::Exception: invalid_argument when the tier has neither nodes nor a
/// directory, no_space when the nodes' available memory (when known) cannot hold the bytes.
inline std::vector<SharePart> split_share(const SpillTier& tier, std::uint64_t bytes, std::size_t gpu,
                                          const SpillNodes& where = {}) {
  if (bytes == 0) {
    return {};
  }
  if (!tier.directory.empty()) {
    return {{-1, bytes}};
  }
  if (tier.numa_nodes.empty()) {
    throw Exception(Errc::invalid_argument,
                    "tier '" + tier.name + "' has neither NUMA nodes nor a directory to allocate from");
  }
  const auto free_on = [&](int node) -> std::optional<std::uint64_t> {
    for (const MemoryNode& n : where.nodes) {
      if (n.id == node) {
        return n.available_bytes;
      }
    }
    return std::nullopt;
  };
  const bool known =
      std::all_of(tier.numa_nodes.begin(), tier.numa_nodes.end(), [&](int node) { return free_on(node).has_value(); });
  std::vector<int> order;
  const std::size_t count = tier.numa_nodes.size();
  for (std::size_t i = 0; i < count; ++i) {
    order.push_back(tier.numa_nodes[(gpu + i) % count]); // GPUs take turns when nothing else decides
  }
  if (known) {
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return *free_on(a) > *free_on(b); });
  }
  if (const auto home = std::find(order.begin(), order.end(), where.home); home != order.end()) {
    std::rotate(order.begin(), home, home + 1);
  }
  std::vector<SharePart> parts;
  std::uint64_t left = bytes;
  for (const int node : order) {
    const std::uint64_t room = known ? *free_on(node) : std::numeric_limits<std::uint64_t>::max();
    const std::uint64_t take = std::min(left, room);
    if (take != 0) {
      parts.push_back({node, take});
      left -= take;
    }
    if (left == 0) {
      return parts;
    }
  }
  throw Exception(Errc::no_space, "tier '" + tier.name + "': its nodes have " + std::to_string(bytes - left) +
                                      " bytes available, the share needs " + std::to_string(bytes));
}

/// The node figures with the given parts taken away, for the next GPU's split.
inline std::vector<MemoryNode> subtract_parts(std::vector<MemoryNode> nodes, const std::vector<SharePart>& parts) {
  for (const SharePart& part : parts) {
    for (MemoryNode& n : nodes) {
      if (n.id == part.node) {
        n.available_bytes -= std::min(n.available_bytes, part.bytes);
      }
    }
  }
  return nodes;
}

/// One GPU's reservation on one tier: a NumaNodeResource or MappedFileResource per SharePart,
/// tried in split order. Copies are handles to the same share; thread-safe. An UpstreamResource
/// that owns its memory and checks deallocations.
class TierShareResource : public CcclSpellings<TierShareResource> {
public:
  /// The reservation of GPU number `gpu` (index into plan.gpus) on tier number `tier`. Throws
  /// carve::Exception: out_of_range when the GPU or tier does not exist (in the plan's lists, or
  /// in the GPU's uses of the tiers); when the tier cannot be backed, as split_share,
  /// NumaNodeResource and MappedFileResource do.
  TierShareResource(const TierPlan& plan, std::size_t gpu, std::size_t tier, const SpillNodes& where = {})
      : state_(std::make_shared<State>()) {
    if (gpu >= plan.gpus.size() || tier >= plan.tiers.size() || tier >= plan.gpus[gpu].tiers.size()) {
      throw Exception(Errc::out_of_range, "tier share: no GPU " + std::to_string(gpu) + " or tier " +
                                              std::to_string(tier) + " in the plan");
    }
    const SpillTier& t = plan.tiers[tier];
    state_->parts = split_share(t, plan.gpus[gpu].tiers[tier].reserved, gpu, where);
    for (const SharePart& part : state_->parts) {
      if (part.node < 0) {
        state_->files.emplace_back(t.directory, part.bytes);
      } else {
        state_->nodes.emplace_back(part.node, part.bytes);
      }
    }
  }

  /// From the first part (the GPU's own node first) that has room. Errors: invalid_size
  /// (check_request); no_space when no part can hold the request.
  [[nodiscard]] cuda::std::expected<void*, Errc> try_allocate(std::size_t bytes, std::size_t alignment) noexcept {
    if (const auto ok = check_request(bytes, alignment); !ok) {
      return cuda::std::unexpected(ok.error());
    }
    for (std::size_t i = 0; i < state_->nodes.size(); ++i) {
      if (const auto p = state_->nodes[i].try_allocate(bytes, alignment)) {
        return remember(*p, i, bytes, alignment);
      }
    }
    for (std::size_t i = 0; i < state_->files.size(); ++i) {
      if (const auto p = state_->files[i].try_allocate(bytes, alignment)) {
        return remember(*p, state_->nodes.size() + i, bytes, alignment);
      }
    }
    return cuda::std::unexpected(Errc::no_space);
  }
  /// try_deallocate; a misuse (a pointer it never gave, a wrong size) stops the program
  /// (report_misuse).
  void deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept {
    if (const auto r = try_deallocate(p, bytes, alignment); !r) {
      report_misuse("carve::TierShareResource::deallocate", p, bytes, r.error());
    }
  }
  /// Returns `p` to its part. Errors (nothing changes): not_allocated when `p` is not a live
  /// allocation of this share; invalid_size when `bytes` is not the size it was allocated with.
  [[nodiscard]] cuda::std::expected<void, Errc> try_deallocate(void* p, std::size_t bytes,
                                                               std::size_t alignment) noexcept {
    std::size_t part = 0;
    {
      const std::lock_guard lock(state_->mutex);
      const auto it = state_->owner.find(reinterpret_cast<std::uintptr_t>(p));
      if (it == state_->owner.end() || it->second.bytes != bytes) {
        return cuda::std::unexpected(it == state_->owner.end() ? Errc::not_allocated : Errc::invalid_size);
      }
      part = it->second.part;
      state_->owner.erase(it);
    }
    release_to(part, p, bytes, alignment);
    return {};
  }

  /// Whether `p` lies in a live allocation of this share.
  bool owns(const void* p) const noexcept {
    const std::lock_guard lock(state_->mutex);
    return detail::block_containing(state_->owner, p, [](const State::Owned& o) { return o.bytes; }) !=
           state_->owner.end();
  }

  /// How the share was split, in the order parts are tried.
  const std::vector<SharePart>& parts() const noexcept { return state_->parts; }
  /// The share's bytes, all parts together.
  std::size_t capacity() const noexcept {
    return sum([](const auto& r) { return r.capacity(); });
  }
  /// Bytes not handed out, all parts together (a request may still fail if no one part has it).
  std::size_t free_bytes() const noexcept {
    return sum([](const auto& r) { return r.free_bytes(); });
  }
  /// Equal when both are handles to the same share.
  friend bool operator==(const TierShareResource& a, const TierShareResource& b) noexcept {
    return a.state_ == b.state_;
  }
#if defined(CARVE_HAS_CUDA_MR)
  /// Its memory is host memory.
  friend constexpr void get_property(const TierShareResource&, cuda::mr::host_accessible) noexcept {}
#endif

private:
  struct State {
    std::vector<SharePart> parts;
    std::vector<NumaNodeResource> nodes; // the memory parts, in split order
    std::vector<MappedFileResource> files;
    std::mutex mutex;
    /// A live allocation.
    struct Owned {
      std::size_t part;  ///< index into nodes, then files
      std::size_t bytes; ///< the size it was allocated with
    };
    std::map<std::uintptr_t, Owned> owner; // live allocations by address
  };

  [[nodiscard]] cuda::std::expected<void*, Errc> remember(void* p, std::size_t part, std::size_t bytes,
                                                          std::size_t alignment) noexcept {
    try {
      const std::lock_guard lock(state_->mutex);
      state_->owner.emplace(reinterpret_cast<std::uintptr_t>(p), State::Owned{part, bytes});
      return p;
    } catch (...) { // no memory for the bookkeeping: give the allocation back
      release_to(part, p, bytes, alignment);
      return cuda::std::unexpected(Errc::no_space);
    }
  }

  void release_to(std::size_t part, void* p, std::size_t bytes, std::size_t alignment) noexcept {
    if (part < state_->nodes.size()) {
      state_->nodes[part].deallocate(p, bytes, alignment);
    } else {
      state_->files[part - state_->nodes.size()].deallocate(p, bytes, alignment);
    }
  }

  template <class F>
  std::size_t sum(F f) const noexcept {
    std::size_t total = 0;
    for (const auto& r : state_->nodes) {
      total += f(r);
    }
    for (const auto& r : state_->files) {
      total += f(r);
    }
    return total;
  }

  std::shared_ptr<State> state_;
};
static_assert(UpstreamResource<TierShareResource> && OwnsMemory<TierShareResource> &&
              ChecksDeallocation<TierShareResource>);

} // namespace carve
