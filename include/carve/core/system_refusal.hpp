/// @file carve/core/system_refusal.hpp
/// Which system call last refused memory to a resource, so that a failed allocation can name the
/// real cause.
///
/// @code
/// carve::clear_system_refusal();
/// auto p = card.try_allocate(bytes, alignment);   // no_space
/// if (const auto r = carve::last_system_refusal()) { ... carve::describe(r) ... }
///                                                  // "memfd_create: Too many open files"
/// @endcode
///
/// Resources that take memory from the operating system (SharedMemoryCard: memfd_create,
/// ftruncate, mmap) note the failing call and its errno here when the system says no. An allocator
/// whose resource fails although it reported room (BorrowingAllocator) reads the note to say
/// "card 2: the system refused the memory (...)" instead of blaming its own choices. Like errno
/// it belongs to the calling thread and means something only right after the failing call:
/// clear it before, read it after. Host-only.
#pragma once

#include <cstring>
#include <string>

namespace carve {

/// A system call that refused memory, and why.
struct SystemRefusal {
  const char* call = nullptr; ///< the system call that failed (a string literal); null: none noted
  int error = 0;              ///< its errno
  /// Whether a refusal was noted.
  explicit operator bool() const noexcept { return call != nullptr; }
};

namespace detail {
inline SystemRefusal& system_refusal_slot() noexcept {
  thread_local SystemRefusal refusal;
  return refusal;
}
} // namespace detail

/// The calling thread's last noted refusal (empty when none since clear_system_refusal()).
inline SystemRefusal last_system_refusal() noexcept { return detail::system_refusal_slot(); }
/// Forgets the calling thread's note; call before the allocation whose cause you want.
inline void clear_system_refusal() noexcept { detail::system_refusal_slot() = SystemRefusal{}; }
/// Notes that `call` failed with `error`; `call` must outlive the note (a string literal).
inline void note_system_refusal(const char* call, int error) noexcept {
  detail::system_refusal_slot() = SystemRefusal{call, error};
}

/// "memfd_create: Too many open files", or "no refusal noted".
inline std::string describe(const SystemRefusal& r) {
  return r ? std::string(r.call) + ": " + std::strerror(r.error) : std::string("no refusal noted");
}

} // namespace carve
