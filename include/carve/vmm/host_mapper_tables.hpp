/// @file carve/vmm/host_mapper_tables.hpp
/// What HostMemoryMapper (the VMM protocol's host twin) remembers: its physical allocations,
/// reservations, mappings and each device's right on each mapping, and the lookups its calls share.
///
/// Every mapping records the device whose physical memory it holds (its owner) beside the rights,
/// so one reservation can hold several simulated devices' memory and say, address by address,
/// whose memory is there and who may touch it, as a device view of a PagedMirror needs.
#pragma once

#include <carve/core/error.hpp>
#include <carve/vmm/physical_memory_mapper.hpp>

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace carve {

/// How a HostMemoryMapper behaves.
struct HostMapperOptions {
  std::size_t granularity = std::size_t{2} << 20; ///< a multiple of the OS page; 2 MiB like today's GPUs
  int device_count = 1;                           ///< simulated devices 0 .. device_count-1
  int cpu_device = 0;                             ///< the device this CPU plays, or HostMemoryMapper::every_device
  /// Addresses only: an allocation is an entry in the tables, not a memfd, and map, unmap and
  /// set_access keep the tables and their rules without entering the kernel, so a replay that
  /// times an allocator times it and not the host's mmap. Every address faults when touched;
  /// export_fd and import_fd say unsupported.
  bool address_only = false;
  /// Whether map places part of an allocation: from an offset other than 0, or fewer bytes than
  /// it holds. false plays a driver that maps whole allocations only (CUDA documents that
  /// cuMemMap's offset must be 0): such a map is refused with invalid_argument, and
  /// maps_partial_allocations says so before, so an ExpandablePool over it never lends a hole.
  bool maps_partial_allocations = true;
};

/// The tables of one HostMemoryMapper and its copies (shared by them; see host_memory_mapper.hpp).
/// The lookups are called with `mutex` held; the destructor unmaps every reservation and closes
/// every descriptor still held.
struct HostMapperTables {
  /// A physical allocation: a sealed memfd.
  struct Physical {
    int fd = -1;          ///< the memfd, owned here (-1: address_only)
    std::size_t size = 0; ///< its bytes
    int device = -1;      ///< the device it was created on; -1: imported
  };
  /// One physical allocation mapped in a reservation.
  struct Mapping {
    std::size_t size = 0;       ///< bytes mapped
    int owner = -1;             ///< whose physical memory it is (Physical::device)
    std::vector<Access> rights; ///< by device
  };
  /// An address range and what is mapped in it.
  struct Reservation {
    std::size_t size = 0;                       ///< bytes reserved
    std::map<std::uintptr_t, Mapping> mappings; ///< by start address
  };
  using ReservationIt = std::map<std::uintptr_t, Reservation>::iterator; ///< a reservation
  using MappingIt = std::map<std::uintptr_t, Mapping>::iterator;         ///< a mapping in one
  /// Mappings [first, last) of one reservation, back to back.
  struct Covered {
    ReservationIt reservation; ///< the reservation holding them
    MappingIt first;           ///< the first mapping
    MappingIt last;            ///< one past the last
  };

  /// Empty tables for a mapper made with `o`.
  explicit HostMapperTables(HostMapperOptions o) : options(o) {}
  HostMapperTables(const HostMapperTables&) = delete;
  HostMapperTables& operator=(const HostMapperTables&) = delete;
  ~HostMapperTables() {
    for (const auto& [base, r] : reservations) {
      ::munmap(reinterpret_cast<void*>(base), r.size);
    }
    for (const auto& [h, p] : physical) {
      if (p.fd >= 0) {
        ::close(p.fd);
      }
    }
  }

  /// `p` as an integer address.
  static std::uintptr_t address(const void* p) noexcept { return reinterpret_cast<std::uintptr_t>(p); }
  /// `p` as text, for messages.
  static std::string text(const void* p) {
    char buffer[32];
    std::snprintf(buffer, sizeof buffer, "%p", p);
    return buffer;
  }
  /// no_space, naming `call` and errno's text.
  static cuda::std::unexpected<Error> system_failure(const char* call) {
    return fail(Errc::no_space, std::string(call) + ": " + std::strerror(errno));
  }
  /// Puts anonymous PROT_NONE pages back over [va, va + bytes). MAP_FIXED replaces whatever is
  /// there in one step, so no other thread can take the range meanwhile.
  static void restore_reservation(void* va, std::size_t bytes) noexcept {
    ::mmap(va, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
  }

  /// The reservation that holds [va, va + bytes) whole, va aligned to the granularity. Errors:
  /// invalid_argument, naming `call`.
  [[nodiscard]] Result<ReservationIt> reservation_of(const char* call, void* va, std::size_t bytes) {
    const std::uintptr_t begin = address(va);
    if (begin % options.granularity != 0) {
      return fail(Errc::invalid_argument, std::string(call) + ": " + text(va) + " is not aligned to the granularity " +
                                              std::to_string(options.granularity));
    }
    auto r = reservations.upper_bound(begin);
    if (r != reservations.begin()) {
      --r;
      if (begin - r->first <= r->second.size && bytes <= r->second.size - (begin - r->first)) {
        return r;
      }
    }
    return fail(Errc::invalid_argument,
                std::string(call) + ": " + text(va) + " +" + std::to_string(bytes) + " is not inside one reservation");
  }

  /// The mappings that cover [va, va + bytes) exactly, back to back. Errors: as reservation_of;
  /// not_allocated when the range is not a run of whole mappings.
  [[nodiscard]] Result<Covered> whole_mappings(const char* call, void* va, std::size_t bytes) {
    auto r = reservation_of(call, va, bytes);
    if (!r) {
      return cuda::std::unexpected(r.error());
    }
    auto& mappings = (*r)->second.mappings;
    const std::uintptr_t begin = address(va);
    const std::uintptr_t end = begin + bytes;
    auto it = mappings.find(begin);
    const auto first = it;
    std::uintptr_t at = begin;
    while (it != mappings.end() && it->first == at && at < end) {
      at += it->second.size;
      ++it;
    }
    if (first == mappings.end() || at != end) {
      return fail(Errc::not_allocated, std::string(call) + ": " + text(va) + " +" + std::to_string(bytes) +
                                           " is not a run of whole mappings");
    }
    return Covered{*r, first, it};
  }

  /// The mapping holding the byte at `va`; nullptr where nothing is mapped.
  const Mapping* mapping_at(const void* va) const {
    const std::uintptr_t at = address(va);
    auto r = reservations.upper_bound(at);
    if (r == reservations.begin()) {
      return nullptr;
    }
    --r;
    auto m = r->second.mappings.upper_bound(at);
    if (m == r->second.mappings.begin() || at >= std::prev(m)->first + std::prev(m)->second.size) {
      return nullptr;
    }
    return &std::prev(m)->second;
  }

  HostMapperOptions options;                          ///< as the mapper was made
  int cpu_device = 0;                                 ///< the device this CPU plays now
  mutable std::mutex mutex;                           ///< guards everything here
  std::uint64_t next_handle = 1;                      ///< the next physical handle
  std::map<std::uint64_t, Physical> physical;         ///< by handle
  std::map<std::uintptr_t, Reservation> reservations; ///< by start address
};

} // namespace carve
