/// @file carve/mirror/write_tracking.hpp
/// How a PagedMirror learns which pages were written.
///
/// - WriteTracking::explicit_calls: only write() and mark_dirty() make pages dirty; plain stores
///   into the mirror are not seen (the cheapest mode, and the only one that needs nothing from
///   the kernel).
/// - WriteTracking::automatic: any store marks its page dirty (MirrorOptions' default): the best
///   mechanism the kernel offers, chosen when the mirror is built (tracking_mechanism() says
///   which):
///   - TrackingMechanism::userfaultfd: userfaultfd write-protection in asynchronous mode (Linux
///     >= 6.7: UFFD_FEATURE_WP_ASYNC with PAGEMAP_SCAN). The kernel resolves the first store to a
///     clean page itself and records it in the page table entry; sync() collects the written
///     pages and write-protects them again in one ioctl. No signal, no thread.
///   - TrackingMechanism::mprotect: clean pages are read-only; the first store raises SIGSEGV,
///     and carve's handler marks the page dirty and makes it writable
///     (carve/mirror/fault_handler.hpp); sync() makes it read-only again.
/// - WriteTracking::automatic_mprotect / automatic_userfaultfd force one mechanism (the
///   constructor throws when the kernel lacks it), for tests and measurements.
///
/// A first store to a clean page (bench_mirror_sync, numbers in docs/mirror.md) costs well under
/// 5 us with userfaultfd, the mechanism that reliably meets that target; the mprotect path (a
/// signal and a system call per first store) is near the limit.
///
/// Either way, a store outside any allocation of the mirror is the program's usual fault: the
/// reserved range is PROT_NONE there, and the handler passes such faults on untouched.
#pragma once

#include <linux/userfaultfd.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <fcntl.h>

#include <cstdint>

namespace carve {

/// What a PagedMirror is asked to track (see the file's description).
enum class WriteTracking {
  explicit_calls,       ///< only write() and mark_dirty() make pages dirty
  automatic,            ///< any store, by the best mechanism the kernel offers
  automatic_mprotect,   ///< any store, by mprotect + SIGSEGV; the mirror throws without it
  automatic_userfaultfd ///< any store, by asynchronous userfaultfd; the mirror throws without it
};
/// How a PagedMirror does track (see the file's description).
enum class TrackingMechanism {
  explicit_calls, ///< write() and mark_dirty() only
  mprotect,       ///< read-only clean pages and a SIGSEGV handler
  userfaultfd     ///< asynchronous userfaultfd write-protection, collected with PAGEMAP_SCAN
};

/// The mechanism's name, for reports.
inline const char* to_string(TrackingMechanism m) noexcept {
  switch (m) {
  case TrackingMechanism::explicit_calls:
    return "explicit calls";
  case TrackingMechanism::mprotect:
    return "mprotect + SIGSEGV";
  case TrackingMechanism::userfaultfd:
    return "userfaultfd write-protect (async)";
  }
  return "?";
}

/// The parts of the Linux UAPI that asynchronous write-protection needs. They entered the kernel's
/// headers in 6.7; spelled out here (the values are ABI and never change) so that carve builds
/// against older headers and decides at run time.
namespace uffd {
inline constexpr std::uint64_t feature_wp_unpopulated = std::uint64_t{1} << 13; ///< UFFD_FEATURE_WP_UNPOPULATED
inline constexpr std::uint64_t feature_wp_async = std::uint64_t{1} << 15;       ///< UFFD_FEATURE_WP_ASYNC
inline constexpr std::uint64_t page_is_written = std::uint64_t{1} << 1;         ///< PAGE_IS_WRITTEN
inline constexpr std::uint64_t scan_wp_matching = std::uint64_t{1} << 0;        ///< PM_SCAN_WP_MATCHING
inline constexpr std::uint64_t scan_check_wpasync = std::uint64_t{1} << 1;      ///< PM_SCAN_CHECK_WPASYNC

/// struct page_region: a run of pages PAGEMAP_SCAN found.
struct PageRegion {
  std::uint64_t start;      ///< first address
  std::uint64_t end;        ///< one past the last
  std::uint64_t categories; ///< the PAGE_IS_* bits the run has
};
/// struct pm_scan_arg: what PAGEMAP_SCAN is asked to do.
struct ScanArg {
  std::uint64_t size;                ///< sizeof(ScanArg)
  std::uint64_t flags;               ///< PM_SCAN_* bits
  std::uint64_t start;               ///< first address to scan
  std::uint64_t end;                 ///< one past the last
  std::uint64_t walk_end;            ///< set by the kernel: where the scan stopped
  std::uint64_t vec;                 ///< PageRegion array for the results
  std::uint64_t vec_len;             ///< its length
  std::uint64_t max_pages;           ///< stop after this many pages; 0: no limit
  std::uint64_t category_inverted;   ///< categories matched when clear
  std::uint64_t category_mask;       ///< categories a page must all have
  std::uint64_t category_anyof_mask; ///< categories a page must have one of
  std::uint64_t return_mask;         ///< categories reported in PageRegion::categories
};
/// The PAGEMAP_SCAN ioctl on /proc/self/pagemap.
inline constexpr unsigned long pagemap_scan = _IOWR('f', 16, ScanArg);

/// A userfaultfd set up for asynchronous write-protection, or -1 when the kernel cannot (too old,
/// userfaultfd disabled for this user, or seccomp forbids it). The caller closes it.
inline int open_async_wp() noexcept {
  // User-mode faults only: allowed to unprivileged processes even where
  // vm.unprivileged_userfaultfd is 0. Asynchronous write faults never reach the descriptor anyway.
  int fd = static_cast<int>(::syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY));
  if (fd < 0) {
    fd = static_cast<int>(::syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK)); // kernels before 5.11
  }
  if (fd < 0) {
    return -1;
  }
  uffdio_api api{};
  api.api = UFFD_API;
  api.features = feature_wp_async | feature_wp_unpopulated;
  if (::ioctl(fd, UFFDIO_API, &api) != 0 || (api.features & feature_wp_async) == 0) {
    ::close(fd);
    return -1;
  }
  const int pagemap = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (pagemap < 0) {
    ::close(fd);
    return -1;
  }
  // PAGEMAP_SCAN arrived with WP_ASYNC, but a kernel may have one without the other: an empty
  // scan tells.
  ScanArg probe{};
  probe.size = sizeof probe;
  const bool scan = ::ioctl(pagemap, pagemap_scan, &probe) >= 0;
  ::close(pagemap);
  if (!scan) {
    ::close(fd);
    return -1;
  }
  return fd;
}
} // namespace uffd

/// Whether this process can use TrackingMechanism::userfaultfd (asks the kernel each call).
inline bool userfaultfd_tracking_available() noexcept {
  const int fd = uffd::open_async_wp();
  if (fd < 0) {
    return false;
  }
  ::close(fd);
  return true;
}

} // namespace carve
