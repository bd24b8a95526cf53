/// @file carve/core/misuse.hpp
/// What a call that cannot report an error does when it is misused.
///
/// A memory resource's deallocate is noexcept and returns nothing, as CCCL and std::pmr require.
/// Handed a pointer it never gave (or the wrong size), going on would corrupt its books or give
/// one block out twice later, so it stops the program with a message saying what happened, as
/// free() does. Code that wants to recover calls the resource's try_deallocate instead.
#pragma once

#include <carve/core/config.hpp>
#include <carve/core/errc.hpp>

#include <nv/target>

#include <cuda/std/cstddef>

#include <cstdio>
#include <cstdlib>

namespace carve {

/// Prints `who(p, bytes): <why>` and stops the program (std::abort on the host, a trap on a
/// device). For a misused call that cannot return an error, such as a noexcept deallocate.
[[noreturn]] CARVE_HOST_DEVICE inline void report_misuse(const char* who, const void* p, cuda::std::size_t bytes,
                                                         Errc why) noexcept {
  NV_IF_ELSE_TARGET(
      NV_IS_DEVICE,
      (::printf("%s(%p, %llu): %s\n", who, p, static_cast<unsigned long long>(bytes), to_string(why)); __trap();),
      (std::fprintf(stderr, "%s(%p, %llu): %s\n", who, p, static_cast<unsigned long long>(bytes), to_string(why));
       std::abort();))
}

} // namespace carve
