/// @file carve/vmm/host_memory_mapper.hpp
/// The VMM protocol run for real on the host: the twin of CudaMemoryMapper.
///
/// @code
/// carve::HostMemoryMapper mapper({.granularity = 64 << 10, .device_count = 2, .cpu_device = 0});
/// auto h = *mapper.create(0, 128 << 10);
/// void* va = *mapper.reserve(128 << 10, 64 << 10);
/// mapper.map(va, 128 << 10, h);                                   // PROT_NONE: nobody may touch it
/// mapper.set_access(va, 128 << 10, 0, carve::Access::read_write);  // device 0 is this CPU: mprotect
/// mapper.set_access(va, 128 << 10, 1, carve::Access::read);        // device 1: a recorded right
/// @endcode
///
/// Each step is the host's counterpart of the driver call, so the protocol (and every error rule
/// of carve/vmm/physical_memory_mapper.hpp) is exercised by real memory on machines without a GPU:
/// - a physical allocation is a memfd of the rounded size (sealed against growing and shrinking,
///   so a process it was passed to cannot truncate it under the others);
/// - export is a duplicate of the memfd; import duplicates the received descriptor (the caller
///   closes its own, as with cuMemImportFromShareableHandle);
/// - a reservation is an anonymous PROT_NONE mapping (MAP_NORESERVE), aligned by trimming;
/// - map is mmap(MAP_FIXED | MAP_SHARED) of the memfd into the reservation, still PROT_NONE; unmap
///   puts the anonymous PROT_NONE pages back, so the reservation stays whole;
/// - the CPU plays one device (`cpu_device`): that device's right is applied with mprotect, the
///   other devices' rights are recorded (access() reports them). With `cpu_device` every_device the
///   CPU gets the widest right any device holds: the stance of a process that runs every
///   simulated device's work on the CPU, as a client of a host_vmm server does. play_device
///   changes the device later (a forked child that runs one device's work); owner(va) says whose
///   physical memory a mapping holds, so one reservation may hold several devices' memory.
/// - release closes the memfd; a mapping keeps its pages, as a CUDA mapping keeps released memory.
///   An allocation not yet released holds its descriptor: an OnDemandReservation keeps each
///   chunk's handle while it is mapped (to map it again elsewhere), so one descriptor per chunk.
///
/// With HostMapperOptions::address_only the same rules are kept in the tables alone: no memfd, no
/// mmap, no mprotect (every address faults), for replays that time the allocator above it.
///
/// Copies are handles to the same mapper (its tables are shared); thread-safe. The destructor of
/// the last copy unmaps every reservation it still holds and closes every descriptor. Linux only
/// (memfd_create).
#pragma once

#include <carve/core/error.hpp>
#include <carve/core/os_page_size.hpp>
#include <carve/mr/segment_export.hpp>
#include <carve/vmm/host_mapper_tables.hpp>
#include <carve/vmm/physical_memory_mapper.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace carve {

/// The host twin of the VMM protocol (see the file's description): a PhysicalMemoryMapper.
class HostMemoryMapper {
public:
  /// An allocation's id in this mapper: never 0, never reused.
  using physical_handle = std::uint64_t;
  /// Segments of a VmmCard over this mapper leave the process as host_vmm.
  static constexpr ExportKind export_kind = ExportKind::host_vmm;
  /// `cpu_device` value: the CPU gets the widest right any device holds.
  static constexpr int every_device = -1;

  /// A mapper with nothing allocated. Throws carve::Exception (invalid_argument) for a granularity
  /// that is not a power of two at least the OS page (a device's is: reservations align to it), a
  /// device_count below 1, or a cpu_device that is neither a device nor every_device.
  explicit HostMemoryMapper(HostMapperOptions options = {}) : state_(std::make_shared<State>(options)) {
    state_->cpu_device = options.cpu_device;
    const std::size_t g = options.granularity;
    if (g < os_page_size() || (g & (g - 1)) != 0) {
      throw Exception(Errc::invalid_argument, "carve::HostMemoryMapper: granularity " + std::to_string(g) +
                                                  " is not a power of two at least the " +
                                                  std::to_string(os_page_size()) + "-byte page");
    }
    if (options.device_count < 1 || options.cpu_device < every_device || options.cpu_device >= options.device_count) {
      throw Exception(Errc::invalid_argument, "carve::HostMemoryMapper: cpu_device " +
                                                  std::to_string(options.cpu_device) + " of " +
                                                  std::to_string(options.device_count) + " devices");
    }
  }

  /// The granularity (the same for every device). Errors: out_of_range for an unknown device.
  [[nodiscard]] Result<std::size_t> granularity(int device) const {
    if (auto ok = check_device(device); !ok) {
      return cuda::std::unexpected(ok.error());
    }
    return state_->options.granularity;
  }

  /// HostMapperOptions::maps_partial_allocations (TellsPartialMaps). Errors: out_of_range.
  [[nodiscard]] Result<bool> maps_partial_allocations(int device) const {
    if (auto ok = check_device(device); !ok) {
      return cuda::std::unexpected(ok.error());
    }
    return state_->options.maps_partial_allocations;
  }

  /// A memfd of `bytes` (a multiple of the granularity) on `device`. Errors: out_of_range,
  /// invalid_size, no_space when the system refuses (the message says which call and why).
  [[nodiscard]] Result<physical_handle> create(int device, std::size_t bytes) {
    if (auto ok = check_device(device); !ok) {
      return cuda::std::unexpected(ok.error());
    }
    if (auto ok = check_size("create", bytes); !ok) {
      return cuda::std::unexpected(ok.error());
    }
    if (state_->options.address_only) {
      return adopt(-1, bytes, device);
    }
    const int fd = ::memfd_create("carve-vmm", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
      return system_failure("memfd_create");
    }
    if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0 ||
        ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
      const int e = errno;
      ::close(fd);
      errno = e;
      return system_failure("ftruncate/F_ADD_SEALS");
    }
    return adopt(fd, bytes, device);
  }

  /// A new descriptor of the allocation (close-on-exec), owned by the caller. Errors:
  /// not_allocated for an unknown handle; no_space when the system refuses the duplicate.
  [[nodiscard]] Result<int> export_fd(physical_handle h) {
    const std::lock_guard lock(state_->mutex);
    const auto it = state_->physical.find(h);
    if (it == state_->physical.end()) {
      return fail(Errc::not_allocated, "export_fd: no physical allocation " + std::to_string(h));
    }
    if (it->second.fd < 0) {
      return fail(Errc::unsupported, "export_fd: an address-only mapper has no memory to share");
    }
    const int fd = ::fcntl(it->second.fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) {
      return system_failure("fcntl(F_DUPFD_CLOEXEC)");
    }
    return fd;
  }

  /// The allocation behind a descriptor another process exported; `fd` stays the caller's.
  /// Errors: invalid_argument for a descriptor that is not a file of whole pages; no_space when the
  /// system refuses the duplicate.
  [[nodiscard]] Result<physical_handle> import_fd(int fd) {
    if (state_->options.address_only) {
      return fail(Errc::unsupported, "import_fd: an address-only mapper has no memory to share");
    }
    struct stat st {};
    if (fd < 0 || ::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0 ||
        static_cast<std::size_t>(st.st_size) % os_page_size() != 0) {
      return fail(Errc::invalid_argument,
                  "import_fd: descriptor " + std::to_string(fd) + " is not an exported physical allocation");
    }
    const int own = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (own < 0) {
      return system_failure("fcntl(F_DUPFD_CLOEXEC)");
    }
    return adopt(own, static_cast<std::size_t>(st.st_size), -1);
  }

  /// Forgets the handle and closes its memfd; mappings of it keep their pages. Errors:
  /// not_allocated for an unknown handle.
  [[nodiscard]] Result<void> release(physical_handle h) {
    const std::lock_guard lock(state_->mutex);
    const auto it = state_->physical.find(h);
    if (it == state_->physical.end()) {
      return fail(Errc::not_allocated, "release: no physical allocation " + std::to_string(h));
    }
    if (it->second.fd >= 0) {
      ::close(it->second.fd);
    }
    state_->physical.erase(it);
    return {};
  }

  /// `bytes` of addresses (a multiple of the granularity), aligned to `alignment` (0: the
  /// granularity; else a power of two), with nothing behind them. Errors: invalid_size,
  /// invalid_argument for an alignment that is not a power of two, no_space when the system has
  /// no such range.
  [[nodiscard]] Result<void*> reserve(std::size_t bytes, std::size_t alignment) {
    if (auto ok = check_size("reserve", bytes); !ok) {
      return cuda::std::unexpected(ok.error());
    }
    if (alignment == 0) {
      alignment = state_->options.granularity;
    }
    if ((alignment & (alignment - 1)) != 0) {
      return fail(Errc::invalid_argument, "reserve: alignment " + std::to_string(alignment) + " is not a power of two");
    }
    alignment = std::max(alignment, os_page_size());
    const auto span = checked_add(bytes, alignment);
    if (!span) {
      return fail(Errc::invalid_size, "reserve: " + std::to_string(bytes) + " bytes cannot be aligned");
    }
    void* raw = ::mmap(nullptr, *span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED) {
      return system_failure("mmap(PROT_NONE)");
    }
    const auto start = reinterpret_cast<std::uintptr_t>(raw);
    const std::uintptr_t base = (start + alignment - 1) & ~(std::uintptr_t{alignment} - 1);
    if (base > start) {
      ::munmap(raw, base - start);
    }
    if (const std::size_t tail = start + *span - (base + bytes); tail > 0) {
      ::munmap(reinterpret_cast<void*>(base + bytes), tail);
    }
    try {
      const std::lock_guard lock(state_->mutex);
      state_->reservations.emplace(base, HostMapperTables::Reservation{bytes, {}});
    } catch (const std::bad_alloc&) {
      ::munmap(reinterpret_cast<void*>(base), bytes);
      return fail(Errc::no_space, "reserve: out of memory for the mapper's tables");
    }
    return reinterpret_cast<void*>(base);
  }

  /// Gives a whole reservation back. Errors: not_allocated when `va` starts no reservation,
  /// invalid_size when `bytes` is not its size, invalid_argument while something is mapped in it.
  [[nodiscard]] Result<void> free_reservation(void* va, std::size_t bytes) {
    const std::lock_guard lock(state_->mutex);
    const auto it = state_->reservations.find(address(va));
    if (it == state_->reservations.end()) {
      return fail(Errc::not_allocated, "free_reservation: no reservation starts at " + text(va));
    }
    if (it->second.size != bytes) {
      return fail(Errc::invalid_size, "free_reservation: the reservation at " + text(va) + " has " +
                                          std::to_string(it->second.size) + " bytes, not " + std::to_string(bytes));
    }
    if (!it->second.mappings.empty()) {
      return fail(Errc::invalid_argument, "free_reservation: the reservation at " + text(va) + " still has " +
                                              std::to_string(it->second.mappings.size()) + " mappings");
    }
    ::munmap(va, bytes);
    state_->reservations.erase(it);
    return {};
  }

  /// Maps `bytes` of the allocation, from `offset`, at `va`, PROT_NONE for every device (memory
  /// mapped at several addresses is one memory). Errors: invalid_size (also: past the allocation's
  /// end), invalid_argument (misaligned address or offset, part of an allocation without
  /// HostMapperOptions::maps_partial_allocations, outside one reservation, over another mapping),
  /// not_allocated (an unknown handle), no_space (mmap failed).
  [[nodiscard]] Result<void> map(void* va, std::size_t bytes, physical_handle h, std::size_t offset = 0) {
    if (auto ok = check_size("map", bytes); !ok) {
      return ok;
    }
    if (offset % state_->options.granularity != 0) {
      return fail(Errc::invalid_argument, "map: offset " + std::to_string(offset) + " is not a multiple of " +
                                              std::to_string(state_->options.granularity));
    }
    const std::lock_guard lock(state_->mutex);
    const auto p = state_->physical.find(h);
    if (p == state_->physical.end()) {
      return fail(Errc::not_allocated, "map: no physical allocation " + std::to_string(h));
    }
    if (offset > p->second.size || bytes > p->second.size - offset) {
      return fail(Errc::invalid_size, "map: " + std::to_string(bytes) + " bytes from " + std::to_string(offset) +
                                          " of a " + std::to_string(p->second.size) + "-byte allocation");
    }
    if ((offset != 0 || bytes != p->second.size) && !state_->options.maps_partial_allocations) {
      return fail(Errc::invalid_argument, "map: " + std::to_string(bytes) + " bytes from " + std::to_string(offset) +
                                              " of a " + std::to_string(p->second.size) +
                                              "-byte allocation: this mapper maps whole allocations only");
    }
    auto r = state_->reservation_of("map", va, bytes);
    if (!r) {
      return cuda::std::unexpected(r.error());
    }
    auto& mappings = (*r)->second.mappings;
    const std::uintptr_t begin = address(va);
    const auto next = mappings.lower_bound(begin);
    const bool overlaps_next = next != mappings.end() && next->first < begin + bytes;
    const bool overlaps_previous =
        next != mappings.begin() && std::prev(next)->first + std::prev(next)->second.size > begin;
    if (overlaps_next || overlaps_previous) {
      return fail(Errc::invalid_argument, "map: " + text(va) + " +" + std::to_string(bytes) + " is mapped already");
    }
    if (!state_->options.address_only &&
        ::mmap(va, bytes, PROT_NONE, MAP_SHARED | MAP_FIXED, p->second.fd, static_cast<off_t>(offset)) == MAP_FAILED) {
      const int e = errno;
      restore_reservation(va, bytes);
      errno = e;
      return system_failure("mmap(MAP_FIXED)");
    }
    try {
      mappings.emplace(
          begin, HostMapperTables::Mapping{bytes, p->second.device, std::vector<Access>(device_count(), Access::none)});
    } catch (const std::bad_alloc&) {
      restore_reservation(va, bytes);
      return fail(Errc::no_space, "map: out of memory for the mapper's tables");
    }
    return {};
  }

  /// Unmaps whole mappings covering exactly [va, va + bytes); their rights go with them. Errors:
  /// invalid_size, invalid_argument (misaligned, outside a reservation), not_allocated (the range
  /// is not exactly whole mappings).
  [[nodiscard]] Result<void> unmap(void* va, std::size_t bytes) {
    if (auto ok = check_size("unmap", bytes); !ok) {
      return ok;
    }
    const std::lock_guard lock(state_->mutex);
    auto covered = state_->whole_mappings("unmap", va, bytes);
    if (!covered) {
      return cuda::std::unexpected(covered.error());
    }
    auto& [reservation, first, last] = *covered;
    if (!state_->options.address_only) {
      restore_reservation(va, bytes);
    }
    reservation->second.mappings.erase(first, last);
    return {};
  }

  /// Gives `device` the right `access` on whole mappings covering exactly [va, va + bytes).
  /// Errors as unmap, and out_of_range for an unknown device; nothing changes on an error.
  [[nodiscard]] Result<void> set_access(void* va, std::size_t bytes, int device, Access access) {
    if (auto ok = check_device(device); !ok) {
      return ok;
    }
    if (auto ok = check_size("set_access", bytes); !ok) {
      return ok;
    }
    const std::lock_guard lock(state_->mutex);
    auto covered = state_->whole_mappings("set_access", va, bytes);
    if (!covered) {
      return cuda::std::unexpected(covered.error());
    }
    auto& [reservation, first, last] = *covered;
    for (auto it = first; it != last; ++it) {
      it->second.rights[static_cast<std::size_t>(device)] = access;
      const int prot = protection(it->second);
      if (!state_->options.address_only && ::mprotect(reinterpret_cast<void*>(it->first), it->second.size, prot) != 0) {
        return system_failure("mprotect"); // cannot happen on our own mapping
      }
    }
    return {};
  }

  /// The right `device` has at `va`. Errors: out_of_range for an unknown device, not_allocated
  /// where nothing is mapped.
  [[nodiscard]] Result<Access> access(void* va, int device) const {
    if (auto ok = check_device(device); !ok) {
      return cuda::std::unexpected(ok.error());
    }
    const std::lock_guard lock(state_->mutex);
    if (const auto* m = state_->mapping_at(va)) {
      return m->rights[static_cast<std::size_t>(device)];
    }
    return fail(Errc::not_allocated, "access: nothing is mapped at " + text(va));
  }

  /// The device whose physical memory is mapped at `va` (-1: an imported allocation). Errors:
  /// not_allocated where nothing is mapped.
  [[nodiscard]] Result<int> owner(void* va) const {
    const std::lock_guard lock(state_->mutex);
    if (const auto* m = state_->mapping_at(va)) {
      return m->owner;
    }
    return fail(Errc::not_allocated, "owner: nothing is mapped at " + text(va));
  }

  /// Makes this CPU play `device` (or every_device) from now on: every mapping's protection
  /// becomes that device's right, so a store where the device has no right faults at that address
  /// as the device's would. For a process that runs one device's work (a forked child, a test).
  /// Errors: out_of_range for an unknown device (nothing changes).
  [[nodiscard]] Result<void> play_device(int device) {
    if (device != every_device) {
      if (auto ok = check_device(device); !ok) {
        return ok;
      }
    }
    const std::lock_guard lock(state_->mutex);
    state_->cpu_device = device;
    for (const auto& [base, r] : state_->reservations) {
      for (const auto& [start, m] : r.mappings) {
        if (!state_->options.address_only && ::mprotect(reinterpret_cast<void*>(start), m.size, protection(m)) != 0) {
          return system_failure("mprotect"); // cannot happen on our own mapping
        }
      }
    }
    return {};
  }
  /// The device this CPU plays now (see play_device).
  int cpu_device() const {
    const std::lock_guard lock(state_->mutex);
    return state_->cpu_device;
  }

  /// Physical allocations with a live handle here.
  std::size_t physical_count() const {
    const std::lock_guard lock(state_->mutex);
    return state_->physical.size();
  }
  /// Reservations held.
  std::size_t reservation_count() const {
    const std::lock_guard lock(state_->mutex);
    return state_->reservations.size();
  }
  /// Mappings in all reservations.
  std::size_t mapping_count() const {
    const std::lock_guard lock(state_->mutex);
    std::size_t n = 0;
    for (const auto& [base, r] : state_->reservations) {
      n += r.mappings.size();
    }
    return n;
  }
  /// The options it was made with.
  const HostMapperOptions& options() const noexcept { return state_->options; }

private:
  using State = HostMapperTables;
  using Covered = HostMapperTables::Covered;
  static std::uintptr_t address(const void* p) noexcept { return HostMapperTables::address(p); }
  static std::string text(const void* p) { return HostMapperTables::text(p); }
  static cuda::std::unexpected<Error> system_failure(const char* call) {
    return HostMapperTables::system_failure(call);
  }
  static void restore_reservation(void* va, std::size_t bytes) noexcept {
    HostMapperTables::restore_reservation(va, bytes);
  }

  std::size_t device_count() const noexcept { return static_cast<std::size_t>(state_->options.device_count); }

  [[nodiscard]] Result<void> check_device(int device) const {
    if (device < 0 || device >= state_->options.device_count) {
      return fail(Errc::out_of_range, "no device " + std::to_string(device) + " (the mapper has " +
                                          std::to_string(state_->options.device_count) + ")");
    }
    return {};
  }
  [[nodiscard]] Result<void> check_size(const char* call, std::size_t bytes) const {
    if (bytes == 0 || bytes % state_->options.granularity != 0) {
      return fail(Errc::invalid_size, std::string(call) + ": " + std::to_string(bytes) +
                                          " bytes is not a non-zero multiple of the granularity " +
                                          std::to_string(state_->options.granularity));
    }
    return {};
  }

  [[nodiscard]] Result<physical_handle> adopt(int fd, std::size_t bytes, int device) {
    try {
      const std::lock_guard lock(state_->mutex);
      const physical_handle h = state_->next_handle++;
      state_->physical.emplace(h, HostMapperTables::Physical{fd, bytes, device});
      return h;
    } catch (const std::bad_alloc&) {
      if (fd >= 0) {
        ::close(fd);
      }
      return fail(Errc::no_space, "out of memory for the mapper's tables");
    }
  }

  int protection(const HostMapperTables::Mapping& m) const noexcept {
    Access cpu = Access::none;
    if (state_->cpu_device == every_device) {
      for (const Access a : m.rights) {
        cpu = std::max(cpu, a);
      }
    } else {
      cpu = m.rights[static_cast<std::size_t>(state_->cpu_device)];
    }
    switch (cpu) {
    case Access::read:
      return PROT_READ;
    case Access::read_write:
      return PROT_READ | PROT_WRITE;
    case Access::none:
      break;
    }
    return PROT_NONE;
  }

  std::shared_ptr<State> state_;
};

static_assert(PhysicalMemoryMapper<HostMemoryMapper> && TellsPartialMaps<HostMemoryMapper>);

} // namespace carve
