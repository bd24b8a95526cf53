/// @file carve/mirror/mirror_pages.hpp
/// Which pages of a PagedMirror are free: its host pages and each device's pages.
///
/// A PagedMirror's memory is counted in pages twice: host pages (one contiguous run per
/// allocation, in the mirror's host reservation) and device pages (runs on the devices a
/// placement chose, found by the Fit policy). MirrorPages holds both books: it is built from the
/// backend's devices, answers what a placement needs to know (DevicePageState per device), checks
/// a placement's plan, and takes and gives back the runs. Host-only; not synchronised (the mirror
/// locks it).
#pragma once

#include <carve/core/errc.hpp>
#include <carve/core/error.hpp>
#include <carve/core/format_bytes.hpp>
#include <carve/core/os_page_size.hpp>
#include <carve/mirror/device_info.hpp>
#include <carve/mirror/placement.hpp>
#include <carve/mirror/sync_report.hpp>
#include <carve/slot/allocator/dynamic_slot_allocator.hpp>
#include <carve/slot/policy/first_fit.hpp>
#include <carve/slot/storage/slot_range.hpp>

#include <cuda/std/expected>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace carve {

/// `s` when it is a page size a mirror takes: a power of two, a multiple of the system page and at
/// most `max`. Throws carve::Exception (invalid_argument) otherwise.
inline std::size_t checked_mirror_page_size(std::size_t s, std::size_t max) {
  if (s == 0 || (s & (s - 1)) != 0 || s % os_page_size() != 0 || s > max) {
    throw Exception(Errc::invalid_argument, "carve::PagedMirror: page size " + std::to_string(s) +
                                                " must be a power of two, a multiple of the system page size (" +
                                                std::to_string(os_page_size()) + ") and at most " +
                                                std::to_string(max));
  }
  return s;
}

/// A run of one device's pages behind consecutive host pages.
struct MirrorRun {
  std::uint32_t device = 0; ///< the device's index in the backend
  SlotRange device_pages{}; ///< its pages on that device
};

/// The free host and device pages of a mirror of pages of `page_size` bytes (see the file's
/// description). Not copyable (the slot allocators are not).
template <class Fit>
requires WordSearchingFitPolicy<Fit>
class MirrorPages {
public:
  /// One book per device (none for an unavailable device or one without a whole page) and a host
  /// book as large as all of them. Throws carve::Exception (invalid_argument): more than
  /// max_mirror_devices devices, more than 2^31 pages on one device or in total, or no device
  /// with a whole page.
  MirrorPages(const std::vector<DeviceInfo>& devices, std::size_t page_size)
      : page_size_(page_size), devices_(make_devices(devices, page_size)), host_(make_host(devices_)) {}

  /// Host pages: the mirror's capacity in pages.
  std::uint32_t host_count() const noexcept { return host_.size(); }
  /// Whether `device` has a book (it is known, available and holds a whole page).
  bool usable(std::uint32_t device) const noexcept { return device < devices_.size() && devices_[device]; }
  /// The devices with a book, in order.
  std::vector<std::uint32_t> usable_devices() const {
    std::vector<std::uint32_t> out;
    for (std::uint32_t d = 0; d < devices_.size(); ++d) {
      if (devices_[d]) {
        out.push_back(d);
      }
    }
    return out;
  }
  /// Pages on `device`; 0 for an unknown or unavailable one.
  std::uint32_t device_count(std::uint32_t device) const noexcept {
    return usable(device) ? devices_[device]->size() : 0;
  }
  /// Free pages on `device`; 0 for an unknown or unavailable one.
  std::uint32_t device_free(std::uint32_t device) const noexcept {
    return usable(device) ? devices_[device]->free_count() : 0;
  }
  /// Free device pages, all devices together.
  std::uint64_t free_total() const noexcept {
    std::uint64_t pages = 0;
    for (const auto& d : devices_) {
      pages += d ? d->free_count() : 0;
    }
    return pages;
  }

  /// What a placement policy is told about each device.
  std::vector<DevicePageState> states() const {
    std::vector<DevicePageState> out(devices_.size());
    for (std::size_t d = 0; d < devices_.size(); ++d) {
      out[d] = devices_[d] ? DevicePageState{devices_[d]->free_count(), devices_[d]->size(), true}
                           : DevicePageState{0, 0, false};
    }
    return out;
  }

  /// Whether `plan` places exactly `count` pages, each chunk on an available device with that
  /// many pages free.
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

  /// `count` contiguous host pages. Errors: no_space.
  [[nodiscard]] cuda::std::expected<SlotRange, Errc> take_host(std::uint32_t count) { return host_.allocate(count); }

  /// `pages` pages of a device that has at least that many free, appended to `runs`: one run when
  /// the Fit policy finds one, else the largest runs there are. Throws carve::Exception
  /// (invalid_placement) when the device has fewer free pages than it reported.
  void take_device(std::uint32_t device, std::uint32_t pages, std::vector<MirrorRun>& runs) {
    if (!usable(device)) {
      throw Exception(Errc::invalid_placement,
                      "carve::MirrorPages: device " + std::to_string(device) + " has no pages");
    }
    DynamicSlotAllocator<Fit>& d = *devices_[device];
    while (pages != 0) {
      runs.reserve(runs.size() + 1); // before the slots are taken: recording them cannot fail
      auto r = d.allocate(pages);
      if (!r) {
        r = d.allocate(std::min(pages, d.largest_free_run()));
      }
      if (!r) {
        throw Exception(Errc::invalid_placement, "carve::MirrorPages: a device lost free pages it reported");
      }
      if (!runs.empty() && runs.back().device == device && runs.back().device_pages.end() == r->first) {
        runs.back().device_pages.count += r->count; // the policy continued the previous run
      } else {
        runs.push_back({device, *r});
      }
      pages -= r->count;
    }
  }

  /// The device pages of every chunk of `plan` (take_device), appended to `runs`, for the host
  /// pages `host`. When it throws (out of host memory, or a device that lost pages), what it took
  /// and `host` are given back.
  void take_plan(const PlacementPlan& plan, SlotRange host, std::vector<MirrorRun>& runs) {
    try {
      for (const PlacementChunk& c : plan) {
        take_device(c.device, c.pages, runs); // each run recorded before the next is taken
      }
    } catch (...) {
      give_back(host, runs);
      throw;
    }
  }

  /// Frees the host pages `host` and the device runs `runs` (taken from this book).
  void give_back(SlotRange host, const std::vector<MirrorRun>& runs) noexcept {
    for (const MirrorRun& r : runs) {
      (void)devices_[r.device]->deallocate(r.device_pages);
    }
    (void)host_.deallocate(host);
  }

  /// "1.5 GiB free: card 0 0.5 GiB, card 1 1.0 GiB", naming each device as `devices` does.
  std::string describe_free(const std::vector<DeviceInfo>& devices) const {
    std::string per_device;
    for (std::uint32_t d = 0; d < devices_.size() && d < devices.size(); ++d) {
      per_device += (d == 0 ? "" : ", ") + devices[d].name + " " +
                    (devices_[d] ? format_bytes(static_cast<std::size_t>(devices_[d]->free_count()) * page_size_)
                                 : std::string("unavailable"));
    }
    return format_bytes(static_cast<std::size_t>(free_total()) * page_size_) + " free: " + per_device;
  }

private:
  using DeviceBook = std::optional<DynamicSlotAllocator<Fit>>;

  static std::vector<DeviceBook> make_devices(const std::vector<DeviceInfo>& devices, std::size_t page_size) {
    if (devices.size() > max_mirror_devices) {
      throw Exception(Errc::invalid_argument,
                      "carve::PagedMirror: more than " + std::to_string(max_mirror_devices) + " devices");
    }
    std::vector<DeviceBook> out;
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
  static DynamicSlotAllocator<FirstFit> make_host(const std::vector<DeviceBook>& devices) {
    std::uint64_t total = 0;
    for (const auto& pages : devices) {
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

  std::size_t page_size_;
  std::vector<DeviceBook> devices_;
  DynamicSlotAllocator<FirstFit> host_;
};

} // namespace carve
