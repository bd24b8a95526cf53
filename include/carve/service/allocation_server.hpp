/// @file carve/service/allocation_server.hpp
/// carve's allocation server: one process owns the cards' memory, and applications borrow it
/// through AllocationClient.
///
/// @code
/// carve::service::ServerOptions options{.socket_path = "/run/user/1000/carve/served.sock"};
/// carve::AllocationServer<carve::SharedMemoryCard> server(topology, cards, options);
/// server.run();                      // until request_stop() (async-signal-safe) is called
/// @endcode
///
/// An AllocationService behind a Unix-domain SOCK_SEQPACKET socket (carve/service/unix_socket.hpp
/// for where it lives and how it is protected), driven by one thread with epoll:
/// - each connection's peer credentials (SO_PEERCRED) are recorded; a peer of another user
///   (other than root) is refused, even if the socket's mode was loosened by hand;
/// - replies a client does not read in time are queued; a client with too much queued stops being
///   read from until it catches up, so one slow client cannot make the server grow without bound,
///   nor take every descriptor the server may have in flight: at max_unread_descriptors sent and
///   not read, its next waits until it reads (reply_queue.hpp), retried every 20 ms;
/// - a client that hangs up or dies has all its regions reclaimed at once;
/// - a connection that has not said Hello within handshake_timeout is refused (timed_out) and
///   closed, so silent connections cannot hold the max_clients slots; with idle_timeout set, so
///   is a client that holds no memory and has sent nothing for that long (one holding regions or
///   mappings never is: closing it would take its memory);
/// - out of descriptors (accept4 fails with EMFILE/ENFILE), the server spends a reserve
///   descriptor to accept the waiting connection and refuse it with an error, so the listener
///   does not stay readable and spin the loop; when even that fails it stops watching the
///   listener for backoff_interval;
/// - descriptors sent to the server, oversized messages and anything that does not decode get an
///   error reply and a closed connection (unknown message types, sequence 0 aside, only an error reply);
/// - request_stop() makes run() stop accepting (the socket file goes, new clients see no server),
///   keep answering the clients already connected and send the replies it owes until nothing is
///   left or drain_timeout has passed, then return; the destructor tells every client the server
///   is shutting down, reclaims everything, removes the socket file (unless another server has
///   replaced it) and returns all memory to the cards.
///
/// Host-only, Linux (epoll, eventfd, timerfd, SO_PEERCRED).
#pragma once

#include <carve/core/error.hpp>
#include <carve/mr/segment_export.hpp>
#include <carve/service/allocation_service.hpp>
#include <carve/service/descriptor_reserve.hpp>
#include <carve/service/event_loop.hpp>
#include <carve/service/protocol.hpp>
#include <carve/service/reply_queue.hpp>
#include <carve/service/server_options.hpp>
#include <carve/service/unix_socket.hpp>
#include <carve/topology/topology.hpp>

#include <sys/epoll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace carve::service {

/// carve's allocation server over `Upstream` cards, lending between those `Peers` allows (see
/// the file's description and AllocationService). run() on one thread; request_stop() from
/// anywhere; the accessors while run() is not running elsewhere.
template <ExportableResource Upstream, PeerAccess Peers = LendingPeers<Upstream>>
class AllocationServer {
public:
  /// Binds the socket. Throws carve::Exception: invalid_argument (options out of range, cards
  /// that do not match the topology, a bad socket path), permission_denied (an unsafe socket
  /// directory, another server on the socket), io_error (the system refused a socket, epoll or
  /// timer); AllocationService's errors (`peers` as there).
  AllocationServer(const Topology& topology, std::vector<Upstream> cards, ServerOptions options = {},
                   std::optional<Peers> peers = std::nullopt)
      : options_(detail::checked_options(std::move(options))),
        service_(topology, std::move(cards), options_.service, std::move(peers)),
        listener_(listen_on(options_.socket_path)) {
    struct stat st {};
    if (!stop_ || !epoll_ || !tick_ || !backoff_ || !reserve_ || ::stat(options_.socket_path.c_str(), &st) != 0) {
      const int e = errno;
      ::unlink(options_.socket_path.c_str());
      throw Exception(Errc::io_error, "cannot set up the event loop: " + detail::errno_text(e));
    }
    socket_inode_ = st.st_ino;
    epoll_.watch(listener_.get(), listener_key, EPOLLIN);
    epoll_.watch(stop_.get(), stop_key, EPOLLIN);
    epoll_.watch(tick_.get(), tick_key, EPOLLIN);
    epoll_.watch(backoff_.get(), backoff_key, EPOLLIN);
  }

  AllocationServer(const AllocationServer&) = delete;
  AllocationServer& operator=(const AllocationServer&) = delete;

  /// Tells every client the server is shutting down (best effort), reclaims everything, returns
  /// all memory to the cards and removes the socket file if it is still this server's.
  ~AllocationServer() {
    // Clients learn why on their next call (best effort: a full socket just closes).
    const auto bye = encode(Reply{ErrorReply{Errc::disconnected, "the server is shutting down"}}, 0);
    std::vector<Outgoing> ignored;
    for (auto& [id, conn] : connections_) {
      (void)send_message(conn.fd.get(), bye, -1, true);
      service_.disconnect(id, ignored);
    }
    connections_.clear();
    remove_socket_file();
  }

  /// Serves until request_stop(), then drains (see the file's description) and returns. Throws
  /// carve::Exception (io_error) if epoll itself fails.
  void run() {
    detail::Epoll::Events events{};
    while (!stopping_) {
      const int n = epoll_.wait(events, -1);
      for (int i = 0; i < n; ++i) {
        handle(events[static_cast<std::size_t>(i)]);
      }
    }
    drain(events);
  }

  /// Makes run() stop accepting, drain and return (at once, if called before run()). Safe to call
  /// from a signal handler or another thread.
  void request_stop() noexcept { stop_.signal(); }

  /// Where it listens (until run() returns).
  const std::filesystem::path& socket_path() const noexcept { return options_.socket_path; }
  /// The clients, regions and cards, for stats and tests.
  const AllocationService<Upstream, Peers>& service() const noexcept { return service_; }
  /// As given, once checked.
  const ServerOptions& options() const noexcept { return options_; }
  /// Connections refused because the server had run out of descriptors, since it started.
  std::uint64_t refused_for_descriptors() const noexcept { return reserve_.refused(); }

private:
  static constexpr std::uint64_t listener_key = 0;
  static constexpr std::uint64_t stop_key = ~std::uint64_t{0};
  static constexpr std::uint64_t tick_key = ~std::uint64_t{0} - 1;
  static constexpr std::uint64_t backoff_key = ~std::uint64_t{0} - 2;
  using Clock = std::chrono::steady_clock;

  struct Connection {
    UniqueFd fd;
    detail::ReplyQueue queue;                   // replies the socket did not take yet, or held back
    std::uint32_t armed = EPOLLIN | EPOLLRDHUP; // the events epoll watches for it
    bool closing = false;                       // close once the queue is sent
    Clock::time_point accepted{};
    Clock::time_point last_request{};
  };

  void handle(const epoll_event& e) {
    switch (e.data.u64) {
    case stop_key: {
      stop_.consume();
      stopping_ = true;
      return;
    }
    case listener_key:
      accept_all();
      return;
    case tick_key:
      expire();
      return;
    case backoff_key: {
      backoff_.consume();
      if (listener_ && paused_) {
        paused_ = false;
        epoll_.watch(listener_.get(), listener_key, EPOLLIN, EPOLL_CTL_MOD);
        accept_all();
      }
      return;
    }
    default:
      serve(static_cast<ClientId>(e.data.u64), e.events);
    }
  }

  void accept_all() {
    while (listener_ && !paused_) {
      UniqueFd fd(::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
      if (!fd) {
        const int e = errno;
        if (e == EINTR || e == ECONNABORTED) {
          continue;
        }
        if (e == EMFILE || e == ENFILE) {
          // accept4 fails so even with nobody waiting: the descriptor is taken first.
          using Refusal = detail::DescriptorReserve::Refusal;
          const Refusal r = reserve_.refuse_one(listener_.get(), e);
          if (r == Refusal::refused) {
            continue;
          }
          if (r == Refusal::nobody_waiting) {
            return;
          }
        }
        if (e != EAGAIN && e != EWOULDBLOCK) {
          pause_accepting(); // out of descriptors without a reserve, or out of kernel memory
        }
        return;
      }
      const auto peer = peer_credentials(fd.get());
      const ClientId id = service_.connect(peer.value_or(PeerCredentials{}));
      std::vector<Outgoing> out;
      if (!peer) {
        service_.reject(id, Errc::permission_denied, "cannot read the client's credentials", out);
      } else if (peer->uid != ::geteuid() && peer->uid != 0) {
        service_.reject(id, Errc::permission_denied,
                        "uid " + std::to_string(peer->uid) + " may not use this server (it serves uid " +
                            std::to_string(::geteuid()) + ")",
                        out);
      } else if (connections_.size() >= options_.max_clients) {
        service_.reject(id, Errc::no_space,
                        "the server has reached its limit of " + std::to_string(options_.max_clients) + " clients",
                        out);
      }
      Connection& c = connections_[id];
      c.fd = std::move(fd);
      c.accepted = c.last_request = Clock::now();
      epoll_.watch(c.fd.get(), id, EPOLLIN | EPOLLRDHUP);
      start_ticking();
      dispatch(out);
    }
  }

  void pause_accepting() {
    paused_ = true;
    epoll_.watch(listener_.get(), listener_key, 0, EPOLL_CTL_MOD);
    backoff_.arm_once(options_.backoff_interval);
  }

  // The deadlines (handshakes, idleness, WaitReclaimed) are checked, and queues held back
  // retried, on a periodic tick, and only while something could expire or is held back: an idle
  // server does not wake up.
  std::chrono::milliseconds tick_interval() const {
    if (any_held_back()) {
      return std::chrono::milliseconds{20}; // a client that has read its descriptors gets the next soon
    }
    return detail::deadline_tick(options_);
  }
  // Ticks at tick_interval() while anything needs it (a tick slower than that is re-armed).
  void start_ticking() {
    const auto interval = tick_interval();
    const bool ticking = tick_.period().count() != 0;
    if ((ticking && interval >= tick_.period()) ||
        (options_.handshake_timeout.count() == 0 && options_.idle_timeout.count() == 0 && !service_.waits_pending() &&
         !any_held_back())) {
      return;
    }
    (void)tick_.arm_every(interval);
  }

  void expire() {
    tick_.consume();
    const auto now = Clock::now();
    std::vector<Outgoing> out;
    std::vector<ClientId> ids;
    bool watching = false;
    retry_held_back();
    for (const auto& [id, c] : connections_) {
      if (!c.closing) {
        ids.push_back(id);
      }
    }
    for (const ClientId id : ids) {
      const auto it = connections_.find(id);
      if (it == connections_.end()) {
        continue;
      }
      const Connection& c = it->second;
      const bool may_idle = service_.greeted(id) && !service_.holds_memory(id) && !service_.waiting(id);
      const detail::Deadline d =
          detail::check_deadline(options_, service_.greeted(id), may_idle, now - c.accepted, now - c.last_request);
      if (d.expired) {
        service_.reject(id, Errc::timed_out, *d.expired, out);
      }
      watching = watching || d.watching;
      dispatch(out);
    }
    service_.expire_waits(now, out);
    dispatch(out);
    if (!watching && !service_.waits_pending() && !any_held_back()) { // a dispatch above may hold one back
      tick_.disarm();
    } else if (tick_interval() > tick_.period()) { // nothing held back any more
      (void)tick_.arm_every(tick_interval());
    }
  }

  void serve(ClientId id, std::uint32_t events) {
    const auto it = connections_.find(id);
    if (it == connections_.end()) {
      return;
    }
    if ((events & (EPOLLHUP | EPOLLERR)) != 0) { // gone both ways: nothing can be delivered
      std::vector<Outgoing> out;
      close(id, out);
      dispatch(out);
      return;
    }
    if ((events & EPOLLOUT) != 0) {
      flush(id, it->second);
    }
    if ((events & (EPOLLIN | EPOLLRDHUP)) != 0) {
      read_messages(id);
    }
  }

  // Reads what the client sent, a bounded number of messages per wake-up so that one busy
  // client cannot starve the others (epoll is level-triggered: the rest comes next round).
  // Returns how many messages were read (a closed connection counts as one).
  int read_messages(ClientId id) {
    std::vector<Outgoing> out;
    int read = 0;
    for (int budget = 32; budget > 0; --budget) {
      const auto it = connections_.find(id);
      if (it == connections_.end() || it->second.closing || (it->second.armed & EPOLLIN) == 0) {
        break;
      }
      std::vector<UniqueFd> fds;
      const ReceivedMessage r = receive_message(it->second.fd.get(), buffer_, fds, true);
      if (r.error == EAGAIN || r.error == EWOULDBLOCK) {
        break;
      }
      ++read;
      if (r.closed || r.error != 0) {
        close(id, out);
        break;
      }
      it->second.last_request = Clock::now();
      if (!fds.empty()) {
        service_.reject(id, Errc::bad_message, "the server accepts no descriptors", out);
      } else if (r.truncated) {
        service_.reject(id, Errc::bad_message,
                        "message of " + std::to_string(r.size) + " bytes exceeds the limit of " +
                            std::to_string(max_request_size),
                        out);
      } else {
        service_.receive(id, std::span<const std::uint8_t>(buffer_.data(), r.size), out);
        if (service_.waits_pending()) {
          start_ticking();
        }
      }
      dispatch(out);
      out.clear();
    }
    dispatch(out);
    return read;
  }

  // After request_stop(): no new clients; requests that already arrived are answered and owed
  // replies flushed, until nothing is left or drain_timeout passes.
  void drain(detail::Epoll::Events& events) {
    if (listener_) {
      epoll_.unwatch(listener_.get());
      listener_.reset();
      remove_socket_file();
    }
    const auto deadline = Clock::now() + options_.drain_timeout;
    for (;;) {
      // A client whose queue is empty has had everything it asked for once its socket is empty.
      int read = 0;
      std::vector<ClientId> ids;
      for (const auto& [id, c] : connections_) {
        ids.push_back(id);
      }
      for (const ClientId id : ids) {
        read += read_messages(id);
      }
      const bool owed = std::any_of(connections_.begin(), connections_.end(),
                                    [](const auto& entry) { return !entry.second.queue.empty(); });
      if (read == 0 && !owed) {
        return;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) {
        return;
      }
      if (owed) {
        const int n = epoll_.wait(events, static_cast<int>(std::min<std::int64_t>(left.count(), 100)));
        for (int i = 0; i < n; ++i) {
          const epoll_event& e = events[static_cast<std::size_t>(i)];
          if (e.data.u64 == tick_key) {
            expire();
          } else if (e.data.u64 != stop_key && e.data.u64 != backoff_key && e.data.u64 != listener_key) {
            serve(static_cast<ClientId>(e.data.u64), e.events);
          }
        }
      }
    }
  }

  void remove_socket_file() {
    // Only our own socket file: another server may have replaced it since.
    struct stat st {};
    if (::stat(options_.socket_path.c_str(), &st) == 0 && st.st_ino == socket_inode_) {
      ::unlink(options_.socket_path.c_str());
    }
  }

  // Sends what the service produced, queueing what a socket cannot take now.
  void dispatch(std::vector<Outgoing>& out) {
    for (Outgoing& o : out) {
      const auto it = connections_.find(o.to);
      if (it == connections_.end() || it->second.closing) {
        continue;
      }
      const ClientId to = o.to;
      const bool close_after = o.close_after;
      it->second.queue.push(std::move(o));
      // An error that ends the connection: nothing more is read from it or sent to it, and no
      // deadline rejects it again while that error waits for room in its socket.
      it->second.closing = it->second.closing || close_after;
      flush(to, it->second);
    }
    out.clear();
  }

  void flush(ClientId id, Connection& c) {
    if (c.queue.send(c.fd.get(), options_.max_unread_descriptors) == detail::ReplyQueue::Stop::ended) {
      c.closing = true;
    }
    if (c.closing && c.queue.empty()) {
      std::vector<Outgoing> out;
      close(id, out);
      dispatch(out);
      return;
    }
    // A client that does not read its replies is not read from until it does; the socket is
    // watched for room while replies wait, and the tick retries a queue held back.
    const std::uint32_t want =
        (c.queue.size() < options_.max_queued_replies && !c.closing ? EPOLLIN | EPOLLRDHUP : 0u) |
        (c.queue.empty() || c.queue.held_back() ? 0u : EPOLLOUT);
    if (want != c.armed) {
      c.armed = want;
      epoll_.watch(c.fd.get(), id, want, EPOLL_CTL_MOD);
    }
    if (c.queue.held_back()) {
      start_ticking();
    }
  }

  // Flushes every queue held back.
  void retry_held_back() {
    std::vector<ClientId> ids;
    for (const auto& [id, c] : connections_) {
      if (c.queue.held_back()) {
        ids.push_back(id);
      }
    }
    for (const ClientId id : ids) {
      if (const auto it = connections_.find(id); it != connections_.end()) {
        flush(id, it->second);
      }
    }
  }
  bool any_held_back() const {
    return std::any_of(connections_.begin(), connections_.end(),
                       [](const auto& entry) { return entry.second.queue.held_back(); });
  }

  void close(ClientId id, std::vector<Outgoing>& out) {
    const auto it = connections_.find(id);
    if (it == connections_.end()) {
      return;
    }
    epoll_.unwatch(it->second.fd.get());
    connections_.erase(it);
    service_.disconnect(id, out);
  }

  ServerOptions options_;
  AllocationService<Upstream, Peers> service_;
  UniqueFd listener_;
  detail::EventFd stop_;
  detail::Epoll epoll_;
  detail::TimerFd tick_;              // deadlines of connections, queues held back
  detail::TimerFd backoff_;           // re-watch the listener after running out of descriptors
  detail::DescriptorReserve reserve_; // /dev/null, given up to refuse a connection when descriptors run out
  ino_t socket_inode_ = 0;
  bool stopping_ = false;
  bool paused_ = false;
  std::unordered_map<ClientId, Connection> connections_;
  std::vector<std::uint8_t> buffer_ = std::vector<std::uint8_t>(max_request_size);
};

} // namespace carve::service

namespace carve {
/// The server under carve's own namespace, beside the other building blocks; its options and
/// protocol stay in carve::service.
template <ExportableResource Upstream, PeerAccess Peers = LendingPeers<Upstream>>
using AllocationServer = service::AllocationServer<Upstream, Peers>;
} // namespace carve
