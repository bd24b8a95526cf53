// What the PagedMirror tests share: backends of simulated cards, and the check that every device
// page behind an allocation holds exactly what a shadow copy says the host wrote.
#pragma once

#include "support/sanitizers.hpp"

#include <carve/mirror.hpp>

#include <cstddef>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

namespace carve::test {

using HostBackend = HostMirrorBackend<>;

inline constexpr std::size_t KiB = 1024;
inline constexpr std::size_t MiB = 1024 * KiB;

// Every tracking mode this machine offers: explicit calls, mprotect, and userfaultfd where the
// kernel has asynchronous write-protection.
inline std::vector<WriteTracking> tracking_modes() {
  std::vector<WriteTracking> modes{WriteTracking::explicit_calls, WriteTracking::automatic_mprotect};
  if (userfaultfd_tracking_available()) {
    modes.push_back(WriteTracking::automatic_userfaultfd);
  }
  return modes;
}

// One simulated card per entry: `bytes` of device memory and `units` compute units.
struct CardSpec {
  std::size_t bytes = 0;
  std::uint32_t units = 0;
  bool available = true;
};

inline void add_cards(HostBackend& backend, std::initializer_list<CardSpec> cards) {
  for (const CardSpec& c : cards) {
    backend.register_device(SimulatedCard(c.bytes), {.name = "card " + std::to_string(backend.device_count()),
                                                     .bytes = c.bytes,
                                                     .compute_units = c.units,
                                                     .available = c.available});
  }
}

inline void wait_all(HostBackend& backend) {
  for (std::size_t d = 0; d < backend.device_count(); ++d) {
    (void)backend.wait(d);
  }
}

// The bytes of [p, p + n) as the devices hold them, gathered through the mirror's page table.
template <class Mirror>
std::vector<unsigned char> device_view(const Mirror& mirror, const HostBackend& backend, const void* p, std::size_t n) {
  std::vector<unsigned char> out;
  out.reserve(n);
  const auto segments = mirror.segments(p, n);
  if (!segments) {
    return out;
  }
  for (const MirrorSegment& s : *segments) {
    const auto memory = backend.device_memory(s.device);
    const auto* first = reinterpret_cast<const unsigned char*>(memory.data()) + s.device_offset;
    out.insert(out.end(), first, first + s.bytes);
  }
  return out;
}

// Number of bytes where the devices differ from `shadow` (0 when they agree everywhere).
template <class Mirror>
std::size_t device_mismatches(const Mirror& mirror, const HostBackend& backend, const void* p,
                              const std::vector<unsigned char>& shadow) {
  const auto view = device_view(mirror, backend, p, shadow.size());
  if (view.size() != shadow.size()) {
    return shadow.size();
  }
  if (view == shadow) {
    return 0; // the common case, at memcmp speed
  }
  std::size_t bad = 0;
  for (std::size_t i = 0; i < shadow.size(); ++i) {
    bad += view[i] != shadow[i] ? 1u : 0u;
  }
  return bad;
}

} // namespace carve::test
