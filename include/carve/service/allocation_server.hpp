// carve/service/allocation_server.hpp — carve's allocation server: one process owns the cards'
// memory, and applications borrow it through AllocationClient.
//
//   carve::service::ServerOptions options{.socket_path = "/run/user/1000/carve/served.sock"};
//   carve::AllocationServer<carve::SharedMemoryCard> server(topology, cards, options);
//   server.run();                      // until request_stop() (async-signal-safe) is called
//
// An AllocationService behind a Unix-domain SOCK_SEQPACKET socket (carve/service/unix_socket.hpp
// for where it lives and how it is protected), driven by one thread with epoll:
// - each connection's peer credentials (SO_PEERCRED) are recorded; a peer of another user
//   (other than root) is refused, even if the socket's mode was loosened by hand;
// - replies a client does not read in time are queued; a client with too much queued stops being
//   read from until it catches up, so one slow client cannot make the server grow without bound;
// - a client that hangs up or dies has all its regions reclaimed at once;
// - descriptors sent to the server, oversized messages and anything that does not decode get an
//   error reply and a closed connection (unknown message types only an error reply);
// - request_stop() ends run(); the destructor disconnects every client, reclaims everything,
//   removes the socket file and returns all memory to the cards.
// Host-only, Linux (epoll, eventfd, SO_PEERCRED).
#pragma once

#include <carve/core/error.hpp>
#include <carve/mr/segment_export.hpp>
#include <carve/service/allocation_service.hpp>
#include <carve/service/protocol.hpp>
#include <carve/service/unix_socket.hpp>
#include <carve/topology/topology.hpp>

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace carve::service {

struct ServerOptions {
  std::filesystem::path socket_path = default_socket_path();
  ServiceOptions service{};
  std::size_t max_clients = 256;
  std::size_t max_queued_replies = 64; // per client, before the server stops reading from it
};

template <ExportableResource Upstream>
class AllocationServer {
public:
  // Binds the socket. Throws carve::Exception (unsafe directory, another server on the socket,
  // cards that do not match the topology).
  AllocationServer(const Topology& topology, std::vector<Upstream> cards, ServerOptions options = {})
      : options_(std::move(options)), service_(topology, std::move(cards), options_.service),
        listener_(listen_on(options_.socket_path)), stop_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
        epoll_(::epoll_create1(EPOLL_CLOEXEC)) {
    struct stat st {};
    if (!stop_ || !epoll_ || ::stat(options_.socket_path.c_str(), &st) != 0) {
      ::unlink(options_.socket_path.c_str());
      throw Exception(Errc::io_error, "cannot set up the event loop: " + detail::errno_text(errno));
    }
    socket_inode_ = st.st_ino;
    watch(listener_.get(), listener_key, EPOLLIN);
    watch(stop_.get(), stop_key, EPOLLIN);
  }

  AllocationServer(const AllocationServer&) = delete;
  AllocationServer& operator=(const AllocationServer&) = delete;

  ~AllocationServer() {
    // Clients learn why on their next call (best effort: a full socket just closes).
    const auto bye = encode(Reply{ErrorReply{Errc::disconnected, "the server is shutting down"}}, 0);
    std::vector<Outgoing> ignored;
    for (auto& [id, conn] : connections_) {
      (void)send_message(conn.fd.get(), bye, -1, true);
      service_.disconnect(id, ignored);
    }
    connections_.clear();
    // Only our own socket file: another server may have replaced it since.
    struct stat st {};
    if (::stat(options_.socket_path.c_str(), &st) == 0 && st.st_ino == socket_inode_) {
      ::unlink(options_.socket_path.c_str());
    }
  }

  // Serves until request_stop(). Throws std::system_error if epoll itself fails.
  void run() {
    std::array<epoll_event, 64> events{};
    for (;;) {
      const int n = ::epoll_wait(epoll_.get(), events.data(), static_cast<int>(events.size()), -1);
      if (n < 0) {
        if (errno == EINTR) {
          continue;
        }
        throw Exception(Errc::io_error, "epoll_wait: " + detail::errno_text(errno));
      }
      for (int i = 0; i < n; ++i) {
        const epoll_event& e = events[static_cast<std::size_t>(i)];
        if (e.data.u64 == stop_key) {
          std::uint64_t value = 0;
          (void)!::read(stop_.get(), &value, sizeof value);
          return;
        }
        if (e.data.u64 == listener_key) {
          accept_all();
        } else {
          serve(static_cast<ClientId>(e.data.u64), e.events);
        }
      }
    }
  }

  // Makes run() return. Safe to call from a signal handler or another thread.
  void request_stop() noexcept {
    const std::uint64_t one = 1;
    (void)!::write(stop_.get(), &one, sizeof one);
  }

  const std::filesystem::path& socket_path() const noexcept { return options_.socket_path; }
  const AllocationService<Upstream>& service() const noexcept { return service_; }

private:
  static constexpr std::uint64_t listener_key = 0;
  static constexpr std::uint64_t stop_key = ~std::uint64_t{0};

  struct Connection {
    UniqueFd fd;
    std::deque<Outgoing> queue;                 // replies the socket could not take yet
    std::uint32_t armed = EPOLLIN | EPOLLRDHUP; // the events epoll watches for it
    bool closing = false;                       // close once the queue is sent
  };

  void watch(int fd, std::uint64_t key, std::uint32_t events, int op = EPOLL_CTL_ADD) {
    epoll_event e{};
    e.events = events;
    e.data.u64 = key;
    if (::epoll_ctl(epoll_.get(), op, fd, &e) != 0 && op == EPOLL_CTL_ADD) {
      throw Exception(Errc::io_error, "epoll_ctl: " + detail::errno_text(errno));
    }
  }

  void accept_all() {
    for (;;) {
      UniqueFd fd(::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
      if (!fd) {
        return; // EAGAIN, or a connection that vanished before it was accepted
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
      watch(c.fd.get(), id, EPOLLIN | EPOLLRDHUP);
      dispatch(out);
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
  void read_messages(ClientId id) {
    std::vector<Outgoing> out;
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
      if (r.closed || r.error != 0) {
        close(id, out);
        break;
      }
      if (!fds.empty()) {
        service_.reject(id, Errc::bad_message, "the server accepts no descriptors", out);
      } else if (r.truncated) {
        service_.reject(id, Errc::bad_message,
                        "message of " + std::to_string(r.size) + " bytes exceeds the limit of " +
                            std::to_string(max_request_size),
                        out);
      } else {
        service_.receive(id, std::span<const std::uint8_t>(buffer_.data(), r.size), out);
      }
      dispatch(out);
      out.clear();
    }
    dispatch(out);
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
      const int e = send_message(c.fd.get(), o.bytes, o.fd, true);
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
  ino_t socket_inode_ = 0;
  std::unordered_map<ClientId, Connection> connections_;
  std::vector<std::uint8_t> buffer_ = std::vector<std::uint8_t>(max_request_size);
};

} // namespace carve::service

namespace carve {
// The server under carve's own namespace, beside the other building blocks; its options and
// protocol stay in carve::service.
template <ExportableResource Upstream>
using AllocationServer = service::AllocationServer<Upstream>;
} // namespace carve
