// How much of this process's memory is resident: what touching pages raises, so a test can show
// that gigabytes handed out by an address-only resource were never touched.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <fstream>

namespace carve::test {

// The resident set in bytes, from /proc/self/statm.
inline std::size_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::size_t pages = 0;
  std::size_t resident = 0;
  statm >> pages >> resident;
  return resident * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
}

} // namespace carve::test
