/// @file carve/core/config.hpp
/// The few macros every carve header relies on.
///
/// carve's algorithms are written once and run on the host and inside CUDA kernels, so every
/// function on the data path is marked CARVE_HOST_DEVICE. Without a CUDA compiler it expands to
/// nothing and the headers are plain C++20.
#pragma once

#include <cuda/std/cassert>

#if defined(__CUDACC__)
/// Marks a function callable from host and device code: `__host__ __device__` under a CUDA
/// compiler, nothing otherwise.
#define CARVE_HOST_DEVICE __host__ __device__
#else
#define CARVE_HOST_DEVICE
#endif

#if defined(__NVCC__)
/// Before a CARVE_HOST_DEVICE template member that calls its parts: an adaptor over a host-only
/// part (a mutex-guarded pool) is only ever called on the host, and nvcc would otherwise warn on
/// every instantiation that a `__host__ __device__` function calls a `__host__` one. A pragma
/// cannot come from a constexpr, so this one is a macro.
#define CARVE_EXEC_CHECK_DISABLE _Pragma("nv_exec_check_disable")
#else
#define CARVE_EXEC_CHECK_DISABLE
#endif

/// Checks a precondition that the type cannot report through its return value (a `void`
/// function). A failed check is a hard error in debug builds, and makes a constant expression
/// ill-formed, so misuse in a static_assert is caught at compile time.
#define CARVE_EXPECTS(cond) assert(cond)

#include <cuda/std/cstddef>

/// Everything carve provides; implementation details live in `carve::detail` and are not part of
/// the API.
namespace carve {
/// How far apart two atomics written by different cores must be to stay out of each other's
/// way: two 64-byte lines, because x86 cores fetch lines in adjacent pairs (a neighbour's write
/// one line over still takes the pair away).
inline constexpr cuda::std::size_t interference_size = 128;
} // namespace carve
