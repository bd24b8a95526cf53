/// @file carve/service/event_loop.hpp
/// The Linux primitives AllocationServer's event loop is built from: an epoll set whose entries
/// carry a 64-bit key, and timerfd and eventfd descriptors with the few operations the server
/// needs. Each throws carve::Exception (io_error) only where the server cannot run without it.
///
/// Host-only, Linux.
#pragma once

#include <carve/core/error.hpp>
#include <carve/service/unix_socket.hpp>

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <ctime>

namespace carve::service::detail {

/// An epoll set whose events carry the key each descriptor was watched with.
class Epoll {
public:
  /// The events one wait() returns at most.
  using Events = std::array<epoll_event, 64>;

  Epoll() : fd_(::epoll_create1(EPOLL_CLOEXEC)) {}
  /// Whether the set was created.
  explicit operator bool() const noexcept { return static_cast<bool>(fd_); }

  /// Watches `fd` for `events` under `key`; EPOLL_CTL_MOD changes what an entry watches (0:
  /// nothing for now). Throws carve::Exception (io_error) when an entry cannot be added.
  void watch(int fd, std::uint64_t key, std::uint32_t events, int op = EPOLL_CTL_ADD) {
    epoll_event e{};
    e.events = events;
    e.data.u64 = key;
    if (::epoll_ctl(fd_.get(), op, fd, &e) != 0 && op == EPOLL_CTL_ADD) {
      throw Exception(Errc::io_error, "epoll_ctl: " + errno_text(errno));
    }
  }
  /// Stops watching `fd`.
  void unwatch(int fd) noexcept { ::epoll_ctl(fd_.get(), EPOLL_CTL_DEL, fd, nullptr); }
  /// Waits up to `timeout_ms` (-1: no limit) and returns how many of `events` are filled.
  /// Throws carve::Exception (io_error) when epoll itself fails.
  int wait(Events& events, int timeout_ms) {
    for (;;) {
      const int n = ::epoll_wait(fd_.get(), events.data(), static_cast<int>(events.size()), timeout_ms);
      if (n >= 0) {
        return n;
      }
      if (errno != EINTR) {
        throw Exception(Errc::io_error, "epoll_wait: " + errno_text(errno));
      }
    }
  }

private:
  UniqueFd fd_;
};

/// A monotonic timerfd: readable when it expires.
class TimerFd {
public:
  TimerFd() : fd_(::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK)) {}
  /// Whether the timer was created.
  explicit operator bool() const noexcept { return static_cast<bool>(fd_); }
  /// Its descriptor, to watch.
  int get() const noexcept { return fd_.get(); }

  /// Expires once, `after` from now.
  bool arm_once(std::chrono::milliseconds after) noexcept { return set(after, std::chrono::milliseconds{0}); }
  /// Expires every `interval`, the first time `interval` from now.
  bool arm_every(std::chrono::milliseconds interval) noexcept { return set(interval, interval); }
  /// Expires no more.
  void disarm() noexcept { (void)set(std::chrono::milliseconds{0}, std::chrono::milliseconds{0}); }
  /// The interval it expires every (arm_every); 0 when disarmed or armed once.
  std::chrono::milliseconds period() const noexcept { return period_; }
  /// Reads the expirations, so that the descriptor is not readable until the next one.
  void consume() noexcept {
    std::uint64_t expirations = 0;
    (void)!::read(fd_.get(), &expirations, sizeof expirations);
  }

private:
  static timespec timespec_of(std::chrono::milliseconds ms) noexcept {
    timespec t{};
    t.tv_sec = static_cast<time_t>(ms.count() / 1000);
    t.tv_nsec = static_cast<long>(ms.count() % 1000) * 1000000L;
    return t;
  }
  bool set(std::chrono::milliseconds first, std::chrono::milliseconds interval) noexcept {
    itimerspec t{};
    t.it_value = timespec_of(first);
    t.it_interval = timespec_of(interval);
    if (::timerfd_settime(fd_.get(), 0, &t, nullptr) != 0) {
      return false;
    }
    period_ = interval;
    return true;
  }

  UniqueFd fd_;
  std::chrono::milliseconds period_{0};
};

/// An eventfd another thread or a signal handler can wake the loop with.
class EventFd {
public:
  EventFd() : fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}
  /// Whether the eventfd was created.
  explicit operator bool() const noexcept { return static_cast<bool>(fd_); }
  /// Its descriptor, to watch.
  int get() const noexcept { return fd_.get(); }
  /// Makes it readable. Async-signal-safe.
  void signal() noexcept {
    const std::uint64_t one = 1;
    (void)!::write(fd_.get(), &one, sizeof one);
  }
  /// Reads the count, so that it is not readable until the next signal().
  void consume() noexcept {
    std::uint64_t value = 0;
    (void)!::read(fd_.get(), &value, sizeof value);
  }

private:
  UniqueFd fd_;
};

} // namespace carve::service::detail
