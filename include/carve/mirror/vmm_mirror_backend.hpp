/// @file carve/mirror/vmm_mirror_backend.hpp
/// A MirrorBackend whose devices' memory is physical granules, so that a PagedMirror can give
/// device code one pointer over several devices' memory (MirrorOptions::device_view).
///
/// @code
/// carve::HostMemoryMapper mapper({.granularity = 64 << 10, .device_count = 3,
///                                 .cpu_device = carve::HostMemoryMapper::every_device});
/// carve::VmmMirrorBackend<> devices(mapper);               // peers: carve::AlwaysMapped
/// for (int d = 0; d < 3; ++d) devices.register_device(d, 1 << 20);
/// carve::PagedMirror mirror(devices, {.page_size = 64 << 10, .device_view = true});
/// auto* x = static_cast<float*>(*mirror.try_allocate(3 << 20, 1));   // pages on all three
/// auto* dx = static_cast<float*>(*mirror.device_pointer(x));          // one pointer for device code
/// @endcode
///
/// Each registered device holds its memory as DeviceGranules (carve/vmm/device_granules.hpp): one
/// physical allocation per granule, mapped back to back in the device's local range, where copies
/// go. map_view places an allocation's device runs back to back in a reservation of its own
/// (map_granule_view) and gives read/write access to every device that can reach every owner of
/// those runs; before a device first reaches another's memory the `Peer` policy (the borrowing
/// layer's PeerAccess: AlwaysMapped, SimulatedPeerAccess, CudaPeerAccess) switches the pair on,
/// once per pair. A device that cannot reach an owner simply gets no access to that view; the
/// mirror's device_pointer(p, device) names the pair.
///
/// Copies are memcpy on one HostCopyStream per device, so the memory must be host-addressable:
/// the host twin (HostMemoryMapper, with cpu_device every_device so the copy threads may touch
/// every device's memory). On GPUs the same views come with cudaMemcpyAsync copies:
/// CudaMirrorBackend is that model. Devices are registered before a mirror is built over it. Not
/// copyable; map_view and unmap_view may come from any thread (PeerViews serialises them).
#pragma once

#include <carve/borrow/peer_access.hpp>
#include <carve/core/errc.hpp>
#include <carve/core/error.hpp>
#include <carve/mirror/device_info.hpp>
#include <carve/mirror/host_copy_stream.hpp>
#include <carve/mirror/host_stream_copies.hpp>
#include <carve/mirror/mirror_backend.hpp>
#include <carve/mirror/peer_views.hpp>
#include <carve/vmm/device_granules.hpp>
#include <carve/vmm/host_memory_mapper.hpp>
#include <carve/vmm/physical_memory_mapper.hpp>

#include <cuda/std/expected>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace carve {

/// A MirrorBackend that can also map views (see the file's description).
template <PhysicalMemoryMapper Mapper = HostMemoryMapper, PeerAccess Peer = AlwaysMapped>
class VmmMirrorBackend : public HostStreamCopies<VmmMirrorBackend<Mapper, Peer>> {
  friend HostStreamCopies<VmmMirrorBackend>;

public:
  using mapper_type = Mapper; ///< where the memory comes from

  /// No devices yet; `mapper` (a copy is kept) makes every device's memory, `peer` says which
  /// devices reach which (by the mapper's device ordinals).
  explicit VmmMirrorBackend(Mapper mapper, Peer peer = {}) : mapper_(std::move(mapper)), views_(std::move(peer)) {}
  VmmMirrorBackend(const VmmMirrorBackend&) = delete;
  VmmMirrorBackend& operator=(const VmmMirrorBackend&) = delete;

  /// Adds the mapper's device `mapper_device` with `bytes` (rounded down to whole granules) and
  /// returns its index. Throws carve::Exception as DeviceGranules does (nothing is registered then).
  std::size_t register_device(int mapper_device, std::size_t bytes, std::string name = {},
                              std::uint32_t compute_units = 0) {
    return add(std::make_unique<Device>(mapper_, mapper_device, bytes), std::move(name), compute_units);
  }

  /// Adds memory another process or node exported (handles this process imported, `granule`
  /// bytes each: import_fd, or CudaMemoryMapper::import_fabric across the nodes of an NVLink
  /// domain) as a device the mapper knows as `mapper_device`, taking the handles over. Throws
  /// carve::Exception as DeviceGranules does (the handles are released then).
  std::size_t register_imported_device(int mapper_device, std::vector<typename Mapper::physical_handle> imported,
                                       std::size_t granule, std::string name = {}, std::uint32_t compute_units = 0) {
    return add(std::make_unique<Device>(mapper_, mapper_device, std::move(imported), granule), std::move(name),
               compute_units);
  }

  /// The devices registered so far, by index.
  std::vector<DeviceInfo> devices() const {
    std::vector<DeviceInfo> out;
    for (const auto& d : devices_) {
      out.push_back(d->info);
    }
    return out;
  }
  /// The granularity of device d's memory: a view's runs are whole granules. 0 for an unknown device.
  std::size_t granularity(std::size_t d) const noexcept {
    return d < devices_.size() ? devices_[d]->memory.granularity() : 0;
  }
  /// Device d's local range (where copies go). Throws carve::Exception (out_of_range) for an
  /// unknown device.
  std::byte* local_memory(std::size_t d) const { return known(d).memory.base(); }
  /// The mapper (to ask who owns an address and who may touch it).
  Mapper& mapper() noexcept { return mapper_; }
  /// The peer policy (with any state it keeps).
  const Peer& peer() const noexcept { return views_.peer(); }

  /// Whether device `from` can reach device `to`'s memory (a device always reaches its own).
  bool reaches(std::size_t from, std::size_t to) const { return views_.reaches(memories(), from, to); }

  /// `runs` back to back in a new range, read/write for every device that reaches every run's
  /// owner (PeerViews::map: peer access switched on first, once per pair). Errors (nothing stays
  /// mapped): out_of_range for an unknown device or a run past its memory, invalid_size for runs
  /// that are not whole granules, the mapper's errors.
  [[nodiscard]] Result<PlacedMemory> map_view(std::span<const MirrorViewRun> runs) {
    return views_.map(mapper_, memories(), runs);
  }
  /// Undoes map_view. Errors: the mapper's (not_allocated for a range map_view did not return).
  [[nodiscard]] Result<void> unmap_view(const PlacedMemory& view) { return views_.unmap(mapper_, view); }

private:
  HostStreamTarget stream_target(std::size_t d) noexcept {
    return d < devices_.size()
               ? HostStreamTarget{devices_[d]->memory.base(), devices_[d]->memory.bytes(), &devices_[d]->stream}
               : HostStreamTarget{};
  }
  struct Device {
    template <class... Memory>
    explicit Device(Memory&&... memory_arguments) : memory(std::forward<Memory>(memory_arguments)...) {}
    DeviceGranules<Mapper> memory;
    DeviceInfo info;
    HostCopyStream stream; // declared last: drained and joined before the memory goes
  };

  std::size_t add(std::unique_ptr<Device> device, std::string name, std::uint32_t compute_units) {
    const std::size_t index = devices_.size();
    device->info.name = name.empty() ? "device " + std::to_string(index) : std::move(name);
    device->info.capacity = device->memory.bytes();
    device->info.compute_units = compute_units;
    devices_.push_back(std::move(device));
    return index;
  }
  const Device& known(std::size_t d) const {
    if (d >= devices_.size()) {
      throw Exception(Errc::out_of_range, "carve::VmmMirrorBackend: no device " + std::to_string(d) + " (" +
                                              std::to_string(devices_.size()) + " registered)");
    }
    return *devices_[d];
  }
  std::vector<typename PeerViews<Mapper, Peer>::Memory> memories() const {
    std::vector<typename PeerViews<Mapper, Peer>::Memory> out;
    for (const auto& d : devices_) {
      out.push_back(d->info.available ? &d->memory : nullptr);
    }
    return out;
  }

  Mapper mapper_;
  PeerViews<Mapper, Peer> views_;
  std::vector<std::unique_ptr<Device>> devices_;
};

static_assert(DeviceViewBackend<VmmMirrorBackend<>>);

} // namespace carve
