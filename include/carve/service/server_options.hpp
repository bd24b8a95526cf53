/// @file carve/service/server_options.hpp
/// How an AllocationServer listens and whom it serves, and the checks its constructor makes.
#pragma once

#include <carve/core/error.hpp>
#include <carve/service/allocation_service.hpp>
#include <carve/service/unix_socket.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <filesystem>
#include <optional>
#include <string>

namespace carve::service {

/// How an AllocationServer listens and whom it serves. The server's constructor refuses times
/// outside 0 ms .. 24 h and counts of 0 (invalid_argument).
struct ServerOptions {
  std::filesystem::path socket_path = default_socket_path(); ///< where to listen
  ServiceOptions service{};                                  ///< how cards are picked
  std::size_t max_clients = 256;       ///< connections served at once; one more is refused (no_space)
  std::size_t max_queued_replies = 64; ///< per client, before the server stops reading from it
  /// Per client: segment descriptors sent that it may not have read yet. Its next one waits until
  /// it has read everything it was sent (reply_queue.hpp says why: Linux bounds the
  /// descriptors a user has in flight by its RLIMIT_NOFILE). max_clients times this should stay
  /// under the server's descriptor limit; carve-served raises its soft limit to the hard one.
  std::size_t max_unread_descriptors = 64;
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
  if (o.max_clients == 0 || o.max_queued_replies == 0 || o.max_unread_descriptors == 0) {
    throw Exception(Errc::invalid_argument,
                    "max_clients, max_queued_replies and max_unread_descriptors must be at least 1");
  }
  return o;
}

/// The tick on which an AllocationServer checks deadlines: an eighth of the shortest timeout
/// (within 5 ms .. 1 s), or 50 ms for WaitReclaimed deadlines alone.
inline std::chrono::milliseconds deadline_tick(const ServerOptions& o) {
  using std::chrono::milliseconds;
  milliseconds shortest{0};
  for (const auto t : {o.handshake_timeout, o.idle_timeout}) {
    if (t.count() > 0 && (shortest.count() == 0 || t < shortest)) {
      shortest = t;
    }
  }
  return shortest.count() == 0 ? milliseconds{50} : std::clamp(shortest / 8, milliseconds{5}, milliseconds{1000});
}

/// What a connection's deadlines say on a tick.
struct Deadline {
  std::optional<std::string> expired; ///< why it is refused now (timed_out), if it is
  bool watching = false;              ///< a deadline of it may still expire
};

/// The handshake deadline for a connection not `greeted` `since_accepted` ago; the idle one for a
/// greeted connection that `may_idle` (holds no memory and waits for nothing) and last spoke
/// `since_request` ago. A greeted connection is watched while idle_timeout is set.
inline Deadline check_deadline(const ServerOptions& o, bool greeted, bool may_idle,
                               std::chrono::steady_clock::duration since_accepted,
                               std::chrono::steady_clock::duration since_request) {
  if (!greeted) {
    if (o.handshake_timeout.count() > 0 && since_accepted >= o.handshake_timeout) {
      return {"no Hello within " + std::to_string(o.handshake_timeout.count()) + " ms", false};
    }
    return {std::nullopt, true};
  }
  if (o.idle_timeout.count() > 0 && may_idle && since_request >= o.idle_timeout) {
    return {"idle for " + std::to_string(o.idle_timeout.count()) + " ms without holding memory; reconnect to continue",
            false};
  }
  return {std::nullopt, o.idle_timeout.count() > 0};
}

} // namespace detail

} // namespace carve::service
