/// @file carve/service/server_options.hpp
/// How an AllocationServer listens and whom it serves, and the checks its constructor makes.
#pragma once

#include <carve/core/error.hpp>
#include <carve/service/allocation_service.hpp>
#include <carve/service/unix_socket.hpp>

#include <chrono>
#include <cstddef>
#include <filesystem>
#include <string>

namespace carve::service {

/// How an AllocationServer listens and whom it serves. The server's constructor refuses times
/// outside 0 ms .. 24 h and counts of 0 (invalid_argument).
struct ServerOptions {
  std::filesystem::path socket_path = default_socket_path(); ///< where to listen
  ServiceOptions service{};                                  ///< how cards are picked
  std::size_t max_clients = 256;       ///< connections served at once; one more is refused (no_space)
  std::size_t max_queued_replies = 64; ///< per client, before the server stops reading from it
  /// A connection that has not said Hello by then is refused (timed_out) and closed. 0: no limit.
  /// A real client says Hello right after connecting, so seconds are generous.
  std::chrono::milliseconds handshake_timeout{5000};
  /// A greeted client that holds no memory (no regions, no mapped segments) and has sent nothing
  /// for this long is told so (timed_out) and closed. 0 (the default): never, because a closed
  /// session surprises a client that merely has nothing to allocate yet, and the handshake
  /// deadline already frees the slots of connections that never speak.
  std::chrono::milliseconds idle_timeout{0};
  /// After request_stop(): how long the server keeps answering its clients and flushing the
  /// replies it owes before it gives up on slow readers.
  std::chrono::milliseconds drain_timeout{2000};
  /// Out of descriptors with no reserve left to refuse a connection: how long the listener is
  /// not watched before the server tries again. Above 0.
  std::chrono::milliseconds backoff_interval{100};
};

namespace detail {

/// `o`, once its times lie in 0 ms .. 24 h, backoff_interval is above 0 and its counts are at
/// least 1; otherwise throws carve::Exception (invalid_argument) naming the setting.
inline ServerOptions checked_options(ServerOptions o) {
  using std::chrono::milliseconds;
  const auto check = [](milliseconds v, const char* what) {
    if (v < milliseconds{0} || v > std::chrono::hours{24}) {
      throw Exception(Errc::invalid_argument,
                      std::string(what) + " of " + std::to_string(v.count()) + " ms is outside 0 ms .. 24 h");
    }
  };
  check(o.handshake_timeout, "handshake_timeout");
  check(o.idle_timeout, "idle_timeout");
  check(o.drain_timeout, "drain_timeout");
  check(o.backoff_interval, "backoff_interval");
  if (o.backoff_interval == milliseconds{0}) {
    throw Exception(Errc::invalid_argument, "backoff_interval must be above 0 ms");
  }
  if (o.max_clients == 0 || o.max_queued_replies == 0) {
    throw Exception(Errc::invalid_argument, "max_clients and max_queued_replies must be at least 1");
  }
  return o;
}

} // namespace detail

} // namespace carve::service
