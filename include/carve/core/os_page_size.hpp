/// @file carve/core/os_page_size.hpp
/// The operating system's page size: the granularity of every
/// mapping and protection change. POSIX hosts.
#pragma once

#include <unistd.h>

#include <cstddef>

namespace carve {

/// The page size in bytes (`sysconf(_SC_PAGESIZE)`, read once).
inline std::size_t os_page_size() noexcept {
  static const auto size = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  return size;
}

} // namespace carve
