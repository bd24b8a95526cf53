/// @file carve/service/unix_socket.hpp
/// The Unix-domain socket under carve's allocation service: where it lives, how it is made safe,
/// and sending and receiving one message with descriptors.
///
/// Safety rules for the server's socket (listen_on):
/// - its directory must be a real directory (not a symlink) owned by the server's user and not
///   writable by group or others; a missing directory is created with mode 0700;
/// - the socket file is created owner-only (0600) and checked after bind;
/// - a socket file left by a dead server is replaced; one a live server answers on is not.
///
/// SOCK_SEQPACKET keeps message boundaries, so one message is one send and descriptors
/// (SCM_RIGHTS) travel with the message they belong to. Also the service manager's readiness
/// notification (connect_notify_socket). Linux only (SO_PEERCRED, MSG_CMSG_CLOEXEC).
#pragma once

#include <carve/core/error.hpp>

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace carve::service {

/// Owns a file descriptor: closes it when destroyed or reset. Move-only; empty holds -1.
class UniqueFd {
public:
  /// Empty.
  UniqueFd() = default;
  /// Takes over `fd` (-1: empty).
  explicit UniqueFd(int fd) noexcept : fd_(fd) {}
  /// Takes `o`'s descriptor, leaving `o` empty.
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  /// Closes its own descriptor, then takes `o`'s.
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) {
      reset(std::exchange(o.fd_, -1));
    }
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  /// The descriptor, still owned; -1 when empty.
  int get() const noexcept { return fd_; }
  /// Whether it holds a descriptor.
  explicit operator bool() const noexcept { return fd_ >= 0; }
  /// Gives up the descriptor without closing it (the caller closes it now).
  int release() noexcept { return std::exchange(fd_, -1); }
  /// Closes the descriptor held, then holds `fd`.
  void reset(int fd = -1) noexcept {
    if (fd_ >= 0) {
      ::close(fd_);
    }
    fd_ = fd;
  }

private:
  int fd_ = -1;
};

/// Who is at the other end of a connection, as the kernel saw it at connect (SO_PEERCRED).
struct PeerCredentials {
  std::uint32_t pid = 0; ///< its process
  std::uint32_t uid = 0; ///< its effective user
  std::uint32_t gid = 0; ///< its effective group
};

/// `$CARVE_SOCKET` if set; else `$XDG_RUNTIME_DIR/carve/served.sock`; else
/// `/tmp/carve-<uid>/served.sock`.
inline std::filesystem::path default_socket_path() {
  if (const char* s = std::getenv("CARVE_SOCKET"); s != nullptr && *s != '\0') {
    return s;
  }
  if (const char* run = std::getenv("XDG_RUNTIME_DIR"); run != nullptr && *run != '\0') {
    return std::filesystem::path(run) / "carve" / "served.sock";
  }
  return std::filesystem::path("/tmp") / ("carve-" + std::to_string(::geteuid())) / "served.sock";
}

namespace detail {

inline std::string errno_text(int e) { return std::strerror(e); }

inline std::optional<sockaddr_un> unix_address(const std::filesystem::path& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string& s = path.native();
  if (s.empty() || s.size() >= sizeof addr.sun_path) {
    return std::nullopt;
  }
  std::memcpy(addr.sun_path, s.c_str(), s.size() + 1);
  return addr;
}

inline int connect_raw(int fd, const sockaddr_un& addr) {
  while (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    if (errno != EINTR) {
      return errno;
    }
  }
  return 0;
}

} // namespace detail

/// Checks (and if missing creates, 0700) the directory a server socket goes in; "" is the current
/// directory. Throws carve::Exception saying what is wrong: permission_denied (not a directory,
/// another user's, writable by group or others), io_error (cannot be read or created).
inline void prepare_socket_directory(const std::filesystem::path& dir) {
  const std::string d = dir.empty() ? std::string(".") : dir.string();
  struct stat st {};
  if (::lstat(d.c_str(), &st) != 0) {
    if (errno != ENOENT || ::mkdir(d.c_str(), 0700) != 0 || ::lstat(d.c_str(), &st) != 0) {
      throw Exception(Errc::io_error, "socket directory " + d + ": " + detail::errno_text(errno));
    }
  }
  if (!S_ISDIR(st.st_mode)) {
    throw Exception(Errc::permission_denied,
                    "socket directory " + d + " is not a directory (symbolic links are not followed)");
  }
  if (st.st_uid != ::geteuid()) {
    throw Exception(Errc::permission_denied, "socket directory " + d + " belongs to uid " + std::to_string(st.st_uid) +
                                                 ", not to this server's uid " + std::to_string(::geteuid()));
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    throw Exception(Errc::permission_denied, "socket directory " + d + " is writable by group or others (mode " + mode +
                                                 "); use a directory only this user can write");
  }
}

/// A listening, non-blocking SOCK_SEQPACKET socket at `path`, following the file's rules. Throws
/// carve::Exception: invalid_argument (a path empty or too long, a file there that is no socket),
/// permission_denied (an unsafe directory, a live server already there), io_error (a system call
/// failed, the socket file could not be made owner-only).
inline UniqueFd listen_on(const std::filesystem::path& path, int backlog = 128) {
  const auto addr = detail::unix_address(path);
  if (!addr) {
    throw Exception(Errc::invalid_argument, "socket path '" + path.string() + "' is empty or longer than " +
                                                std::to_string(sizeof(sockaddr_un::sun_path) - 1) + " bytes");
  }
  prepare_socket_directory(path.parent_path());
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      throw Exception(Errc::invalid_argument, path.string() + " exists and is not a socket");
    }
    UniqueFd probe(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    const int e = probe ? detail::connect_raw(probe.get(), *addr) : errno;
    if (e == 0) {
      throw Exception(Errc::permission_denied, "another server is already listening on " + path.string());
    }
    if (e != ECONNREFUSED && e != ENOENT) {
      throw Exception(Errc::io_error,
                      "cannot check the existing socket " + path.string() + ": " + detail::errno_text(e));
    }
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) { // left by a server that died
      throw Exception(Errc::io_error,
                      "cannot remove the stale socket " + path.string() + ": " + detail::errno_text(errno));
    }
  }
  UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd) {
    throw Exception(Errc::io_error, std::string("socket(): ") + detail::errno_text(errno));
  }
  // On Linux the socket file takes the socket inode's mode: set it before bind, so the file is
  // never more open than 0600, whatever the umask.
  ::fchmod(fd.get(), S_IRUSR | S_IWUSR);
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&*addr), sizeof *addr) != 0) {
    throw Exception(Errc::io_error, "bind " + path.string() + ": " + detail::errno_text(errno));
  }
  if (::chmod(path.c_str(), S_IRUSR | S_IWUSR) != 0 || ::lstat(path.c_str(), &st) != 0 || (st.st_mode & 0777) != 0600 ||
      st.st_uid != ::geteuid()) {
    ::unlink(path.c_str());
    throw Exception(Errc::io_error, "cannot make " + path.string() + " owner-only (0600)");
  }
  if (::listen(fd.get(), backlog) != 0) {
    ::unlink(path.c_str());
    throw Exception(Errc::io_error, "listen " + path.string() + ": " + detail::errno_text(errno));
  }
  return fd;
}

/// A blocking connection to the server at `path`. Errors: disconnected (nothing there, or it
/// refused), permission_denied (the socket is another user's), invalid_size (a path empty or too
/// long for a socket address).
[[nodiscard]] inline Result<UniqueFd> connect_to(const std::filesystem::path& path) {
  const auto addr = detail::unix_address(path);
  if (!addr) {
    return fail(Errc::invalid_size, "socket path '" + path.string() + "' is empty or too long");
  }
  UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!fd) {
    return fail(Errc::disconnected, std::string("socket(): ") + detail::errno_text(errno));
  }
  const int e = detail::connect_raw(fd.get(), *addr);
  switch (e) {
  case 0:
    return fd;
  case ENOENT:
    return fail(Errc::disconnected, "no carve-served socket at " + path.string() + " (is the server running?)");
  case ECONNREFUSED:
    return fail(Errc::disconnected, "nothing listens on " + path.string() + " (the server has stopped)");
  case EACCES:
  case EPERM:
    return fail(Errc::permission_denied,
                "permission denied for " + path.string() + " (the server belongs to another user)");
  default:
    return fail(Errc::disconnected, "connect " + path.string() + ": " + detail::errno_text(e));
  }
}

/// The peer of connected socket `fd`; nullopt when the kernel does not say.
inline std::optional<PeerCredentials> peer_credentials(int fd) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || len != sizeof cred) {
    return std::nullopt;
  }
  return PeerCredentials{static_cast<std::uint32_t>(cred.pid), static_cast<std::uint32_t>(cred.uid),
                         static_cast<std::uint32_t>(cred.gid)};
}

/// Sends one message, with `pass_fd` attached (SCM_RIGHTS, a copy: the caller still owns it) when
/// it is not -1. Returns 0 or an errno value (EAGAIN when `dont_wait` and the socket is full; EPIPE
/// when the peer is gone; EMSGSIZE when only part was sent). Never raises SIGPIPE.
inline int send_message(int fd, std::span<const std::uint8_t> bytes, int pass_fd = -1, bool dont_wait = false) {
  iovec iov{const_cast<std::uint8_t*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (pass_fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
  }
  const int flags = MSG_NOSIGNAL | (dont_wait ? MSG_DONTWAIT : 0);
  for (;;) {
    const ssize_t n = ::sendmsg(fd, &msg, flags);
    if (n >= 0) {
      return static_cast<std::size_t>(n) == bytes.size() ? 0 : EMSGSIZE;
    }
    if (errno != EINTR) {
      return errno;
    }
  }
}

/// What receive_message found.
struct ReceivedMessage {
  std::size_t size = 0;   ///< the message's real size (may exceed the buffer: see truncated)
  bool truncated = false; ///< larger than the buffer (or too many descriptors); the rest is lost
  bool closed = false;    ///< the peer closed the connection (no message)
  int error = 0;          ///< an errno value (EAGAIN when `dont_wait` and nothing is there)
};

/// Receives one message into `buffer` (its size is the limit), and any descriptors sent with
/// it into `fds` (close-on-exec, at most 8). A message with descriptors the caller did not expect
/// should be refused and its descriptors closed, which UniqueFd does.
inline ReceivedMessage receive_message(int fd, std::span<std::uint8_t> buffer, std::vector<UniqueFd>& fds,
                                       bool dont_wait = false) {
  constexpr std::size_t max_fds = 8;
  iovec iov{buffer.data(), buffer.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * max_fds)] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ReceivedMessage r;
  ssize_t n = 0;
  do {
    n = ::recvmsg(fd, &msg, MSG_TRUNC | MSG_CMSG_CLOEXEC | (dont_wait ? MSG_DONTWAIT : 0));
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    r.error = errno;
    return r;
  }
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      const std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (std::size_t i = 0; i < count; ++i) {
        int received = -1;
        std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        fds.emplace_back(received);
      }
    }
  }
  if (n == 0 && fds.empty()) {
    r.closed = true;
    return r;
  }
  r.size = static_cast<std::size_t>(n);
  r.truncated = (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0;
  return r;
}

/// A datagram socket connected to the service manager's notification socket, $NOTIFY_SOCKET
/// (systemd's readiness protocol, spoken directly so that no library is needed: each datagram
/// is newline-separated VARIABLE=value assignments); an empty UniqueFd when the variable is
/// unset. A name starting with '@' is in the abstract namespace. Errors: invalid_argument for a
/// name that is not an absolute path or '@' name, or too long; disconnected when nothing listens
/// there; io_error when no socket can be made.
[[nodiscard]] inline Result<UniqueFd> connect_notify_socket() {
  const char* env = std::getenv("NOTIFY_SOCKET");
  if (env == nullptr || *env == '\0') {
    return UniqueFd{};
  }
  const std::string_view name(env);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if ((name.front() != '/' && name.front() != '@') || name.size() >= sizeof addr.sun_path) {
    return fail(Errc::invalid_argument,
                "NOTIFY_SOCKET '" + std::string(name) +
                    "' is not an absolute path or an abstract '@' name that fits a socket address");
  }
  std::memcpy(addr.sun_path, name.data(), name.size());
  socklen_t length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size());
  if (name.front() == '@') {
    addr.sun_path[0] = '\0'; // abstract: the length, not a terminator, ends the name
  } else {
    ++length;
  }
  UniqueFd fd(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!fd) {
    return fail(Errc::io_error, std::string("socket(): ") + detail::errno_text(errno));
  }
  while (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), length) != 0) {
    if (errno != EINTR) {
      return fail(Errc::disconnected, "NOTIFY_SOCKET " + std::string(name) + ": " + detail::errno_text(errno));
    }
  }
  return fd;
}

/// Sends one notification ("READY=1\nMAINPID=42" once serving, "STOPPING=1" when stopping) on a
/// socket from connect_notify_socket(). Async-signal-safe. Returns 0 or an errno value (EBADF
/// for `fd` -1).
inline int notify_service_manager(int fd, std::string_view state) noexcept {
  if (fd < 0) {
    return EBADF;
  }
  while (::send(fd, state.data(), state.size(), MSG_NOSIGNAL) < 0) {
    if (errno != EINTR) {
      return errno;
    }
  }
  return 0;
}

} // namespace carve::service
