// carve-served as operators run it: deadlines for connections that never speak, running out of
// descriptors, readiness (sd_notify, --ready-fd, --pidfile), SIGTERM with calls in flight, and
// waiting for a dead client's memory to come back.
#include "service_process.hpp"

#include <carve/service.hpp>

#include <doctest/doctest.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

// In a namespace of its own: the area's test files compile as one translation unit.
namespace test_service_daemon {

using namespace std::chrono_literals;
using carve::Errc;
using carve::service::AllocationClient;
using carve::service::ClientOptions;
using carve::test::RawConnection;
using carve::test::ServedProcess;
namespace svc = carve::service;

namespace {

constexpr std::size_t KiB = std::size_t{1} << 10;

std::vector<std::string> dgx1(std::vector<std::string> extra = {}) {
  return carve::test::served_on_dgx1(CARVE_TEST_DATA_DIR, std::move(extra));
}

carve::Result<AllocationClient> try_connect(const ServedProcess& s, std::chrono::milliseconds timeout = 5s) {
  return AllocationClient::connect(ClientOptions{s.socket(), "test", timeout});
}

AllocationClient connect(const ServedProcess& s) {
  auto c = try_connect(s);
  if (!c) {
    FAIL("cannot connect: " << c.error().message << "\n" << s.output());
  }
  return std::move(*c);
}

// The server process's CPU time so far (user + system), from /proc.
std::chrono::milliseconds cpu_time(pid_t pid) {
  const std::string stat = carve::test::read_text("/proc/" + std::to_string(pid) + "/stat");
  // Fields after the command name (which may hold spaces) start after the last ')'.
  std::istringstream in(stat.substr(stat.rfind(')') + 2));
  std::string field;
  unsigned long long utime = 0;
  unsigned long long stime = 0;
  for (int i = 3; i <= 15 && in >> field; ++i) {
    if (i == 14) {
      utime = std::stoull(field);
    } else if (i == 15) {
      stime = std::stoull(field);
    }
  }
  const long ticks = ::sysconf(_SC_CLK_TCK);
  return std::chrono::milliseconds((utime + stime) * 1000 / static_cast<unsigned long long>(ticks));
}

// The error a raw connection is refused with (sequence 0), or nullopt.
std::optional<svc::ErrorReply> refusal(RawConnection& raw) {
  const auto r = raw.receive();
  if (!r || r->sequence != 0) {
    return std::nullopt;
  }
  if (const auto* e = std::get_if<svc::ErrorReply>(&r->body)) {
    return *e;
  }
  return std::nullopt;
}

// A datagram socket standing in for the service manager's notification socket. `abstract`:
// in the abstract namespace (NOTIFY_SOCKET then starts with '@').
class FakeNotifySocket {
public:
  FakeNotifySocket(const std::filesystem::path& dir, bool abstract)
      : fd_(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0)) {
    REQUIRE(fd_);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    name_ = abstract ? "@carve-test-notify-" + std::to_string(::getpid()) + "-" + std::to_string(++made_)
                     : (dir / "notify.sock").string();
    REQUIRE(name_.size() < sizeof addr.sun_path);
    std::memcpy(addr.sun_path, name_.data(), name_.size());
    auto length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name_.size());
    if (abstract) {
      addr.sun_path[0] = '\0';
    } else {
      ++length;
    }
    REQUIRE(::bind(fd_.get(), reinterpret_cast<const sockaddr*>(&addr), length) == 0);
  }
  const std::string& name() const noexcept { return name_; }
  // The next datagram, or nullopt after 10 s.
  std::optional<std::string> next() {
    pollfd p{fd_.get(), POLLIN, 0};
    if (::poll(&p, 1, 10000) != 1) {
      return std::nullopt;
    }
    char buffer[512];
    const ssize_t n = ::recv(fd_.get(), buffer, sizeof buffer, 0);
    return n < 0 ? std::nullopt : std::optional<std::string>(std::string(buffer, static_cast<std::size_t>(n)));
  }

private:
  svc::UniqueFd fd_;
  std::string name_;
  static inline int made_ = 0;
};

} // namespace

TEST_CASE("connections that never say Hello cannot lock out a well-behaved client") {
  ServedProcess server(dgx1({"--max-clients", "8", "--handshake-timeout", "200ms"}));
  REQUIRE(server.listening());
  std::vector<RawConnection> silent;
  for (int i = 0; i < 8; ++i) {
    silent.emplace_back(server.socket());
  }
  std::this_thread::sleep_for(50ms);
  const auto full = try_connect(server);
  REQUIRE_FALSE(full); // every slot is taken, for now
  CHECK(full.error().message.find("limit of 8 clients") != std::string::npos);

  // Each silent connection is told why and closed once its deadline passes.
  for (RawConnection& raw : silent) {
    const auto why = refusal(raw);
    REQUIRE(why);
    CHECK(why->code == Errc::timed_out);
    CHECK(why->message == "no Hello within 200 ms");
    CHECK(raw.closed_by_server());
  }
  AllocationClient c = connect(server);
  const auto r = c.lease(64 * KiB, 0, 256);
  REQUIRE(r);
  std::this_thread::sleep_for(300ms); // a greeted client has no handshake deadline
  CHECK(c.free(r->ptr));
  CHECK(server.stop() == 0);
}

TEST_CASE("the idle policy closes clients that hold nothing, never one holding memory") {
  ServedProcess server(dgx1({"--idle-timeout", "200ms"}));
  AllocationClient holder = connect(server);
  AllocationClient idle = connect(server);
  const auto r = holder.lease(64 * KiB, 0, 256);
  REQUIRE(r);
  std::this_thread::sleep_for(500ms);
  const auto gone = idle.stats();
  REQUIRE_FALSE(gone);
  CHECK(gone.error().code == Errc::timed_out);
  CHECK(gone.error().message ==
        "carve-served closed the connection: idle for 200 ms without holding memory; reconnect to continue");
  REQUIRE(idle.reconnect());
  CHECK(idle.stats());
  CHECK(holder.free(r->ptr)); // still connected after 500 ms
  CHECK(server.stop() == 0);
}

TEST_CASE("the idle policy never closes a client that waits for a WaitReclaimed answer") {
  ServedProcess server(dgx1({"--idle-timeout", "300ms"}));
  AllocationClient holder = connect(server);
  const auto r = holder.lease(64 * KiB, 0, 256); // holds memory: stays connected
  REQUIRE(r);
  AllocationClient waiter = connect(server); // holds nothing, but waits
  const auto started = std::chrono::steady_clock::now();
  const auto waited = waiter.wait_reclaimed_client(holder.server().client_id, 1500ms);
  REQUIRE_FALSE(waited);
  CHECK(waited.error().code == Errc::timed_out);
  CHECK(waited.error().message.find("still connected after 1500 ms") != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - started >= 1500ms);
  CHECK(waiter.connected());
  CHECK(holder.free(r->ptr));
  CHECK(server.stop() == 0);
}

TEST_CASE("a connection refused for good is read no more, and rejected once, while its error waits") {
  ServedProcess server(dgx1({"--idle-timeout", "200ms"}));
  AllocationClient observer = connect(server);
  const auto held = observer.lease(64 * KiB, 0, 256); // never idle
  REQUIRE(held);
  RawConnection slow(server.socket());
  REQUIRE(slow.send(svc::Request{svc::Hello{"slow"}}, 1));
  REQUIRE(slow.receive());
  // It never reads: its replies fill the socket, then the server's queue, and the server stops
  // reading it. Then a fatal error (Hello twice), and an Allocate that must not be served.
  std::uint32_t seq = 2;
  for (int i = 0; i < 400; ++i) {
    (void)svc::send_message(slow.fd(), svc::encode(svc::Request{svc::StatsRequest{}}, seq++), -1, true);
  }
  (void)svc::send_message(slow.fd(), svc::encode(svc::Request{svc::Hello{"again"}}, seq++), -1, true);
  (void)svc::send_message(slow.fd(), svc::encode(svc::Request{svc::Allocate{4096, 0}}, seq++), -1, true);
  const auto before = observer.stats();
  REQUIRE(before);
  std::this_thread::sleep_for(1s); // five idle deadlines
  const auto after = observer.stats();
  REQUIRE(after);
  CHECK(after->allocations == before->allocations);
  CHECK(after->rejected_messages <= before->rejected_messages + 1);
  CHECK(observer.free(held->ptr));
  CHECK(server.stop() == 0);
}

TEST_CASE("a client that does not read is sent at most max-unread-descriptors segments; the rest follow as it reads") {
  ServedProcess server(dgx1({"--max-unread-descriptors", "4"}));
  RawConnection slow(server.socket());
  REQUIRE(slow.send(svc::Request{svc::Hello{"slow"}}, 1));
  REQUIRE(slow.receive());
  constexpr std::uint32_t asked = 12;
  for (std::uint32_t seq = 2; seq < 2 + asked; ++seq) {
    REQUIRE(slow.send(svc::Request{svc::Allocate{64 * KiB, 0}}, seq)); // each region a segment of its own
  }
  // Another client is served meanwhile: the bound is per connection.
  AllocationClient other = connect(server);
  const auto lease = other.lease(64 * KiB, 0, 256);
  REQUIRE(lease);
  // Once the server has made all thirteen regions, what the slow client's socket holds is settled:
  // four were sent as they were made and the rest are held back until it reads.
  for (auto deadline = std::chrono::steady_clock::now() + 10s;;) {
    const auto stats = other.stats();
    REQUIRE(stats);
    if (stats->live_regions == asked + 1 || std::chrono::steady_clock::now() > deadline) {
      break;
    }
    std::this_thread::sleep_for(10ms);
  }
  std::this_thread::sleep_for(100ms); // five retries of the held-back replies
  int queued_bytes = 0;
  REQUIRE(::ioctl(slow.fd(), FIONREAD, &queued_bytes) == 0); // a sequenced-packet socket: every message's bytes
  std::size_t descriptors = 0;
  std::size_t first_four = 0;
  for (std::uint32_t seq = 2; seq < 2 + asked; ++seq) {
    const auto r = slow.receive(&descriptors);
    REQUIRE(r);
    CHECK(r->sequence == seq);
    REQUIRE(std::holds_alternative<svc::Allocated>(r->body));
    CHECK(std::get<svc::Allocated>(r->body).new_mapping);
    if (seq < 6) {
      first_four += svc::encode(r->body, seq).size();
    }
  }
  CHECK(static_cast<std::size_t>(queued_bytes) == first_four); // no more than four were in flight
  CHECK(descriptors == asked);                                 // and none was lost
  CHECK(other.free(lease->ptr));
  CHECK(server.stop() == 0);
}

TEST_CASE("timeouts are checked settings") {
  // Each text, and the time it must parse to (nullopt: refused). Parsing that merely does not
  // throw is not enough: a unit read wrongly would still parse.
  const std::vector<std::pair<std::string, std::optional<std::chrono::milliseconds>>> cases{
      {"200ms", 200ms}, {"5s", 5000ms}, {"2min", 120000ms}, {"0", 0ms}, {"1440min", 24h},
      {"200", {}},      {"5h", {}},     {"-1s", {}},        {"ms", {}}, {"1441min", {}}};
  for (const auto& entry : cases) { // not a structured binding: clang 14 cannot capture one in a lambda
    const std::string& value = entry.first;
    const auto& expected = entry.second;
    CAPTURE(value);
    const std::vector<std::string_view> args{"--handshake-timeout", value};
    if (expected) {
      const auto parsed = svc::parse_server_args(args).server_options();
      CHECK(parsed.handshake_timeout == *expected);
      CHECK(parsed.idle_timeout == svc::ServerOptions{}.idle_timeout); // the others keep their defaults
      CHECK(parsed.drain_timeout == svc::ServerOptions{}.drain_timeout);
    } else {
      CHECK_THROWS_WITH_AS(svc::parse_server_args(args), doctest::Contains("is not a time such as 200ms, 5s or 10min"),
                           carve::Exception);
    }
  }
  const auto c = svc::parse_server_args(std::vector<std::string_view>{"--handshake-timeout=250ms", "--idle-timeout",
                                                                      "1min", "--drain-timeout", "3s", "--pidfile",
                                                                      "/tmp/x.pid", "--ready-fd", "7"});
  const svc::ServerOptions o = c.server_options();
  CHECK(o.handshake_timeout == 250ms);
  CHECK(o.idle_timeout == 60s);
  CHECK(o.drain_timeout == 3s);
  CHECK(c.pidfile == "/tmp/x.pid");
  CHECK(c.ready_fd == 7);
  CHECK_THROWS_WITH_AS(svc::parse_server_args(std::vector<std::string_view>{"--ready-fd", "1"}),
                       doctest::Contains("ready-fd: '1' is not a descriptor above 2"), carve::Exception);
}

TEST_CASE("live segments hold no server descriptor") {
  ServedProcess server(dgx1());
  AllocationClient c = connect(server);
  const auto before = c.stats();
  REQUIRE(before);
  std::vector<void*> held;
  for (int i = 0; i < 64; ++i) {
    auto r = c.lease(64 * KiB, i % 8, 256);
    REQUIRE(r);
    held.push_back(r->ptr);
  }
  const auto during = c.stats();
  REQUIRE(during);
  CHECK(during->live_regions == 64);
  // Each segment's memfd went to the client with its reply; the server kept none.
  CHECK(during->open_descriptors == before->open_descriptors);
  for (void* p : held) {
    REQUIRE(c.free(p));
  }
  CHECK(server.stop() == 0);
}

TEST_CASE("out of descriptors: no spinning, a clear refusal, and service again once they free up") {
  // 24 descriptors in all: the server's own (standard streams, socket, epoll, timers, reserve)
  // and one per client connection. Segments hold none, so clients are what use them up.
  ServedProcess server(dgx1({"--max-clients", "100", "--handshake-timeout", "60s"}), {}, [] {
    const rlimit low{24, 24};
    ::setrlimit(RLIMIT_NOFILE, &low);
  });
  REQUIRE(server.listening());
  AllocationClient c = connect(server);
  std::vector<void*> held;
  for (int i = 0; i < 32; ++i) { // more regions than the server has descriptors
    auto r = c.lease(64 * KiB, 0, 256);
    REQUIRE(r);
    held.push_back(r->ptr);
  }

  // Clients until the descriptors run out: the next is accepted on the reserve and refused.
  std::vector<AllocationClient> clients;
  carve::Error refused;
  for (int i = 0; i < 40; ++i) {
    auto next = try_connect(server, 2s);
    if (!next) {
      refused = next.error();
      break;
    }
    clients.push_back(std::move(*next));
  }
  REQUIRE_FALSE(clients.empty());
  CHECK(refused.message.find("run out of file descriptors (Too many open files)") != std::string::npos);

  // A client that arrives now is refused at once, and the server does not spin while it waits.
  RawConnection waiting(server.socket());
  const auto before = cpu_time(server.pid());
  std::this_thread::sleep_for(1s);
  const auto used = cpu_time(server.pid()) - before;
  CHECK_MESSAGE(used < 200ms, "the server used " << used.count() << " ms of CPU in 1 s");
  const auto why = refusal(waiting);
  REQUIRE(why);
  CHECK(why->code == Errc::no_space);
  CHECK(why->message.find("carve-served has run out of file descriptors (Too many open files)") == 0);

  // A new segment needs a memfd, which the system refuses now: the failure names that cause.
  const auto failed = c.lease(64 * KiB, 0, 256);
  REQUIRE_FALSE(failed);
  CHECK(failed.error().code == Errc::no_space);
  CHECK(failed.error().message.find("card 0: the system refused the memory (memfd_create: Too many open files)") == 0);
  CHECK(failed.error().message.find("strategy") == std::string::npos);

  // Descriptors come back with the clients: new clients are served again.
  std::vector<std::uint32_t> ids;
  for (const AllocationClient& gone : clients) {
    ids.push_back(gone.server().client_id);
  }
  clients.clear(); // each hangs up
  for (const std::uint32_t id : ids) {
    REQUIRE(c.wait_reclaimed_client(id, 5s));
  }
  AllocationClient later = connect(server);
  const auto r = later.lease(64 * KiB, 1, 256);
  REQUIRE(r);
  CHECK(later.free(r->ptr));
  for (void* p : held) {
    REQUIRE(c.free(p));
  }
  CHECK(server.stop() == 0);
}

TEST_CASE("under a service manager it reports READY=1 and, on SIGTERM, STOPPING=1") {
  for (const bool abstract : {false, true}) {
    CAPTURE(abstract);
    carve::test::TempDir dir;
    FakeNotifySocket manager(dir.path(), abstract);
    const std::string name = manager.name();
    ServedProcess server(dgx1(), {}, [&name] { ::setenv("NOTIFY_SOCKET", name.c_str(), 1); });
    REQUIRE(server.listening());
    const pid_t pid = server.pid();
    CHECK(manager.next() == "READY=1\nMAINPID=" + std::to_string(pid));
    AllocationClient c = connect(server); // ready means ready: the socket answers
    CHECK(c.stats());
    CHECK(server.stop(SIGTERM) == 0);
    CHECK(manager.next() == "STOPPING=1");
  }
}

TEST_CASE("--ready-fd gets a line once the server listens; --pidfile holds its pid until it exits") {
  carve::test::TempDir dir;
  const auto pidfile = dir.path() / "served.pid";
  int ready[2] = {-1, -1};
  REQUIRE(::pipe2(ready, O_CLOEXEC) == 0);
  ServedProcess server(dgx1({"--ready-fd", "9", "--pidfile", pidfile.string()}), {}, [&ready] {
    ::dup2(ready[1], 9); // dup2 clears close-on-exec on the copy
  });
  ::close(ready[1]);
  REQUIRE(server.listening());
  std::string said;
  for (;;) { // until the server closes its end
    pollfd p{ready[0], POLLIN, 0};
    REQUIRE(::poll(&p, 1, 10000) == 1);
    char buffer[64];
    const ssize_t n = ::read(ready[0], buffer, sizeof buffer);
    REQUIRE(n >= 0);
    if (n == 0) {
      break;
    }
    said.append(buffer, static_cast<std::size_t>(n));
  }
  ::close(ready[0]);
  CHECK(said == "READY=1\n");
  CHECK(carve::test::read_text(pidfile) == std::to_string(server.pid()) + "\n");
  AllocationClient c = connect(server);
  CHECK(c.stats());
  CHECK(server.stop(SIGTERM) == 0);
  CHECK_FALSE(std::filesystem::exists(pidfile));

  ServedProcess closed(dgx1({"--ready-fd", "42"}));
  CHECK(closed.wait() == 1);
  CHECK(closed.output().find("carve-served: ready-fd 42 is not an open descriptor") != std::string::npos);
}

TEST_CASE("SIGTERM stops accepting, answers the calls in flight, then exits 0") {
  ServedProcess server(dgx1());
  RawConnection raw(server.socket());
  REQUIRE(raw.send(svc::Request{svc::Hello{"pipelined"}}, 1));
  REQUIRE(raw.receive());
  // Requests the client does not read the answers of: the replies fill its socket, the server's
  // queue for it, then the requests wait in the server's socket.
  std::uint32_t sent = 0;
  for (std::uint32_t seq = 2; seq < 600; ++seq) {
    if (svc::send_message(raw.fd(), svc::encode(svc::Request{svc::StatsRequest{}}, seq), -1, true) != 0) {
      break;
    }
    ++sent;
  }
  REQUIRE(sent > 100);
  std::this_thread::sleep_for(100ms);
  REQUIRE(::kill(server.pid(), SIGTERM) == 0);
  std::uint32_t answered = 0;
  for (;;) {
    const auto r = raw.receive();
    if (!r || r->sequence == 0) {
      REQUIRE_MESSAGE(r, "the server closed the connection without saying why");
      const auto* bye = std::get_if<svc::ErrorReply>(&r->body);
      REQUIRE(bye);
      CHECK(bye->message == "the server is shutting down");
      break;
    }
    CHECK(r->sequence == answered + 2);
    CHECK(std::holds_alternative<svc::StatsReply>(r->body));
    ++answered;
  }
  CHECK(answered == sent);
  CHECK(server.wait() == 0);
  const auto after = try_connect(server);
  REQUIRE_FALSE(after);
  CHECK(after.error().code == Errc::disconnected);
  CHECK(after.error().message.find("no carve-served socket") == 0);
}

TEST_CASE("wait_reclaimed returns once a killed client's regions are back") {
  ServedProcess server(dgx1());
  AllocationClient observer = connect(server);
  int go[2] = {-1, -1};
  REQUIRE(::pipe(go) == 0);
  const pid_t victim = carve::test::fork_child([&] {
    auto c = AllocationClient::connect(ClientOptions{server.socket(), "victim", 10s});
    for (int i = 0; c && i < 3; ++i) {
      if (!c->lease(300 * KiB, i, 256)) {
        return 1;
      }
    }
    if (!c || ::write(go[1], "x", 1) != 1) {
      return 2;
    }
    ::pause();
    return 0;
  });
  char x = 0;
  REQUIRE(::read(go[0], &x, 1) == 1);
  ::close(go[0]);
  ::close(go[1]);
  const auto held = observer.stats();
  REQUIRE(held);
  CHECK(held->live_regions == 3);

  // Still connected: the wait ends with timed_out.
  const auto early = observer.wait_reclaimed_pid(static_cast<std::uint32_t>(victim), 100ms);
  REQUIRE_FALSE(early);
  CHECK(early.error().code == Errc::timed_out);
  CHECK(early.error().message == "a client of pid " + std::to_string(victim) + " is still connected after 100 ms");

  ::kill(victim, SIGKILL);
  CHECK(carve::test::wait_exit(victim) == 128 + SIGKILL);
  const auto reclaimed = observer.wait_reclaimed_pid(static_cast<std::uint32_t>(victim), 5s);
  REQUIRE_MESSAGE(reclaimed, (reclaimed ? "" : reclaimed.error().message));
  CHECK(*reclaimed == 3);
  const auto after = observer.stats(); // no polling: the books are settled already
  REQUIRE(after);
  CHECK(after->clients == 1);
  CHECK(after->live_regions == 0);
  CHECK(after->reclaimed_regions == 3);
  CHECK(after->consistent);
  for (const svc::CardStats& card : after->cards) {
    CHECK(card.bytes_in_use == 0);
    CHECK(card.bytes_reserved == 0);
  }

  // Nobody of that pid any more: the answer is immediate. A client in this process, by id.
  CHECK(observer.wait_reclaimed_pid(static_cast<std::uint32_t>(victim), 0ms));
  auto other = connect(server);
  const std::uint32_t other_id = other.server().client_id;
  CHECK(observer.wait_reclaimed_client(other_id, 50ms).error().code == Errc::timed_out);
  other = connect(server); // the old session hangs up
  CHECK(observer.wait_reclaimed_client(other_id, 5s));

  // Bad input: refused, and the connection stays usable.
  CHECK(observer.wait_reclaimed_pid(0, 1s).error().code == Errc::invalid_argument);
  CHECK(observer.wait_reclaimed_pid(static_cast<std::uint32_t>(::getpid()), 1s).error().message ==
        "a client cannot wait for its own reclaim");
  CHECK(observer.wait_reclaimed_client(observer.server().client_id, 1s).error().code == Errc::invalid_argument);
  CHECK(observer.wait_reclaimed_pid(1, std::chrono::hours(2)).error().code == Errc::invalid_argument);
  CHECK(observer.stats());
  CHECK(server.stop() == 0);
}

} // namespace test_service_daemon
