/// @file carve/vmm/device_granules.hpp
/// One device's memory as separate physical granules, and views that map granules of several
/// devices at consecutive addresses: one pointer over several devices' memory.
///
/// @code
/// carve::HostMemoryMapper mapper({.granularity = 64 << 10, .device_count = 2, .cpu_device =
/// carve::HostMemoryMapper::every_device}); carve::DeviceGranules<carve::HostMemoryMapper> d0(mapper, 0, 1 << 20),
/// d1(mapper, 1, 1 << 20); const carve::GranuleRun<carve::HostMemoryMapper> runs[] = {{&d0, 0, 64 << 10}, {&d1, 0, 64
/// << 10}}; const int devices[] = {0, 1}; auto view = carve::map_granule_view(mapper, runs, devices);    // 128 KiB:
/// d0's granule, then d1's
/// ...
/// (void)carve::unplace_physical(mapper, *view);
/// @endcode
///
/// Why granules: CUDA maps a physical allocation only from its start (cuMemMap's offset must be
/// 0), so memory that another range must be able to map piece by piece has to be created piece by
/// piece. DeviceGranules creates a device's memory as one physical allocation per granule, keeps
/// every handle, and maps them back to back in a reservation of its own with the device's
/// read/write right (the device's "local" range, where copies go). map_granule_view reserves a
/// new range and maps the named granules of any devices into it in order, then gives each listed
/// device read/write access to the whole range: the device view of a PagedMirror allocation.
/// Both run on any PhysicalMemoryMapper: the host twin in the tests, CudaMemoryMapper on GPUs.
#pragma once

#include <carve/core/checked_math.hpp>
#include <carve/core/error.hpp>
#include <carve/vmm/physical_memory_mapper.hpp>

#include <cstddef>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace carve {

/// `bytes` of one device's memory made of separate physical granules, mapped back to back at
/// base() with the device's read/write right (see the file's description). Not copyable.
template <PhysicalMemoryMapper Mapper>
class DeviceGranules {
public:
  using handle_type = typename Mapper::physical_handle; ///< one granule's physical allocation

  /// Creates `bytes` (rounded down to whole granules) on `device` through `mapper` (a copy is
  /// kept; a mapper's copies share its tables), one physical allocation per `granule` bytes (0:
  /// the mapper's granularity; else a power-of-two multiple of it, as views are reserved aligned to
  /// it: larger granules, fewer driver calls, and a view maps whole ones). Throws carve::Exception:
  /// invalid_argument when `granule` is not such a multiple or not one granule fits in `bytes`; the
  /// mapper's error when it refuses (nothing is left behind).
  DeviceGranules(Mapper mapper, int device, std::size_t bytes, std::size_t granule = 0)
      : mapper_(std::move(mapper)), device_(device) {
    const auto g = mapper_.granularity(device);
    if (!g) {
      throw Exception(g.error().code, "carve::DeviceGranules: " + g.error().message);
    }
    if (granule % *g != 0 || (granule & (granule - 1)) != 0) {
      throw Exception(Errc::invalid_argument, "carve::DeviceGranules: a granule of " + std::to_string(granule) +
                                                  " bytes is not a power-of-two multiple of the device's " +
                                                  std::to_string(*g));
    }
    granularity_ = granule == 0 ? *g : granule;
    const std::size_t count = bytes / granularity_;
    if (count == 0) {
      throw Exception(Errc::invalid_argument, "carve::DeviceGranules: " + std::to_string(bytes) +
                                                  " bytes hold no granule of " + std::to_string(granularity_));
    }
    bytes_ = count * granularity_;
    handles_.reserve(count);
    try {
      for (std::size_t i = 0; i < count; ++i) {
        const auto h = mapper_.create(device, granularity_);
        if (!h) {
          throw Exception(h.error().code, "carve::DeviceGranules: " + h.error().message);
        }
        handles_.push_back(*h);
      }
      map_all();
    } catch (...) {
      release_handles();
      throw;
    }
  }

  /// Takes over `imported` (physical allocations of `granule` bytes each, a multiple of the
  /// mapper's granularity, that another process or node exported and this one imported:
  /// import_fd, or CudaMemoryMapper::import_fabric across nodes) as `device`'s memory, in that
  /// order. Throws carve::Exception: invalid_argument for no handles or a bad granule; the
  /// mapper's error (the handles are released either way).
  DeviceGranules(Mapper mapper, int device, std::vector<handle_type> imported, std::size_t granule)
      : mapper_(std::move(mapper)), device_(device), granularity_(granule), handles_(std::move(imported)) {
    try {
      const auto g = mapper_.granularity(device);
      if (!g) {
        throw Exception(g.error().code, "carve::DeviceGranules: " + g.error().message);
      }
      if (handles_.empty() || granule == 0 || granule % *g != 0) {
        throw Exception(Errc::invalid_argument, "carve::DeviceGranules: imported memory needs handles of whole "
                                                "granules of the device's " +
                                                    std::to_string(*g) + " bytes");
      }
      bytes_ = handles_.size() * granularity_;
      map_all();
    } catch (...) {
      release_handles();
      throw;
    }
  }
  /// Unmaps the local range and releases every granule (views still mapping one keep its memory).
  ~DeviceGranules() {
    unmap_first(handles_.size());
    release_handles();
  }
  DeviceGranules(const DeviceGranules&) = delete;
  DeviceGranules& operator=(const DeviceGranules&) = delete;

  /// The local range: every granule, in order, read/write for device().
  std::byte* base() const noexcept { return base_; }
  /// Bytes held (whole granules).
  std::size_t bytes() const noexcept { return bytes_; }
  /// Bytes per physical allocation: a view maps whole ones.
  std::size_t granularity() const noexcept { return granularity_; }
  /// The mapper's device ordinal.
  int device() const noexcept { return device_; }
  /// The granule holding local offset `offset`. Errors: out_of_range past bytes().
  [[nodiscard]] Result<handle_type> handle(std::size_t offset) const {
    if (offset >= bytes_) {
      return fail(Errc::out_of_range, "carve::DeviceGranules: offset " + std::to_string(offset) + " is past " +
                                          std::to_string(bytes_) + " bytes of device " + std::to_string(device_));
    }
    return handles_[offset / granularity_];
  }

private:
  // Reserves bytes_ and maps every handle there in order, read/write for device_.
  void map_all() {
    const auto va = mapper_.reserve(bytes_, granularity_);
    if (!va) {
      throw Exception(va.error().code, "carve::DeviceGranules: " + va.error().message);
    }
    base_ = static_cast<std::byte*>(*va);
    for (std::size_t i = 0; i < handles_.size(); ++i) {
      if (const auto m = mapper_.map(base_ + i * granularity_, granularity_, handles_[i]); !m) {
        unmap_first(i);
        throw Exception(m.error().code, "carve::DeviceGranules: " + m.error().message);
      }
    }
    if (const auto a = mapper_.set_access(base_, bytes_, device_, Access::read_write); !a) {
      unmap_first(handles_.size());
      throw Exception(a.error().code, "carve::DeviceGranules: " + a.error().message);
    }
  }
  void unmap_first(std::size_t count) noexcept {
    if (base_ == nullptr) {
      return;
    }
    for (std::size_t i = 0; i < count; ++i) {
      (void)mapper_.unmap(base_ + i * granularity_, granularity_);
    }
    (void)mapper_.free_reservation(base_, bytes_);
    base_ = nullptr;
  }
  void release_handles() noexcept {
    for (const handle_type& h : handles_) {
      (void)mapper_.release(h);
    }
    handles_.clear();
  }

  Mapper mapper_;
  int device_;
  std::size_t granularity_ = 0;
  std::size_t bytes_ = 0;
  std::byte* base_ = nullptr;
  std::vector<handle_type> handles_;
};

/// Bytes [offset, offset + bytes) of one DeviceGranules, both whole granules.
template <PhysicalMemoryMapper Mapper>
struct GranuleRun {
  const DeviceGranules<Mapper>* owner = nullptr; ///< whose memory
  std::size_t offset = 0;                        ///< into owner's local range
  std::size_t bytes = 0;                         ///< how much
};

/// A new range holding `runs` back to back, read/write for every device of `devices` (see the
/// file's description); undone with unplace_physical. Errors (nothing stays reserved or mapped):
/// invalid_size for no runs, a run that is not whole granules of its owner, owners of different
/// granularities, or sizes whose sum overflows; the mapper's errors.
template <PhysicalMemoryMapper Mapper>
[[nodiscard]] Result<PlacedMemory> map_granule_view(Mapper& mapper, std::span<const GranuleRun<Mapper>> runs,
                                                    std::span<const int> devices) {
  std::size_t total = 0;
  const std::size_t g = !runs.empty() && runs.front().owner != nullptr ? runs.front().owner->granularity() : 0;
  for (const GranuleRun<Mapper>& r : runs) {
    const auto sum = checked_add(total, r.bytes);
    if (g == 0 || r.owner == nullptr || r.owner->granularity() != g || r.bytes == 0 || r.bytes % g != 0 ||
        r.offset % g != 0 || r.offset > r.owner->bytes() || r.bytes > r.owner->bytes() - r.offset || !sum) {
      return fail(Errc::invalid_size, "carve::map_granule_view: a run that is not whole granules of its device");
    }
    total = *sum;
  }
  if (total == 0) {
    return fail(Errc::invalid_size, "carve::map_granule_view: no memory to map");
  }
  const auto va = mapper.reserve(total, g);
  if (!va) {
    return cuda::std::unexpected(va.error());
  }
  auto* base = static_cast<std::byte*>(*va);
  std::size_t mapped = 0;
  const auto undo = [&] {
    for (std::size_t at = 0; at < mapped; at += g) {
      (void)mapper.unmap(base + at, g);
    }
    (void)mapper.free_reservation(base, total);
  };
  for (const GranuleRun<Mapper>& r : runs) {
    for (std::size_t at = 0; at < r.bytes; at += g) {
      const auto h = r.owner->handle(r.offset + at);
      const auto m = h ? mapper.map(base + mapped, g, *h) : Result<void>(cuda::std::unexpected(h.error()));
      if (!m) {
        undo();
        return cuda::std::unexpected(m.error());
      }
      mapped += g;
    }
  }
  for (const int device : devices) {
    if (const auto a = mapper.set_access(base, total, device, Access::read_write); !a) {
      undo();
      return cuda::std::unexpected(a.error());
    }
  }
  return PlacedMemory{base, total};
}

} // namespace carve
