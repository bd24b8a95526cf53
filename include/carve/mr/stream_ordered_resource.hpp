/// @file carve/mr/stream_ordered_resource.hpp
/// The concept of a stream-ordered resource: one whose allocations and frees name the stream
/// whose work uses the block (StreamOrderedPool, StreamCachingPool, ExpandablePool, and the
/// adaptors over them), so that a block freed on a stream may be reused by that stream's later
/// work at once.
#pragma once

#include <carve/core/errc.hpp>

#include <cuda/std/expected>

#include <concepts>
#include <cstddef>

namespace carve {

/// A resource with a `stream_type` and the stream-ordered calls, each noexcept:
/// `try_allocate(stream, bytes, alignment)` (a block for work on `stream`),
/// `try_deallocate(stream, p, bytes, alignment)` (the block is free once the work queued on
/// `stream` so far has run), and `check_deallocate(p, bytes, alignment)`, which answers what
/// try_deallocate would, changing nothing, so that a free made later can be refused now.
template <class R>
concept StreamOrderedResource = requires(R& r, typename R::stream_type s, void* p, std::size_t n) {
  requires std::copy_constructible<typename R::stream_type>;
  { s == s } -> std::convertible_to<bool>;
  { r.try_allocate(s, n, n) }
  noexcept->std::same_as<cuda::std::expected<void*, Errc>>;
  { r.try_deallocate(s, p, n, n) }
  noexcept->std::same_as<cuda::std::expected<void, Errc>>;
  { r.check_deallocate(p, n, n) }
  noexcept->std::same_as<cuda::std::expected<void, Errc>>;
};

} // namespace carve
