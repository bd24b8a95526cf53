// carve-served as operators run it: deadlines for connections that never speak, running out of
// descriptors, readiness (sd_notify, --ready-fd, --pidfile), SIGTERM with calls in flight, and
// waiting for a dead client's memory to come back.
#include "service_process.hpp"

#include <carve/service.hpp>

#include <doctest/doctest.h>

#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using carve::Errc;
using carve::service::AllocationClient;
using carve::service::ClientOptions;
using carve::test::RawConnection;
using carve::test::ServedProcess;
namespace svc = carve::service;

namespace {

constexpr std::size_t KiB = std::size_t{1} << 10;

const std::string dgx1_file = std::string(CARVE_TEST_DATA_DIR) + "/topology/dgx1_v100.txt";

std::vector<std::string> dgx1(std::vector<std::string> extra = {}) {
  std::vector<std::string> args{"--topology", "nvidia-smi:" + dgx1_file, "--card-memory",
                                "16MiB",      "--segment-size",          "1MiB"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
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
  const auto r = c.allocate(64 * KiB, 0);
  REQUIRE(r);
  std::this_thread::sleep_for(300ms); // a greeted client has no handshake deadline
  CHECK(c.free(r->ptr));
  CHECK(server.stop() == 0);
}

TEST_CASE("the idle policy closes clients that hold nothing, never one holding memory") {
  ServedProcess server(dgx1({"--idle-timeout", "200ms"}));
  AllocationClient holder = connect(server);
  AllocationClient idle = connect(server);
  const auto r = holder.allocate(64 * KiB, 0);
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

TEST_CASE("timeouts are checked settings") {
  for (const auto& [value, ok] : std::vector<std::pair<std::string, bool>>{{"200ms", true},
                                                                           {"5s", true},
                                                                           {"2min", true},
                                                                           {"0", true},
                                                                           {"200", false},
                                                                           {"5h", false},
                                                                           {"-1s", false},
                                                                           {"ms", false},
                                                                           {"1441min", false}}) {
    CAPTURE(value);
    const std::vector<std::string_view> args{"--handshake-timeout", value};
    if (ok) {
      CHECK_NOTHROW(svc::parse_server_args(args));
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

TEST_CASE("out of descriptors: no spinning, a clear refusal, and service again once they free up") {
  // 24 descriptors in all: the server's own (standard streams, socket, epoll, timers, reserve) and
  // a dozen or so for clients and segments. idle-threshold 0: a freed segment closes its memfd.
  ServedProcess server(dgx1({"--segment-size", "64KiB", "--idle-threshold", "0", "--max-clients", "100"}), {}, [] {
    const rlimit low{24, 24};
    ::setrlimit(RLIMIT_NOFILE, &low);
  });
  REQUIRE(server.listening());
  AllocationClient c = connect(server);

  // Every 64 KiB region is a new segment, and every segment a memfd: the descriptors run out.
  std::vector<void*> held;
  carve::Error failure;
  for (int i = 0; i < 64; ++i) {
    auto r = c.allocate(64 * KiB, 0);
    if (!r) {
      failure = r.error();
      break;
    }
    held.push_back(r->ptr);
  }
  REQUIRE(!held.empty());
  REQUIRE(held.size() < 64);
  CHECK(failure.code == Errc::no_space);
  CHECK(failure.message.find("card 0: the system refused the memory (memfd_create: Too many open files)") == 0);
  CHECK(failure.message.find("strategy") == std::string::npos);

  // The process has no descriptor left: a client that arrives is accepted on the reserve and
  // refused at once, and the server does not spin while it waits.
  RawConnection waiting(server.socket());
  const auto before = cpu_time(server.pid());
  std::this_thread::sleep_for(1s);
  const auto used = cpu_time(server.pid()) - before;
  CHECK_MESSAGE(used < 200ms, "the server used " << used.count() << " ms of CPU in 1 s");
  const auto why = refusal(waiting);
  REQUIRE(why);
  CHECK(why->code == Errc::no_space);
  CHECK(why->message.find("carve-served has run out of file descriptors (Too many open files)") == 0);
  const auto refused = try_connect(server);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().message.find("run out of file descriptors") != std::string::npos);

  // Descriptors come back with the segments: new clients are served again.
  for (void* p : held) {
    REQUIRE(c.free(p));
  }
  AllocationClient later = connect(server);
  const auto r = later.allocate(64 * KiB, 1);
  REQUIRE(r);
  CHECK(later.free(r->ptr));
  CHECK(server.stop() == 0);
}
