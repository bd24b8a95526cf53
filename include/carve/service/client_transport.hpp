/// @file carve/service/client_transport.hpp
/// An AllocationClient's connection to carve-served: requests out, replies and notices in, and
/// what a lost connection looks like.
///
/// One request is outstanding at a time (the client serialises its calls). Between a request
/// and its reply the server may send notices (SegmentsRetired, sequence 0), which go to the
/// caller's handler, and an ErrorReply with sequence 0 when it closes the connection on its own,
/// which becomes the call's error. Any failure of the transport itself (no reply in time, a
/// reset, a message that does not decode, a reply to another request) hangs up: the caller sees
/// connected() turn false and treats its regions as orphans.
///
/// Not thread-safe: the client's mutex guards it. Host-only, Linux.
#pragma once

#include <carve/core/error.hpp>
#include <carve/service/protocol.hpp>
#include <carve/service/unix_socket.hpp>

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace carve::service::detail {

/// The client's side of the socket (see the file's description).
class ClientTransport {
public:
  /// Not connected yet: connect() opens `socket_path`; each reply is awaited for `timeout`.
  ClientTransport(std::filesystem::path socket_path, std::chrono::milliseconds timeout)
      : path_(std::move(socket_path)), timeout_(timeout) {}

  /// Connects (after hanging up any earlier connection) and checks that the server runs as this
  /// user or as root. Errors: connect_to's; permission_denied for a server of another user.
  [[nodiscard]] Result<void> connect() {
    hang_up();
    auto fd = connect_to(path_);
    if (!fd) {
      return cuda::std::unexpected(std::move(fd.error()));
    }
    const auto peer = peer_credentials(fd->get());
    if (!peer || (peer->uid != ::geteuid() && peer->uid != 0)) {
      return fail(Errc::permission_denied, path_.string() + " is served by another user; refusing to use it");
    }
    socket_ = std::move(*fd);
    return {};
  }
  /// Whether the connection is up as far as this side knows.
  bool connected() const noexcept { return static_cast<bool>(socket_); }
  /// Closes the connection (the server then reclaims this session's regions).
  void hang_up() noexcept { socket_.reset(); }

  /// Sends `request` and waits for its reply (the matching type or the server's ErrorReply, as
  /// sent), at most the timeout plus `extra_wait`. Notices that arrive first go to
  /// `on_notice(const SegmentsRetired&)`; the reply's descriptors to `fds` when it is not null.
  /// Errors, after which the connection is closed: disconnected (not connected, no reply in time,
  /// the server stopped, a reply that does not decode or answers another request), and the code
  /// of an ErrorReply with which the server closed the connection.
  template <class OnNotice>
  [[nodiscard]] Result<Reply> call(const Request& request, std::vector<UniqueFd>* fds,
                                   std::chrono::milliseconds extra_wait, OnNotice&& on_notice) {
    if (!socket_) {
      return fail(Errc::disconnected, "not connected to carve-served at " + path_.string() + "; call reconnect()");
    }
    const std::uint32_t seq = next_sequence();
    if (const int e = send_message(socket_.get(), encode(request, seq)); e != 0) {
      return e == EPIPE || e == ECONNRESET ? server_hung_up() : lost("cannot send to carve-served: " + errno_text(e));
    }
    const auto deadline = std::chrono::steady_clock::now() + timeout_ + extra_wait;
    for (;;) {
      std::vector<UniqueFd> received;
      auto message = next_message(deadline, received);
      if (!message) {
        return cuda::std::unexpected(std::move(message.error()));
      }
      if (auto* notice = std::get_if<SegmentsRetired>(&message->body); notice != nullptr && message->sequence == 0) {
        on_notice(*notice);
        if (!socket_) { // the handler's answer could not be sent
          return fail(Errc::disconnected, "lost the connection to carve-served while answering a notice");
        }
        continue;
      }
      if (auto* why = std::get_if<ErrorReply>(&message->body); why != nullptr && message->sequence == 0) {
        return hung_up(*why); // refused, or the server is shutting down
      }
      if (message->sequence != seq) {
        return lost("carve-served answered request " + std::to_string(message->sequence) + " while " +
                    std::to_string(seq) + " was pending");
      }
      if (fds != nullptr) {
        *fds = std::move(received);
      }
      return std::move(message->body);
    }
  }

  /// Sends a request that gets no reply (Unmapped). Returns false, having hung up, when it cannot
  /// be sent.
  bool notify(const Request& request) {
    if (!socket_) {
      return false;
    }
    if (send_message(socket_.get(), encode(request, next_sequence())) != 0) {
      hang_up();
      return false;
    }
    return true;
  }

  /// Hands the notices that have arrived to `on_notice(const SegmentsRetired&)` without waiting.
  /// Anything else waiting between calls, or a closed connection, hangs up.
  template <class OnNotice>
  void drain(OnNotice&& on_notice) {
    while (socket_) {
      std::vector<UniqueFd> fds;
      const ReceivedMessage r = receive_message(socket_.get(), buffer_, fds, true);
      if (r.error == EAGAIN || r.error == EWOULDBLOCK) {
        break;
      }
      if (r.closed || r.error != 0 || r.truncated) {
        hang_up();
        break;
      }
      auto decoded = decode_reply(std::span<const std::uint8_t>(buffer_.data(), r.size));
      auto* notice = decoded ? std::get_if<SegmentsRetired>(&decoded->body) : nullptr;
      if (notice == nullptr || decoded->sequence != 0) {
        hang_up(); // nothing but notices can be waiting between calls
        break;
      }
      on_notice(*notice);
    }
  }

private:
  std::uint32_t next_sequence() noexcept {
    sequence_ = sequence_ == std::numeric_limits<std::uint32_t>::max() ? 1 : sequence_ + 1;
    return sequence_;
  }

  [[nodiscard]] Result<Decoded<Reply>> next_message(std::chrono::steady_clock::time_point deadline,
                                                    std::vector<UniqueFd>& fds) {
    for (;;) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      pollfd p{socket_.get(), POLLIN, 0};
      // poll takes an int of milliseconds: a longer wait is made of waits of at most INT_MAX.
      const int ready = ::poll(&p, 1, static_cast<int>(std::clamp<std::int64_t>(left.count(), 0, INT_MAX)));
      if (ready < 0 && errno == EINTR) {
        continue;
      }
      if (ready == 0) {
        return lost("no reply from carve-served within " + std::to_string(timeout_.count()) + " ms");
      }
      const ReceivedMessage r = receive_message(socket_.get(), buffer_, fds);
      if (r.closed || r.error == ECONNRESET) {
        return server_hung_up();
      }
      if (r.error != 0 || r.truncated) {
        return lost(r.error != 0 ? "cannot read from carve-served: " + errno_text(r.error)
                                 : "carve-served sent an oversized message");
      }
      auto decoded = decode_reply(std::span<const std::uint8_t>(buffer_.data(), r.size));
      if (!decoded) {
        return lost("carve-served sent a message that does not decode: " + decoded.error().message);
      }
      return std::move(*decoded);
    }
  }

  // The connection is gone. A server that hangs up says why first (an ErrorReply with
  // sequence 0) when it can; a reset is reported before the data that is still queued.
  cuda::std::unexpected<Error> server_hung_up() {
    if (const auto why = goodbye()) {
      return hung_up(*why);
    }
    return lost("carve-served closed the connection (it stopped or restarted)");
  }
  std::optional<ErrorReply> goodbye() {
    for (int resets = 0;;) {
      std::vector<UniqueFd> fds;
      const ReceivedMessage r = receive_message(socket_.get(), buffer_, fds, true);
      if (r.error == ECONNRESET && ++resets < 2) {
        continue;
      }
      if (r.error != 0 || r.closed || r.truncated) {
        return std::nullopt;
      }
      auto decoded = decode_reply(std::span<const std::uint8_t>(buffer_.data(), r.size));
      if (!decoded) {
        return std::nullopt;
      }
      if (auto* why = std::get_if<ErrorReply>(&decoded->body); why != nullptr && decoded->sequence == 0) {
        return *why;
      }
    }
  }

  // The server said why it closes the connection (an ErrorReply with sequence 0).
  cuda::std::unexpected<Error> hung_up(const ErrorReply& why) {
    hang_up();
    return fail(why.code, "carve-served closed the connection: " + why.message);
  }
  cuda::std::unexpected<Error> lost(std::string why) {
    hang_up();
    return fail(Errc::disconnected, std::move(why));
  }

  std::filesystem::path path_;
  std::chrono::milliseconds timeout_;
  UniqueFd socket_;
  std::uint32_t sequence_ = 0;
  std::vector<std::uint8_t> buffer_ = std::vector<std::uint8_t>(max_message_size);
};

} // namespace carve::service::detail
