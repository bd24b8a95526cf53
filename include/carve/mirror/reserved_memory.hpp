/// @file carve/mirror/reserved_memory.hpp
/// Address space that costs nothing until it is used.
///
/// - ReservedRange: a range of virtual addresses reserved PROT_NONE (MAP_NORESERVE): no memory,
///   no swap, only page-table bookkeeping in the kernel. Parts of it are committed (made
///   accessible) and decommitted (memory handed back) page by page.
/// - LazyArray<T>: an array of zero-initialised T whose memory the kernel provides when a page of
///   it is first written; reading an untouched part reads the shared zero page.
///
/// A PagedMirror over 1 TiB of device memory reserves 1 TiB of host addresses and a page table for
/// 1 TiB worth of pages, and both cost nothing until allocations use them. Host-only (POSIX mmap);
/// construction throws carve::Exception (no_space) when the kernel refuses the reservation.
#pragma once

#include <carve/core/error.hpp>
#include <carve/core/os_page_size.hpp>

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>

namespace carve {

namespace detail {
inline void* map_anonymous(std::size_t bytes, int prot, const char* what) {
  void* p = ::mmap(nullptr, bytes, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    throw Exception(Errc::no_space, std::string(what) + ": " + std::strerror(errno));
  }
  return p;
}
} // namespace detail

/// Virtual addresses reserved and inaccessible, committed and decommitted in parts. Move-only.
class ReservedRange {
public:
  /// Reserves `bytes` (a multiple of os_page_size()), inaccessible. Throws carve::Exception
  /// (no_space) when the kernel refuses.
  explicit ReservedRange(std::size_t bytes)
      : base_(static_cast<std::byte*>(detail::map_anonymous(bytes, PROT_NONE, "carve: reserving address space"))),
        bytes_(bytes) {}
  /// Unmaps the whole range.
  ~ReservedRange() {
    if (base_ != nullptr) {
      ::munmap(base_, bytes_);
    }
  }
  /// Takes the other's range; it is left empty.
  ReservedRange(ReservedRange&& other) noexcept
      : base_(std::exchange(other.base_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  ReservedRange& operator=(ReservedRange&&) = delete;
  ReservedRange(const ReservedRange&) = delete;
  ReservedRange& operator=(const ReservedRange&) = delete;

  /// The first address.
  std::byte* data() const noexcept { return base_; }
  /// Bytes reserved.
  std::size_t size() const noexcept { return bytes_; }
  /// Whether `p` lies in the range.
  bool contains(const void* p) const noexcept {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    const auto b = reinterpret_cast<std::uintptr_t>(base_);
    return a >= b && a - b < bytes_;
  }

  /// Makes [offset, offset + bytes) accessible with `prot`; its pages read as zero until written.
  /// Returns 0, or the errno on failure (e.g. ENOMEM when the process runs out of memory mappings).
  int commit(std::size_t offset, std::size_t bytes, int prot) noexcept {
    return ::mprotect(base_ + offset, bytes, prot) == 0 ? 0 : errno;
  }
  /// Hands the memory of [offset, offset + bytes) back and makes it inaccessible again.
  void decommit(std::size_t offset, std::size_t bytes) noexcept {
    ::madvise(base_ + offset, bytes, MADV_DONTNEED);
    ::mprotect(base_ + offset, bytes, PROT_NONE);
  }

private:
  std::byte* base_;
  std::size_t bytes_;
};

/// `count` zero-initialised T (trivially copyable, all-zero bytes their initial state) whose
/// pages cost memory only once written. Not copyable; not synchronised.
template <class T>
class LazyArray {
  static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_destructible_v<T>,
                "LazyArray holds plain values whose all-zero bytes are their initial state");

public:
  /// Reserves room for `count` elements. Throws carve::Exception (no_space) when the kernel
  /// refuses.
  explicit LazyArray(std::size_t count)
      : bytes_(round_up(count * sizeof(T))),
        data_(static_cast<T*>(detail::map_anonymous(bytes_, PROT_READ | PROT_WRITE, "carve: reserving a table"))),
        count_(count) {}
  /// Unmaps the elements.
  ~LazyArray() {
    if (data_ != nullptr) {
      ::munmap(data_, bytes_);
    }
  }
  LazyArray(const LazyArray&) = delete;
  LazyArray& operator=(const LazyArray&) = delete;

  /// The first element.
  T* data() noexcept { return data_; }
  /// The first element.
  const T* data() const noexcept { return data_; }
  /// Elements.
  std::size_t size() const noexcept { return count_; }
  /// Element i (< size()); unchecked.
  T& operator[](std::size_t i) noexcept { return data_[i]; }
  /// Element i (< size()); unchecked.
  const T& operator[](std::size_t i) const noexcept { return data_[i]; }

private:
  static std::size_t round_up(std::size_t bytes) noexcept {
    const std::size_t page = os_page_size();
    return bytes == 0 ? page : (bytes + page - 1) / page * page;
  }

  std::size_t bytes_;
  T* data_;
  std::size_t count_;
};

} // namespace carve
