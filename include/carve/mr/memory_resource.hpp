/// @file carve/mr/memory_resource.hpp
/// The concept every carve byte resource models, and the small
/// capability concepts that combinators look for.
///
/// @code
/// struct MyArena {
///   cuda::std::expected<void*, carve::Errc> try_allocate(std::size_t bytes, std::size_t alignment) noexcept;
///   void deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept;
///
///   // Optional, each detected by presence and named by its own concept below:
///   bool owns(const void* p) const noexcept;            // OwnsMemory
///   std::size_t free_bytes() const;                     // ReportsFreeBytes
///   std::size_t capacity() const;                       // ReportsCapacity
///   std::size_t trim();                                 // Trimmable: bytes given back upstream
///   auto stats() const;                                 // ReportsStats
///   cuda::std::expected<void, carve::Errc>
///   try_deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept;   // ChecksDeallocation
/// };
/// static_assert(carve::MemoryResource<MyArena>);
/// @endcode
///
/// Semantic requirements:
/// - try_allocate returns memory of at least `bytes` aligned to `alignment`, or an error and
///   changes nothing. Errc::invalid_size only for what no resource could serve: 0 bytes, an
///   alignment that is not a power of two, a size that overflows when rounded up to the
///   resource's granule. Errc::no_space for everything else this resource
///   cannot serve — it is full, the request is larger than it could ever hold, the alignment is
///   coarser than it can give — so that a FallbackResource passes the request on.
/// - deallocate takes back exactly what try_allocate gave, with the same bytes and alignment.
///   It cannot report misuse; resources that can detect it offer try_deallocate, and their
///   deallocate ends the program with a message (as free() does with a pointer it never gave).
/// - owns(p) is true exactly for addresses inside memory this resource handed out or holds.
/// - free_bytes may change under other users' feet (a real GPU is shared): a hint, not a promise.
///
/// Host and device: the concept is checked the same way in both; a resource runs in kernels
/// when its members are __host__ __device__.
#pragma once

#include <carve/core/config.hpp>
#include <carve/core/errc.hpp>

#include <cuda/std/concepts>
#include <cuda/std/cstddef>
#include <cuda/std/expected>

namespace carve {

/// The alignment the throwing spellings use when a caller names none: what cudaMalloc gives.
inline constexpr cuda::std::size_t default_alignment = 256;

/// A byte resource: `try_allocate(bytes, alignment)` returning `expected<void*, Errc>` and
/// `deallocate(p, bytes, alignment)`, both noexcept, with the semantic requirements above.
template <class R>
concept MemoryResource = requires(R& r, void* p, cuda::std::size_t bytes, cuda::std::size_t alignment) {
  { r.try_allocate(bytes, alignment) }
  noexcept->cuda::std::same_as<cuda::std::expected<void*, Errc>>;
  { r.deallocate(p, bytes, alignment) }
  noexcept;
};

/// A resource that tells whether an address is in its memory: `owns(p)`, noexcept.
template <class R>
concept OwnsMemory = MemoryResource<R> && requires(const R& r, const void* p) {
  { r.owns(p) }
  noexcept->cuda::std::convertible_to<bool>;
};

/// A resource that tells how many bytes it could still hand out: `free_bytes()` (a hint).
template <class R>
concept ReportsFreeBytes = MemoryResource<R> && requires(const R& r) {
  { r.free_bytes() } -> cuda::std::convertible_to<cuda::std::size_t>;
};

/// A resource that tells how many bytes it holds in all: `capacity()`.
template <class R>
concept ReportsCapacity = MemoryResource<R> && requires(const R& r) {
  { r.capacity() } -> cuda::std::convertible_to<cuda::std::size_t>;
};

/// A resource that can give cached memory back upstream: `trim()` returns the bytes given back.
template <class R>
concept Trimmable = MemoryResource<R> && requires(R& r) {
  { r.trim() } -> cuda::std::convertible_to<cuda::std::size_t>;
};

/// A resource with counters: `stats()` (ResourceStats, PoolStats or a type of its own).
template <class R>
concept ReportsStats = MemoryResource<R> && requires(const R& r) {
  r.stats();
};

/// A resource that detects a bad deallocate: `try_deallocate(p, bytes, alignment)` returns
/// not_allocated (or another Errc) and changes nothing, where deallocate would end the program.
template <class R>
concept ChecksDeallocation = MemoryResource<R> &&
    requires(R& r, void* p, cuda::std::size_t bytes, cuda::std::size_t alignment) {
  { r.try_deallocate(p, bytes, alignment) }
  noexcept->cuda::std::same_as<cuda::std::expected<void, Errc>>;
};

/// What a pool needs from the memory under it: a resource that says how much it holds and has left.
template <class R>
concept UpstreamResource = ReportsFreeBytes<R> && ReportsCapacity<R>;

/// Whether a request is one some resource could serve: more than 0 bytes, at an alignment that is a
/// power of two. (check_request as a bool, for hot paths that branch on it.)
CARVE_HOST_DEVICE constexpr bool valid_request(cuda::std::size_t bytes, cuda::std::size_t alignment) noexcept {
  return bytes != 0 && alignment != 0 && (alignment & (alignment - 1)) == 0;
}

/// The check every resource makes first: invalid_size for 0 bytes or an alignment that is not a
/// power of two.
[[nodiscard]] CARVE_HOST_DEVICE constexpr cuda::std::expected<void, Errc>
check_request(cuda::std::size_t bytes, cuda::std::size_t alignment) noexcept {
  if (!valid_request(bytes, alignment)) {
    return cuda::std::unexpected(Errc::invalid_size);
  }
  return {};
}

/// `bytes` rounded up to a multiple of `granule` (a positive number), or 0 when that overflows.
CARVE_HOST_DEVICE constexpr cuda::std::size_t round_up(cuda::std::size_t bytes, cuda::std::size_t granule) noexcept {
  const cuda::std::size_t rest = bytes % granule;
  if (rest == 0) {
    return bytes;
  }
  const cuda::std::size_t add = granule - rest;
  return bytes > static_cast<cuda::std::size_t>(-1) - add ? 0 : bytes + add;
}

/// The number of `granule`-sized pieces that hold `bytes` (granule > 0), without overflow.
CARVE_HOST_DEVICE constexpr cuda::std::size_t pieces(cuda::std::size_t bytes, cuda::std::size_t granule) noexcept {
  return bytes == 0 ? 0 : (bytes - 1) / granule + 1;
}

namespace detail {
// The least a resource can be, and one that also knows what it owns: what the combinators'
// headers check their concepts against. Never called.
struct ResourceArchetype {
  [[nodiscard]] CARVE_HOST_DEVICE cuda::std::expected<void*, Errc> try_allocate(cuda::std::size_t,
                                                                                cuda::std::size_t) noexcept {
    return cuda::std::unexpected(Errc::no_space);
  }
  CARVE_HOST_DEVICE void deallocate(void*, cuda::std::size_t, cuda::std::size_t) noexcept {}
  friend CARVE_HOST_DEVICE constexpr bool operator==(ResourceArchetype, ResourceArchetype) noexcept { return true; }
};
struct OwningArchetype : ResourceArchetype {
  CARVE_HOST_DEVICE bool owns(const void*) const noexcept { return false; }
};
} // namespace detail

static_assert(MemoryResource<detail::ResourceArchetype> && !OwnsMemory<detail::ResourceArchetype>);
static_assert(OwnsMemory<detail::OwningArchetype>);

} // namespace carve
