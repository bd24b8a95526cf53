/// @file carve/service/descriptor_reserve.hpp
/// How AllocationServer refuses a client when the process is out of file descriptors: it keeps
/// one descriptor in reserve (/dev/null), and gives it up for a moment to accept the waiting
/// client, tell it why it is refused and close it. Without this the listener stays readable
/// and epoll reports it again at once, forever.
///
/// Host-only, Linux.
#pragma once

#include <carve/core/error.hpp>
#include <carve/service/protocol.hpp>
#include <carve/service/unix_socket.hpp>

#include <fcntl.h>
#include <sys/socket.h>

#include <cstdint>
#include <string>

namespace carve::service::detail {

/// One spare descriptor, spent to refuse a client when descriptors run out.
class DescriptorReserve {
public:
  /// What refuse_one did.
  enum class Refusal {
    refused,        ///< a waiting client was accepted, told why and closed
    nobody_waiting, ///< the reserve was free, but no client waited
    no_reserve,     ///< the reserve could not be (re)taken: the server should stop accepting a while
  };

  DescriptorReserve() : fd_(take()) {}
  /// Whether a descriptor is held in reserve.
  explicit operator bool() const noexcept { return static_cast<bool>(fd_); }

  /// The process is out of descriptors (`error`: EMFILE or ENFILE) and `listener` is readable:
  /// frees the reserve, accepts one client, tells it why it is refused (no_space), closes it and
  /// takes the reserve back.
  Refusal refuse_one(int listener, int error) {
    if (!fd_) { // another thread of the process took the slot last time
      fd_ = take();
      return Refusal::no_reserve;
    }
    fd_.reset();
    UniqueFd fd(::accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    const bool accepted = static_cast<bool>(fd);
    if (accepted) {
      ++refused_;
      const auto why =
          encode(Reply{ErrorReply{Errc::no_space, "carve-served has run out of file descriptors (" + errno_text(error) +
                                                      "); try again when clients have left"}},
                 0);
      (void)send_message(fd.get(), why, -1, true);
      fd.reset();
    }
    fd_ = take();
    if (!fd_) {
      return Refusal::no_reserve;
    }
    return accepted ? Refusal::refused : Refusal::nobody_waiting;
  }

  /// Clients refused this way so far.
  std::uint64_t refused() const noexcept { return refused_; }

private:
  static UniqueFd take() noexcept { return UniqueFd(::open("/dev/null", O_RDONLY | O_CLOEXEC)); }

  UniqueFd fd_;
  std::uint64_t refused_ = 0;
};

} // namespace carve::service::detail
