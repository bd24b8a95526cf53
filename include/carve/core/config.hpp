// carve/core/config.hpp — the few macros every carve header relies on.
//
// carve's algorithms are written once and run on the host and inside CUDA kernels, so every
// function on the data path is marked CARVE_HOST_DEVICE. Without a CUDA compiler it expands to
// nothing and the headers are plain C++20.
#pragma once

#include <cuda/std/cassert>

#if defined(__CUDACC__)
#define CARVE_HOST_DEVICE __host__ __device__
#else
#define CARVE_HOST_DEVICE
#endif

// Checks a precondition that the type cannot report through its return value (a `void`
// function). A failed check is a hard error in debug builds, and makes a constant expression
// ill-formed, so misuse in a static_assert is caught at compile time.
#define CARVE_EXPECTS(cond) assert(cond)

#include <cuda/std/cstddef>

namespace carve {
// How far apart two atomics written by different cores must be to stay out of each other's
// way: two 64-byte lines, because x86 cores fetch lines in adjacent pairs (a neighbour's write
// one line over still takes the pair away).
inline constexpr cuda::std::size_t interference_size = 128;
} // namespace carve
