// carve/slot/storage/atomic_words.hpp — a live bitmap as a WordSource: each word is loaded atomically
// when a search reaches it.
//
// A search over AtomicWords sees each word as it was at the moment it was read, so its answer
// is a candidate, not a fact: the caller claims it with an atomic read-modify-write and checks
// the old value (see ConcurrentSlotAllocator). Loads are relaxed; the claim is what orders.
#pragma once

#include <carve/core/bits.hpp>
#include <carve/core/config.hpp>

#include <cuda/atomic>
#include <cuda/std/cstddef>
#include <cuda/std/cstdint>

namespace carve {

template <std::uint32_t N, cuda::thread_scope Scope>
class AtomicWords {
public:
  static constexpr cuda::std::size_t extent = bits::word_count(N);

  CARVE_HOST_DEVICE constexpr explicit AtomicWords(bits::word* words) noexcept : words_(words) {}

  CARVE_HOST_DEVICE static constexpr cuda::std::size_t size() noexcept { return extent; }

  CARVE_HOST_DEVICE bits::word operator[](cuda::std::size_t k) const noexcept {
    return atomic(k).load(cuda::std::memory_order_relaxed);
  }

  CARVE_HOST_DEVICE cuda::atomic_ref<bits::word, Scope> atomic(cuda::std::size_t k) const noexcept {
    return cuda::atomic_ref<bits::word, Scope>(words_[k]);
  }

private:
  bits::word* words_;
};

} // namespace carve
