/// @file carve/mirror/paged_mirror.hpp
/// One large virtual device over several devices, kept in step page by page.
///
/// @code
/// carve::HostMirrorBackend<> devices;                       // or carve::CudaMirrorBackend
/// devices.register_device(carve::SimulatedCard(1 << 30));
/// devices.register_device(carve::SimulatedCard(1 << 30));
/// carve::PagedMirror mirror(devices, {.page_size = 64 << 10, .tracking = carve::WriteTracking::automatic});
///
/// auto p = mirror.try_allocate(256 << 20);                  // expected<void*, Errc>
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
/// device code wrote back. The compute side (submit / dispatch / release) hands devices or SM
/// partitions to requests in priority order and answers with a pair: a compute resource and a
/// virtual address. The `Partitioner` decides whether a partition binds: AdvisorySmLedger (the
/// default) keeps a ledger only; CudaGreenContexts backs each grant with a green context, whose
/// stream (compute_stream) runs on the granted SMs only. A released grant's SMs and memory return
/// when the work on its stream has run (see carve/mirror/sm_partitioner.hpp).
///
/// The mirror is a carve::MemoryResource: a stack can put a pool or a StatsResource over it.
/// Errors come back as carve::Errc and change nothing: invalid_size (0 bytes, an alignment that is
/// not a power of two), no_space (more than the whole mirror could ever hold, an alignment above
/// the page size, not enough free pages now), out_of_range (a range that is not inside one
/// allocation, an unknown device), not_allocated (a pointer that is not an allocation),
/// device_error (a copy failed: the pages stay dirty). Construction throws carve::Exception
/// (invalid_argument for a bad page size or no usable device; what the kernel refused).
///
/// Thread safety: write(), mark_dirty(), is_dirty(), locate(), segments() and plain stores may come
/// from any number of threads, also while another thread syncs; a page stored to during a sync is
/// copied again by the next one. The other calls serialise on an internal lock. Stores into memory
/// being fetched, deallocated, or written by write() at the same time are races, as for any memory.
#pragma once

#include <carve/core/error.hpp>
#include <carve/core/format_bytes.hpp>
#include <carve/core/misuse.hpp>
#include <carve/mirror/device_info.hpp>
#include <carve/mirror/device_segments.hpp>
#include <carve/mirror/host_backend.hpp>
#include <carve/mirror/mirror_backend.hpp>
#include <carve/mirror/page_table.hpp>
#include <carve/mirror/placement.hpp>
#include <carve/mirror/priority_dispatcher.hpp>
#include <carve/mirror/sm_partitioner.hpp>
#include <carve/mirror/sync_report.hpp>
#include <carve/mirror/write_tracker.hpp>
#include <carve/mirror/write_tracking.hpp>
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

/// How a PagedMirror is built.
struct MirrorOptions {
  /// A power of two, a multiple of the OS page, at most 1 GiB: 4 KiB, 64 KiB, 2 MiB.
  std::size_t page_size = std::size_t{64} << 10;
  /// Plain stores are seen unless asked otherwise: userfaultfd write-protection where the kernel
  /// has it (Linux >= 6.7), else mprotect (see write_tracking.hpp). explicit_calls is cheaper but
  /// syncs only what write() and mark_dirty() name.
  WriteTracking tracking = WriteTracking::automatic;
  DispatchOrder dispatch_order = DispatchOrder::strict_priority; ///< for submit / dispatch
};

/// Where an allocation's pages should go: its priority (higher syncs first) and the device that
/// will use it (placement policies that care put its pages there or close).
struct MirrorHint {
  int priority = 0;                                 ///< higher syncs first
  std::optional<std::uint32_t> near = std::nullopt; ///< the device that will use the memory
};

/// A request for compute and memory together.
struct ResourceRequest {
  std::size_t bytes = 0;           ///< memory wanted
  int priority = 0;                ///< higher is served first
  std::uint32_t compute_units = 0; ///< contiguous units on one device, rounded up to whole groups; 0: a whole device
};

/// What a request received: compute units and memory near them.
struct ResourceGrant {
  ComputeGrant compute{};  ///< the compute resource: device and unit range
  void* address = nullptr; ///< the memory, placed near compute.device by the placement policy
  std::size_t bytes = 0;   ///< as requested
};

/// A piece of mirror memory that lives in one run of one device's pages.
struct MirrorSegment {
  std::uint32_t device = 0;      ///< the device's index in the backend
  std::size_t device_offset = 0; ///< into the backend's memory for the mirror on that device
  std::byte* host = nullptr;     ///< the piece's host address
  std::size_t bytes = 0;         ///< the piece's size
};

/// One virtual device over `Backend`'s devices, pages placed by `Placement` and found on each device
/// by `Fit` (see the file's description). A MemoryResource; not copyable.
template <MirrorBackend Backend, PagePlacement Placement = FillPlacement, class Fit = FirstFit,
          SmPartitioner Partitioner = AdvisorySmLedger>
requires WordSearchingFitPolicy<Fit>
class PagedMirror {
public:
  using backend_type = Backend;                          ///< the devices
  using placement_type = Placement;                      ///< the placement policy
  using partitioner_type = Partitioner;                  ///< how compute grants are backed
  using stream_type = typename Partitioner::stream_type; ///< where a grant's work goes

  /// The largest page size the mirror takes.
  static constexpr std::size_t max_page_size = std::size_t{1} << 30;

  /// Asks `backend` (which must outlive the mirror) for its devices and reserves their total
  /// memory in host addresses. Throws carve::Exception: invalid_argument for a bad page size, more
  /// than max_mirror_devices devices, more than 2^31 pages, or no available device with a whole
  /// page; as WriteTracker does for the tracking mode and the reservation.
  explicit PagedMirror(Backend& backend, MirrorOptions options = {}, Placement placement = {},
                       Partitioner partitioner = {})
      : backend_(backend), options_(options), placement_(std::move(placement)), devices_(backend.devices()),
        page_size_(checked_page_size(options.page_size)), device_pages_(make_device_pages(devices_, page_size_)),
        host_pages_(total_pages(device_pages_)), tracker_(host_pages_.size(), page_size_, options.tracking),
        table_(host_pages_.size()), dispatcher_(devices_, options.dispatch_order, std::move(partitioner)) {}

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

  // --- memory -------------------------------------------------------------------------------

  /// `bytes` of zeroed memory, rounded up to whole pages, host and device copies equal; it starts
  /// on a page, so any alignment up to the page size is met.
  cuda::std::expected<void*, Errc> try_allocate(std::size_t bytes, std::size_t alignment = 1,
                                                MirrorHint hint = {}) noexcept {
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
  /// try_allocate returned (or was freed already); invalid_size when `bytes` is not its size.
  cuda::std::expected<void, Errc> try_deallocate(void* p, std::size_t bytes, std::size_t alignment = 1) noexcept {
    const std::lock_guard control(control_);
    return deallocate_locked(p, bytes, alignment);
  }
  /// The same without naming the size, which the mirror knows.
  cuda::std::expected<void, Errc> try_deallocate(void* p) noexcept {
    const std::lock_guard control(control_);
    return deallocate_locked(p, std::nullopt, 1);
  }
  /// try_deallocate; a misuse (an address it never gave, a wrong size) stops the program
  /// (report_misuse).
  void deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept {
    if (const auto r = try_deallocate(p, bytes, alignment); !r) {
      report_misuse("carve::PagedMirror::deallocate", p, bytes, r.error());
    }
  }
  /// Whether `p` lies in the mirror's address space (allocated or not).
  bool owns(const void* p) const noexcept {
    const auto* b = static_cast<const std::byte*>(p);
    return b >= tracker_.base() && b < tracker_.base() + capacity();
  }

  /// Copies n bytes into the mirror at dst and marks the pages dirty. Errors: out_of_range when
  /// [dst, dst + n) is not inside one allocation (nothing is written).
  cuda::std::expected<void, Errc> write(void* dst, const void* src, std::size_t n) {
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
  cuda::std::expected<void, Errc> mark_dirty(const void* p, std::size_t n) {
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
  cuda::std::expected<SyncReport, Errc> sync() {
    const std::lock_guard control(control_);
    return sync_locked(/*everything=*/false);
  }

  /// Copies every allocated page, dirty or not, and leaves all clean: the full sync that sync()
  /// avoids. For measurements, and for memory changed behind the tracker's back (explicit mode).
  cuda::std::expected<SyncReport, Errc> sync_all() {
    const std::lock_guard control(control_);
    return sync_locked(/*everything=*/true);
  }

  /// Replaces the host copy of the pages of [p, p + n) with what the devices hold (after device code
  /// wrote them). Host writes to those pages not yet synced are lost; the report counts the pages.
  /// Errors: out_of_range, device_error (the host copy may then be partly updated; it stays dirty).
  cuda::std::expected<FetchReport, Errc> fetch(const void* p, std::size_t n) {
    const std::lock_guard control(control_);
    const std::shared_lock lock(allocations_mutex_);
    const auto pages = pages_of(p, n);
    if (!pages) {
      return cuda::std::unexpected(pages.error());
    }
    FetchReport report;
    report.mechanism = tracker_.mechanism();
    report.device_count = static_cast<std::uint32_t>(devices_.size());
    if (n == 0) {
      return report;
    }
    report.discarded_dirty_pages = tracker_.dirty_count(*pages);
    const auto start = std::chrono::steady_clock::now();
    tracker_.prepare_host_write(*pages);
    cuda::std::expected<void, Errc> result;
    std::vector<bool> used(devices_.size(), false);
    for_each_device_segment(table_, *pages, [&](const DeviceSegment& s) {
      if (!result) {
        return;
      }
      result =
          backend_.copy_to_host(s.device, host_address(s.host_page), device_offset(s.device_page), bytes_of(s.pages));
      used[s.device] = true;
      report.add(s.device, s.pages, bytes_of(s.pages));
    });
    for (std::uint32_t d = 0; d < devices_.size(); ++d) {
      if (used[d]) {
        if (auto w = backend_.wait(d); !w && result) {
          result = w;
        }
      }
    }
    report.copy_time = std::chrono::steady_clock::now() - start;
    if (!result) {
      tracker_.mark_dirty(*pages);
      return cuda::std::unexpected(result.error());
    }
    tracker_.mark_clean(*pages);
    return report;
  }

  // --- where memory lives ---------------------------------------------------------------------

  /// The device page behind the page holding p; nullopt when p is not in an allocation.
  std::optional<PageLocation> locate(const void* p) const {
    const std::shared_lock lock(allocations_mutex_);
    const auto pages = pages_of(p, 1);
    return pages ? table_.find(pages->first) : std::nullopt;
  }

  /// [p, p + n) cut into the pieces that are contiguous on one device, in address order (to launch
  /// a kernel per device on its part). Errors: out_of_range.
  cuda::std::expected<std::vector<MirrorSegment>, Errc> segments(const void* p, std::size_t n) const {
    const std::shared_lock lock(allocations_mutex_);
    const auto pages = pages_of(p, n);
    if (!pages) {
      return cuda::std::unexpected(pages.error());
    }
    std::vector<MirrorSegment> out;
    const auto* begin = static_cast<const std::byte*>(p);
    const std::byte* end = begin + n;
    for_each_device_segment(table_, *pages, [&](const DeviceSegment& s) {
      std::byte* host = host_address(s.host_page);
      const std::byte* lo = std::max<const std::byte*>(host, begin);
      const std::byte* hi = std::min<const std::byte*>(host + bytes_of(s.pages), end);
      if (lo < hi) {
        out.push_back({s.device, device_offset(s.device_page) + static_cast<std::size_t>(lo - host),
                       const_cast<std::byte*>(lo), static_cast<std::size_t>(hi - lo)});
      }
    });
    return out;
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

  // --- compute -------------------------------------------------------------------------------

  /// Queues a request for compute and memory. Errors: invalid_size (0 bytes, more compute units
  /// than any device has), no_space (more memory than the mirror holds: it could never be granted,
  /// and in strict priority order it would hold back every request behind it for good).
  cuda::std::expected<std::uint64_t, Errc> submit(const ResourceRequest& r) {
    const std::lock_guard control(control_);
    if (r.bytes == 0) {
      return cuda::std::unexpected(Errc::invalid_size);
    }
    if (pages_for(r.bytes) > host_pages_.size()) {
      return cuda::std::unexpected(Errc::no_space);
    }
    const auto ticket = dispatcher_.submit({r.priority, r.compute_units});
    if (ticket) {
      pending_bytes_.emplace(*ticket, r.bytes);
    }
    return ticket;
  }

  /// Takes back grants whose work has run (reclaim()), then grants queued requests in priority
  /// order: each gets a compute resource, then its memory near that device. A request whose memory
  /// does not fit now stays queued (and, in strict priority order, holds back the ones behind it).
  std::vector<ResourceGrant> dispatch() {
    const std::lock_guard control(control_);
    reclaim_locked();
    std::vector<ResourceGrant> out;
    dispatcher_.dispatch([&](const ComputeGrant& g) {
      const std::size_t bytes = pending_bytes_.at(g.ticket);
      const auto memory = allocate_locked(bytes, g.priority, g.device);
      if (!memory) {
        return false;
      }
      pending_bytes_.erase(g.ticket);
      granted_memory_.emplace(g.ticket, *memory);
      out.push_back({g, *memory, bytes});
      return true;
    });
    return out;
  }

  /// Where the grant's work goes: a stream on its SMs (see PriorityDispatcher::stream). Errors:
  /// not_allocated when the grant is not held or was released.
  cuda::std::expected<stream_type, Errc> compute_stream(const ResourceGrant& g) const {
    const std::lock_guard control(control_);
    return dispatcher_.stream(g.compute);
  }

  /// Hands a grant back: nothing more will be queued on its stream. Its compute units and its
  /// memory return together once that work has run: at once when it has (always, for advisory
  /// grants), else at a later reclaim() or dispatch(). Errors: not_allocated when the grant is not
  /// held or was released already.
  cuda::std::expected<void, Errc> release(const ResourceGrant& g) {
    const std::lock_guard control(control_);
    const auto held = granted_memory_.find(g.compute.ticket);
    if (held == granted_memory_.end() || held->second != g.address) {
      return cuda::std::unexpected(Errc::not_allocated);
    }
    if (auto r = dispatcher_.release(g.compute); !r) {
      return r;
    }
    reclaim_locked();
    return {};
  }

  /// Queues the grant's work, `work(stream)` with its compute stream, then hands the grant back:
  /// its units and memory return once that work has run, with no release() to call. `work` runs
  /// outside the mirror's lock (it may call segments() for device pointers); no other thread may
  /// release the grant meanwhile. Errors: not_allocated when the grant is not held or was
  /// released (work is not called then).
  template <class Work>
  cuda::std::expected<void, Errc> run(const ResourceGrant& g, Work&& work) {
    const auto s = compute_stream(g);
    if (!s) {
      return cuda::std::unexpected(s.error());
    }
    std::forward<Work>(work)(*s);
    return release(g);
  }

  /// Takes back every released grant whose work has run (compute units and memory) and returns
  /// how many. Asks the streams without waiting.
  std::size_t reclaim() {
    const std::lock_guard control(control_);
    return reclaim_locked();
  }

  /// Grants handed out and not yet taken back (released ones still running included).
  std::size_t held_grants() const {
    const std::lock_guard control(control_);
    return dispatcher_.held();
  }

  /// The partitioner behind the grants (SimulatedGreenContexts: where a test queues and completes
  /// the grants' work; it synchronises itself).
  Partitioner& partitioner() noexcept { return dispatcher_.partitioner(); }

  /// Whether grants on `device` are enforced by the hardware (see ComputeGrant::enforced).
  bool compute_enforced(std::uint32_t device) const {
    const std::lock_guard control(control_);
    return dispatcher_.enforced(device);
  }

  /// Withdraws a queued request. Errors: not_allocated when it is not queued.
  cuda::std::expected<void, Errc> cancel(std::uint64_t ticket) {
    const std::lock_guard control(control_);
    auto r = dispatcher_.cancel(ticket);
    if (r) {
      pending_bytes_.erase(ticket);
    }
    return r;
  }

  /// Requests submitted and not yet granted or cancelled.
  std::size_t queued_requests() const {
    const std::lock_guard control(control_);
    return dispatcher_.queued();
  }

  // --- description ---------------------------------------------------------------------------

  /// Bytes per page.
  std::size_t page_size() const noexcept { return page_size_; }
  /// Bytes the mirror holds: every available device's whole pages.
  std::size_t capacity() const noexcept { return bytes_of(host_pages_.size()); }
  /// Bytes in free device pages, all devices together.
  std::size_t free_bytes() const {
    const std::lock_guard control(control_);
    std::uint64_t pages = 0;
    for (const auto& d : device_pages_) {
      pages += d ? d->free_count() : 0;
    }
    return static_cast<std::size_t>(pages) * page_size_;
  }
  /// Devices the backend reported, usable or not.
  std::size_t device_count() const noexcept { return devices_.size(); }
  /// The devices, as the backend described them at construction.
  const std::vector<DeviceInfo>& devices() const noexcept { return devices_; }
  /// Pages on `device`; 0 for an unknown or unavailable one.
  std::uint32_t device_pages(std::uint32_t device) const noexcept {
    return device < device_pages_.size() && device_pages_[device] ? device_pages_[device]->size() : 0;
  }
  /// Free pages on `device`; 0 for an unknown or unavailable one.
  std::uint32_t device_free_pages(std::uint32_t device) const {
    const std::lock_guard control(control_);
    return device < device_pages_.size() && device_pages_[device] ? device_pages_[device]->free_count() : 0;
  }
  /// Live allocations.
  std::size_t allocation_count() const {
    const std::shared_lock lock(allocations_mutex_);
    return allocations_.size();
  }
  /// How dirty pages are found (the mechanism `options.tracking` led to).
  TrackingMechanism tracking_mechanism() const noexcept { return tracker_.mechanism(); }
  /// The reserved host range: every allocation lies inside it.
  const std::byte* host_base() const noexcept { return tracker_.base(); }
  /// The backend.
  Backend& backend() noexcept { return backend_; }
  /// The placement policy (with any state it keeps).
  const Placement& placement() const noexcept { return placement_; }

  /// Why try_allocate(bytes) fails: "cannot allocate 3.0 GiB: the mirror holds 2.0 GiB (1.5 GiB free:
  /// card 0 0.5 GiB, card 1 1.0 GiB)".
  std::string allocation_failure_message(std::size_t bytes) const {
    const std::lock_guard control(control_);
    std::string m = "cannot allocate " + format_bytes(bytes) + ": the mirror holds " + format_bytes(capacity()) + " (";
    std::uint64_t free = 0;
    std::string per_device;
    for (std::uint32_t d = 0; d < devices_.size(); ++d) {
      const std::uint64_t f = device_pages_[d] ? device_pages_[d]->free_count() : 0;
      free += f;
      per_device +=
          (d == 0 ? "" : ", ") + devices_[d].name + " " +
          (device_pages_[d] ? format_bytes(static_cast<std::size_t>(f) * page_size_) : std::string("unavailable"));
    }
    return m + format_bytes(static_cast<std::size_t>(free) * page_size_) + " free: " + per_device + ")";
  }

private:
  struct Run {
    std::uint32_t device;
    SlotRange device_pages;
  };
  struct Allocation {
    SlotRange pages; // host pages
    std::size_t bytes;
    int priority;
    std::vector<Run> runs; // device page runs, in host order
  };

  static std::size_t checked_page_size(std::size_t s) {
    if (s == 0 || (s & (s - 1)) != 0 || s % os_page_size() != 0 || s > max_page_size) {
      throw Exception(Errc::invalid_argument, "carve::PagedMirror: page size " + std::to_string(s) +
                                                  " must be a power of two, a multiple of the system page size (" +
                                                  std::to_string(os_page_size()) + ") and at most 1 GiB");
    }
    return s;
  }
  static std::vector<std::optional<DynamicSlotAllocator<Fit>>> make_device_pages(const std::vector<DeviceInfo>& devices,
                                                                                 std::size_t page_size) {
    if (devices.size() > max_mirror_devices) {
      throw Exception(Errc::invalid_argument,
                      "carve::PagedMirror: more than " + std::to_string(max_mirror_devices) + " devices");
    }
    std::vector<std::optional<DynamicSlotAllocator<Fit>>> out;
    for (const DeviceInfo& d : devices) {
      const std::size_t pages = d.available ? d.capacity / page_size : 0;
      if (pages > max_slots) {
        throw Exception(Errc::invalid_argument,
                        "carve::PagedMirror: " + d.name + " has more than 2^31 pages; use larger pages");
      }
      if (pages == 0) {
        out.emplace_back(std::nullopt);
      } else {
        out.emplace_back(DynamicSlotAllocator<Fit>(static_cast<std::uint32_t>(pages)));
      }
    }
    return out;
  }
  static DynamicSlotAllocator<FirstFit> total_pages(const std::vector<std::optional<DynamicSlotAllocator<Fit>>>& d) {
    std::uint64_t total = 0;
    for (const auto& pages : d) {
      total += pages ? pages->size() : 0;
    }
    if (total == 0) {
      throw Exception(Errc::invalid_argument,
                      "carve::PagedMirror: the backend has no available device with a whole page");
    }
    if (total > max_slots) {
      throw Exception(Errc::invalid_argument, "carve::PagedMirror: more than 2^31 pages in total; use larger pages");
    }
    return DynamicSlotAllocator<FirstFit>(static_cast<std::uint32_t>(total));
  }

  std::size_t bytes_of(std::uint64_t pages) const noexcept { return static_cast<std::size_t>(pages) * page_size_; }
  // Rounded up without forming bytes + page_size - 1, which wraps for sizes near SIZE_MAX.
  std::uint64_t pages_for(std::size_t bytes) const noexcept {
    return std::uint64_t{bytes / page_size_} + (bytes % page_size_ != 0 ? 1 : 0);
  }
  std::byte* host_address(std::uint32_t page) const noexcept { return tracker_.base() + bytes_of(page); }
  std::size_t device_offset(std::uint32_t page) const noexcept { return bytes_of(page); }

  // The host pages of [p, p + n) when they lie inside one allocation (n == 0: p must be inside
  // one, or at its end). Caller holds allocations_mutex_.
  cuda::std::expected<SlotRange, Errc> pages_of(const void* p, std::size_t n) const {
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

  cuda::std::expected<void*, Errc> allocate_locked(std::size_t bytes, int priority, std::optional<std::uint32_t> near) {
    if (bytes > capacity()) {
      return cuda::std::unexpected(Errc::no_space);
    }
    if (near && *near >= devices_.size()) {
      return cuda::std::unexpected(Errc::out_of_range);
    }
    const auto count = static_cast<std::uint32_t>(pages_for(bytes));
    std::vector<DevicePageState> states(devices_.size());
    for (std::size_t d = 0; d < devices_.size(); ++d) {
      states[d] = device_pages_[d] ? DevicePageState{device_pages_[d]->free_count(), device_pages_[d]->size(), true}
                                   : DevicePageState{0, 0, false};
    }
    auto plan = placement_.place(PlacementRequest{count, page_size_, priority, near}, states);
    if (!plan) {
      return cuda::std::unexpected(plan.error());
    }
    if (!valid(*plan, count, states)) {
      return cuda::std::unexpected(Errc::invalid_placement);
    }
    const auto host = host_pages_.allocate(count);
    if (!host) {
      return cuda::std::unexpected(host.error()); // free pages exist, but no contiguous host range
    }
    Allocation a{*host, bytes, priority, {}};
    for (const PlacementChunk& c : *plan) {
      take_device_pages(c.device, c.pages, a.runs);
    }
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
    for (const Run& r : a.runs) {
      for (std::uint32_t i = 0; i < r.device_pages.count; ++i) {
        table_.map(page++, PageLocation{r.device, r.device_pages.first + i});
      }
    }
    for (const Run& r : a.runs) {
      if (!backend_.zero(r.device, device_offset(r.device_pages.first), bytes_of(r.device_pages.count))) {
        wait_all();
        release_host(a);
        give_back(a);
        return cuda::std::unexpected(Errc::device_error);
      }
    }
    void* address = host_address(a.pages.first);
    const std::unique_lock lock(allocations_mutex_);
    allocations_.emplace(a.pages.first, std::move(a));
    return address;
  }

  bool valid(const PlacementPlan& plan, std::uint32_t count, const std::vector<DevicePageState>& states) const {
    std::vector<std::uint64_t> per_device(states.size(), 0);
    std::uint64_t total = 0;
    for (const PlacementChunk& c : plan) {
      if (c.device >= states.size() || !states[c.device].available || c.pages == 0) {
        return false;
      }
      per_device[c.device] += c.pages;
      total += c.pages;
    }
    for (std::size_t d = 0; d < states.size(); ++d) {
      if (per_device[d] > states[d].free_pages) {
        return false;
      }
    }
    return total == count;
  }

  // `pages` pages of a device that has at least that many free: one run when the Fit policy finds
  // one, else the largest runs there are.
  void take_device_pages(std::uint32_t device, std::uint32_t pages, std::vector<Run>& runs) {
    DynamicSlotAllocator<Fit>& d = *device_pages_[device];
    while (pages != 0) {
      auto r = d.allocate(pages);
      if (!r) {
        r = d.allocate(std::min(pages, d.largest_free_run()));
      }
      if (!r) {
        throw Exception(Errc::invalid_placement, "carve::PagedMirror: a device lost free pages it reported");
      }
      if (!runs.empty() && runs.back().device == device && runs.back().device_pages.end() == r->first) {
        runs.back().device_pages.count += r->count; // the policy continued the previous run
      } else {
        runs.push_back({device, *r});
      }
      pages -= r->count;
    }
  }

  void give_back(const Allocation& a) {
    for (const Run& r : a.runs) {
      (void)device_pages_[r.device]->deallocate(r.device_pages);
    }
    (void)host_pages_.deallocate(a.pages);
  }

  void release_host(const Allocation& a) {
    if constexpr (HostMemoryObserver<Backend>) {
      backend_.host_released(host_address(a.pages.first), bytes_of(a.pages.count));
    }
    tracker_.release(a.pages);
    table_.unmap(a.pages);
  }

  // `bytes` nullopt: whatever size the allocation has.
  cuda::std::expected<void, Errc> deallocate_locked(void* p, std::optional<std::size_t> bytes, std::size_t alignment) {
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

  cuda::std::expected<SyncReport, Errc> sync_locked(bool everything) {
    const std::shared_lock lock(allocations_mutex_);
    SyncReport report;
    report.mechanism = tracker_.mechanism();
    report.device_count = static_cast<std::uint32_t>(devices_.size());
    // Higher priority first, so their copies are queued (and land) first on every stream.
    std::vector<const Allocation*> order;
    order.reserve(allocations_.size());
    for (const auto& [first, a] : allocations_) {
      order.push_back(&a);
    }
    std::stable_sort(order.begin(), order.end(),
                     [](const Allocation* x, const Allocation* y) { return x->priority > y->priority; });

    std::vector<std::vector<SlotRange>> queued(devices_.size()); // host pages per device, to redo on failure
    cuda::std::expected<void, Errc> result;
    std::chrono::nanoseconds collect{};
    const auto start = std::chrono::steady_clock::now();
    const auto copy = [&](SlotRange run) {
      for_each_device_segment(table_, run, [&](const DeviceSegment& s) {
        const SlotRange host{s.host_page, s.pages};
        auto r = backend_.copy_to_device(s.device, device_offset(s.device_page), host_address(s.host_page),
                                         bytes_of(s.pages));
        if (!r) {
          tracker_.mark_dirty(host);
          result = r;
          return;
        }
        queued[s.device].push_back(host);
        report.add(s.device, s.pages, bytes_of(s.pages));
      });
    };
    for (const Allocation* a : order) {
      const auto t0 = std::chrono::steady_clock::now();
      if (everything) {
        tracker_.harvest(a->pages, [](SlotRange) {});
        collect += std::chrono::steady_clock::now() - t0;
        copy(a->pages);
      } else {
        std::vector<SlotRange> runs;
        tracker_.harvest(a->pages, [&](SlotRange run) { runs.push_back(run); });
        collect += std::chrono::steady_clock::now() - t0;
        for (const SlotRange run : runs) {
          copy(run);
        }
      }
    }
    // Every device, not only those copied to now: earlier work on a stream (an allocation's
    // zeroing) must be finished too when sync() says the devices hold what the host holds.
    for (std::uint32_t d = 0; d < devices_.size(); ++d) {
      if (!device_pages_[d]) {
        continue;
      }
      if (auto w = backend_.wait(d); !w) {
        for (const SlotRange host : queued[d]) {
          tracker_.mark_dirty(host);
        }
        result = w;
      }
    }
    report.collect_time = collect;
    report.copy_time = std::chrono::steady_clock::now() - start - collect;
    if (!result) {
      return cuda::std::unexpected(result.error());
    }
    return report;
  }

  std::size_t reclaim_locked() {
    const std::vector<ComputeGrant> done = dispatcher_.reclaim();
    for (const ComputeGrant& g : done) {
      const auto it = granted_memory_.find(g.ticket);
      if (it != granted_memory_.end()) {
        (void)deallocate_locked(it->second, std::nullopt, 1);
        granted_memory_.erase(it);
      }
    }
    return done.size();
  }

  void wait_all() noexcept {
    for (std::uint32_t d = 0; d < devices_.size(); ++d) {
      if (device_pages_[d]) {
        (void)backend_.wait(d);
      }
    }
  }

  Backend& backend_;
  MirrorOptions options_;
  Placement placement_;
  std::vector<DeviceInfo> devices_;
  std::size_t page_size_;
  std::vector<std::optional<DynamicSlotAllocator<Fit>>> device_pages_;
  DynamicSlotAllocator<FirstFit> host_pages_;
  WriteTracker tracker_;
  PageTable table_;
  PriorityDispatcher<Partitioner> dispatcher_;
  std::map<std::uint64_t, std::size_t> pending_bytes_; // queued requests' memory
  std::map<std::uint64_t, void*> granted_memory_;      // held grants' memory, by ticket
  std::map<std::uint32_t, Allocation> allocations_;    // by first host page
  mutable std::mutex control_;
  mutable std::shared_mutex allocations_mutex_;
};

static_assert(MemoryResource<PagedMirror<HostMirrorBackend<>>> && OwnsMemory<PagedMirror<HostMirrorBackend<>>> &&
              ChecksDeallocation<PagedMirror<HostMirrorBackend<>>>);

} // namespace carve
