/// @file carve/mirror/device_view.hpp
/// The device view of a PagedMirror allocation: one device pointer over every page, wherever
/// placement put it (MirrorOptions::device_view).
///
/// @code
/// auto* x = static_cast<float*>(*mirror.try_allocate_placed(n * sizeof(float), 1, {.near = 0}));
/// auto* dx = static_cast<float*>(*mirror.device_pointer(x));   // the same memory, for device code
/// kernel<<<grid, block>>>(dx, n);                               // unchanged: one pointer, one launch
/// @endcode
///
/// With the view on, each allocation gets, beside its host range, a device range of its own of
/// the same size: the backend maps each page's memory there from the device that owns it, at the
/// page's offset in the allocation, and gives read/write access to every device that can reach
/// every owner (DeviceViewBackend::map_view; peer access switched on once per pair). One
/// reservation per allocation rather than one per mirror: a view is mapped and unmapped whole with
/// its allocation, and which devices may use it depends on that allocation's owners alone, so one
/// allocation spread onto an unreachable device does not take the view away from the others. What
/// it costs, measured on the host twin (this 2-core machine, 64 KiB granules, three devices): a
/// reservation and its release about 8 us per allocation, mapping 6 to 10 us per granule; one
/// reservation per mirror would save the former only, about one granule's mapping.
///
/// Writes from both sides: host stores reach device memory at sync() (dirty pages only), device
/// stores through the view reach the host copy at fetch(). The unit is the page and the last
/// transfer wins: when host and device code both wrote one page between two transfers, sync()
/// replaces the device's bytes with the host's whole page, and fetch() replaces the host's with the
/// device's (FetchReport::discarded_dirty_pages counts the host pages so lost). Nothing merges
/// bytes; code that writes one page from both sides syncs or fetches in between.
#pragma once

#include <carve/core/errc.hpp>
#include <carve/core/error.hpp>
#include <carve/mirror/device_info.hpp>
#include <carve/mirror/mirror_backend.hpp>
#include <carve/mirror/mirror_pages.hpp>

#include <cuda/std/expected>

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <mutex>
#include <new>
#include <optional>
#include <shared_mutex>
#include <string>
#include <vector>

namespace carve {

/// Throws carve::Exception unless `backend` can map device views (unsupported) and `page_size`
/// is a multiple of the granularity of every available device (invalid_argument): a view maps
/// whole pages.
template <MirrorBackend Backend>
void check_view_page_size(const Backend& backend, const std::vector<DeviceInfo>& devices, std::size_t page_size) {
  if constexpr (!DeviceViewBackend<Backend>) {
    throw Exception(Errc::unsupported, "carve::PagedMirror: the backend cannot map device views");
  } else {
    for (std::size_t d = 0; d < devices.size(); ++d) {
      const std::size_t g = backend.granularity(d);
      if (devices[d].available && (g == 0 || page_size % g != 0)) {
        throw Exception(Errc::invalid_argument, "carve::PagedMirror: page size " + std::to_string(page_size) +
                                                    " is not a multiple of " + devices[d].name + "'s granularity " +
                                                    std::to_string(g) + " (a device view maps whole granules)");
      }
    }
  }
}

/// The view of an allocation whose device pages are `runs` (pages of `page_size` bytes). Errors:
/// unsupported for a backend without views; the backend's.
template <MirrorBackend Backend>
[[nodiscard]] Result<PlacedMemory> map_allocation_view(Backend& backend, const std::vector<MirrorRun>& runs,
                                                       std::size_t page_size) {
  if constexpr (DeviceViewBackend<Backend>) {
    std::vector<MirrorViewRun> view;
    view.reserve(runs.size());
    for (const MirrorRun& r : runs) {
      view.push_back(
          {r.device, std::size_t{r.device_pages.first} * page_size, std::size_t{r.device_pages.count} * page_size});
    }
    return backend.map_view(view);
  } else {
    return fail(Errc::unsupported, "carve::PagedMirror: the backend cannot map device views");
  }
}

/// Undoes map_allocation_view (a view it did not map is left alone).
template <MirrorBackend Backend>
void unmap_allocation_view(Backend& backend, const PlacedMemory& view) noexcept {
  if constexpr (DeviceViewBackend<Backend>) {
    try {
      (void)backend.unmap_view(view);
    } catch (const std::bad_alloc&) {
      // only the error's message could not be built
    }
  }
}

/// The device_pointer calls of PagedMirror `Mirror` (its CRTP base). `Mirror` gives it, as a
/// friend: options_, allocations_mutex_, allocations_ (whose values have `pages`, `runs` and
/// `view`), pages_of, host_address, backend_ and devices_.
template <class Mirror>
class MirrorDeviceViews {
public:
  /// The device address of host address `p` in its allocation's device view: valid on every
  /// device that can reach every page's owner. Errors: unsupported when the mirror has no device
  /// views (MirrorOptions::device_view), out_of_range when `p` is not inside an allocation.
  [[nodiscard]] cuda::std::expected<void*, Errc> device_pointer(const void* p) const {
    auto r = device_pointer(p, std::nullopt);
    return r ? cuda::std::expected<void*, Errc>(*r) : cuda::std::unexpected(r.error().code);
  }

  /// device_pointer(p), checked for `device` when one is named: also out_of_range for a device the
  /// mirror does not have or cannot use, unsupported (the message names the pair) when `device`
  /// cannot reach the owner of one of the allocation's pages.
  [[nodiscard]] Result<void*> device_pointer(const void* p, std::optional<std::uint32_t> device) const {
    const Mirror& m = static_cast<const Mirror&>(*this);
    if (!m.options_.device_view) {
      return fail(Errc::unsupported, "carve::PagedMirror: device views are off (MirrorOptions::device_view)");
    }
    const std::shared_lock lock(m.allocations_mutex_);
    const auto pages = m.pages_of(p, 1);
    if (!pages) {
      return fail(pages.error(), "carve::PagedMirror: the address is not inside an allocation");
    }
    const auto& a = std::prev(m.allocations_.upper_bound(pages->first))->second;
    if (device) {
      const std::vector<DeviceInfo>& devices = m.devices_;
      if (*device >= devices.size() || !devices[*device].available) {
        return fail(Errc::out_of_range, "carve::PagedMirror: no usable device " + std::to_string(*device));
      }
      if constexpr (DeviceViewBackend<typename Mirror::backend_type>) {
        for (const MirrorRun& r : a.runs) {
          if (!m.backend_.reaches(*device, r.device)) {
            return fail(Errc::unsupported, "carve::PagedMirror: " + devices[*device].name + " cannot reach " +
                                               devices[r.device].name + ", which holds pages of this allocation");
          }
        }
      }
    }
    return static_cast<std::byte*>(a.view.base) + (static_cast<const std::byte*>(p) - m.host_address(a.pages.first));
  }

protected:
  MirrorDeviceViews() = default;
  ~MirrorDeviceViews() = default;
  /// Stateless: copied with nothing in it (the mirror itself is not copyable).
  MirrorDeviceViews(const MirrorDeviceViews&) = default;
  /// Stateless: assigned with nothing in it.
  MirrorDeviceViews& operator=(const MirrorDeviceViews&) = default;
};

} // namespace carve
