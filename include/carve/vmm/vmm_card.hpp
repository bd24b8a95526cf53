/// @file carve/vmm/vmm_card.hpp
/// A card whose every allocation is a VMM physical allocation of its own, mapped here and
/// exportable to other processes as a file descriptor.
///
/// @code
/// carve::VmmCard<carve::CudaMemoryMapper> gpu3(carve::CudaMemoryMapper{}, 3, 8ull << 30);  // 8 GiB of GPU 3
/// carve::VmmCard<carve::HostMemoryMapper> twin(carve::HostMemoryMapper{}, 0, 64 << 20);   // the host twin
/// void* p = *twin.try_allocate(1 << 20, 256);
/// auto e = twin.export_segment(p, 1 << 20);   // kind host_vmm, e->fd: pass it with SCM_RIGHTS
/// @endcode
///
/// Each try_allocate runs the mapper's protocol: create a physical allocation of the request rounded
/// up to the device's granularity, reserve addresses for it, map it, and give the card's device
/// read/write access (place_physical). deallocate undoes it in reverse. Capacity is counted in
/// rounded bytes, which is what the device gives. export_segment exports the allocation as a
/// descriptor once and lends it (the card keeps it open until the segment is freed or
/// release_descriptor hands it over), so the allocation server (carve/service/) sends it with
/// SCM_RIGHTS and the client maps it with map_segment, which runs the same protocol on its side.
///
/// Why one physical allocation per allocation: an export then reaches exactly the memory the
/// server lends, never a neighbour's (as with SharedMemoryCard); small requests belong in a pool in
/// the client. `release_while_mapped` is true: the VMM keeps memory alive while any process maps
/// it, unlike legacy CUDA IPC, so the server may free a segment a client still maps.
///
/// Over CudaMemoryMapper it is the device memory of the allocation service and the replacement for
/// CudaDeviceResource's cudaMalloc + CUDA IPC, which stays for memory that came from cudaMalloc.
/// Over HostMemoryMapper it runs the same code on the host. Copies are handles to the same card and
/// compare equal; thread-safe.
#pragma once

#include <carve/core/error.hpp>
#include <carve/mr/byte_budget.hpp>
#include <carve/mr/cuda_mr.hpp>
#include <carve/mr/detail/segment_descriptors.hpp>
#include <carve/mr/device_uuid.hpp>
#include <carve/mr/memory_resource.hpp>
#include <carve/mr/segment_export.hpp>
#include <carve/vmm/physical_memory_mapper.hpp>

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace carve {

/// A card of `capacity_bytes` on one device of `Mapper`, each allocation a physical allocation of
/// its own: an ExportableResource that owns its memory and hands descriptors over.
template <PhysicalMemoryMapper Mapper>
class VmmCard : public CcclSpellings<VmmCard<Mapper>> {
public:
  static constexpr ExportKind export_kind = Mapper::export_kind; ///< cuda_vmm or host_vmm
  static constexpr bool release_while_mapped = true;             ///< a mapping keeps its memory

  /// A new, empty card on `device`; copies share it. Throws carve::Exception when the mapper has no
  /// such device (its error's code) or the capacity is below one granule (invalid_argument).
  VmmCard(Mapper mapper, int device, std::size_t capacity_bytes)
      : budget_(capacity_bytes), state_(std::make_shared<State>(std::move(mapper), device)) {
    const auto g = state_->mapper.granularity(device);
    if (!g) {
      throw Exception(g.error().code, "carve::VmmCard: " + g.error().message);
    }
    if (capacity_bytes < *g) {
      throw Exception(Errc::invalid_argument, "carve::VmmCard: a capacity of " + std::to_string(capacity_bytes) +
                                                  " bytes is below the granularity " + std::to_string(*g));
    }
    state_->granularity = *g;
  }

  /// Errors: invalid_size (0 bytes, an alignment that is not a power of two); no_space for an
  /// alignment above the granularity, a full card, or when the mapper refuses (last_failure() says
  /// why).
  [[nodiscard]] cuda::std::expected<void*, Errc> try_allocate(std::size_t bytes, std::size_t alignment) noexcept {
    if (const auto ok = check_request(bytes, alignment); !ok) {
      return cuda::std::unexpected(ok.error());
    }
    const auto rounded = round_up_to_granularity(bytes, state_->granularity);
    if (alignment > state_->granularity || !rounded || !budget_.take(*rounded)) {
      return cuda::std::unexpected(Errc::no_space);
    }
    try {
      const std::lock_guard lock(state_->mutex);
      auto h = state_->mapper.create(state_->device, *rounded);
      if (!h) {
        state_->last_failure = std::move(h.error().message);
      } else if (auto placed = place_physical(state_->mapper, *h, *rounded, state_->device, Access::read_write);
                 !placed) {
        state_->last_failure = std::move(placed.error().message);
        (void)state_->mapper.release(*h);
      } else {
        try {
          state_->segments.emplace(reinterpret_cast<std::uintptr_t>(placed->base), Segment{*h, *placed, -1});
        } catch (const std::bad_alloc&) { // not recorded: not kept
          (void)unplace_physical(state_->mapper, *placed);
          (void)state_->mapper.release(*h);
          throw;
        }
        return placed->base;
      }
    } catch (const std::bad_alloc&) {
      // the mapper's or the table's memory: the request fails as a full card would
    }
    budget_.give_back(*rounded);
    return cuda::std::unexpected(Errc::no_space);
  }

  /// Frees what try_allocate gave: unmaps it here, releases the physical allocation and closes a
  /// descriptor still held (other processes' mappings keep their memory). An unknown pointer is
  /// ignored.
  void deallocate(void* p, std::size_t, std::size_t) noexcept {
    const std::lock_guard lock(state_->mutex);
    const auto it = state_->segments.find(reinterpret_cast<std::uintptr_t>(p));
    if (it == state_->segments.end()) {
      return;
    }
    const Segment s = it->second;
    state_->segments.erase(it);
    try {
      (void)unplace_physical(state_->mapper, s.placed);
      (void)state_->mapper.release(s.handle);
    } catch (const std::bad_alloc&) {
      // only an error message could not be built; the calls themselves were made
    }
    if (s.fd >= 0) {
      ::close(s.fd);
    }
    budget_.give_back(s.placed.bytes);
  }

  /// The live allocation at `base` exported as a descriptor (made at the first export, lent: open
  /// until the allocation is freed or its descriptor is taken over); nullopt for an unknown
  /// allocation, `bytes` larger than its rounded size, or when the mapper refuses.
  std::optional<SegmentExport> export_segment(void* base, std::size_t bytes) const {
    const std::lock_guard lock(state_->mutex);
    const auto it = state_->segments.find(reinterpret_cast<std::uintptr_t>(base));
    if (it == state_->segments.end() || bytes == 0 || bytes > it->second.placed.bytes) {
      return std::nullopt;
    }
    if (it->second.fd < 0) {
      auto fd = state_->mapper.export_fd(it->second.handle);
      if (!fd) {
        state_->last_failure = std::move(fd.error().message);
        return std::nullopt;
      }
      it->second.fd = *fd;
    }
    return SegmentExport{.kind = export_kind, .size = bytes, .fd = it->second.fd, .device = state_->device};
  }

  /// Hands the segment's exported descriptor over to the caller, who closes it; nullopt for an
  /// unknown segment or one with no descriptor held.
  std::optional<int> release_descriptor(void* base) noexcept {
    const std::lock_guard lock(state_->mutex);
    return detail::release_segment_descriptor(state_->segments, base);
  }

  /// Whether `p` lies in a live allocation of this card.
  bool owns(const void* p) const noexcept {
    const std::lock_guard lock(state_->mutex);
    return detail::segment_holds(state_->segments, p, [](const Segment& s) { return s.placed.bytes; });
  }

  /// The device the card's memory is on.
  int device() const noexcept { return state_->device; }
  /// That device's UUID, where the mapper knows one (CudaMemoryMapper; the host twin does not).
  [[nodiscard]] Result<DeviceUuid> device_uuid() const requires requires(const Mapper& m) { m.device_uuid(0); }
  { return state_->mapper.device_uuid(state_->device); }
  /// The device's granularity: every allocation is rounded up to it.
  std::size_t granularity() const noexcept { return state_->granularity; }
  /// Why the mapper last refused (empty when it never did).
  std::string last_failure() const {
    const std::lock_guard lock(state_->mutex);
    return state_->last_failure;
  }
  /// The live allocations as this process maps them (base, rounded bytes), by address: to look at
  /// what another process wrote into memory this card lent it.
  std::vector<std::pair<void*, std::size_t>> allocations() const {
    const std::lock_guard lock(state_->mutex);
    std::vector<std::pair<void*, std::size_t>> out;
    for (const auto& [base, s] : state_->segments) {
      out.emplace_back(s.placed.base, s.placed.bytes);
    }
    return out;
  }
  /// The mapper (a copy: mappers are handles or stateless).
  Mapper mapper() const { return state_->mapper; }

  /// The card's size.
  std::size_t capacity() const noexcept { return budget_.capacity(); }
  /// Bytes allocated now, rounded to the granularity.
  std::size_t used_bytes() const noexcept { return budget_.used_bytes(); }
  /// Bytes left.
  std::size_t free_bytes() const noexcept { return budget_.free_bytes(); }
  /// Live allocations.
  std::size_t allocation_count() const noexcept { return budget_.allocation_count(); }

  /// Equal when both are handles to the same card.
  friend bool operator==(const VmmCard& a, const VmmCard& b) noexcept { return a.budget_ == b.budget_; }

private:
  struct Segment {
    typename Mapper::physical_handle handle;
    PlacedMemory placed;
    int fd = -1; // exported, until handed over
  };
  struct State {
    State(Mapper m, int d) : mapper(std::move(m)), device(d) {}
    State(const State&) = delete;
    State& operator=(const State&) = delete;
    ~State() {
      for (auto& [base, s] : segments) { // a card dropped with live allocations gives them back
        (void)unplace_physical(mapper, s.placed);
        (void)mapper.release(s.handle);
        if (s.fd >= 0) {
          ::close(s.fd);
        }
      }
    }
    Mapper mapper;
    int device;
    std::size_t granularity = 0;
    mutable std::mutex mutex;
    std::map<std::uintptr_t, Segment> segments; // by base address
    std::string last_failure;
  };

  ByteBudget budget_;
  std::shared_ptr<State> state_;
};

} // namespace carve
