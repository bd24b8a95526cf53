/// @file carve/mirror/write_tracker.hpp
/// The dirty pages of a mirror, under any tracking mechanism.
///
/// WriteTracker owns the mirror's reserved address range and knows, per page, whether it is
/// allocated and whether it is dirty. PagedMirror drives it:
/// - commit(pages), track(pages): an allocation appears: its memory is committed, then
///   write-protected (a backend may pin it in between);
/// - release(pages): it goes: memory handed back;
/// - mark_dirty(pages): an explicit write;
/// - prepare_host_write(pages): before carve itself writes the host copy (write(), fetch()):
///   under mprotect the pages are made writable first, so carve's copy does not fault page by
///   page;
/// - mark_clean(pages): after fetch(): host and device agree again;
/// - harvest(pages, emit): sync(): every dirty run in `pages` is passed to emit and is clean (and
///   write-protected, in automatic modes) afterwards.
///
/// The harvest order is what makes concurrent stores safe: a page's dirty state is cleared (and
/// the page write-protected) before its copy is queued, so a store that lands after that point
/// marks the page dirty again for the next sync, and a store before it is in the copy.
/// commit/release/mark_clean/harvest are called under PagedMirror's lock; mark_dirty and
/// prepare_host_write from any thread.
#pragma once

#include <carve/core/bits.hpp>
#include <carve/core/error.hpp>
#include <carve/mirror/atomic_page_bits.hpp>
#include <carve/mirror/fault_handler.hpp>
#include <carve/mirror/reserved_memory.hpp>
#include <carve/mirror/write_tracking.hpp>
#include <carve/slot/storage/slot_range.hpp>

#include <linux/userfaultfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <fcntl.h>

#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <system_error>
#include <vector>

namespace carve {

/// A mirror's reserved range and its allocated and dirty pages (see the file's description for
/// which calls need the mirror's lock). Not copyable.
class WriteTracker {
public:
  /// Reserves pages * page_size bytes and sets up the mechanism `mode` asks for. Throws
  /// carve::Exception: unsupported when `mode` forces a mechanism this kernel lacks or the SIGSEGV
  /// handler cannot be installed (or max_fault_targets trackers use it already); no_space when the
  /// address space cannot be reserved.
  WriteTracker(std::uint32_t pages, std::size_t page_size, WriteTracking mode)
      : range_(std::size_t{pages} * page_size), page_size_(page_size), allocated_(pages), dirty_(pages) {
    if (mode == WriteTracking::automatic || mode == WriteTracking::automatic_userfaultfd) {
      uffd_ = uffd::open_async_wp();
      if (uffd_ >= 0) {
        pagemap_ = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
        mechanism_ = TrackingMechanism::userfaultfd;
      } else if (mode == WriteTracking::automatic_userfaultfd) {
        throw Exception(Errc::unsupported, "carve: userfaultfd asynchronous write-protection is not available here "
                                           "(needs Linux 6.7 or later and userfaultfd allowed for this process)");
      }
    }
    if (mechanism_ == TrackingMechanism::explicit_calls &&
        (mode == WriteTracking::automatic || mode == WriteTracking::automatic_mprotect)) {
      mechanism_ = TrackingMechanism::mprotect;
      target_ =
          std::make_unique<FaultTarget>(FaultTarget{range_.data(), range_.size(), page_size, &allocated_, &dirty_});
      register_fault_target(target_.get());
    }
  }
  /// Stops tracking and gives the address range back.
  ~WriteTracker() {
    if (target_) {
      unregister_fault_target(target_.get());
    }
    if (uffd_ >= 0) {
      ::close(uffd_);
      ::close(pagemap_);
    }
  }
  WriteTracker(const WriteTracker&) = delete;
  WriteTracker& operator=(const WriteTracker&) = delete;

  /// The mechanism chosen.
  TrackingMechanism mechanism() const noexcept { return mechanism_; }
  /// The first address of the range.
  std::byte* base() const noexcept { return range_.data(); }
  /// Bytes per page.
  std::size_t page_size() const noexcept { return page_size_; }
  /// Pages in the range.
  std::uint32_t pages() const noexcept { return allocated_.size(); }
  /// Whether `page` is tracked (committed and handed out).
  bool allocated(std::uint32_t page) const noexcept { return allocated_.test(page); }

  /// Makes the pages readable and writable (zero). Returns 0 or the errno of the failure (then
  /// nothing changed). track() must follow before the pages are handed out.
  int commit(SlotRange pages) noexcept {
    return range_.commit(offset(pages.first), bytes(pages), PROT_READ | PROT_WRITE);
  }

  /// Starts tracking writes to committed pages, all clean: write-protects them in automatic modes.
  /// Returns 0 or the errno of the failure (then the pages are as commit() left them).
  int track(SlotRange pages) noexcept {
    if (mechanism_ == TrackingMechanism::mprotect &&
        ::mprotect(base() + offset(pages.first), bytes(pages), PROT_READ) != 0) {
      return errno;
    }
    if (mechanism_ == TrackingMechanism::userfaultfd) {
      uffdio_register reg{};
      reg.range = uffd_range(pages);
      reg.mode = UFFDIO_REGISTER_MODE_WP;
      if (::ioctl(uffd_, UFFDIO_REGISTER, &reg) != 0) {
        return errno;
      }
      if (!write_protect(pages)) {
        const int e = errno;
        uffdio_range r = uffd_range(pages);
        ::ioctl(uffd_, UFFDIO_UNREGISTER, &r);
        return e;
      }
    }
    dirty_.clear(pages);
    allocated_.set(pages);
    return 0;
  }

  /// Hands committed pages back (tracked or not).
  void release(SlotRange pages) noexcept {
    allocated_.clear(pages);
    dirty_.clear(pages);
    if (mechanism_ == TrackingMechanism::userfaultfd) {
      uffdio_range r = uffd_range(pages);
      ::ioctl(uffd_, UFFDIO_UNREGISTER, &r);
    }
    range_.decommit(offset(pages.first), bytes(pages));
  }

  /// The pages were written (an explicit write). Any thread.
  void mark_dirty(SlotRange pages) noexcept { dirty_.set(pages); }

  /// Before carve writes the pages itself: under mprotect they are marked dirty and made writable.
  /// Any thread.
  void prepare_host_write(SlotRange pages) noexcept {
    if (mechanism_ == TrackingMechanism::mprotect) {
      // Dirty first, writable second: the order the fault handler uses.
      dirty_.set(pages);
      // When this fails (out of mappings), carve's copy faults page by page and the handler copes.
      (void)::mprotect(base() + offset(pages.first), bytes(pages), PROT_READ | PROT_WRITE);
    }
  }

  /// The pages match the devices again: write-protected and clean (they stay dirty when they
  /// cannot be protected).
  void mark_clean(SlotRange pages) noexcept {
    if (mechanism_ == TrackingMechanism::mprotect) {
      if (::mprotect(base() + offset(pages.first), bytes(pages), PROT_READ) != 0) {
        return; // still writable, so they must stay dirty
      }
    } else if (mechanism_ == TrackingMechanism::userfaultfd) {
      write_protect(pages);
    }
    dirty_.clear(pages);
  }

  /// Whether `page` was written since it was last clean (userfaultfd: after a scan).
  bool is_dirty(std::uint32_t page) noexcept {
    if (mechanism_ == TrackingMechanism::userfaultfd) {
      collect_written({page, 1}, /*protect=*/false);
    }
    return dirty_.test(page);
  }

  /// Calls emit(SlotRange run) for each maximal run of dirty pages within `pages`, lowest first;
  /// the runs are clean when emit sees them.
  template <class Emit>
  void harvest(SlotRange pages, Emit&& emit) {
    if (mechanism_ == TrackingMechanism::userfaultfd) {
      collect_written(pages, /*protect=*/true);
    }
    std::uint32_t run_first = 0;
    std::uint32_t run_count = 0;
    const auto flush = [&] {
      if (run_count != 0) {
        const SlotRange run{run_first, run_count};
        if (mechanism_ == TrackingMechanism::mprotect &&
            ::mprotect(base() + offset(run.first), bytes(run), PROT_READ) != 0) {
          dirty_.set(run); // still writable: keep it dirty, copy it anyway
        }
        emit(run);
        run_count = 0;
      }
    };
    for (const WordMask w : word_masks(pages)) {
      for (bits::word taken = dirty_.take(w.word, w.mask); taken != 0;) {
        const std::uint32_t bit = bits::lowest_set(taken);
        const std::uint32_t len = bits::low_run(taken >> bit);
        const std::uint32_t first = w.word * bits::word_bits + bit;
        if (run_count != 0 && run_first + run_count != first) {
          flush();
        }
        run_first = run_count == 0 ? first : run_first;
        run_count += len;
        taken &= ~bits::range_mask(bit, len);
      }
    }
    flush();
  }

  /// Which pages of `pages` are dirty, page by page, as the last dirty_count() of them found.
  std::vector<bool> dirty_pages(SlotRange pages) const {
    std::vector<bool> out(pages.count);
    for (std::uint32_t i = 0; i < pages.count; ++i) {
      out[i] = dirty_.test(pages.first + i);
    }
    return out;
  }

  /// Dirty pages within `pages` as this tracker knows them now (userfaultfd: after a scan).
  std::uint32_t dirty_count(SlotRange pages) noexcept {
    if (mechanism_ == TrackingMechanism::userfaultfd) {
      collect_written(pages, /*protect=*/false);
    }
    return dirty_.count(pages);
  }

private:
  std::size_t offset(std::uint32_t page) const noexcept { return std::size_t{page} * page_size_; }
  std::size_t bytes(SlotRange pages) const noexcept { return std::size_t{pages.count} * page_size_; }
  uffdio_range uffd_range(SlotRange pages) const noexcept {
    return {reinterpret_cast<std::uint64_t>(base() + offset(pages.first)), bytes(pages)};
  }
  bool write_protect(SlotRange pages) noexcept {
    uffdio_writeprotect wp{};
    wp.range = uffd_range(pages);
    wp.mode = UFFDIO_WRITEPROTECT_MODE_WP;
    return ::ioctl(uffd_, UFFDIO_WRITEPROTECT, &wp) == 0;
  }

  // Folds the pages the kernel saw written into dirty_ (and with `protect`, write-protects them
  // again in the same step, atomically per page).
  void collect_written(SlotRange pages, bool protect) noexcept {
    std::array<uffd::PageRegion, 256> regions;
    const auto begin = reinterpret_cast<std::uint64_t>(base() + offset(pages.first));
    const std::uint64_t end = begin + bytes(pages);
    std::uint64_t at = begin;
    while (at < end) {
      uffd::ScanArg arg{};
      arg.size = sizeof arg;
      arg.flags = protect ? uffd::scan_wp_matching | uffd::scan_check_wpasync : 0;
      arg.start = at;
      arg.end = end;
      arg.vec = reinterpret_cast<std::uint64_t>(regions.data());
      arg.vec_len = regions.size();
      arg.category_mask = uffd::page_is_written;
      arg.return_mask = uffd::page_is_written;
      const long found = ::ioctl(pagemap_, uffd::pagemap_scan, &arg);
      if (found < 0) {
        // Should not happen on a range the tracker registered; treat every page as written
        // rather than lose a write.
        dirty_.set(pages);
        return;
      }
      const auto base_address = reinterpret_cast<std::uint64_t>(base());
      for (long i = 0; i < found; ++i) {
        const auto& r = regions[static_cast<std::size_t>(i)];
        const auto first = static_cast<std::uint32_t>((r.start - base_address) / page_size_);
        const auto last = static_cast<std::uint32_t>((r.end - 1 - base_address) / page_size_);
        dirty_.set({first, last - first + 1});
      }
      if (arg.walk_end <= at) {
        break;
      }
      at = arg.walk_end;
    }
  }

  ReservedRange range_;
  std::size_t page_size_;
  AtomicPageBits allocated_;
  AtomicPageBits dirty_;
  TrackingMechanism mechanism_ = TrackingMechanism::explicit_calls;
  int uffd_ = -1;
  int pagemap_ = -1;
  std::unique_ptr<FaultTarget> target_;
};

} // namespace carve
