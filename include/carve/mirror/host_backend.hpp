/// @file carve/mirror/host_backend.hpp
/// Devices played by host memory: PagedMirror without a GPU.
///
/// @code
/// carve::HostMirrorBackend<> devices;
/// devices.register_device(carve::SimulatedCard(256 << 20), {.name = "card 0", .compute_units = 108});
/// devices.register_device(carve::SimulatedCard(256 << 20), {.name = "card 1", .compute_units = 108});
/// carve::PagedMirror mirror(devices);
/// @endcode
///
/// Devices register themselves: each brings a card (any carve::UpstreamResource; SimulatedCard by
/// default) from which the backend takes the device's memory once, and a description. Every device
/// has its own HostCopyStream, so copies to different devices run at the same time, each in order,
/// as on GPUs. device_memory(d) shows what a device holds, which is how tests compare it with the
/// host. Not copyable or movable (the streams' threads refer to it). Registration is not
/// thread-safe; the copy calls are, per the MirrorBackend contract.
#pragma once

#include <carve/core/error.hpp>
#include <carve/mirror/device_info.hpp>
#include <carve/mirror/host_copy_stream.hpp>
#include <carve/mirror/host_stream_copies.hpp>
#include <carve/mirror/mirror_backend.hpp>
#include <carve/mr/memory_resource.hpp>
#include <carve/mr/simulated_card.hpp>

#include <cuda/std/expected>

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace carve {

/// How register_device describes a device.
struct HostDeviceSpec {
  std::string name{};              ///< default: "card <index>"
  std::size_t bytes = 0;           ///< taken from the card; 0 for all of its free memory
  std::uint32_t compute_units = 0; ///< what the dispatcher may hand out
  bool available = true;           ///< false: registered, but the mirror must not use it
};

/// A MirrorBackend whose devices are memory taken from `Card`s, each with a copy thread.
template <UpstreamResource Card = SimulatedCard>
class HostMirrorBackend : public HostStreamCopies<HostMirrorBackend<Card>> {
  friend HostStreamCopies<HostMirrorBackend>;

public:
  /// Device memory is aligned for the largest page size PagedMirror takes.
  static constexpr std::size_t alignment = std::size_t{2} << 20;

  /// No devices yet.
  HostMirrorBackend() = default;
  HostMirrorBackend(const HostMirrorBackend&) = delete;
  HostMirrorBackend& operator=(const HostMirrorBackend&) = delete;

  /// Adds a device and returns its index. Throws carve::Exception (no_space) when the card cannot
  /// give the bytes (nothing is registered then).
  std::size_t register_device(Card card, HostDeviceSpec spec = {}) {
    const std::size_t index = devices_.size();
    const std::size_t bytes = spec.bytes != 0 ? spec.bytes : static_cast<std::size_t>(card.free_bytes());
    const auto got = card.try_allocate(bytes, alignment);
    if (!got) {
      throw Exception(Errc::no_space, "carve::HostMirrorBackend: card " + std::to_string(index) + " cannot give " +
                                          std::to_string(bytes) + " bytes");
    }
    auto* memory = static_cast<std::byte*>(*got);
    auto device = std::make_unique<Device>(std::move(card), memory, bytes);
    device->info.name = spec.name.empty() ? "card " + std::to_string(index) : std::move(spec.name);
    device->info.capacity = bytes;
    device->info.compute_units = spec.compute_units;
    device->info.available = spec.available;
    devices_.push_back(std::move(device));
    return index;
  }

  /// The devices registered so far, by index.
  std::vector<DeviceInfo> devices() const {
    std::vector<DeviceInfo> out;
    for (const auto& d : devices_) {
      out.push_back(d->info);
    }
    return out;
  }

  /// What device d holds (call wait(d) first to see the effect of queued copies). Throws
  /// carve::Exception (out_of_range) for an unknown device.
  std::span<const std::byte> device_memory(std::size_t d) const {
    const Device& device = known(d);
    return {device.memory, device.info.capacity};
  }
  /// Devices registered.
  std::size_t device_count() const noexcept { return devices_.size(); }

private:
  HostStreamTarget stream_target(std::size_t d) noexcept {
    return d < devices_.size() ? HostStreamTarget{devices_[d]->memory, devices_[d]->size, &devices_[d]->stream}
                               : HostStreamTarget{};
  }
  // The card's memory, given back when the device goes.
  struct Arena {
    Arena(Card c, std::byte* m, std::size_t bytes) : card(std::move(c)), memory(m), size(bytes) {}
    ~Arena() { card.deallocate(memory, size, alignment); }
    Arena(const Arena&) = delete;
    Arena& operator=(const Arena&) = delete;
    Card card;
    std::byte* memory;
    std::size_t size;
  };
  struct Device {
    Device(Card c, std::byte* m, std::size_t bytes) : arena(std::move(c), m, bytes), memory(m), size(bytes) {}
    Arena arena;
    std::byte* memory;
    std::size_t size;
    DeviceInfo info;
    HostCopyStream stream; // declared last: drained and joined before the arena goes back
  };

  const Device& known(std::size_t d) const {
    if (d >= devices_.size()) {
      throw Exception(Errc::out_of_range, "carve::HostMirrorBackend: no device " + std::to_string(d) + " (" +
                                              std::to_string(devices_.size()) + " registered)");
    }
    return *devices_[d];
  }

  std::vector<std::unique_ptr<Device>> devices_;
};

static_assert(MirrorBackend<HostMirrorBackend<>>);

} // namespace carve
