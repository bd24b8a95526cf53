/// @file carve/slot/storage/word_fingerprint.hpp
/// Whether two reads of a live bitmap saw the same words,
/// without keeping a copy of either.
///
/// A read of L words is summarised as a polynomial in a point x, modulo the prime p = 2^61 - 1
/// (each word contributes its two 32-bit halves as coefficients). Two different reads are two
/// different polynomials of degree below 2L, which agree at no more than 2L - 1 points; with x
/// drawn at random for each comparison (fingerprint_point), a difference therefore goes unseen
/// with probability below 2L / p — under 1e-12 for a million words. Memory: one 64-bit value per
/// read, however large the bitmap; cost: two multiplications modulo p per word.
///
/// ConcurrentSlotAllocator uses it to confirm "no space" on bitmaps too large for a thread to
/// keep every word it searched (see there).
#pragma once

#include <carve/core/config.hpp>
#include <carve/slot/storage/word_source.hpp>

#include <cuda/std/cstdint>
#include <cuda/std/type_traits>
#include <nv/target>

#if !defined(__CUDA_ARCH__)
#include <chrono>
#endif

namespace carve {

namespace fingerprint_detail {

inline constexpr std::uint64_t prime = (std::uint64_t{1} << 61) - 1;

// x mod p for any 64-bit x.
CARVE_HOST_DEVICE constexpr std::uint64_t reduce(std::uint64_t x) noexcept {
  x = (x & prime) + (x >> 61); // 2^61 = 1 (mod p); now below 2^61 + 8
  return x >= prime ? x - prime : x;
}

// The top 64 bits of the 128-bit product a * b, from 32-bit halves.
CARVE_HOST_DEVICE constexpr std::uint64_t high_half(std::uint64_t a, std::uint64_t b) noexcept {
  constexpr std::uint64_t half = 0xffff'ffffu;
  const std::uint64_t ll = (a & half) * (b & half);
  const std::uint64_t lh = (a & half) * (b >> 32);
  const std::uint64_t hl = (a >> 32) * (b & half);
  const std::uint64_t carry = ((ll >> 32) + (lh & half) + (hl & half)) >> 32;
  return (a >> 32) * (b >> 32) + (lh >> 32) + (hl >> 32) + carry;
}

// a * b mod p for a, b < p. The product, below 2^122, is high 2^64 + low, with 2^64 = 8 and
// 2^61 = 1 (mod p). A device takes the high half from one instruction (__umul64hi) rather than
// four multiplications and their carries: this runs inside every kernel that allocates. (The host
// tests check the portable form against 128-bit arithmetic; the device form has been compiled for
// sm_80 and sm_90, not yet run on a card.)
CARVE_HOST_DEVICE constexpr std::uint64_t multiply(std::uint64_t a, std::uint64_t b) noexcept {
  std::uint64_t high = 0;
  if (cuda::std::is_constant_evaluated()) {
    high = high_half(a, b);
  } else {
    NV_IF_ELSE_TARGET(NV_IS_DEVICE, (high = __umul64hi(a, b);), (high = high_half(a, b);))
  }
  const std::uint64_t low = a * b;
  return reduce((high << 3) + (low & prime) + (low >> 61));
}

CARVE_HOST_DEVICE constexpr std::uint64_t mix(std::uint64_t x) noexcept { // splitmix64's finaliser
  x ^= x >> 30;
  x *= 0xbf58'476d'1ce4'e5b9u;
  x ^= x >> 27;
  x *= 0x94d0'49bb'1331'11ebu;
  return x ^ (x >> 31);
}

} // namespace fingerprint_detail

/// The fingerprint of words [0, words.size()) at point x (x < 2^61 - 1).
template <WordSource Words>
CARVE_HOST_DEVICE constexpr std::uint64_t word_fingerprint(const Words& words, std::uint64_t x) noexcept {
  namespace fp = fingerprint_detail;
  std::uint64_t h = 0;
  // One word at a time on a device: unrolled, several words' loads in flight hold registers that
  // every allocating kernel would reserve for this rarely taken path.
#if defined(__CUDA_ARCH__)
#pragma unroll 1
#endif
  for (std::uint32_t k = 0; k < words.size(); ++k) {
    const std::uint64_t w = words[k];
    h = fp::reduce(fp::multiply(h, x) + (w >> 32));
    h = fp::reduce(fp::multiply(h, x) + (w & 0xffff'ffffu));
  }
  return h;
}

/// A point for one comparison, drawn from the clock (and the calling thread), so it does not
/// depend on the words being compared.
CARVE_HOST_DEVICE inline std::uint64_t fingerprint_point() noexcept {
  std::uint64_t seed = 0;
  NV_IF_ELSE_TARGET(NV_IS_DEVICE,
                    (std::uint64_t t; asm volatile("mov.u64 %0, %%globaltimer;"
                                                   : "=l"(t));
                     seed = t ^ (static_cast<std::uint64_t>(clock64()) << 20) ^
                            (std::uint64_t{blockIdx.x} << 40 | std::uint64_t{blockIdx.y} << 24 | threadIdx.x);),
                    (const auto t = std::chrono::steady_clock::now().time_since_epoch().count();
                     seed = static_cast<std::uint64_t>(t) ^ reinterpret_cast<std::uintptr_t>(&seed);))
  return fingerprint_detail::mix(seed) % fingerprint_detail::prime;
}

} // namespace carve
