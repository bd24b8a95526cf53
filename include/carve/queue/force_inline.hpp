/// @file carve/queue/force_inline.hpp
/// CARVE_QUEUE_INLINE, for the small functions on a queue's hot path.
///
/// Every push and pop runs through a few small functions: the ring's claims, the gate, a drain
/// policy's pick(). GCC leaves some of them out of line, and then builds the cuda::std::optional
/// they return in memory a byte at a time and reads it back whole: a stalled load (store
/// forwarding fails) per call, which on one thread cost more than the ring's compare-exchange.
/// Inlined, the optional lives in registers (benchmarks/queue.md, step 1).
#pragma once

#if defined(__CUDACC__)
/// Forces a small queue function inline: `__forceinline__` under a CUDA compiler,
/// `always_inline` under GCC and Clang, plain `inline` elsewhere.
#define CARVE_QUEUE_INLINE __forceinline__
#elif defined(__GNUC__)
#define CARVE_QUEUE_INLINE __attribute__((always_inline)) inline
#else
#define CARVE_QUEUE_INLINE inline
#endif
