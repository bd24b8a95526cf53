// carve/tier/tier_resources.hpp — real memory behind a tier plan.
//
//   NumaNodeResource   memory on one NUMA node (DRAM or CXL), through libnuma. Present when
//                      <numa.h> is found (Debian: libnuma-dev); programs using it link libnuma
//                      (CMake: carve::numa).
//   MappedFileResource memory in a file under a directory (a disk tier), mapped shared; the file
//                      is unlinked at once, so nothing is left behind if the process dies.
//   GpuSpill           a GPU's reservations from a TierPlan, allocated on their tiers and
//                      released when it goes away.
//
// Both resources follow the allocate(bytes, alignment) / deallocate(ptr, bytes, alignment) shape
// of cuda::mr resources, so they can be the upstream of carve's pools. They hand out whole pages;
// an alignment beyond the page size, or zero bytes, is refused with TierError.
#pragma once

#include <carve/tier/spill_tier.hpp>
#include <carve/tier/tier_planner.hpp>

#if __has_include(<numa.h>)
#include <numa.h>
#endif
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace carve {

namespace detail {
inline std::size_t page_size() { return static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)); }

inline void check_request(const char* who, std::size_t bytes, std::size_t alignment) {
  if (bytes == 0) {
    throw TierError(std::string(who) + ": cannot allocate 0 bytes");
  }
  if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment > page_size()) {
    throw TierError(std::string(who) + ": alignment " + std::to_string(alignment) +
                    " is not a power of two up to the page size");
  }
}
} // namespace detail

#if __has_include(<numa.h>)
inline constexpr bool numa_resource_available = true;

class NumaNodeResource {
public:
  explicit NumaNodeResource(int node) : node_(node) {
    if (::numa_available() < 0) {
      throw TierError("NUMA is not available on this system");
    }
    if (node < 0 || node > ::numa_max_node()) {
      throw TierError("NUMA node " + std::to_string(node) + " does not exist");
    }
  }

  void* allocate(std::size_t bytes, std::size_t alignment = alignof(std::max_align_t)) {
    detail::check_request("NumaNodeResource", bytes, alignment);
    void* p = ::numa_alloc_onnode(bytes, node_);
    if (p == nullptr) {
      throw TierError("cannot allocate " + std::to_string(bytes) + " bytes on NUMA node " + std::to_string(node_));
    }
    return p;
  }
  void deallocate(void* p, std::size_t bytes, std::size_t = alignof(std::max_align_t)) noexcept {
    ::numa_free(p, bytes);
  }

  int node() const noexcept { return node_; }
  friend bool operator==(const NumaNodeResource& a, const NumaNodeResource& b) noexcept { return a.node_ == b.node_; }

private:
  int node_;
};
#else
inline constexpr bool numa_resource_available = false;
#endif

class MappedFileResource {
public:
  explicit MappedFileResource(std::filesystem::path directory) : directory_(std::move(directory)) {
    if (!std::filesystem::is_directory(directory_)) {
      throw TierError("MappedFileResource: " + directory_.string() + " is not a directory");
    }
  }

  void* allocate(std::size_t bytes, std::size_t alignment = alignof(std::max_align_t)) {
    detail::check_request("MappedFileResource", bytes, alignment);
    std::string path = (directory_ / "carve-spill-XXXXXX").string();
    const int fd = ::mkstemp(path.data());
    if (fd < 0) {
      throw TierError("cannot create a spill file in " + directory_.string() + ": " + std::strerror(errno));
    }
    ::unlink(path.c_str());
    if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      const int error = errno;
      ::close(fd);
      throw TierError("cannot size a spill file to " + std::to_string(bytes) + " bytes: " + std::strerror(error));
    }
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int error = errno;
    ::close(fd); // the mapping keeps the file alive
    if (p == MAP_FAILED) {
      throw TierError("cannot map a spill file of " + std::to_string(bytes) + " bytes: " + std::strerror(error));
    }
    return p;
  }
  void deallocate(void* p, std::size_t bytes, std::size_t = alignof(std::max_align_t)) noexcept { ::munmap(p, bytes); }

  const std::filesystem::path& directory() const noexcept { return directory_; }
  friend bool operator==(const MappedFileResource& a, const MappedFileResource& b) noexcept {
    return a.directory_ == b.directory_;
  }

private:
  std::filesystem::path directory_;
};

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
  // Throws TierError when a tier cannot be backed (no NUMA support, no directory) or an
  // allocation fails; whatever was allocated before is released.
  GpuSpill(const TierPlan& plan, std::size_t gpu) {
    for (std::size_t t = 0; t < plan.tiers.size(); ++t) {
      const std::uint64_t bytes = plan.gpus.at(gpu).tiers[t].reserved;
      if (bytes != 0) {
        regions_.push_back(allocate_on(plan.tiers[t], t, gpu, bytes));
      }
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
  SpillRegion allocate_on(const SpillTier& tier, std::size_t t, std::size_t gpu, std::uint64_t bytes) {
    try {
      if (!tier.directory.empty()) {
        return {t, MappedFileResource(tier.directory).allocate(bytes), bytes, -1};
      }
      if (!tier.numa_nodes.empty()) {
#if __has_include(<numa.h>)
        const int node = tier.numa_nodes[gpu % tier.numa_nodes.size()];
        return {t, NumaNodeResource(node).allocate(bytes), bytes, node};
#else
        throw TierError("tier '" + tier.name + "' needs libnuma, which this build does not have");
#endif
      }
      throw TierError("tier '" + tier.name + "' has neither NUMA nodes nor a directory to allocate from");
    } catch (...) {
      release();
      throw;
    }
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
