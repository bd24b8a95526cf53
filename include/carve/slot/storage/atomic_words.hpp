/// @file carve/slot/storage/atomic_words.hpp
/// A live bitmap as a WordSource: each word is loaded atomically
/// when a search reaches it.
///
/// A search over AtomicWords sees each word as it was at the moment it was read, so its answer
/// is a candidate, not a fact: the caller claims it with an atomic read-modify-write and checks
/// the old value (see ConcurrentSlotAllocator). Loads are relaxed; the claim is what orders.
#pragma once

#include <carve/core/bits.hpp>
#include <carve/core/config.hpp>

#include <cuda/atomic>
#include <cuda/std/cstddef>
#include <cuda/std/cstdint>

namespace carve {

/// A WordSource over the live words of an N-slot bitmap, read with relaxed atomic loads at
/// scope `Scope`. A non-owning view: the words must outlive it.
template <std::uint32_t N, cuda::thread_scope Scope>
class AtomicWords {
public:
  /// Words in the bitmap (known at compile time, so searches can unroll).
  static constexpr cuda::std::size_t extent = bits::word_count(N);

  /// Views `words`, which must hold `extent` words in SlotBitmap's layout.
  CARVE_HOST_DEVICE constexpr explicit AtomicWords(bits::word* words) noexcept : words_(words) {}

  /// Words in the bitmap.
  CARVE_HOST_DEVICE static constexpr cuda::std::size_t size() noexcept { return extent; }

  /// Word `k` as it is now (a relaxed load).
  CARVE_HOST_DEVICE bits::word operator[](cuda::std::size_t k) const noexcept {
    return atomic(k).load(cuda::std::memory_order_relaxed);
  }

  /// Word `k` for a read-modify-write (the claim that makes a candidate a fact).
  CARVE_HOST_DEVICE cuda::atomic_ref<bits::word, Scope> atomic(cuda::std::size_t k) const noexcept {
    return cuda::atomic_ref<bits::word, Scope>(words_[k]);
  }

private:
  bits::word* words_;
};

} // namespace carve
