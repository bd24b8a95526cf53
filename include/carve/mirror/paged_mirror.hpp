/// @file carve/mirror/paged_mirror.hpp
/// One large virtual device over several devices, kept in step page by page.
///
/// @code
/// carve::HostMirrorBackend<> devices;                       // or carve::CudaMirrorBackend
/// devices.register_device(carve::SimulatedCard(1 << 30));
/// devices.register_device(carve::SimulatedCard(1 << 30));
/// carve::PagedMirror mirror(devices, {.page_size = 64 << 10, .tracking = carve::WriteTracking::automatic});
///
/// auto p = mirror.try_allocate(256 << 20, 1);               // expected<void*, Errc>
/// std::memset(*p, 1, 4096);                                 // a plain store: its page is now dirty
/// auto report = mirror.sync();                              // copies that one page, nothing else
/// @endcode
///
/// One virtual GPU over several. Construction asks the backend for its devices and
/// reserves host address space equal to their total memory (PROT_NONE, committed per allocation),
/// cut into pages of options.page_size; the page table maps each host page to a page of one device.
/// An allocation takes contiguous host pages and, on the devices the Placement policy chooses, device
/// pages (runs of them where possible, found by the Fit policy in a DynamicSlotAllocator per device).
/// Host code reads and writes the host copy; sync() copies only the dirty pages to the device pages
/// behind them, adjacent pages coalesced into one copy per device run, queued on each device's
/// stream so devices copy in parallel, higher-priority allocations first; fetch() brings pages that
/// device code wrote back. The compute side (submit / dispatch / release: compute and memory
/// granted together in priority order, backed by the `Partitioner`) is the base
/// MirrorComputeGrants (carve/mirror/compute_grants.hpp).
///
/// With MirrorOptions::device_view each allocation also has one device pointer over all its pages
/// (device_pointer; carve/mirror/device_view.hpp). The mirror is a carve::MemoryResource. Errors
/// come back as carve::Errc and change nothing: invalid_size (0 bytes, an alignment not a power of
/// two), no_space (more than the mirror could ever hold, an alignment above the page size, too few
/// free pages now, or host memory), out_of_range (a range not inside one allocation, an unknown
/// device), not_allocated (not an allocation), device_error (a copy failed: sync's pages stay
/// dirty). Construction throws carve::Exception (invalid_argument for a bad page size or no usable
/// device; what the kernel refused).
///
/// Thread safety: write(), mark_dirty(), is_dirty(), locate(), segments() and plain stores may come
/// from any number of threads, also while another thread syncs; a page stored to during a sync is
/// copied again by the next one. The other calls serialise on an internal lock. Stores into memory
/// being fetched, deallocated, or written by write() at the same time are races, as for any memory.
#pragma once

#include <carve/core/error.hpp>
#include <carve/core/format_bytes.hpp>
#include <carve/core/misuse.hpp>
#include <carve/mirror/compute_grants.hpp>
#include <carve/mirror/device_info.hpp>
#include <carve/mirror/device_segments.hpp>
#include <carve/mirror/device_view.hpp>
#include <carve/mirror/host_backend.hpp>
#include <carve/mirror/mirror_backend.hpp>
#include <carve/mirror/mirror_options.hpp>
#include <carve/mirror/mirror_pages.hpp>
#include <carve/mirror/page_copies.hpp>
#include <carve/mirror/page_table.hpp>
#include <carve/mirror/placement.hpp>
#include <carve/mirror/sync_report.hpp>
#include <carve/mirror/write_tracker.hpp>
#include <carve/mirror/write_tracking.hpp>
#include <carve/mr/cuda_mr.hpp>
#include <carve/mr/memory_resource.hpp>
#include <carve/slot/allocator/dynamic_slot_allocator.hpp>
#include <carve/slot/policy/first_fit.hpp>

#include <cuda/std/expected>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <utility>
#include <vector>

namespace carve {

/// One virtual device over `Backend`'s devices, pages placed by `Placement` and found on each device
/// by `Fit` (see the file's description). A MemoryResource; not copyable.
template <MirrorBackend Backend, PagePlacement Placement = FillPlacement, class Fit = FirstFit,
          SmPartitioner Partitioner = AdvisorySmLedger>
requires WordSearchingFitPolicy<Fit>
class PagedMirror : public MirrorComputeGrants<PagedMirror<Backend, Placement, Fit, Partitioner>, Partitioner>,
                    public MirrorDeviceViews<PagedMirror<Backend, Placement, Fit, Partitioner>>,
                    public CcclSpellings<PagedMirror<Backend, Placement, Fit, Partitioner>> {
  using Grants = MirrorComputeGrants<PagedMirror, Partitioner>;
  friend Grants;
  friend MirrorDeviceViews<PagedMirror>;

public:
  using backend_type = Backend;     ///< the devices
  using placement_type = Placement; ///< the placement policy

  /// The largest page size the mirror takes.
  static constexpr std::size_t max_page_size = std::size_t{1} << 30;

  /// Asks `backend` (which must outlive the mirror) for its devices and reserves their total
  /// memory in host addresses. Throws carve::Exception: invalid_argument for a bad page size, more
  /// than max_mirror_devices devices, more than 2^31 pages, or no available device with a whole
  /// page; as WriteTracker does for the tracking mode and the reservation.
  explicit PagedMirror(Backend& backend, MirrorOptions options = {}, Placement placement = {},
                       Partitioner partitioner = {})
      : Grants(backend.devices(), options.dispatch_order, std::move(partitioner)), backend_(backend), options_(options),
        placement_(std::move(placement)), devices_(backend.devices()),
        page_size_(checked_mirror_page_size(options.page_size, max_page_size)), pages_(devices_, page_size_),
        tracker_(pages_.host_count(), page_size_, options.tracking), table_(pages_.host_count()) {
    if (options.device_view) {
      check_view_page_size(backend_, devices_, page_size_);
    }
  }

  /// Waits for every device, then gives back every allocation's host memory.
  ~PagedMirror() {
    wait_all();
    const std::unique_lock lock(allocations_mutex_);
    for (auto& [first, a] : allocations_) {
      release_host(a);
    }
  }
  PagedMirror(const PagedMirror&) = delete;
  PagedMirror& operator=(const PagedMirror&) = delete;

  /// `bytes` of zeroed memory, rounded up to whole pages, host and device copies equal; it starts
  /// on a page, so any alignment up to the page size is met. Pages placed with no hint.
  [[nodiscard]] cuda::std::expected<void*, Errc> try_allocate(std::size_t bytes, std::size_t alignment) noexcept {
    return try_allocate_placed(bytes, alignment, MirrorHint{});
  }

  /// try_allocate, the pages placed as `hint` asks (see MirrorHint). Errors as try_allocate, and
  /// out_of_range when the hint names a device the mirror does not have.
  [[nodiscard]] cuda::std::expected<void*, Errc> try_allocate_placed(std::size_t bytes, std::size_t alignment,
                                                                     MirrorHint hint) noexcept {
    if (const auto ok = check_request(bytes, alignment); !ok) {
      return cuda::std::unexpected(ok.error());
    }
    if (alignment > page_size_) {
      return cuda::std::unexpected(Errc::no_space);
    }
    try {
      const std::lock_guard control(control_);
      return allocate_locked(bytes, hint.priority, hint.near);
    } catch (const std::bad_alloc&) {
      return cuda::std::unexpected(Errc::no_space);
    }
  }

  /// Frees an allocation whole. Errors (nothing changes): not_allocated when `p` is not an address
  /// try_allocate returned (or was freed already, or is a grant's memory, which goes back with its
  /// grant); invalid_size when `bytes` is not its size.
  [[nodiscard]] cuda::std::expected<void, Errc> try_deallocate(void* p, std::size_t bytes,
                                                               std::size_t alignment) noexcept {
    const std::lock_guard control(control_);
    if (this->holds_grant_memory(p)) {
      return cuda::std::unexpected(Errc::not_allocated); // it goes back with its grant
    }
    return deallocate_locked(p, bytes, alignment);
  }
  /// The same without naming the size, which the mirror knows.
  [[nodiscard]] cuda::std::expected<void, Errc> try_deallocate(void* p) noexcept {
    const std::lock_guard control(control_);
    if (this->holds_grant_memory(p)) {
      return cuda::std::unexpected(Errc::not_allocated);
    }
    return deallocate_locked(p, std::nullopt, 1);
  }
  /// try_deallocate; a misuse (an address it never gave, a wrong size) stops the program
  /// (report_misuse).
  void deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept {
    if (const auto r = try_deallocate(p, bytes, alignment); !r) {
      report_misuse("carve::PagedMirror::deallocate", p, bytes, r.error());
    }
  }
  /// Two mirrors are equal when they are one object: each frees only what it gave.
  friend bool operator==(const PagedMirror& a, const PagedMirror& b) noexcept { return &a == &b; }
  /// Whether `p` lies in the mirror's address space (allocated or not).
  bool owns(const void* p) const noexcept {
    const auto* b = static_cast<const std::byte*>(p);
    return b >= tracker_.base() && b < tracker_.base() + capacity();
  }

  /// Copies n bytes into the mirror at dst and marks the pages dirty. Errors: out_of_range when
  /// [dst, dst + n) is not inside one allocation (nothing is written).
  [[nodiscard]] cuda::std::expected<void, Errc> write(void* dst, const void* src, std::size_t n) {
    const std::shared_lock lock(allocations_mutex_);
    const auto pages = pages_of(dst, n);
    if (!pages) {
      return cuda::std::unexpected(pages.error());
    }
    if (n != 0) {
      tracker_.prepare_host_write(*pages);
      std::memcpy(dst, src, n);
      tracker_.mark_dirty(*pages); // after the data: a sync that misses the bit sees the data
    }
    return {};
  }

  /// Marks the pages of [p, p + n) dirty (after plain stores in explicit mode). Errors: out_of_range.
  [[nodiscard]] cuda::std::expected<void, Errc> mark_dirty(const void* p, std::size_t n) {
    const std::shared_lock lock(allocations_mutex_);
    const auto pages = pages_of(p, n);
    if (!pages) {
      return cuda::std::unexpected(pages.error());
    }
    if (n != 0) {
      tracker_.mark_dirty(*pages);
    }
    return {};
  }

  /// Copies every dirty page to its device page and waits until every device has finished all the
  /// work queued so far. On device_error the pages whose copies failed are dirty again, so a later
  /// sync retries them.
  [[nodiscard]] cuda::std::expected<SyncReport, Errc> sync() {
    const std::lock_guard control(control_);
    return sync_locked(/*everything=*/false);
  }

  /// Copies every allocated page, dirty or not, and leaves all clean: the full sync that sync()
  /// avoids. For measurements, and for memory changed behind the tracker's back (explicit mode).
  [[nodiscard]] cuda::std::expected<SyncReport, Errc> sync_all() {
    const std::lock_guard control(control_);
    return sync_locked(/*everything=*/true);
  }

  /// Replaces the host copy of the pages of [p, p + n) with what the devices hold (after device code
  /// wrote them). Host writes to those pages not yet synced are lost; the report counts the pages.
  /// Errors: out_of_range, device_error (the host copy may then be partly updated: pages that were
  /// dirty stay dirty, the others stay clean, so no sync pushes a half-fetched page to the devices).
  [[nodiscard]] cuda::std::expected<FetchReport, Errc> fetch(const void* p, std::size_t n) {
    const std::lock_guard control(control_);
    const std::shared_lock lock(allocations_mutex_);
    const auto pages = pages_of(p, n);
    if (!pages) {
      return cuda::std::unexpected(pages.error());
    }
    return copy_pages_to_host(backend_, tracker_, table_, n == 0 ? SlotRange{pages->first, 0} : *pages,
                              devices_.size());
  }

  /// The device page behind the page holding p; nullopt when p is not in an allocation.
  [[nodiscard]] std::optional<PageLocation> locate(const void* p) const {
    const std::shared_lock lock(allocations_mutex_);
    const auto pages = pages_of(p, 1);
    return pages ? table_.find(pages->first) : std::nullopt;
  }

  /// [p, p + n) cut into the pieces that are contiguous on one device, in address order (to launch
  /// a kernel per device on its part). Errors: out_of_range.
  [[nodiscard]] cuda::std::expected<std::vector<MirrorSegment>, Errc> segments(const void* p, std::size_t n) const {
    const std::shared_lock lock(allocations_mutex_);
    const auto pages = pages_of(p, n);
    if (!pages) {
      return cuda::std::unexpected(pages.error());
    }
    return clip_segments(table_, *pages, tracker_.base(), page_size_, static_cast<const std::byte*>(p), n);
  }

  /// Whether the page holding `p` is dirty; false when `p` is not in an allocation.
  bool is_dirty(const void* p) {
    const std::shared_lock lock(allocations_mutex_);
    const auto pages = pages_of(p, 1);
    return pages && tracker_.is_dirty(pages->first);
  }

  /// Dirty pages over all allocations, as the tracker knows them now.
  std::uint64_t dirty_pages() {
    const std::shared_lock lock(allocations_mutex_);
    std::uint64_t n = 0;
    for (const auto& [first, a] : allocations_) {
      n += tracker_.dirty_count(a.pages);
    }
    return n;
  }

  std::size_t page_size() const noexcept { return page_size_; } ///< bytes per page
  /// Bytes the mirror holds: every available device's whole pages.
  std::size_t capacity() const noexcept { return bytes_of(pages_.host_count()); }
  /// Bytes in free device pages, all devices together.
  std::size_t free_bytes() const {
    const std::lock_guard control(control_);
    return bytes_of(pages_.free_total());
  }
  std::size_t device_count() const noexcept { return devices_.size(); } ///< devices the backend reported, usable or not
  const std::vector<DeviceInfo>& devices() const noexcept { return devices_; } ///< as the backend described them
  /// Pages on `device`; 0 for an unknown or unavailable one.
  std::uint32_t device_pages(std::uint32_t device) const noexcept { return pages_.device_count(device); }
  /// Free pages on `device`; 0 for an unknown or unavailable one.
  std::uint32_t device_free_pages(std::uint32_t device) const {
    const std::lock_guard control(control_);
    return pages_.device_free(device);
  }
  /// Live allocations.
  std::size_t allocation_count() const {
    const std::shared_lock lock(allocations_mutex_);
    return allocations_.size();
  }
  TrackingMechanism tracking_mechanism() const noexcept { return tracker_.mechanism(); } ///< how dirty pages are found
  const std::byte* host_base() const noexcept { return tracker_.base(); } ///< the start of every allocation's range
  Backend& backend() noexcept { return backend_; }                        ///< the backend
  const Placement& placement() const noexcept { return placement_; }      ///< the placement policy, with its state

  /// Why try_allocate(bytes) fails: "cannot allocate 3.0 GiB: the mirror holds 2.0 GiB (1.5 GiB free:
  /// card 0 0.5 GiB, card 1 1.0 GiB)".
  std::string allocation_failure_message(std::size_t bytes) const {
    const std::lock_guard control(control_);
    return "cannot allocate " + format_bytes(bytes) + ": the mirror holds " + format_bytes(capacity()) + " (" +
           pages_.describe_free(devices_) + ")";
  }

private:
  struct Allocation {
    SlotRange pages; // host pages
    std::size_t bytes;
    int priority;
    std::vector<MirrorRun> runs; // device page runs, in host order
    PlacedMemory view{};         // the device view; base null without one
  };

  std::size_t bytes_of(std::uint64_t pages) const noexcept { return static_cast<std::size_t>(pages) * page_size_; }
  // Rounded up without forming bytes + page_size - 1, which wraps for sizes near SIZE_MAX.
  std::uint64_t pages_for(std::size_t bytes) const noexcept {
    return std::uint64_t{bytes / page_size_} + (bytes % page_size_ != 0 ? 1 : 0);
  }
  std::byte* host_address(std::uint32_t page) const noexcept { return tracker_.base() + bytes_of(page); }
  std::size_t device_offset(std::uint32_t page) const noexcept { return bytes_of(page); }

  // The host pages of [p, p + n) when they lie inside one allocation (n == 0: p must be inside
  // one, or at its end). Caller holds allocations_mutex_.
  [[nodiscard]] cuda::std::expected<SlotRange, Errc> pages_of(const void* p, std::size_t n) const {
    const auto* b = static_cast<const std::byte*>(p);
    const std::byte* base = tracker_.base();
    if (b < base || b >= base + capacity() || n > capacity()) {
      return cuda::std::unexpected(Errc::out_of_range);
    }
    const auto offset = static_cast<std::size_t>(b - base);
    const auto page = static_cast<std::uint32_t>(offset / page_size_);
    auto it = allocations_.upper_bound(page);
    if (it == allocations_.begin()) {
      return cuda::std::unexpected(Errc::out_of_range);
    }
    const Allocation& a = (--it)->second;
    const std::size_t begin = bytes_of(a.pages.first);
    if (offset + n > begin + a.bytes || offset >= begin + a.bytes) {
      return cuda::std::unexpected(Errc::out_of_range);
    }
    const auto last = static_cast<std::uint32_t>((offset + (n == 0 ? 0 : n - 1)) / page_size_);
    return SlotRange{page, last - page + 1};
  }

  [[nodiscard]] cuda::std::expected<void*, Errc> allocate_locked(std::size_t bytes, int priority,
                                                                 std::optional<std::uint32_t> near) {
    if (bytes > capacity()) {
      return cuda::std::unexpected(Errc::no_space);
    }
    if (near && *near >= devices_.size()) {
      return cuda::std::unexpected(Errc::out_of_range);
    }
    const auto count = static_cast<std::uint32_t>(pages_for(bytes));
    const std::vector<DevicePageState> states = pages_.states();
    auto plan = placement_.place(PlacementRequest{count, page_size_, priority, near}, states);
    if (!plan) {
      return cuda::std::unexpected(plan.error());
    }
    if (!pages_.valid(*plan, count, states)) {
      return cuda::std::unexpected(Errc::invalid_placement);
    }
    const auto host = pages_.take_host(count);
    if (!host) {
      return cuda::std::unexpected(host.error()); // free pages exist, but no contiguous host range
    }
    Allocation a{*host, bytes, priority, {}};
    pages_.take_plan(*plan, *host, a.runs); // when it throws, nothing is left taken
    if (tracker_.commit(a.pages) != 0) {
      give_back(a);
      return cuda::std::unexpected(Errc::no_space); // the kernel refused the host memory
    }
    if constexpr (HostMemoryObserver<Backend>) {
      backend_.host_committed(host_address(a.pages.first), bytes_of(a.pages.count)); // pinned before protected
    }
    if (tracker_.track(a.pages) != 0) {
      release_host(a);
      give_back(a);
      return cuda::std::unexpected(Errc::no_space);
    }
    std::uint32_t page = a.pages.first;
    for (const MirrorRun& r : a.runs) {
      for (std::uint32_t i = 0; i < r.device_pages.count; ++i) {
        table_.map(page++, PageLocation{r.device, r.device_pages.first + i});
      }
    }
    for (const MirrorRun& r : a.runs) {
      if (!backend_.zero(r.device, device_offset(r.device_pages.first), bytes_of(r.device_pages.count))) {
        undo(a);
        return cuda::std::unexpected(Errc::device_error);
      }
    }
    if (options_.device_view) {
      auto view = map_allocation_view(backend_, a.runs, page_size_);
      if (!view) {
        undo(a);
        return cuda::std::unexpected(view.error().code);
      }
      a.view = *view;
    }
    void* address = host_address(a.pages.first);
    const std::unique_lock lock(allocations_mutex_);
    try {
      allocations_.emplace(a.pages.first, std::move(a)); // a node that cannot be made moves nothing
    } catch (const std::bad_alloc&) {
      undo(a);
      throw;
    }
    return address;
  }

  // What allocate_locked took for `a`, given back once the zeroing queued for it has run.
  void undo(const Allocation& a) {
    wait_all();
    release_host(a);
    give_back(a);
  }

  void give_back(const Allocation& a) noexcept { pages_.give_back(a.pages, a.runs); }

  void release_host(const Allocation& a) {
    if (a.view.base != nullptr) unmap_allocation_view(backend_, a.view);
    if constexpr (HostMemoryObserver<Backend>) {
      backend_.host_released(host_address(a.pages.first), bytes_of(a.pages.count));
    }
    tracker_.release(a.pages);
    table_.unmap(a.pages);
  }

  // `bytes` nullopt: whatever size the allocation has.
  [[nodiscard]] cuda::std::expected<void, Errc> deallocate_locked(void* p, std::optional<std::size_t> bytes,
                                                                  std::size_t alignment) {
    const std::unique_lock lock(allocations_mutex_);
    const auto* b = static_cast<const std::byte*>(p);
    if (b < tracker_.base() || b >= tracker_.base() + capacity() ||
        static_cast<std::size_t>(b - tracker_.base()) % page_size_ != 0) {
      return cuda::std::unexpected(Errc::not_allocated);
    }
    const auto it =
        allocations_.find(static_cast<std::uint32_t>(static_cast<std::size_t>(b - tracker_.base()) / page_size_));
    if (it == allocations_.end()) {
      return cuda::std::unexpected(Errc::not_allocated);
    }
    if ((bytes && *bytes != it->second.bytes) || !check_request(it->second.bytes, alignment)) {
      return cuda::std::unexpected(Errc::invalid_size);
    }
    release_host(it->second);
    give_back(it->second);
    allocations_.erase(it);
    return {};
  }

  [[nodiscard]] cuda::std::expected<SyncReport, Errc> sync_locked(bool everything) {
    const std::shared_lock lock(allocations_mutex_);
    std::vector<PrioritisedPages> ranges;
    ranges.reserve(allocations_.size());
    for (const auto& [first, a] : allocations_) {
      ranges.push_back({a.priority, a.pages});
    }
    return copy_pages_to_devices(backend_, tracker_, table_, std::move(ranges), everything, pages_.usable_devices(),
                                 devices_.size());
  }

  // The hooks MirrorComputeGrants uses (under control_).
  bool could_ever_hold(std::size_t bytes) const noexcept { return pages_for(bytes) <= pages_.host_count(); }
  void free_granted(void* p) { (void)deallocate_locked(p, std::nullopt, 1); }

  void wait_all() noexcept {
    for (std::uint32_t d = 0; d < devices_.size(); ++d) {
      if (pages_.usable(d)) {
        (void)backend_.wait(d);
      }
    }
  }

  Backend& backend_;
  MirrorOptions options_;
  Placement placement_;
  std::vector<DeviceInfo> devices_;
  std::size_t page_size_;
  MirrorPages<Fit> pages_;
  WriteTracker tracker_;
  PageTable table_;
  std::map<std::uint32_t, Allocation> allocations_; // by first host page
  mutable std::mutex control_;
  mutable std::shared_mutex allocations_mutex_;
};

static_assert(MemoryResource<PagedMirror<HostMirrorBackend<>>> && OwnsMemory<PagedMirror<HostMirrorBackend<>>> &&
              ChecksDeallocation<PagedMirror<HostMirrorBackend<>>>);

} // namespace carve
