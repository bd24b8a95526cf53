/// @file carve/service/reply_queue.hpp
/// One connection's replies that its socket has not taken yet, sent in order as the socket and
/// the bound on unread descriptors allow.
///
/// A descriptor sent over a Unix socket (SCM_RIGHTS) is in flight until the peer reads the
/// message it came with, and Linux counts every descriptor a user has in flight against that
/// user's RLIMIT_NOFILE (privileged senders aside): past it, sendmsg fails with ETOOMANYREFS.
/// Without a bound per connection, one client that asks for segments and never reads its
/// replies would use up the whole server's allowance, and no other client could be sent a
/// segment. So the queue counts the descriptors it sends and, at the bound, asks the kernel
/// (SIOCOUTQ) whether the peer has read everything it was sent; until it has, the next
/// descriptor waits, and so do the replies after it (replies go in order). A send the system
/// refuses for descriptors in flight waits the same way: the server's whole allowance is not one
/// client's doing, so it is no reason to close that client.
///
/// Host-only, Linux.
#pragma once

#include <carve/service/allocation_service.hpp>
#include <carve/service/unix_socket.hpp>

#include <linux/sockios.h>
#include <sys/ioctl.h>

#include <cerrno>
#include <cstddef>
#include <deque>
#include <utility>

namespace carve::service::detail {

/// The bytes sent on socket `fd` that its peer has not read (SIOCOUTQ: the sender's socket is
/// charged for them until the peer reads them); -1 when the kernel cannot say.
inline int unread_bytes(int fd) noexcept {
  int unread = 0;
  return ::ioctl(fd, SIOCOUTQ, &unread) == 0 ? unread : -1;
}

/// A connection's replies not sent yet (see the file's description).
class ReplyQueue {
public:
  /// Why send() stopped.
  enum class Stop {
    sent_all,    ///< nothing is left
    socket_full, ///< the socket takes no more now: wait until it is writable
    held_back,   ///< a descriptor must wait for the peer to read, or for any in flight to be read: retry later
    ended,       ///< a send failed, or a reply that ends the connection went: close it (the queue is emptied)
  };

  /// Appends `reply`.
  void push(Outgoing reply) { queue_.push_back(std::move(reply)); }
  /// Drops every reply not sent (their descriptors are closed).
  void clear() noexcept {
    queue_.clear();
    held_back_ = false;
  }
  bool empty() const noexcept { return queue_.empty(); }
  std::size_t size() const noexcept { return queue_.size(); }
  /// Whether the last send() stopped for held_back (retry it later; the socket being writable
  /// says nothing about it).
  bool held_back() const noexcept { return held_back_; }
  /// Descriptors sent that the peer may not have read: an upper bound, reset once the peer is
  /// seen to have read everything.
  std::size_t unread_descriptors() const noexcept { return unread_; }

  /// Sends replies in order on socket `fd` (non-blocking) until one of the Stop reasons, with at
  /// most `max_unread` descriptors unread by the peer at once (where the kernel cannot say what
  /// the peer has read, only the system's own refusal holds one back).
  Stop send(int fd, std::size_t max_unread) {
    held_back_ = false;
    while (!queue_.empty()) {
      Outgoing& o = queue_.front();
      if (o.fd && unread_ >= max_unread) {
        if (unread_bytes(fd) > 0) {
          held_back_ = true;
          return Stop::held_back;
        }
        unread_ = 0;
      }
      const int e = send_message(fd, o.bytes, o.fd.get(), true);
      if (e == EAGAIN || e == EWOULDBLOCK) {
        return Stop::socket_full;
      }
      if (e == ETOOMANYREFS) {
        held_back_ = true;
        return Stop::held_back;
      }
      const bool ends = e != 0 || o.close_after;
      if (e == 0 && o.fd) {
        ++unread_;
      }
      queue_.pop_front();
      if (ends) {
        queue_.clear();
        return Stop::ended;
      }
    }
    return Stop::sent_all;
  }

private:
  std::deque<Outgoing> queue_;
  std::size_t unread_ = 0;
  bool held_back_ = false;
};

} // namespace carve::service::detail
