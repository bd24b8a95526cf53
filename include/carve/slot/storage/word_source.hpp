/// @file carve/slot/storage/word_source.hpp
/// What the run searches read: anything that yields bitmap words.
///
/// A span of words (a SlotBitmap's storage, a snapshot) is a word source; so is a view that
/// loads each word atomically only when a search reaches it (see AtomicWords), which lets a
/// concurrent allocator search a live bitmap without copying it first. Searches read word k at
/// most once per pass and must tolerate words that change between reads: whatever they report
/// is a candidate that the caller still has to claim.
#pragma once

#include <carve/core/bits.hpp>

#include <cuda/std/concepts>
#include <cuda/std/cstddef>
#include <cuda/std/cstdint>
#include <cuda/std/span>

namespace carve {

/// Anything that yields bitmap words: `size()` words, word k as `source[k]` (SlotBitmap's layout).
template <class S>
concept WordSource = requires(const S& source, std::uint32_t k) {
  { source.size() } -> cuda::std::convertible_to<cuda::std::size_t>;
  { source[k] } -> cuda::std::convertible_to<bits::word>;
};

/// The number of words when it is known at compile time (a member `extent`, as on
/// cuda::std::span), else cuda::std::dynamic_extent. Lets searches unroll small bitmaps.
template <WordSource S>
inline constexpr cuda::std::size_t static_word_count = cuda::std::dynamic_extent;
/// @cond
template <WordSource S>
requires requires { S::extent; }
inline constexpr cuda::std::size_t static_word_count<S> = S::extent;
/// @endcond

static_assert(WordSource<cuda::std::span<const bits::word, 2>>);
static_assert(static_word_count<cuda::std::span<const bits::word, 2>> == 2);
static_assert(static_word_count<cuda::std::span<const bits::word>> == cuda::std::dynamic_extent);

} // namespace carve
