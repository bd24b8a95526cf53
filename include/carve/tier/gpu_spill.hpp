/// @file carve/tier/gpu_spill.hpp
/// A GPU's reservations from a TierPlan, allocated up front.
///
/// @code
/// carve::GpuSpill spill(plan, /*gpu*/ 0, {.home = 0, .nodes = carve::discover_memory_nodes()});
/// for (const carve::SpillRegion& r : spill.regions()) { ... r.data, r.bytes, r.numa_node ... }
/// @endcode
///
/// Every reserved byte is allocated when the GpuSpill is made, spread over each tier as
/// split_share() says (the GPU's own NUMA node first, then the tier's other nodes by free
/// memory; files for a disk tier), and released when it goes away. For memory drawn as it is
/// needed, use a TierShareResource per tier instead.
#pragma once

#include <carve/tier/spill_tier.hpp>
#include <carve/tier/tier_planner.hpp>
#include <carve/tier/tier_resources.hpp>
#include <carve/tier/tier_share_resource.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace carve {

/// One allocated piece of a GPU's reservation: on one NUMA node, or in one file.
struct SpillRegion {
  std::size_t tier;    ///< index into the plan's tiers
  void* data;          ///< the first byte
  std::uint64_t bytes; ///< the piece's size
  int numa_node;       ///< -1 for a file
};

/// GPU `gpu`'s reservation on every tier of a plan, allocated when made and released when
/// destroyed. Move-only.
class GpuSpill {
public:
  /// Allocates every byte the plan reserves for `gpu`. Throws carve::Exception: out_of_range for
  /// a GPU the plan does not have (or whose uses of the tiers do not match the plan's tiers); when a tier cannot be
  /// backed (no NUMA support, no directory, too little free memory on the tier's nodes) or the system refuses the
  /// memory. Whatever was allocated before is released.
  GpuSpill(const TierPlan& plan, std::size_t gpu, const SpillNodes& where = {}) {
    if (gpu >= plan.gpus.size()) {
      throw Exception(Errc::out_of_range, "GPU spill: the plan has no GPU " + std::to_string(gpu));
    }
    if (plan.gpus[gpu].tiers.size() != plan.tiers.size()) {
      throw Exception(Errc::out_of_range, "GPU spill: the plan has " + std::to_string(plan.tiers.size()) +
                                              " tiers, GPU " + std::to_string(gpu) + " uses " +
                                              std::to_string(plan.gpus[gpu].tiers.size()));
    }
    try {
      for (std::size_t t = 0; t < plan.tiers.size(); ++t) {
        const SpillTier& tier = plan.tiers[t];
        for (const SharePart& part : split_share(tier, plan.gpus[gpu].tiers[t].reserved, gpu, where)) {
          const auto p = part.node < 0 ? MappedFileResource(tier.directory, part.bytes).try_allocate(part.bytes, 1)
                                       : NumaNodeResource(part.node, part.bytes).try_allocate(part.bytes, 1);
          if (!p) {
            throw Exception(Errc::no_space,
                            "cannot allocate " + std::to_string(part.bytes) + " bytes on tier '" + tier.name + "'" +
                                (part.node < 0 ? "" : " (NUMA node " + std::to_string(part.node) + ")"));
          }
          regions_.push_back({t, *p, part.bytes, part.node});
        }
      }
    } catch (...) {
      release();
      throw;
    }
  }
  /// Takes the other's regions; it is left empty.
  GpuSpill(GpuSpill&& other) noexcept : regions_(std::exchange(other.regions_, {})) {}
  /// Releases this one's regions, then takes the other's.
  GpuSpill& operator=(GpuSpill&& other) noexcept {
    if (this != &other) {
      release();
      regions_ = std::exchange(other.regions_, {});
    }
    return *this;
  }
  /// Releases every region.
  ~GpuSpill() { release(); }

  /// The allocated pieces, tier by tier.
  const std::vector<SpillRegion>& regions() const noexcept { return regions_; }

private:
  // The resources above are only the way in: their budgets die with them, and the pages they
  // mapped are returned directly.
  void release() noexcept {
    for (const SpillRegion& r : regions_) {
      detail::unmap_pages(r.data, r.bytes);
    }
    regions_.clear();
  }

  std::vector<SpillRegion> regions_;
};

} // namespace carve
