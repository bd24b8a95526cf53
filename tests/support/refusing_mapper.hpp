// A HostMemoryMapper that refuses calls as a device in trouble does: out of memory at its n-th
// create or map, unmaps and access grants refused, a part of an allocation refused.
#pragma once

#include <carve/core/error.hpp>
#include <carve/vmm/host_memory_mapper.hpp>

#include <cstddef>
#include <memory>

namespace carve::test {

// A mapper that refuses its n-th call of one kind, as a device out of memory does.
struct RefusingMapper : HostMemoryMapper {
  using HostMemoryMapper::HostMemoryMapper;
  std::shared_ptr<int> creates_left = std::make_shared<int>(1 << 30);
  std::shared_ptr<int> maps_left = std::make_shared<int>(1 << 30);
  carve::Result<physical_handle> create(int device, std::size_t bytes) {
    if ((*creates_left)-- <= 0) {
      return carve::fail(carve::Errc::no_space, "cuMemCreate: CUDA_ERROR_OUT_OF_MEMORY (simulated)");
    }
    return HostMemoryMapper::create(device, bytes);
  }
  // As a driver that wants offset 0 under a mapper that said it maps parts (its answer wrong).
  std::shared_ptr<bool> refuse_offsets = std::make_shared<bool>(false);
  // Maps from an offset other than 0 that find the device out of memory, before they succeed.
  std::shared_ptr<int> offset_maps_short = std::make_shared<int>(0);
  carve::Result<void> map(void* va, std::size_t bytes, physical_handle h, std::size_t offset = 0) {
    if (offset != 0 && *refuse_offsets) {
      return carve::fail(carve::Errc::invalid_argument,
                         "cuMemMap: CUDA_ERROR_INVALID_VALUE (simulated: offset 0 only)");
    }
    if (offset != 0 && (*offset_maps_short)-- > 0) {
      return carve::fail(carve::Errc::no_space, "cuMemMap: CUDA_ERROR_OUT_OF_MEMORY (simulated)");
    }
    if ((*maps_left)-- <= 0) {
      return carve::fail(carve::Errc::device_error, "cuMemMap: CUDA_ERROR_UNKNOWN (simulated)");
    }
    return HostMemoryMapper::map(va, bytes, h, offset);
  }
  // Unmaps refused before they succeed (a driver in trouble).
  std::shared_ptr<int> unmaps_refused = std::make_shared<int>(0);
  carve::Result<void> unmap(void* va, std::size_t bytes) {
    if ((*unmaps_refused)-- > 0) {
      return carve::fail(carve::Errc::device_error, "cuMemUnmap: CUDA_ERROR_UNKNOWN (simulated)");
    }
    return HostMemoryMapper::unmap(va, bytes);
  }
  // Grants to a device other than 0 (closing one is never refused), and to device 0 refused first.
  std::shared_ptr<int> peer_grants_left = std::make_shared<int>(1 << 30);
  std::shared_ptr<int> own_grants_refused = std::make_shared<int>(0);
  carve::Result<void> set_access(void* va, std::size_t bytes, int device, carve::Access access) {
    if (device != 0 && access != carve::Access::none && (*peer_grants_left)-- <= 0) {
      return carve::fail(carve::Errc::device_error, "cuMemSetAccess: CUDA_ERROR_INVALID_DEVICE (simulated)");
    }
    if (device == 0 && access != carve::Access::none && (*own_grants_refused)-- > 0) {
      return carve::fail(carve::Errc::device_error, "cuMemSetAccess: CUDA_ERROR_UNKNOWN (simulated)");
    }
    return HostMemoryMapper::set_access(va, bytes, device, access);
  }
};
static_assert(carve::PhysicalMemoryMapper<RefusingMapper>);

} // namespace carve::test
