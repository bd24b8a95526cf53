// carve/tier/tier_resources.hpp — real memory behind a tier plan.
//
//   NumaNodeResource   memory on one NUMA node (DRAM or CXL), through libnuma. Present when
//                      <numa.h> is found (Debian: libnuma-dev); programs using it link libnuma
//                      (CMake: carve::numa).
//   MappedFileResource memory in files under a directory (a disk tier), mapped shared; each
//                      file is unlinked at once, so nothing is left behind if the process dies.
//   GpuSpill           a GPU's reservations from a TierPlan, allocated on their tiers up front
//                      and released when it goes away.
//
// The two resources are UpstreamResources (carve/mr/upstream.hpp) with a byte budget — typically
// a GPU's share of the tier — so a CachingPool can sit on top of them, and they have the CCCL
// allocate/deallocate spellings. They hand out whole pages: try_allocate returns nullptr for zero
// bytes, an alignment that is not a power of two up to the page size, a request past the budget,
// or when the system refuses the memory.
#pragma once

#include <carve/mr/byte_budget.hpp>
#include <carve/mr/cuda_mr.hpp>
#include <carve/mr/upstream.hpp>
#include <carve/tier/spill_tier.hpp>
#include <carve/tier/tier_planner.hpp>

#if __has_include(<numa.h>)
#include <numa.h>
#endif
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace carve {

namespace detail {
inline bool page_request(std::size_t bytes, std::size_t alignment) noexcept {
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  return bytes != 0 && alignment != 0 && (alignment & (alignment - 1)) == 0 && alignment <= page;
}
} // namespace detail

#if __has_include(<numa.h>)
inline constexpr bool numa_resource_available = true;

class NumaNodeResource : public CcclSpellings<NumaNodeResource> {
public:
  // Throws TierError when the system has no NUMA support or no such node.
  NumaNodeResource(int node, std::size_t budget) : node_(node), budget_(budget) {
    if (::numa_available() < 0) {
      throw TierError("NUMA is not available on this system");
    }
    if (node < 0 || node > ::numa_max_node()) {
      throw TierError("NUMA node " + std::to_string(node) + " does not exist");
    }
  }

  void* try_allocate(std::size_t bytes, std::size_t alignment) noexcept {
    if (!detail::page_request(bytes, alignment) || !budget_.take(bytes)) {
      return nullptr;
    }
    void* p = ::numa_alloc_onnode(bytes, node_);
    if (p == nullptr) {
      budget_.give_back(bytes);
    }
    return p;
  }
  void deallocate(void* p, std::size_t bytes, std::size_t) noexcept {
    ::numa_free(p, bytes);
    budget_.give_back(bytes);
  }

  int node() const noexcept { return node_; }
  std::size_t capacity() const noexcept { return budget_.capacity(); }
  std::size_t free_bytes() const noexcept { return budget_.free_bytes(); }
  friend bool operator==(const NumaNodeResource& a, const NumaNodeResource& b) noexcept {
    return a.budget_ == b.budget_;
  }
#if defined(CARVE_HAS_CUDA_MR)
  friend constexpr void get_property(const NumaNodeResource&, cuda::mr::host_accessible) noexcept {}
#endif

private:
  int node_;
  ByteBudget budget_;
};
static_assert(UpstreamResource<NumaNodeResource>);
#else
inline constexpr bool numa_resource_available = false;
#endif

class MappedFileResource : public CcclSpellings<MappedFileResource> {
public:
  // Throws TierError when `directory` is not a directory.
  MappedFileResource(std::filesystem::path directory, std::size_t budget)
      : directory_(std::move(directory)), budget_(budget) {
    if (!std::filesystem::is_directory(directory_)) {
      throw TierError("MappedFileResource: " + directory_.string() + " is not a directory");
    }
  }

  void* try_allocate(std::size_t bytes, std::size_t alignment) noexcept {
    if (!detail::page_request(bytes, alignment) || !budget_.take(bytes)) {
      return nullptr;
    }
    void* p = map_new_file(bytes);
    if (p == nullptr) {
      budget_.give_back(bytes);
    }
    return p;
  }
  void deallocate(void* p, std::size_t bytes, std::size_t) noexcept {
    ::munmap(p, bytes);
    budget_.give_back(bytes);
  }

  const std::filesystem::path& directory() const noexcept { return directory_; }
  std::size_t capacity() const noexcept { return budget_.capacity(); }
  std::size_t free_bytes() const noexcept { return budget_.free_bytes(); }
  friend bool operator==(const MappedFileResource& a, const MappedFileResource& b) noexcept {
    return a.budget_ == b.budget_;
  }
#if defined(CARVE_HAS_CUDA_MR)
  friend constexpr void get_property(const MappedFileResource&, cuda::mr::host_accessible) noexcept {}
#endif

private:
  void* map_new_file(std::size_t bytes) const noexcept {
    std::string path = (directory_ / "carve-spill-XXXXXX").string();
    const int fd = ::mkstemp(path.data());
    if (fd < 0) {
      return nullptr;
    }
    ::unlink(path.c_str());
    void* p = ::ftruncate(fd, static_cast<off_t>(bytes)) == 0
                  ? ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                  : MAP_FAILED;
    ::close(fd); // the mapping keeps the file alive
    return p == MAP_FAILED ? nullptr : p;
  }

  std::filesystem::path directory_;
  ByteBudget budget_;
};
static_assert(UpstreamResource<MappedFileResource>);

struct SpillRegion {
  std::size_t tier;
  void* data;
  std::uint64_t bytes;
  int numa_node; // -1 for a file
};

// A GPU's reservations, allocated: on a memory tier from one of its NUMA nodes (GPUs take the
// tier's nodes in turn), on a disk tier from a file in its directory.
class GpuSpill {
public:
  // Throws TierError when a tier cannot be backed (no NUMA support, no directory) or the system
  // refuses the memory; whatever was allocated before is released.
  GpuSpill(const TierPlan& plan, std::size_t gpu) {
    try {
      for (std::size_t t = 0; t < plan.tiers.size(); ++t) {
        const std::uint64_t bytes = plan.gpus.at(gpu).tiers[t].reserved;
        if (bytes != 0) {
          allocate_on(plan.tiers[t], t, gpu, bytes);
        }
      }
    } catch (...) {
      release();
      throw;
    }
  }
  GpuSpill(GpuSpill&& other) noexcept : regions_(std::exchange(other.regions_, {})) {}
  GpuSpill& operator=(GpuSpill&& other) noexcept {
    if (this != &other) {
      release();
      regions_ = std::exchange(other.regions_, {});
    }
    return *this;
  }
  ~GpuSpill() { release(); }

  const std::vector<SpillRegion>& regions() const noexcept { return regions_; }

private:
  void allocate_on(const SpillTier& tier, std::size_t t, std::size_t gpu, std::uint64_t bytes) {
    const auto failed = [&] {
      return TierError("cannot allocate " + std::to_string(bytes) + " bytes on tier '" + tier.name + "'");
    };
    if (!tier.directory.empty()) {
      void* p = MappedFileResource(tier.directory, bytes).try_allocate(bytes, 1);
      if (p == nullptr) {
        throw failed();
      }
      regions_.push_back({t, p, bytes, -1});
      return;
    }
    if (tier.numa_nodes.empty()) {
      throw TierError("tier '" + tier.name + "' has neither NUMA nodes nor a directory to allocate from");
    }
#if __has_include(<numa.h>)
    const int node = tier.numa_nodes[gpu % tier.numa_nodes.size()];
    void* p = NumaNodeResource(node, bytes).try_allocate(bytes, 1);
    if (p == nullptr) {
      throw failed();
    }
    regions_.push_back({t, p, bytes, node});
#else
    (void)gpu;
    throw TierError("tier '" + tier.name + "' needs libnuma, which this build does not have");
#endif
  }

  void release() noexcept {
    for (const SpillRegion& r : regions_) {
      if (r.numa_node < 0) {
        ::munmap(r.data, r.bytes);
      } else {
#if __has_include(<numa.h>)
        ::numa_free(r.data, r.bytes);
#endif
      }
    }
    regions_.clear();
  }

  std::vector<SpillRegion> regions_;
};

} // namespace carve
