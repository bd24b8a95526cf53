/// @file carve/service/shared_memory_card.hpp
/// A simulated card whose memory other processes can map.
///
/// @code
/// carve::SharedMemoryCard card(64 << 20);              // 64 MiB, like SimulatedCard
/// void* p = *card.try_allocate(2 << 20, 256);
/// auto e = card.export_segment(p, 2 << 20);            // e->fd: pass it with SCM_RIGHTS
/// // another process: mmap(nullptr, e->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
/// @endcode
///
/// The host stand-in for a GPU that a server shares with its clients (carve/service/): every
/// allocation is its own memfd (Linux), mapped shared, counted against the card's capacity. The
/// memfd is sealed against growing and shrinking, so a process it was passed to cannot truncate
/// it under the others (which would make their accesses fault). Copies are handles to the same
/// card and compare equal. Thread-safe. Linux only (memfd_create).
///
/// Descriptors: a live allocation keeps its memfd open until it is exported for the last time,
/// which its owner says by taking the descriptor over (release_descriptor): the allocation server
/// exports each segment once, to the one client that leases it, and then holds no descriptor for
/// it. (A descriptor cannot be had again later: reopening the mapping through
/// `/proc/self/map_files/<start>-<end>` needs CAP_CHECKPOINT_RESTORE, and re-creating the memfd
/// would break the sharing with the process that maps the old one.) When
/// the system refuses (memfd_create fails with EMFILE, the memory is not there), try_allocate
/// notes which call failed and why (carve/core/system_refusal.hpp), so the failure names the real
/// cause.
#pragma once

#include <carve/core/os_page_size.hpp>
#include <carve/core/system_refusal.hpp>
#include <carve/mr/byte_budget.hpp>
#include <carve/mr/cuda_mr.hpp>
#include <carve/mr/detail/segment_descriptors.hpp>
#include <carve/mr/memory_resource.hpp>
#include <carve/mr/segment_export.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <utility>

namespace carve {

/// A card of `capacity_bytes` whose every allocation is a memfd another process can map: an
/// ExportableResource that owns its memory.
class SharedMemoryCard : public CcclSpellings<SharedMemoryCard> {
public:
  static constexpr ExportKind export_kind = ExportKind::shared_memory; ///< segments leave as memfds
  static constexpr bool release_while_mapped = true;                   ///< a mapping keeps its pages after the free

  /// A new, empty card; copies share it. `name` labels the memfds (visible in
  /// `/proc/<pid>/maps` and fdinfo).
  explicit SharedMemoryCard(std::size_t capacity_bytes, std::string name = "carve-card")
      : budget_(capacity_bytes), state_(std::make_shared<State>(std::move(name))) {}

  /// Errors: invalid_size (0 bytes, an alignment that is not a power of two); no_space for an
  /// alignment above the OS page, a full card, or when the system refuses the memory (then noted:
  /// last_system_refusal()).
  [[nodiscard]] cuda::std::expected<void*, Errc> try_allocate(std::size_t bytes, std::size_t alignment) noexcept {
    clear_system_refusal(); // a card that is merely full is not the system's refusal
    if (const auto ok = check_request(bytes, alignment); !ok) {
      return cuda::std::unexpected(ok.error());
    }
    if (alignment > os_page_size() || !budget_.take(bytes)) {
      return cuda::std::unexpected(Errc::no_space);
    }
    const int fd = ::memfd_create(state_->name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
    void* p = MAP_FAILED;
    if (fd < 0) {
      note_system_refusal("memfd_create", errno);
    } else if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      note_system_refusal("ftruncate", errno);
    } else if (::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
      note_system_refusal("fcntl(F_ADD_SEALS)", errno);
    } else if (p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0); p == MAP_FAILED) {
      note_system_refusal("mmap", errno);
    }
    if (p != MAP_FAILED) {
      try {
        const std::lock_guard lock(state_->mutex);
        state_->segments.emplace(reinterpret_cast<std::uintptr_t>(p), Segment{fd, bytes});
        return p;
      } catch (const std::bad_alloc&) {
        note_system_refusal("operator new", ENOMEM);
        ::munmap(p, bytes);
      }
    }
    if (fd >= 0) {
      ::close(fd);
    }
    budget_.give_back(bytes);
    return cuda::std::unexpected(Errc::no_space);
  }

  /// Frees what try_allocate gave, with the same bytes: unmaps it here and closes its memfd
  /// (other processes' mappings keep their pages).
  void deallocate(void* p, std::size_t bytes, std::size_t) noexcept {
    int fd = -1;
    {
      const std::lock_guard lock(state_->mutex);
      const auto it = state_->segments.find(reinterpret_cast<std::uintptr_t>(p));
      if (it != state_->segments.end()) {
        fd = it->second.fd;
        state_->segments.erase(it);
      }
    }
    ::munmap(p, bytes);
    if (fd >= 0) {
      ::close(fd);
    }
    budget_.give_back(bytes);
  }

  /// The memfd behind the live allocation at `base` of exactly `bytes`, lent (open until that
  /// allocation is freed or its descriptor is taken over; the receiver gets its own copy through
  /// SCM_RIGHTS); nullopt otherwise.
  std::optional<SegmentExport> export_segment(void* base, std::size_t bytes) const {
    const std::lock_guard lock(state_->mutex);
    const auto it = state_->segments.find(reinterpret_cast<std::uintptr_t>(base));
    if (it == state_->segments.end() || it->second.size != bytes || it->second.fd < 0) {
      return std::nullopt;
    }
    return SegmentExport{.kind = ExportKind::shared_memory, .size = it->second.size, .fd = it->second.fd};
  }

  /// Hands the segment's memfd over to the caller, who closes it: the segment will not be
  /// exported again, so the card need not keep a descriptor open for it. nullopt for an unknown
  /// segment or one already handed over.
  std::optional<int> release_descriptor(void* base) noexcept {
    const std::lock_guard lock(state_->mutex);
    return detail::release_segment_descriptor(state_->segments, base);
  }

  /// Whether `p` lies in a live allocation of this card.
  bool owns(const void* p) const noexcept {
    const std::lock_guard lock(state_->mutex);
    return detail::segment_holds(state_->segments, p, [](const Segment& s) { return s.size; });
  }

  /// The card's size.
  std::size_t capacity() const noexcept { return budget_.capacity(); }
  /// Bytes allocated now.
  std::size_t used_bytes() const noexcept { return budget_.used_bytes(); }
  /// Bytes left.
  std::size_t free_bytes() const noexcept { return budget_.free_bytes(); }
  /// Live allocations.
  std::size_t allocation_count() const noexcept { return budget_.allocation_count(); }

  /// Equal when both are handles to the same card.
  friend bool operator==(const SharedMemoryCard& a, const SharedMemoryCard& b) noexcept {
    return a.budget_ == b.budget_;
  }

#if defined(CARVE_HAS_CUDA_MR)
  /// Its memory is host memory.
  friend constexpr void get_property(const SharedMemoryCard&, cuda::mr::host_accessible) noexcept {}
#endif

private:
  struct Segment {
    int fd = -1;
    std::size_t size = 0;
  };
  struct State {
    explicit State(std::string n) : name(std::move(n)) {}
    std::string name;
    std::mutex mutex;
    std::map<std::uintptr_t, Segment> segments; // by base address
  };

  ByteBudget budget_;
  std::shared_ptr<State> state_;
};

static_assert(ExportableResource<SharedMemoryCard> && OwnsMemory<SharedMemoryCard>);
static_assert(SynchronousResource<SharedMemoryCard>);
static_assert(detail::cccl_accepts<SharedMemoryCard>());
#if defined(CARVE_HAS_CUDA_MR)
static_assert(SynchronousResourceWith<SharedMemoryCard, cuda::mr::host_accessible>);
#endif

} // namespace carve
