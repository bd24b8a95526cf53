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
///   read from until it catches up, so one slow client cannot make the server grow without bound;
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
///   error reply and a closed connection (unknown message types only an error reply);
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
#include <carve/service/protocol.hpp>
#include <carve/service/unix_socket.hpp>
#include <carve/topology/topology.hpp>

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

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

/// carve's allocation server over `Upstream` cards (see the file's description). run() on one
/// thread; request_stop() from anywhere; the accessors while run() is not running elsewhere.
template <ExportableResource Upstream>
class AllocationServer {
public:
  /// Binds the socket. Throws carve::Exception: invalid_argument (options out of range, cards
  /// that do not match the topology, a bad socket path), permission_denied (an unsafe socket
  /// directory, another server on the socket), io_error (the system refused a socket, epoll or
  /// timer).
  AllocationServer(const Topology& topology, std::vector<Upstream> cards, ServerOptions options = {})
      : options_(checked(std::move(options))), service_(topology, std::move(cards), options_.service),
        listener_(listen_on(options_.socket_path)), stop_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
        epoll_(::epoll_create1(EPOLL_CLOEXEC)), tick_(::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK)),
        backoff_(::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK)),
        reserve_(::open("/dev/null", O_RDONLY | O_CLOEXEC)) {
    struct stat st {};
    if (!stop_ || !epoll_ || !tick_ || !backoff_ || !reserve_ || ::stat(options_.socket_path.c_str(), &st) != 0) {
      const int e = errno;
      ::unlink(options_.socket_path.c_str());
      throw Exception(Errc::io_error, "cannot set up the event loop: " + detail::errno_text(e));
    }
    socket_inode_ = st.st_ino;
    watch(listener_.get(), listener_key, EPOLLIN);
    watch(stop_.get(), stop_key, EPOLLIN);
    watch(tick_.get(), tick_key, EPOLLIN);
    watch(backoff_.get(), backoff_key, EPOLLIN);
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
    std::array<epoll_event, 64> events{};
    while (!stopping_) {
      const int n = wait(events, -1);
      for (int i = 0; i < n; ++i) {
        handle(events[static_cast<std::size_t>(i)]);
      }
    }
    drain(events);
  }

  /// Makes run() stop accepting, drain and return (at once, if called before run()). Safe to call
  /// from a signal handler or another thread.
  void request_stop() noexcept {
    const std::uint64_t one = 1;
    (void)!::write(stop_.get(), &one, sizeof one);
  }

  /// Where it listens (until run() returns).
  const std::filesystem::path& socket_path() const noexcept { return options_.socket_path; }
  /// The clients, regions and cards, for stats and tests.
  const AllocationService<Upstream>& service() const noexcept { return service_; }
  /// As given, once checked.
  const ServerOptions& options() const noexcept { return options_; }
  /// Connections refused because the server had run out of descriptors, since it started.
  std::uint64_t refused_for_descriptors() const noexcept { return refused_for_descriptors_; }

private:
  static constexpr std::uint64_t listener_key = 0;
  static constexpr std::uint64_t stop_key = ~std::uint64_t{0};
  static constexpr std::uint64_t tick_key = ~std::uint64_t{0} - 1;
  static constexpr std::uint64_t backoff_key = ~std::uint64_t{0} - 2;
  using Clock = std::chrono::steady_clock;

  struct Connection {
    UniqueFd fd;
    std::deque<Outgoing> queue;                 // replies the socket could not take yet
    std::uint32_t armed = EPOLLIN | EPOLLRDHUP; // the events epoll watches for it
    bool closing = false;                       // close once the queue is sent
    Clock::time_point accepted{};
    Clock::time_point last_request{};
  };

  static ServerOptions checked(ServerOptions o) {
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

  int wait(std::array<epoll_event, 64>& events, int timeout_ms) {
    for (;;) {
      const int n = ::epoll_wait(epoll_.get(), events.data(), static_cast<int>(events.size()), timeout_ms);
      if (n >= 0) {
        return n;
      }
      if (errno != EINTR) {
        throw Exception(Errc::io_error, "epoll_wait: " + detail::errno_text(errno));
      }
    }
  }

  void handle(const epoll_event& e) {
    switch (e.data.u64) {
    case stop_key: {
      std::uint64_t value = 0;
      (void)!::read(stop_.get(), &value, sizeof value);
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
      std::uint64_t expirations = 0;
      (void)!::read(backoff_.get(), &expirations, sizeof expirations);
      if (listener_ && paused_) {
        paused_ = false;
        watch(listener_.get(), listener_key, EPOLLIN, EPOLL_CTL_MOD);
        accept_all();
      }
      return;
    }
    default:
      serve(static_cast<ClientId>(e.data.u64), e.events);
    }
  }

  void watch(int fd, std::uint64_t key, std::uint32_t events, int op = EPOLL_CTL_ADD) {
    epoll_event e{};
    e.events = events;
    e.data.u64 = key;
    if (::epoll_ctl(epoll_.get(), op, fd, &e) != 0 && op == EPOLL_CTL_ADD) {
      throw Exception(Errc::io_error, "epoll_ctl: " + detail::errno_text(errno));
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
          const Refusal r = refuse_for_descriptors(e);
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
      watch(c.fd.get(), id, EPOLLIN | EPOLLRDHUP);
      start_ticking();
      dispatch(out);
    }
  }

  // The process is out of descriptors and a client waits: free the reserve, accept that client,
  // tell it why it is refused, close it and take the reserve back. Without this the listener
  // stays readable and epoll reports it again at once, forever.
  enum class Refusal { refused, nobody_waiting, no_reserve };
  Refusal refuse_for_descriptors(int error) {
    if (!reserve_) { // another thread of the process took the slot last time
      reserve_.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
      return Refusal::no_reserve;
    }
    reserve_.reset();
    UniqueFd fd(::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    const bool accepted = static_cast<bool>(fd);
    if (accepted) {
      ++refused_for_descriptors_;
      const auto why = encode(
          Reply{ErrorReply{Errc::no_space, "carve-served has run out of file descriptors (" +
                                               detail::errno_text(error) + "); try again when clients have left"}},
          0);
      (void)send_message(fd.get(), why, -1, true);
      fd.reset();
    }
    reserve_.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    if (!reserve_) {
      return Refusal::no_reserve;
    }
    return accepted ? Refusal::refused : Refusal::nobody_waiting;
  }

  void pause_accepting() {
    paused_ = true;
    watch(listener_.get(), listener_key, 0, EPOLL_CTL_MOD);
    itimerspec t{};
    t.it_value = timespec_of(options_.backoff_interval);
    ::timerfd_settime(backoff_.get(), 0, &t, nullptr);
  }

  static timespec timespec_of(std::chrono::milliseconds ms) {
    timespec t{};
    t.tv_sec = static_cast<time_t>(ms.count() / 1000);
    t.tv_nsec = static_cast<long>(ms.count() % 1000) * 1000000L;
    return t;
  }

  // The deadlines (handshakes, idleness, WaitReclaimed) are checked on a periodic tick, a
  // fraction of the shortest timeout, and only while something could expire: an idle server
  // does not wake up.
  std::chrono::milliseconds tick_interval() const {
    std::chrono::milliseconds shortest{0};
    for (const auto t : {options_.handshake_timeout, options_.idle_timeout}) {
      if (t.count() > 0 && (shortest.count() == 0 || t < shortest)) {
        shortest = t;
      }
    }
    return shortest.count() == 0
               ? std::chrono::milliseconds{50} // WaitReclaimed deadlines alone
               : std::clamp(shortest / 8, std::chrono::milliseconds{5}, std::chrono::milliseconds{1000});
  }
  void start_ticking() {
    if (ticking_ ||
        (options_.handshake_timeout.count() == 0 && options_.idle_timeout.count() == 0 && !service_.waits_pending())) {
      return;
    }
    const auto interval = tick_interval();
    itimerspec t{};
    t.it_value = t.it_interval = timespec_of(interval);
    ticking_ = ::timerfd_settime(tick_.get(), 0, &t, nullptr) == 0;
  }

  void expire() {
    std::uint64_t expirations = 0;
    (void)!::read(tick_.get(), &expirations, sizeof expirations);
    const auto now = Clock::now();
    std::vector<Outgoing> out;
    std::vector<ClientId> ids;
    bool watching = false;
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
      if (!service_.greeted(id)) {
        if (options_.handshake_timeout.count() > 0 && now - c.accepted >= options_.handshake_timeout) {
          service_.reject(id, Errc::timed_out,
                          "no Hello within " + std::to_string(options_.handshake_timeout.count()) + " ms", out);
        } else {
          watching = true;
        }
      } else if (options_.idle_timeout.count() > 0 && !service_.holds_memory(id)) {
        if (now - c.last_request >= options_.idle_timeout) {
          service_.reject(id, Errc::timed_out,
                          "idle for " + std::to_string(options_.idle_timeout.count()) +
                              " ms without holding memory; reconnect to continue",
                          out);
        } else {
          watching = true;
        }
      } else if (options_.idle_timeout.count() > 0) {
        watching = true;
      }
      dispatch(out);
    }
    service_.expire_waits(now, out);
    dispatch(out);
    if (!watching && !service_.waits_pending()) {
      itimerspec off{};
      ::timerfd_settime(tick_.get(), 0, &off, nullptr);
      ticking_ = false;
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
  void drain(std::array<epoll_event, 64>& events) {
    if (listener_) {
      ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, listener_.get(), nullptr);
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
        const int n = wait(events, static_cast<int>(std::min<std::int64_t>(left.count(), 100)));
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
      it->second.queue.push_back(std::move(o));
      flush(to, it->second);
    }
    out.clear();
  }

  void flush(ClientId id, Connection& c) {
    while (!c.queue.empty()) {
      Outgoing& o = c.queue.front();
      const int e = send_message(c.fd.get(), o.bytes, o.fd.get(), true);
      if (e == EAGAIN || e == EWOULDBLOCK) {
        break;
      }
      const bool close_after = o.close_after;
      c.queue.pop_front();
      if (e != 0 || close_after) {
        c.closing = true;
        c.queue.clear();
      }
    }
    if (c.closing && c.queue.empty()) {
      std::vector<Outgoing> out;
      close(id, out);
      dispatch(out);
      return;
    }
    // A client that does not read its replies is not read from until it does; the socket is
    // watched for room while replies wait.
    const std::uint32_t want =
        (c.queue.size() < options_.max_queued_replies && !c.closing ? EPOLLIN | EPOLLRDHUP : 0u) |
        (c.queue.empty() ? 0u : EPOLLOUT);
    if (want != c.armed) {
      c.armed = want;
      watch(c.fd.get(), id, want, EPOLL_CTL_MOD);
    }
  }

  void close(ClientId id, std::vector<Outgoing>& out) {
    const auto it = connections_.find(id);
    if (it == connections_.end()) {
      return;
    }
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, it->second.fd.get(), nullptr);
    connections_.erase(it);
    service_.disconnect(id, out);
  }

  ServerOptions options_;
  AllocationService<Upstream> service_;
  UniqueFd listener_;
  UniqueFd stop_;
  UniqueFd epoll_;
  UniqueFd tick_;    // deadlines of connections
  UniqueFd backoff_; // re-watch the listener after running out of descriptors
  UniqueFd reserve_; // /dev/null, given up to refuse a connection when descriptors run out
  ino_t socket_inode_ = 0;
  bool stopping_ = false;
  bool ticking_ = false;
  bool paused_ = false;
  std::uint64_t refused_for_descriptors_ = 0;
  std::unordered_map<ClientId, Connection> connections_;
  std::vector<std::uint8_t> buffer_ = std::vector<std::uint8_t>(max_request_size);
};

} // namespace carve::service

namespace carve {
/// The server under carve's own namespace, beside the other building blocks; its options and
/// protocol stay in carve::service.
template <ExportableResource Upstream>
using AllocationServer = service::AllocationServer<Upstream>;
} // namespace carve
