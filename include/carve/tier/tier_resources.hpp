/// @file carve/tier/tier_resources.hpp
/// Real memory for a spill tier.
///
/// - NumaNodeResource: memory on one NUMA node (DRAM or CXL), bound there with libnuma. Works
///   when `<numa.h>` is found (Debian: libnuma-dev) and the program links libnuma (CMake:
///   carve::numa); otherwise constructing one throws carve::Exception.
/// - MappedFileResource: memory in files under a directory (a disk tier), mapped shared; each
///   file is unlinked at once, so nothing is left behind if the process dies.
///
/// What they hand out is backed when it is handed out. Files get their blocks with
/// posix_fallocate, so a full disk is a no_space from try_allocate rather than a SIGBUS at a
/// later store into a sparse hole. Node memory is faulted in on its node at allocation
/// (MemoryBacking::populate, the default), so a node without the room refuses there; with
/// MemoryBacking::on_first_touch the pages are only a promise the kernel may break later (cheaper
/// for shares that are mostly never touched).
///
/// Both are carve::UpstreamResources (carve/mr/memory_resource.hpp) with a byte budget —
/// typically a GPU's share of the tier — so a CachingPool, a PagedMirror backend or a
/// TierShareResource can sit on top of them, and they have the CCCL allocate/deallocate
/// spellings. They hand out whole pages at any power-of-two alignment up to 1 GiB (PagedMirror's
/// host backend asks for 2 MiB). try_allocate: invalid_size for zero bytes or an alignment that
/// is not a power of two; no_space for an alignment above 1 GiB, a request past the budget, or
/// when the system refuses the memory.
#pragma once

#include <carve/core/error.hpp>
#include <carve/core/os_page_size.hpp>
#include <carve/mr/byte_budget.hpp>
#include <carve/mr/cuda_mr.hpp>
#include <carve/mr/memory_resource.hpp>
#include <carve/tier/spill_tier.hpp>

#if __has_include(<numa.h>)
#include <numa.h>
#endif
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>

namespace carve {

namespace detail {
inline std::size_t whole_pages(std::size_t bytes) noexcept {
  const std::size_t page = os_page_size();
  return (bytes + page - 1) / page * page;
}

// The errors both resources give before they touch their budget.
[[nodiscard]] inline cuda::std::expected<void, Errc> check_mappable(std::size_t bytes, std::size_t alignment) noexcept {
  if (const auto ok = check_request(bytes, alignment); !ok) {
    return ok;
  }
  if (bytes > (std::size_t{1} << 62) || alignment > (std::size_t{1} << 30)) {
    return cuda::std::unexpected(Errc::no_space);
  }
  return {};
}

// Maps whole pages for `bytes` at an address aligned to `alignment`: anonymous private memory
// when fd < 0, else the file from offset 0, shared. mmap aligns only to pages, so a larger
// alignment reserves the slack first and trims it off around the mapping.
inline void* map_aligned(std::size_t bytes, std::size_t alignment, int fd) noexcept {
  const std::size_t page = os_page_size();
  const std::size_t length = whole_pages(bytes);
  const std::size_t align = alignment > page ? alignment : page;
  const std::size_t span = length + align - page;
  void* area = ::mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (area == MAP_FAILED) {
    return nullptr;
  }
  const auto base = reinterpret_cast<std::uintptr_t>(area);
  const std::uintptr_t start = (base + align - 1) / align * align;
  void* p = fd < 0
                ? ::mmap(reinterpret_cast<void*>(start), length, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0)
                : ::mmap(reinterpret_cast<void*>(start), length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
  if (p == MAP_FAILED) {
    ::munmap(area, span);
    return nullptr;
  }
  if (start > base) {
    ::munmap(area, start - base);
  }
  if (base + span > start + length) {
    ::munmap(reinterpret_cast<void*>(start + length), base + span - (start + length));
  }
  return p;
}

inline void unmap_pages(void* p, std::size_t bytes) noexcept { ::munmap(p, whole_pages(bytes)); }

// Faults in every page of a fresh private mapping, false when the memory is not there. The
// kernel's MADV_POPULATE_WRITE (Linux 5.14) reports a shortage as an error; before it, only a
// store faults a page in, and a shortage then meets the OOM killer, not an error.
inline bool populate(void* p, std::size_t bytes) noexcept {
#if defined(MADV_POPULATE_WRITE)
  if (::madvise(p, whole_pages(bytes), MADV_POPULATE_WRITE) == 0) {
    return true;
  }
  if (errno != EINVAL) {
    return false;
  }
#endif
  const std::size_t page = os_page_size();
  for (std::size_t at = 0; at < bytes; at += page) {
    static_cast<volatile char*>(p)[at] = 0;
  }
  return true;
}

// What NumaNodeResource and MappedFileResource (`Derived`) share: a byte budget that copies
// share, charged before pages are mapped and credited once they are unmapped, and the calls
// that report it.
template <class Derived>
class MappedBudget {
public:
  /// The budget.
  std::size_t capacity() const noexcept { return budget_.capacity(); }
  /// Bytes of the budget not handed out.
  std::size_t free_bytes() const noexcept { return budget_.free_bytes(); }
  /// Equal when both are copies sharing one budget.
  friend bool operator==(const Derived& a, const Derived& b) noexcept {
    return static_cast<const MappedBudget&>(a).budget_ == static_cast<const MappedBudget&>(b).budget_;
  }
#if defined(CARVE_HAS_CUDA_MR)
  /// Its memory is host memory.
  friend constexpr void get_property(const Derived&, cuda::mr::host_accessible) noexcept {}
#endif

protected:
  explicit MappedBudget(std::size_t budget) : budget_(budget) {}

  // Checks the request, charges the budget and maps the pages with `map()` (nullptr: the system
  // refused, no_space); a failed mapping gives its bytes back.
  template <class Map>
  [[nodiscard]] cuda::std::expected<void*, Errc> map_charged(std::size_t bytes, std::size_t alignment,
                                                             Map&& map) noexcept {
    if (const auto ok = check_mappable(bytes, alignment); !ok) {
      return cuda::std::unexpected(ok.error());
    }
    if (!budget_.take(bytes)) {
      return cuda::std::unexpected(Errc::no_space);
    }
    void* p = map();
    if (p == nullptr) {
      budget_.give_back(bytes);
      return cuda::std::unexpected(Errc::no_space);
    }
    return p;
  }
  // Unmaps what map_charged() mapped and gives its bytes back to the budget.
  void unmap_credited(void* p, std::size_t bytes) noexcept {
    unmap_pages(p, bytes);
    budget_.give_back(bytes);
  }

private:
  ByteBudget budget_;
};
} // namespace detail

#if __has_include(<numa.h>)
/// Whether this build found `<numa.h>`, so that a NumaNodeResource can be made.
inline constexpr bool numa_resource_available = true;
#else
inline constexpr bool numa_resource_available = false;
#endif

/// When node memory gets its physical pages.
enum class MemoryBacking {
  populate,       ///< at allocation, on the node; no room there is no_space
  on_first_touch, ///< when first written; the allocation is a plan, not a reservation
};

/// Up to `budget` bytes on NUMA node `node`, in whole pages. Copies share the budget;
/// thread-safe.
class NumaNodeResource : public CcclSpellings<NumaNodeResource>, public detail::MappedBudget<NumaNodeResource> {
public:
  /// Throws carve::Exception when this build has no libnuma or the system no NUMA support
  /// (unsupported), or there is no such node (invalid_argument).
  NumaNodeResource(int node, std::size_t budget, MemoryBacking backing = MemoryBacking::populate)
      : MappedBudget<NumaNodeResource>(budget), node_(node), backing_(backing) {
#if __has_include(<numa.h>)
    if (::numa_available() < 0) {
      throw Exception(Errc::unsupported, "NUMA is not available on this system");
    }
    if (node < 0 || node > ::numa_max_node()) {
      throw Exception(Errc::invalid_argument, "NUMA node " + std::to_string(node) + " does not exist");
    }
#else
    throw Exception(Errc::unsupported,
                    "NUMA node " + std::to_string(node) + ": this build has no libnuma (<numa.h> not found)");
#endif
  }

  /// Fresh pages bound to the node, backed as backing() says. Errors as the file's description
  /// says; no_space also when populating finds no room on the node.
  [[nodiscard]] cuda::std::expected<void*, Errc> try_allocate(std::size_t bytes, std::size_t alignment) noexcept {
    return map_charged(bytes, alignment, [&]() -> void* {
      void* p = detail::map_aligned(bytes, alignment, -1);
      if (p == nullptr) {
        return nullptr;
      }
#if __has_include(<numa.h>)
      ::numa_tonode_memory(p, detail::whole_pages(bytes), node_); // every page faulted in lands on the node
#endif
      if (backing_ == MemoryBacking::populate && !detail::populate(p, bytes)) {
        detail::unmap_pages(p, bytes);
        return nullptr;
      }
      return p;
    });
  }
  /// Unmaps the pages and gives their bytes back to the budget.
  void deallocate(void* p, std::size_t bytes, std::size_t) noexcept { unmap_credited(p, bytes); }

  /// The NUMA node.
  int node() const noexcept { return node_; }
  /// When pages get their memory.
  MemoryBacking backing() const noexcept { return backing_; }
  // capacity(), free_bytes(), == and host_accessible: detail::MappedBudget.

private:
  int node_;
  MemoryBacking backing_;
};
static_assert(UpstreamResource<NumaNodeResource>);

/// Up to `budget` bytes in unlinked files under `directory`, one file per allocation. Copies share
/// the budget; thread-safe.
class MappedFileResource : public CcclSpellings<MappedFileResource>, public detail::MappedBudget<MappedFileResource> {
public:
  /// Throws carve::Exception (invalid_argument) when `directory` is not a directory.
  MappedFileResource(std::filesystem::path directory, std::size_t budget)
      : MappedBudget<MappedFileResource>(budget), directory_(std::move(directory)) {
    if (!std::filesystem::is_directory(directory_)) {
      throw Exception(Errc::invalid_argument, "MappedFileResource: " + directory_.string() + " is not a directory");
    }
  }

  /// A new file's blocks, mapped shared. Errors as the file's description says; no_space also
  /// when the file cannot be made or its blocks allocated (a full disk).
  [[nodiscard]] cuda::std::expected<void*, Errc> try_allocate(std::size_t bytes, std::size_t alignment) noexcept {
    return map_charged(bytes, alignment, [&] { return map_new_file(bytes, alignment); });
  }
  /// Unmaps the file (which then goes away) and gives its bytes back to the budget.
  void deallocate(void* p, std::size_t bytes, std::size_t) noexcept { unmap_credited(p, bytes); }

  /// Where the files go.
  const std::filesystem::path& directory() const noexcept { return directory_; }
  // capacity(), free_bytes(), == and host_accessible: detail::MappedBudget.

private:
  void* map_new_file(std::size_t bytes, std::size_t alignment) const noexcept {
    std::string path = (directory_ / "carve-spill-XXXXXX").string();
    const int fd = ::mkstemp(path.data());
    if (fd < 0) {
      return nullptr;
    }
    ::unlink(path.c_str());
    // Blocks, not a sparse length: a store into a hole the disk cannot fill is a SIGBUS.
    void* p = ::posix_fallocate(fd, 0, static_cast<off_t>(detail::whole_pages(bytes))) == 0
                  ? detail::map_aligned(bytes, alignment, fd)
                  : nullptr;
    ::close(fd); // the mapping keeps the file alive
    return p;
  }

  std::filesystem::path directory_;
};
static_assert(UpstreamResource<MappedFileResource>);

} // namespace carve
