// carve-served and AllocationClient end to end: the server is started with fork/exec, clients
// run in this process and in forked children, on the shared-memory (simulated card) backend.
#include "service_process.hpp"

#include <carve/mr.hpp>
#include <carve/service.hpp>

#include <doctest/doctest.h>

#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

// In a namespace of its own: the area's test files compile as one translation unit.
namespace test_service {

using namespace std::chrono_literals;
using carve::Errc;
using carve::service::AllocationClient;
using carve::service::ClientOptions;
using carve::test::RawConnection;
using carve::test::ServedProcess;
namespace svc = carve::service;

namespace {

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;

const std::string dgx1_file = std::string(CARVE_TEST_DATA_DIR) + "/topology/dgx1_v100.txt";

std::vector<std::string> dgx1(std::vector<std::string> extra = {}) {
  return carve::test::served_on_dgx1(CARVE_TEST_DATA_DIR, std::move(extra));
}

AllocationClient connect(const ServedProcess& s, const std::string& name = "test") {
  auto c = AllocationClient::connect(ClientOptions{s.socket(), name, 10s});
  if (!c) {
    FAIL("cannot connect: " << c.error().message << "\n" << s.output());
  }
  return std::move(*c);
}

svc::StatsReply stats_of(AllocationClient& c) {
  auto s = c.stats();
  REQUIRE_MESSAGE(s, (s ? "" : s.error().message));
  return *s;
}

// Raw requests (no assertions: children use them too).
// The connection's client id, once the server has answered Hello.
std::optional<std::uint32_t> hello_id(RawConnection& raw) {
  if (!raw.send(svc::Request{svc::Hello{"raw"}}, 1)) {
    return std::nullopt;
  }
  const auto r = raw.receive();
  if (!r || !std::holds_alternative<svc::HelloReply>(r->body)) {
    return std::nullopt;
  }
  return std::get<svc::HelloReply>(r->body).client_id;
}
bool hello(RawConnection& raw) { return hello_id(raw).has_value(); }

// The error a raw request gets (nullopt for any other answer).
std::optional<svc::ErrorReply> error_for(RawConnection& raw, const svc::Request& request, std::uint32_t seq) {
  if (!raw.send(request, seq)) {
    return std::nullopt;
  }
  const auto r = raw.receive();
  if (!r || r->sequence != seq) {
    return std::nullopt;
  }
  if (const auto* e = std::get_if<svc::ErrorReply>(&r->body)) {
    return *e;
  }
  return std::nullopt;
}

// A pipe for "go on" between a test and its child.
struct Signal {
  int fds[2] = {-1, -1};
  Signal() { REQUIRE(::pipe(fds) == 0); }
  ~Signal() {
    ::close(fds[0]);
    ::close(fds[1]);
  }
  void post() { REQUIRE(::write(fds[1], "x", 1) == 1); }
  bool wait() {
    char c = 0;
    return ::read(fds[0], &c, 1) == 1;
  }
};

} // namespace

TEST_CASE("borrowing across cards follows the picker, for every strategy") {
  for (const std::string strategy :
       {"largest-bandwidth", "threshold-most-free:threshold=30", "weighted-score:free=1,bandwidth=1,history=2"}) {
    CAPTURE(strategy);
    ServedProcess server(dgx1({"--strategy", strategy}));
    REQUIRE(server.listening());
    AllocationClient client = connect(server);

    // The same requests against an in-process BorrowingAllocator with the same machine, cards
    // and strategy: the server must decide exactly as the picker does. (Its cards hand each
    // region a segment of its own, as SimulatedCard hands out blocks.)
    const auto topo = carve::Topology::from_nvidia_smi(carve::test::read_text(dgx1_file));
    carve::BorrowingAllocator<carve::SimulatedCard, carve::AnyStrategy> oracle(
        topo, [](int) { return carve::SimulatedCard(16 * MiB); }, carve::parse_strategy(strategy));
    std::mt19937 rng(7);
    std::vector<std::pair<svc::Region, carve::BorrowHandle>> held;
    int borrowed = 0;
    for (int step = 0; step < 300; ++step) {
      if (!held.empty() && rng() % 3 == 0) {
        const std::size_t i = rng() % held.size();
        REQUIRE(client.free(held[i].first.ptr));
        REQUIRE(oracle.give_back(held[i].second));
        held.erase(held.begin() + static_cast<std::ptrdiff_t>(i));
        continue;
      }
      const std::size_t bytes = (1 + rng() % 12) * 256 * KiB + rng() % 1000;
      const int requester = static_cast<int>(rng() % 3); // three busy cards, five lenders
      auto got = client.lease(bytes, requester, 256);
      auto want = oracle.borrow_explained(requester, bytes, carve::default_alignment);
      REQUIRE(got.has_value() == want.has_value());
      if (!got) {
        CHECK(got.error().code == want.error().code);
        CHECK(got.error().message == want.error().message);
        continue;
      }
      CHECK(got->info.card == want->card);
      CHECK(got->info.requester == requester);
      CHECK(got->info.size == bytes);
      borrowed += got->borrowed() ? 1 : 0;
      held.emplace_back(*got, *want);
    }
    CHECK(borrowed > 20); // the sequence does exercise borrowing
    const auto s = stats_of(client);
    CHECK(s.consistent);
    CHECK(s.live_regions == held.size());
    // The server's history is the picker's: the same (requester, lender) counts.
    const carve::BorrowHistory h = oracle.history();
    for (const svc::BorrowCount& b : s.borrows) {
      CHECK(b.count == h.count(b.requester, b.lender));
    }
    for (const auto& [region, handle] : held) {
      REQUIRE(oracle.give_back(handle));
    }
    CHECK(server.stop() == 0);
  }
}

// Every byte in any mapping `c` holds.
bool mappings_hold(const AllocationClient& c, unsigned char value) {
  for (const svc::MappedSegment& m : c.mappings()) {
    const auto* bytes = static_cast<const unsigned char*>(m.base);
    if (std::find(bytes, bytes + m.size, value) != bytes + m.size) {
      return true;
    }
  }
  return false;
}

// Whether [p, p + 1) is mapped in this process.
bool mapped_here(const void* p) {
  unsigned char in = 0;
  void* page = reinterpret_cast<void*>(reinterpret_cast<std::uintptr_t>(p) & ~(carve::os_page_size() - 1));
  return ::mincore(page, 1, &in) == 0;
}

TEST_CASE("regions keep their ids, and each is a segment its client alone maps") {
  ServedProcess server(dgx1());
  AllocationClient a = connect(server, "a");
  auto r = a.lease(64 * KiB, 2, 256);
  REQUIRE(r);
  CHECK(r->info.card == 2);
  CHECK(r->info.size == 64 * KiB);
  CHECK(r->info.offset == 0);
  std::memset(r->ptr, 0xa1, r->info.size);
  // pointer -> id here, and the server's record of it
  CHECK(a.region_of(r->ptr) == r->info.id);
  CHECK_FALSE(a.region_of(static_cast<unsigned char*>(r->ptr) + 1));
  const auto q = a.query(static_cast<unsigned char*>(r->ptr) + 1000); // any byte of the region
  REQUIRE(q);
  CHECK(*q == r->info);
  // A second region, kept while the first is freed: a segment of its own, not a neighbour.
  auto kept = a.lease(4 * KiB, 2, 256);
  REQUIRE(kept);
  CHECK(kept->info.segment != r->info.segment);
  CHECK(a.mapped_segments() == 2);
  std::memset(kept->ptr, 0xa2, kept->info.size);

  Signal freed;
  Signal written;
  Signal checked;
  const svc::RegionInfo first = r->info;
  const pid_t child = carve::test::fork_child([&] {
    auto b = AllocationClient::connect(ClientOptions{server.socket(), "b", 10s});
    if (!b || !freed.wait()) {
      return 1;
    }
    std::vector<svc::Region> mine;
    for (int i = 0; i < 8; ++i) { // the freed size, and sizes that would fit beside `kept`
      auto got = b->lease(i == 0 ? 64 * KiB : 4 * KiB * static_cast<std::size_t>(i), 2, 256);
      if (!got || got->info.segment == first.segment || got->info.segment == r->info.segment) {
        return 2;
      }
      const auto* seen = static_cast<const unsigned char*>(got->ptr);
      if (std::any_of(seen, seen + got->info.size, [](unsigned char c) { return c != 0; })) {
        return 3; // fresh memory, never what `a` wrote
      }
      std::memset(got->ptr, 0xb7, got->info.size);
      mine.push_back(*got);
    }
    if (mappings_hold(*b, 0xa1) || mappings_hold(*b, 0xa2)) {
      return 4;
    }
    written.post();
    return checked.wait() ? 0 : 5; // holds its regions until the parent has looked
  });
  REQUIRE(a.free(r->ptr));
  CHECK_FALSE(a.region_of(r->ptr));
  CHECK(a.mapped_segments() == 1);
  CHECK_FALSE(mapped_here(r->ptr)); // a freed region's segment is unmapped at once
  freed.post();
  REQUIRE(written.wait());
  // `b` filled eight live regions with 0xb7: none of it shows through anything `a` maps.
  CHECK_FALSE(mappings_hold(a, 0xb7));
  CHECK(std::all_of(static_cast<unsigned char*>(kept->ptr), static_cast<unsigned char*>(kept->ptr) + kept->info.size,
                    [](unsigned char c) { return c == 0xa2; }));
  checked.post();
  CHECK(carve::test::wait_exit(child) == 0);
  auto again = a.lease(64 * KiB, 2, 256);
  REQUIRE(again);
  CHECK(again->info.id != first.id); // ids are never reused
  CHECK_FALSE(mappings_hold(a, 0xb7));
  CHECK(stats_of(a).consistent);
  CHECK(server.stop() == 0);
}

TEST_CASE("a client-side pool serves small blocks from its leases; the server still counts every byte") {
  ServedProcess server(dgx1());
  AllocationClient observer = connect(server, "observer");
  Signal filled;
  const pid_t child = carve::test::fork_child([&] {
    auto c = AllocationClient::connect(ClientOptions{server.socket(), "pooled", 10s, 3});
    if (!c) {
      return 1;
    }
    carve::CachingPool pool(carve::ref(*c), {.granularity = 256, .segment_size = 1 * MiB});
    std::vector<void*> blocks;
    for (int i = 0; i < 1000; ++i) { // 1000 x 512 B: one 1 MiB lease
      auto p = pool.try_allocate(512, 256);
      if (!p) {
        return 2;
      }
      std::memset(*p, i & 0xff, 512);
      blocks.push_back(*p);
    }
    const auto s = c->stats();
    if (!s || s->my_regions != 1 || s->my_bytes != 1 * MiB || !c->owns(blocks.back())) {
      return 3;
    }
    for (void* p : blocks) {
      pool.deallocate(p, 512, 256);
    }
    pool.trim(); // the idle lease goes back to the server
    const auto after = c->stats();
    if (!after || after->my_regions != 0 || c->mapped_segments() != 0) {
      return 4;
    }
    for (int i = 0; i < 10; ++i) {
      (void)pool.try_allocate(512, 256); // a new lease, held when the process dies
    }
    filled.post();
    ::pause();
    return 0;
  });
  REQUIRE(filled.wait());
  const auto held = stats_of(observer); // the child's lease was granted before it said so
  CHECK(held.live_regions == 1);
  CHECK(held.cards[3].bytes_in_use == 1 * MiB);
  ::kill(child, SIGKILL);
  CHECK(carve::test::wait_exit(child) == 128 + SIGKILL);
  REQUIRE(observer.wait_reclaimed_pid(static_cast<std::uint32_t>(child), 10s));
  const auto after = stats_of(observer);
  CHECK(after.live_regions == 0);
  CHECK(after.reclaimed_regions == 1);
  CHECK(after.cards[3].free_bytes == 16 * MiB);
  CHECK(after.consistent);
}

TEST_CASE("the client's byte spellings are every resource's, on its default card; a card is named by lease()") {
  ServedProcess server(dgx1());
  auto made = AllocationClient::connect(ClientOptions{server.socket(), "bytes", 10s, 3}); // default card 3
  REQUIRE(made);
  AllocationClient& c = *made;
  // allocate(bytes, alignment) as on every carve resource: once the client's allocate(bytes, card)
  // hid it, and this call asked the server for a region for card 256.
  void* p = c.allocate(4096, 256);
  CHECK(reinterpret_cast<std::uintptr_t>(p) % 256 == 0);
  const auto q = c.query(p);
  REQUIRE(q);
  CHECK(q->size == 4096);
  CHECK(q->requester == 3);
  std::memset(p, 0x5c, 4096);
  c.deallocate(p, 4096, 256);
  void* s = c.allocate_sync(8192, 4096);
  CHECK(reinterpret_cast<std::uintptr_t>(s) % 4096 == 0);
  CHECK(c.query(s)->requester == 3);
  c.deallocate_sync(s, 8192, 4096);
  CHECK(c.try_allocate(4096, 3).error() == Errc::invalid_size); // not a power of two: nothing is sent
  CHECK(c.try_allocate(0, 256).error() == Errc::invalid_size);
  // A card is named only by lease(), which says so: card 256 is no card of this server.
  const auto far = c.lease(4096, 256, 256);
  REQUIRE_FALSE(far);
  CHECK(far.error().code == Errc::out_of_range);
  const auto odd = c.lease(4096, 1, 24);
  REQUIRE_FALSE(odd);
  CHECK(odd.error().code == Errc::invalid_size);
  auto other = c.lease(4096, 1, 256);
  REQUIRE(other);
  CHECK(other->info.requester == 1);
  CHECK(reinterpret_cast<std::uintptr_t>(other->ptr) % 256 == 0);
  REQUIRE(c.free(other->ptr));
  // An alignment coarser than a mapping gives: met by chance, or given back as no_space.
  const auto coarse = c.try_allocate(4096, std::size_t{1} << 40);
  if (coarse) {
    CHECK(reinterpret_cast<std::uintptr_t>(*coarse) % (std::size_t{1} << 40) == 0);
    c.deallocate(*coarse, 4096, std::size_t{1} << 40);
  } else {
    CHECK(coarse.error() == Errc::no_space);
  }
  const auto after = stats_of(c);
  CHECK(after.live_regions == 0);
  CHECK(after.consistent);
}

TEST_CASE("a client frees and queries only its own regions") {
  ServedProcess server(dgx1());
  AllocationClient owner = connect(server, "owner");
  auto r = owner.lease(100 * KiB, 1, 256);
  REQUIRE(r);
  std::memset(r->ptr, 0x11, r->info.size);
  const svc::RegionId id = r->info.id;

  const pid_t child = carve::test::fork_child([&] {
    RawConnection raw(server.socket());
    if (!hello(raw)) {
      return 9;
    }
    const auto free_other = error_for(raw, svc::Request{svc::Free{id}}, 2);
    const auto query_other = error_for(raw, svc::Request{svc::Query{id}}, 3);
    const auto free_none = error_for(raw, svc::Request{svc::Free{id + 1000}}, 4);
    if (!free_other || free_other->code != Errc::permission_denied ||
        free_other->message != "region " + std::to_string(id) + " belongs to another client") {
      return 1;
    }
    if (!query_other || query_other->code != Errc::permission_denied) {
      return 2;
    }
    return free_none && free_none->code == Errc::not_allocated ? 0 : 3;
  });
  CHECK(carve::test::wait_exit(child) == 0);
  // Nothing changed for the owner.
  const auto q = owner.query(r->ptr);
  REQUIRE(q);
  CHECK(q->id == id);
  CHECK(static_cast<unsigned char*>(r->ptr)[0] == 0x11);
  // Through the client API a pointer that is not one of ours is refused locally.
  int local = 0;
  const auto not_ours = owner.free(&local);
  REQUIRE_FALSE(not_ours);
  CHECK(not_ours.error().code == Errc::not_allocated);
  CHECK(owner.free(r->ptr));
  CHECK(stats_of(owner).consistent);
}

TEST_CASE("the server records each peer's credentials") {
  ServedProcess server(dgx1());
  AllocationClient c = connect(server, "credentials");
  CHECK(c.server().server_pid == static_cast<std::uint32_t>(server.pid()));
  CHECK(c.server().peer_pid == static_cast<std::uint32_t>(::getpid()));
  CHECK(c.server().peer_uid == static_cast<std::uint32_t>(::geteuid()));
  CHECK(c.server().cards == 8);
  CHECK(c.server().backend == carve::ExportKind::shared_memory);
  REQUIRE(c.lease(3 * MiB, 0, 256));
  const auto s = stats_of(c);
  REQUIRE(s.client_list.size() == 1);
  CHECK(s.client_list[0].pid == static_cast<std::uint32_t>(::getpid()));
  CHECK(s.client_list[0].name == "credentials");
  CHECK(s.client_list[0].regions == 1);
  CHECK(s.my_bytes == 3 * MiB);
}

TEST_CASE("the socket is owner-only, in a directory the server checks") {
  ServedProcess server(dgx1());
  REQUIRE(server.listening());
  struct stat st {};
  REQUIRE(::lstat(server.socket().c_str(), &st) == 0);
  CHECK(S_ISSOCK(st.st_mode));
  CHECK((st.st_mode & 0777) == 0600);
  CHECK(st.st_uid == ::geteuid());

  carve::test::TempDir dir;
  SUBCASE("a directory others can write is refused") {
    const auto open_dir = dir.path() / "open";
    std::filesystem::create_directory(open_dir);
    ::chmod(open_dir.c_str(), 0777);
    ServedProcess refused(dgx1(), open_dir / "s.sock");
    CHECK_FALSE(refused.listening());
    CHECK(refused.wait() == 1);
    CHECK(refused.output().find("is writable by group or others (mode 0777)") != std::string::npos);
  }
  SUBCASE("a symbolic link is not followed") {
    std::filesystem::create_directory_symlink(server.directory(), dir.path() / "link");
    ServedProcess refused(dgx1(), dir.path() / "link" / "s.sock");
    CHECK(refused.wait() == 1);
    CHECK(refused.output().find("is not a directory") != std::string::npos);
  }
  SUBCASE("a file in the socket's place is left alone") {
    const auto file = dir.path() / "s.sock";
    std::ofstream(file) << "data";
    ServedProcess refused(dgx1(), file);
    CHECK(refused.wait() == 1);
    CHECK(refused.output().find("exists and is not a socket") != std::string::npos);
    CHECK(carve::test::read_text(file) == "data");
  }
  SUBCASE("a missing directory is created owner-only") {
    const auto fresh = dir.path() / "fresh";
    ServedProcess created(dgx1(), fresh / "s.sock");
    REQUIRE(created.listening());
    REQUIRE(::lstat(fresh.c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0700);
  }
  SUBCASE("another user cannot connect, and is refused if the modes are loosened") {
    if (::geteuid() != 0) {
      MESSAGE("not root: cannot act as another user here");
      return;
    }
    const auto as_nobody = [&] {
      return carve::test::fork_child([&] {
        if (::setgid(65534) != 0 || ::setuid(65534) != 0) {
          return 10;
        }
        auto c = AllocationClient::connect(ClientOptions{server.socket(), "intruder", 5s});
        if (c) {
          return 11;
        }
        return c.error().code == Errc::permission_denied ? 0 : 12;
      });
    };
    CHECK(carve::test::wait_exit(as_nobody()) == 0); // the directory and the socket keep it out
    ::chmod(server.directory().c_str(), 0755);
    ::chmod(server.socket().c_str(), 0666);
    CHECK(carve::test::wait_exit(as_nobody()) == 0); // SO_PEERCRED: the server refuses uid 65534
    AllocationClient c = connect(server);
    CHECK(stats_of(c).rejected_messages == 1);
  }
}

TEST_CASE("a client killed mid-stream has everything reclaimed") {
  ServedProcess server(dgx1());
  AllocationClient observer = connect(server, "observer");
  const auto before = stats_of(observer);
  REQUIRE(before.clients == 1);

  Signal busy;
  const pid_t victim = carve::test::fork_child([&] {
    auto c = AllocationClient::connect(ClientOptions{server.socket(), "victim", 10s});
    if (!c) {
      return 1;
    }
    std::mt19937 rng(3);
    std::vector<void*> held;
    bool posted = false;
    for (int allocations = 0;;) {
      if (allocations == 250 && !posted) {
        busy.post(); // the parent then kills it at some later point of the stream
        posted = true;
      }
      if (held.size() > 150 || (!held.empty() && rng() % 4 == 0)) {
        const std::size_t k = rng() % held.size();
        (void)c->free(held[k]);
        held.erase(held.begin() + static_cast<std::ptrdiff_t>(k));
        continue;
      }
      if (auto r = c->lease(4 * KiB + rng() % (600 * KiB), static_cast<int>(rng() % 8), 256)) {
        std::memset(r->ptr, 0x3c, 64);
        held.push_back(r->ptr);
        ++allocations;
      }
    }
  });
  REQUIRE(busy.wait());
  std::this_thread::sleep_for(20ms); // still allocating and freeing
  ::kill(victim, SIGKILL);
  CHECK(carve::test::wait_exit(victim) == 128 + SIGKILL);

  // The server reclaims when it notices the hang-up; the reply comes once it has.
  const auto reclaimed = observer.wait_reclaimed_pid(static_cast<std::uint32_t>(victim), 10s);
  REQUIRE_MESSAGE(reclaimed, (reclaimed ? "" : reclaimed.error().message));
  const auto after = stats_of(observer);
  CHECK(*reclaimed == after.reclaimed_regions);
  CHECK(after.clients == 1);
  CHECK(after.live_regions == 0);
  CHECK(after.reclaimed_regions > 0);
  CHECK(after.allocations > 250);
  CHECK(after.consistent);
  CHECK(after.leased_segments == 0);
  CHECK(after.retired_segments == 0);
  for (const svc::CardStats& card : after.cards) {
    CHECK(card.bytes_in_use == 0);
    CHECK(card.live_blocks == 0);
    CHECK(card.bytes_reserved == 0); // every segment went back to its card
    CHECK(card.free_bytes == card.capacity);
  }
  CHECK(after.open_descriptors == before.open_descriptors); // no memfd or socket left behind
  CHECK(server.stop() == 0);
}

TEST_CASE("malformed, truncated, oversized and unknown messages get an error or a closed connection") {
  ServedProcess server(dgx1());
  const auto header = [](std::uint32_t magic, std::uint16_t version, std::uint16_t type, std::uint32_t length,
                         std::uint32_t seq) {
    std::vector<std::uint8_t> b;
    carve::service::WireWriter w(b);
    w(magic, version, type, length, seq);
    return b;
  };
  int rejected = 0;
  std::vector<std::uint32_t> damaged; // client ids of the connections that get damaged messages
  const auto expect_closed_after_error = [&](RawConnection& raw, Errc code, const std::string& text) {
    const auto r = raw.receive();
    REQUIRE(r);
    const auto* e = std::get_if<svc::ErrorReply>(&r->body);
    REQUIRE(e);
    CHECK(e->code == code);
    CHECK_MESSAGE(e->message.find(text) != std::string::npos, e->message);
    CHECK(raw.closed_by_server());
    ++rejected;
  };
  {
    RawConnection raw(server.socket());
    REQUIRE(raw.send(std::vector<std::uint8_t>(40, 0xee)));
    expect_closed_after_error(raw, Errc::bad_message, "bad magic");
  }
  {
    RawConnection raw(server.socket());
    REQUIRE(raw.send(header(svc::protocol_magic, 1, 1, 0, 1))); // a client from before GPUs were named by UUID
    expect_closed_after_error(raw, Errc::unsupported_version, "protocol version 1");
  }
  {
    RawConnection raw(server.socket());
    REQUIRE(hello(raw));
    auto m = svc::encode(svc::Request{svc::Allocate{4096, 0}}, 2);
    m.resize(m.size() - 4);
    REQUIRE(raw.send(m));
    expect_closed_after_error(raw, Errc::bad_message, "announces 12 payload bytes but 8 arrived");
  }
  {
    RawConnection raw(server.socket());
    REQUIRE(hello(raw));
    auto m = header(svc::protocol_magic, svc::protocol_version, 2, 10000 - 16, 2);
    m.resize(10000);
    REQUIRE(raw.send(m));
    expect_closed_after_error(raw, Errc::bad_message, "exceeds the limit of 4096");
  }
  {
    RawConnection raw(server.socket());
    REQUIRE(raw.send(svc::Request{svc::StatsRequest{}}, 1));
    expect_closed_after_error(raw, Errc::bad_message, "the first message must be Hello");
  }
  {
    RawConnection raw(server.socket());
    REQUIRE(hello(raw));
    REQUIRE(raw.send(svc::encode(svc::Request{svc::CardsRequest{}}, 2), STDIN_FILENO));
    expect_closed_after_error(raw, Errc::bad_message, "accepts no descriptors");
  }
  {
    RawConnection raw(server.socket());
    REQUIRE(hello(raw));
    REQUIRE(raw.send(svc::Request{svc::Hello{"again"}}, 2));
    expect_closed_after_error(raw, Errc::bad_message, "Hello sent twice");
  }
  {
    RawConnection raw(server.socket());
    REQUIRE(hello(raw));
    auto m = svc::encode(svc::Request{svc::Hello{"x"}}, 2);
    m[16] = 200; // the name's length: beyond its limit and the message
    REQUIRE(raw.send(m));
    expect_closed_after_error(raw, Errc::bad_message, "malformed payload");
  }
  {
    // Unknown but well-framed: an error, and the connection stays usable.
    RawConnection raw(server.socket());
    REQUIRE(hello(raw));
    REQUIRE(raw.send(header(svc::protocol_magic, svc::protocol_version, 0x0999, 0, 5)));
    const auto r = raw.receive();
    REQUIRE(r);
    CHECK(r->sequence == 5);
    REQUIRE(std::holds_alternative<svc::ErrorReply>(r->body));
    CHECK(std::get<svc::ErrorReply>(r->body).message == "unknown message type 2457");
    ++rejected;
    const auto zero = error_for(raw, svc::Request{svc::Allocate{0, 0}}, 6);
    REQUIRE(zero);
    CHECK(zero->code == Errc::invalid_size);
    const auto no_card = error_for(raw, svc::Request{svc::Allocate{4096, 99}}, 7);
    REQUIRE(no_card);
    CHECK(no_card->code == Errc::out_of_range);
    const auto huge = error_for(raw, svc::Request{svc::Allocate{std::uint64_t{1} << 62, 0}}, 8);
    REQUIRE(huge);
    CHECK(huge->code == Errc::no_space);
    CHECK(huge->message.find("no card can hold") == 0);
  }
  {
    // Unknown, with sequence 0 (reserved for notices): its error, sequence 0, ends the connection.
    RawConnection raw(server.socket());
    REQUIRE(hello(raw));
    REQUIRE(raw.send(header(svc::protocol_magic, svc::protocol_version, 0x0999, 0, 0)));
    expect_closed_after_error(raw, Errc::bad_message, "unknown message type 2457");
  }
  {
    // Random damage to valid messages from a few connections: errors and closed connections
    // only; the server keeps serving and its pools stay consistent.
    std::mt19937 rng(11);
    const std::vector<svc::Request> valid{svc::Allocate{8192, 1}, svc::Free{1}, svc::Query{2}, svc::StatsRequest{},
                                          svc::Unmapped{{1, 2}}};
    for (int conn = 0; conn < 20; ++conn) {
      RawConnection raw(server.socket());
      const auto id = hello_id(raw);
      REQUIRE(id);
      damaged.push_back(*id);
      for (int i = 0; i < 50; ++i) {
        auto m = svc::encode(valid[rng() % valid.size()], 2 + static_cast<std::uint32_t>(i));
        const int flips = 1 + static_cast<int>(rng() % 3);
        for (int f = 0; f < flips; ++f) {
          m[rng() % m.size()] ^= static_cast<std::uint8_t>(1u << (rng() % 8));
        }
        if (rng() % 4 == 0) {
          m.resize(rng() % m.size());
        }
        if (!raw.send(m)) {
          break;
        }
      }
    }
  }
  AllocationClient c = connect(server);
  for (const std::uint32_t id : damaged) {
    REQUIRE(c.wait_reclaimed_client(id, 10s));
  }
  const auto s = stats_of(c);
  CHECK(s.consistent);
  CHECK(s.clients == 1);
  CHECK(s.live_regions == 0);
  CHECK(s.rejected_messages >= static_cast<std::uint64_t>(rejected));
  REQUIRE(c.lease(MiB, 0, 256));
  CHECK(server.stop() == 0);
}

TEST_CASE("server restart: clients get a clear error and reconnect") {
  ServedProcess first(dgx1());
  AllocationClient c = connect(first);
  auto old = c.lease(256 * KiB, 0, 256);
  REQUIRE(old);
  std::memset(old->ptr, 0x42, old->info.size);

  CHECK(first.stop(SIGTERM) == 0);
  CHECK(first.output().find("stopping: disconnecting 1 clients, reclaiming 1 regions") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(first.socket())); // removed on the way out

  const auto lost = c.lease(4096, 0, 256);
  REQUIRE_FALSE(lost);
  CHECK(lost.error().code == Errc::disconnected);
  CHECK(lost.error().message == "carve-served closed the connection: the server is shutting down");
  CHECK_FALSE(c.connected());
  const auto still = c.stats();
  REQUIRE_FALSE(still);
  CHECK(still.error().message.find("call reconnect()") != std::string::npos);
  CHECK(static_cast<unsigned char*>(old->ptr)[100] == 0x42); // the orphan stays mapped

  ServedProcess second(dgx1(), first.socket());
  REQUIRE(second.listening());
  REQUIRE(c.reconnect());
  CHECK(c.server().server_pid == static_cast<std::uint32_t>(second.pid()));
  auto fresh = c.lease(256 * KiB, 0, 256);
  REQUIRE(fresh);
  CHECK(c.free(old->ptr)); // dropped locally: its server is gone
  CHECK(c.free(fresh->ptr));
  CHECK(c.live_regions() == 0);
  CHECK(stats_of(c).live_regions == 0);

  // A server killed outright leaves its socket file; the next one replaces it.
  CHECK(second.stop(SIGKILL) == 128 + SIGKILL);
  CHECK(std::filesystem::exists(first.socket()));
  ServedProcess third(dgx1(), first.socket());
  CHECK(third.listening());
  CHECK(c.reconnect());
}

TEST_CASE("a server at its client limit refuses more, with a reason") {
  ServedProcess server(dgx1({"--max-clients", "1"}));
  AllocationClient first = connect(server);
  auto second = AllocationClient::connect(ClientOptions{server.socket(), "second", 10s});
  REQUIRE_FALSE(second);
  CHECK(second.error().code == Errc::no_space);
  CHECK(second.error().message == "carve-served closed the connection: the server has reached its limit of 1 clients");
  CHECK(first.lease(4096, 0, 256));
}

TEST_CASE("a second server on a live socket is refused") {
  ServedProcess first(dgx1());
  ServedProcess second(dgx1(), first.socket());
  CHECK_FALSE(second.listening());
  CHECK(second.wait() == 1);
  CHECK(second.output().find("another server is already listening on") != std::string::npos);
  AllocationClient c = connect(first);
  CHECK(c.connected());
}

TEST_CASE("a freed region's segment is unmapped and goes back to its card") {
  ServedProcess server(dgx1());
  AllocationClient c = connect(server, "mapper");
  auto big = c.lease(3 * MiB, 4, 256);
  REQUIRE(big);
  CHECK(c.mapped_segments() == 1);
  const auto held = stats_of(c);
  CHECK(held.leased_segments == 1);
  CHECK(held.cards[4].bytes_in_use == 3 * MiB);
  CHECK(held.cards[4].bytes_reserved == 3 * MiB);
  CHECK(held.cards[4].free_bytes == 13 * MiB);
  REQUIRE(c.free(big->ptr));
  CHECK(c.mapped_segments() == 0);
  const auto released = stats_of(c); // sent after the client's Unmapped, so it sees the release
  CHECK(released.retired_segments == 0);
  CHECK(released.leased_segments == 0);
  CHECK(released.cards[4].free_bytes == 16 * MiB);
  CHECK(released.cards[4].upstream_allocations == 1);
  CHECK(released.cards[4].upstream_frees == 1);
  CHECK(released.consistent);
  CHECK(c.process_notices() == 0); // the notice of the retired segment finds nothing left to unmap
  CHECK(c.lease(3 * MiB, 4, 256)); // and the card's memory is there again
}

TEST_CASE("cards and stats describe the machine") {
  ServedProcess server(dgx1({"--card-memory", "3=8MiB"}));
  AllocationClient c = connect(server);
  const auto cards = c.cards();
  REQUIRE(cards);
  REQUIRE(cards->size() == 8);
  CHECK((*cards)[0].name == "GPU0");
  CHECK((*cards)[0].capacity == 16 * MiB);
  CHECK((*cards)[3].capacity == 8 * MiB);
  CHECK((*cards)[3].free_bytes == 8 * MiB);
  CHECK((*cards)[0].bandwidth_gbps[3] == 40.0); // NV2, 20 GB/s per link
  CHECK((*cards)[0].bandwidth_gbps[5] == 10.0); // what GPU0's loads get: the system path, not two NVLink hops
  CHECK(std::isinf((*cards)[0].bandwidth_gbps[0]));
  auto r = c.lease(5 * MiB, 3, 256);
  REQUIRE(r);
  const auto s = stats_of(c);
  CHECK(s.cards[3].bytes_in_use == 5 * MiB);
  CHECK(s.cards[3].free_bytes == 3 * MiB);
  CHECK(s.my_regions == 1);
  CHECK(s.allocations == 1);
}

TEST_CASE("the example client runs against carve-served") {
  ServedProcess server(dgx1({"--card-memory", "64MiB"}));
  carve::test::TempDir dir;
  const auto log = dir.path() / "client.log";
  const pid_t client = carve::test::spawn({CARVE_SERVICE_CLIENT, "--socket", server.socket().string()}, log);
  CHECK(carve::test::wait_exit(client) == 0);
  const std::string out = carve::test::read_text(log);
  CHECK_MESSAGE(out.find("region 3: 24 MiB for GPU0 on GPU3 (borrowed, 40 GB/s from GPU0)") != std::string::npos, out);
  CHECK(out.find("freed 4 regions") != std::string::npos);
}

TEST_CASE("bad settings stop carve-served with a clear message") {
  const auto refuses = [](std::vector<std::string> args, const std::string& text) {
    ServedProcess s(std::move(args));
    CHECK_FALSE(s.listening());
    CHECK(s.wait() == 1);
    CHECK_MESSAGE(s.output().find(text) != std::string::npos, s.output());
  };
  refuses({}, "no topology");
  refuses(dgx1({"--strategy", "fastest"}), "unknown strategy 'fastest'");
  refuses(dgx1({"--card-memory", "lots"}), "size 'lots': expected a number");
  refuses(dgx1({"--card-memory", "9=1GiB"}), "card-memory names card 9 but the topology has 8 GPUs");
  refuses({"--topology", "nvidia-smi:/nonexistent"}, "topology file /nonexistent cannot be read");
  refuses(dgx1({"--frobnicate", "1"}), "unknown setting 'frobnicate'");
}

} // namespace test_service
