// The allocation service's parts in one process: AnyStrategy, SharedMemoryCard, LeasedUpstream,
// AllocationService driven by encoded messages, the socket rules and carve-served's settings.
#include "service_process.hpp"
#include "support/topology_data.hpp"

#include <carve/mr.hpp>
#include <carve/service.hpp>

#include <doctest/doctest.h>

#include <fcntl.h>
#include <grp.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

// In a namespace of its own: the area's test files compile as one translation unit.
namespace test_service_parts {

using namespace carve::service;
using carve::Errc;

namespace {

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;

template <class M>
M reply_as(const Outgoing& o) {
  const auto d = decode_reply(o.bytes);
  REQUIRE(d);
  REQUIRE_MESSAGE(std::holds_alternative<M>(d->body),
                  (std::holds_alternative<ErrorReply>(d->body) ? std::get<ErrorReply>(d->body).message : ""));
  return std::get<M>(d->body);
}

// A connected SOCK_SEQPACKET pair, as the server's connections are: [0] the server's end.
std::array<UniqueFd, 2> socket_pair() {
  int fds[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds) == 0);
  return {UniqueFd(fds[0]), UniqueFd(fds[1])};
}

// A one-byte reply numbered `n`, with a descriptor of its own when `with_fd`.
Outgoing numbered(std::uint8_t n, bool with_fd, bool close_after = false) {
  Outgoing o{0, {n}, UniqueFd(), close_after};
  if (with_fd) {
    o.fd = UniqueFd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    REQUIRE(o.fd);
  }
  return o;
}

// What the peer can read now: each message's number, and how many came with a descriptor.
struct Read {
  std::vector<std::uint8_t> numbers;
  std::size_t descriptors = 0;
};
Read read_now(int fd, std::size_t at_most = SIZE_MAX) {
  Read r;
  std::array<std::uint8_t, 8> buffer{};
  while (r.numbers.size() < at_most) {
    std::vector<UniqueFd> fds;
    const ReceivedMessage m = receive_message(fd, buffer, fds, true);
    if (m.error != 0 || m.closed) {
      break;
    }
    r.numbers.push_back(buffer[0]);
    r.descriptors += fds.size();
  }
  return r;
}

} // namespace

TEST_CASE("ReplyQueue: in order, at most max_unread descriptors the peer has not read, the rest when it has") {
  auto [server, client] = socket_pair();
  detail::ReplyQueue q;
  using Stop = detail::ReplyQueue::Stop;
  for (std::uint8_t n = 0; n < 10; ++n) {
    q.push(numbered(n, n != 5)); // 5 carries none, and still waits behind 4
  }
  CHECK(q.send(server.get(), 3) == Stop::held_back);
  CHECK(q.held_back());
  CHECK(q.size() == 7);
  CHECK(q.unread_descriptors() == 3);
  const Read first = read_now(client.get(), 2);
  CHECK(first.numbers == std::vector<std::uint8_t>{0, 1});
  CHECK(q.send(server.get(), 3) == Stop::held_back); // message 2 is unread yet
  const Read second = read_now(client.get());
  CHECK(second.numbers == std::vector<std::uint8_t>{2});
  CHECK(first.descriptors + second.descriptors == 3);
  CHECK(q.send(server.get(), 3) == Stop::held_back); // 3 to 6 went (5 without one); 7 waits
  CHECK(read_now(client.get()).numbers == std::vector<std::uint8_t>{3, 4, 5, 6});
  CHECK(q.send(server.get(), 3) == Stop::sent_all);
  CHECK_FALSE(q.held_back());
  const Read last = read_now(client.get());
  CHECK(last.numbers == std::vector<std::uint8_t>{7, 8, 9});
  CHECK(last.descriptors == 3);
  // A reply that ends the connection drops what is queued after it.
  q.push(numbered(10, false, true));
  q.push(numbered(11, true));
  CHECK(q.send(server.get(), 3) == Stop::ended);
  CHECK(q.empty());
  CHECK(read_now(client.get()).numbers == std::vector<std::uint8_t>{10});
  client.reset(); // a peer gone: the send fails and ends the connection
  q.push(numbered(12, false));
  CHECK(q.send(server.get(), 3) == Stop::ended);
}

TEST_CASE("ReplyQueue: a send the system refuses for descriptors in flight waits, and goes once they are read") {
  // Linux bounds the descriptors a user has in flight by RLIMIT_NOFILE (root is exempt). The
  // check runs in a child that lowers its limit and, run as root, becomes a user of its own; the
  // count is the user's across processes, so the first send may already be refused.
  const pid_t child = carve::test::fork_child([] {
    auto [server, client] = socket_pair();
    detail::ReplyQueue q;
    for (std::uint8_t n = 0; n < 40; ++n) {
      q.push(numbered(n, true)); // 40 open descriptors, made before the limit drops
    }
    const rlimit low{16, 16};
    const uid_t unused = 54321;
    if (::setrlimit(RLIMIT_NOFILE, &low) != 0 ||
        (::geteuid() == 0 && (::setgroups(0, nullptr) != 0 || ::setgid(unused) != 0 || ::setuid(unused) != 0))) {
      return 77;
    }
    using Stop = detail::ReplyQueue::Stop;
    if (q.send(server.get(), 1000) != Stop::held_back || q.empty()) {
      return 1; // refused and closed, or never refused
    }
    std::size_t received = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (received < 40 && std::chrono::steady_clock::now() < deadline) {
      received += read_now(client.get()).descriptors;
      if (q.send(server.get(), 1000) == Stop::ended) {
        return 2;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return received == 40 && q.empty() ? 0 : 3;
  });
  REQUIRE(child > 0);
  const int code = carve::test::wait_exit(child);
  if (code == 77) {
    MESSAGE("skipped: cannot give up root or lower the descriptor limit here");
    return;
  }
  CHECK(code == 0);
}

TEST_CASE("AnyStrategy decides as the strategy it holds") {
  const auto& topo = carve::test::dgx1();
  const carve::BandwidthWeightedPicker<carve::AnyStrategy> any_weighted(
      topo, carve::parse_strategy("weighted-score:history=2"));
  const carve::BandwidthWeightedPicker<carve::WeightedScore> weighted(topo, carve::WeightedScore{1.0, 1.0, 2.0});
  const carve::BandwidthWeightedPicker<carve::AnyStrategy> any_threshold(
      topo, carve::parse_strategy("threshold-most-free:threshold=30,strict"));
  const carve::BandwidthWeightedPicker<carve::ThresholdMostFree> threshold(topo, carve::ThresholdMostFree{30.0, true});
  carve::BorrowHistory history(8, 64);
  std::mt19937 rng(1);
  for (int i = 0; i < 2000; ++i) {
    std::vector<carve::CardState> states;
    for (int c = 0; c < 8; ++c) {
      const std::size_t free = (rng() % 16) * MiB;
      states.push_back({free, free});
    }
    const int requester = static_cast<int>(rng() % 8);
    states[static_cast<std::size_t>(requester)] = {};
    const std::size_t bytes = (1 + rng() % 8) * MiB;
    const auto a = any_weighted.pick(requester, bytes, states, &history);
    const auto b = weighted.pick(requester, bytes, states, &history);
    REQUIRE(a.has_value() == b.has_value());
    if (a) {
      CHECK(a->card == b->card);
      history.record(requester, a->card, bytes);
    }
    const auto c = any_threshold.pick(requester, bytes, states);
    const auto d = threshold.pick(requester, bytes, states);
    REQUIRE(c.has_value() == d.has_value());
    if (c) {
      CHECK(c->card == d->card);
    }
  }
}

TEST_CASE("strategies are read from text and written back") {
  for (const char* text :
       {"largest-bandwidth", "threshold-most-free:threshold=48", "threshold-most-free:threshold=30,strict",
        "weighted-score:free=1,bandwidth=2,history=0.25"}) {
    CAPTURE(text);
    CHECK(carve::to_string(carve::parse_strategy(text)) == text);
  }
  CHECK(carve::to_string(carve::parse_strategy("weighted-score")) == "weighted-score:free=1,bandwidth=1,history=0.5");
  CHECK(std::string(carve::parse_strategy("threshold-most-free").name()) == "threshold-most-free");
  const auto error = [](const char* text) {
    try {
      (void)carve::parse_strategy(text);
    } catch (const carve::Exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(error("fastest") ==
        "unknown strategy 'fastest' (use largest-bandwidth, threshold-most-free or weighted-score)");
  CHECK(error("weighted-score:free=-1") == "strategy weighted-score: free=-1 is not a non-negative number");
  CHECK(error("weighted-score:strict") == "strategy weighted-score has no setting 'strict'");
  CHECK(error("largest-bandwidth:threshold=3") == "strategy largest-bandwidth has no setting 'threshold=3'");
  CHECK(error("threshold-most-free:threshold=fast") ==
        "strategy threshold-most-free: threshold=fast is not a non-negative number");
}

TEST_CASE("SharedMemoryCard: a capacity, and memory another process can map") {
  carve::SharedMemoryCard card(MiB, "carve-test");
  CHECK(card.try_allocate(0, 256).error() == carve::Errc::invalid_size);
  CHECK(card.try_allocate(4096, 3).error() == carve::Errc::invalid_size);
  CHECK(card.try_allocate(4096, 1 << 20).error() == carve::Errc::no_space); // beyond a page
  CHECK(card.try_allocate(2 * MiB, 256).error() == carve::Errc::no_space);  // beyond the card
  void* p = *card.try_allocate(256 * KiB, 4096);
  REQUIRE(p != nullptr);
  CHECK(card.owns(static_cast<char*>(p) + 1000));
  int elsewhere = 0;
  CHECK_FALSE(card.owns(&elsewhere));
  CHECK(card.free_bytes() == 768 * KiB);
  CHECK_FALSE(card.export_segment(p, 128 * KiB)); // not the size it was allocated with
  int dummy = 0;
  CHECK_FALSE(card.export_segment(&dummy, 256 * KiB));
  const auto e = card.export_segment(p, 256 * KiB);
  REQUIRE(e);
  CHECK(e->kind == carve::ExportKind::shared_memory);
  CHECK(e->size == 256 * KiB);
  std::memset(p, 0x21, 256 * KiB);

  // A child maps the descriptor, sees what was written, writes back; it cannot resize it.
  const pid_t child = carve::test::fork_child([&] {
    void* q = ::mmap(nullptr, 256 * KiB, PROT_READ | PROT_WRITE, MAP_SHARED, e->fd, 0);
    if (q == MAP_FAILED) {
      return 1;
    }
    auto* bytes = static_cast<unsigned char*>(q);
    if (bytes[0] != 0x21 || bytes[256 * KiB - 1] != 0x21) {
      return 2;
    }
    bytes[1000] = 0x7e;
    if (::ftruncate(e->fd, 4096) == 0 || ::ftruncate(e->fd, static_cast<off_t>(MiB)) == 0) {
      return 3; // sealed against shrinking and growing
    }
    return 0;
  });
  CHECK(carve::test::wait_exit(child) == 0);
  CHECK(static_cast<unsigned char*>(p)[1000] == 0x7e);

  struct stat st {};
  REQUIRE(::fstat(e->fd, &st) == 0);
  const int fd = e->fd;
  card.deallocate(p, 256 * KiB, 4096);
  CHECK(::fstat(fd, &st) != 0); // its descriptor is closed with it
  CHECK(card.free_bytes() == MiB);
}

TEST_CASE("LeasedUpstream: ids, locations, and a released segment's leases") {
  LeasedUpstream<carve::SharedMemoryCard> card(carve::SharedMemoryCard(4 * MiB));
  void* a = *card.try_allocate(MiB, 512);
  void* b = *card.try_allocate(MiB, 512);
  REQUIRE(a);
  REQUIRE(b);
  const auto la = card.locate(static_cast<char*>(a) + 100);
  const auto lb = card.locate(b);
  REQUIRE(la);
  REQUIRE(lb);
  CHECK(la->offset == 100);
  CHECK(la->segment_size == MiB);
  CHECK(la->segment != lb->segment);
  int local = 0;
  CHECK_FALSE(card.locate(&local));
  CHECK_FALSE(card.locate(nullptr));
  REQUIRE(card.lease(la->segment));
  REQUIRE(card.lease(la->segment));
  CHECK(card.leased_count() == 1);
  card.deallocate(b, MiB, 512); // not leased: released, forgotten
  CHECK_FALSE(card.lease(lb->segment));
  CHECK(card.take_retired().empty());
  card.deallocate(a, MiB, 512); // leased twice: retired; shared memory goes back at once
  CHECK(card.free_bytes() == 4 * MiB);
  CHECK(card.take_retired() == std::vector<SegmentId>{la->segment});
  CHECK(card.take_retired().empty());
  CHECK_FALSE(card.locate(a));
  CHECK_FALSE(card.lease(la->segment)); // no new leases on a retired segment
  CHECK(card.retired_count() == 1);
  CHECK(card.unlease(la->segment));
  CHECK(card.unlease(la->segment));
  CHECK_FALSE(card.unlease(la->segment));
  CHECK(card.retired_count() == 0);
  CHECK(card.leased_count() == 0);
}

TEST_CASE("LeasedUpstream keeps memory the upstream must not free while it is mapped") {
  LeasedUpstream<carve::test::CudaIpcLikeCard> card(carve::test::CudaIpcLikeCard(4 * MiB));
  carve::CachingPool pool(card, carve::PoolOptions{.granularity = 512, .segment_size = MiB, .idle_threshold = 0});
  auto p = pool.try_allocate(3 * MiB, 256);
  REQUIRE(p);
  const auto where = card.locate(*p);
  REQUIRE(where);
  REQUIRE(card.lease(where->segment));
  REQUIRE(pool.try_deallocate(*p, 3 * MiB, 256)); // idle threshold 0: the pool gives the segment back
  CHECK(pool.stats().bytes_reserved == 0);
  CHECK(card.free_bytes() == MiB); // but the memory stays allocated while it is mapped
  CHECK(card.held_count() == 1);
  CHECK_FALSE(pool.try_allocate(2 * MiB, 256)); // and it is not there to be had
  CHECK(card.take_retired() == std::vector<SegmentId>{where->segment});
  CHECK(card.unlease(where->segment)); // the last mapper is done
  CHECK(card.free_bytes() == 4 * MiB);
  CHECK(card.held_count() == 0);
  CHECK(pool.try_allocate(2 * MiB, 256));
}

TEST_CASE("AllocationService: sessions, ownership, mappings and reclamation") {
  const auto& topo = carve::test::dgx1();
  std::vector<carve::SharedMemoryCard> cards;
  for (int i = 0; i < 8; ++i) {
    cards.emplace_back(8 * MiB);
  }
  AllocationService<carve::SharedMemoryCard> service(topo, cards);
  const ClientId a = service.connect(PeerCredentials{100, 0, 0});
  const ClientId b = service.connect(PeerCredentials{200, 0, 0});
  std::vector<Outgoing> out;
  const auto send = [&](ClientId who, const Request& r, std::uint32_t seq) {
    out.clear();
    service.receive(who, encode(r, seq), out);
    return std::move(out);
  };

  // Before Hello nothing is served, and the connection is closed.
  auto o = send(a, Request{StatsRequest{}}, 1);
  REQUIRE(o.size() == 1);
  CHECK(o[0].close_after);
  CHECK(reply_as<ErrorReply>(o[0]).message == "the first message must be Hello");
  const ClientId a2 = service.connect(PeerCredentials{100, 0, 0});
  o = send(a2, Request{Hello{"a"}}, 1);
  CHECK(reply_as<HelloReply>(o[0]).peer_pid == 100);
  CHECK(reply_as<HelloReply>(o[0]).cards == 8);
  send(b, Request{Hello{"b"}}, 1);

  // Every region is a segment of its own, leased to its client alone: each comes with a descriptor.
  o = send(a2, Request{Allocate{64 * KiB, 0}}, 2);
  REQUIRE(o.size() == 1);
  const auto first = reply_as<Allocated>(o[0]);
  CHECK(first.new_mapping);
  CHECK(o[0].fd.get() >= 0);
  CHECK(first.region.card == 0);
  CHECK(first.region.offset == 0);
  CHECK(first.segment_size == 64 * KiB);
  o = send(a2, Request{Allocate{64 * KiB, 0}}, 3);
  const auto second = reply_as<Allocated>(o[0]);
  CHECK(second.new_mapping);
  CHECK(o[0].fd.get() >= 0);
  CHECK(second.region.segment != first.region.segment);
  o = send(b, Request{Allocate{4 * KiB, 0}}, 2);
  const auto third = reply_as<Allocated>(o[0]);
  CHECK(third.new_mapping);
  CHECK(third.region.segment != first.region.segment);
  CHECK(third.region.segment != second.region.segment);
  CHECK(service.stats(b).leased_segments == 3);

  // b can neither free nor query a's regions; a's stay.
  o = send(b, Request{Free{first.region.id}}, 3);
  CHECK(reply_as<ErrorReply>(o[0]).code == Errc::permission_denied);
  o = send(b, Request{Query{first.region.id}}, 4);
  CHECK(reply_as<ErrorReply>(o[0]).code == Errc::permission_denied);
  o = send(a2, Request{Query{first.region.id}}, 4);
  CHECK(reply_as<QueryReply>(o[0]).region == first.region);
  CHECK(service.consistent());

  // a goes away: its regions are reclaimed and their segments released; b's stays.
  out.clear();
  service.disconnect(a2, out);
  CHECK(out.empty());
  CHECK(service.region_count() == 1);
  CHECK(service.consistent());
  const auto s = service.stats(b);
  CHECK(s.reclaimed_regions == 2);
  CHECK(s.my_regions == 1);
  CHECK(s.cards[0].bytes_in_use == 4 * KiB);

  CHECK(s.leased_segments == 1);
  CHECK(s.cards[0].free_bytes == 8 * MiB - 4 * KiB);

  // b frees its region: the segment goes back to the card (shared memory: b's mapping keeps its
  // own pages until b unmaps), and b is told to unmap it.
  o = send(b, Request{Free{third.region.id}}, 5);
  REQUIRE(o.size() == 2);
  CHECK(reply_as<Freed>(o[0]).region == third.region.id);
  CHECK(reply_as<SegmentsRetired>(o[1]).segments == std::vector<SegmentId>{third.region.segment});
  CHECK(o[1].to == b);
  CHECK(service.stats(b).retired_segments == 1);
  CHECK(service.stats(b).cards[0].free_bytes == 8 * MiB);
  o = send(b, Request{Unmapped{{third.region.segment, 12345}}}, 6); // unknown ids are ignored
  CHECK(o.empty());
  CHECK(service.stats(b).retired_segments == 0);
  CHECK(service.stats(b).leased_segments == 0);
  CHECK(service.consistent());
}

TEST_CASE("AllocationService::card checks its index and throws carve::Exception") {
  std::vector<carve::SharedMemoryCard> cards;
  for (int i = 0; i < 8; ++i) {
    cards.emplace_back(MiB);
  }
  const AllocationService<carve::SharedMemoryCard> service(carve::test::dgx1(), cards);
  CHECK(service.card(7).capacity() == MiB);
  for (const int bad : {8, -1, 256}) {
    try {
      (void)service.card(bad);
      FAIL("card(" << bad << ") did not throw");
    } catch (const carve::Exception& e) { // not std::out_of_range from vector::at
      CHECK(e.code() == Errc::out_of_range);
      CHECK(std::string(e.what()).find("card " + std::to_string(bad) + " ") != std::string::npos);
    }
  }
}

namespace {

// A card on a GPU that says which (KnowsItsDevice), as VmmCard<CudaMemoryMapper> does: GPU c's
// UUID is c + 1 followed by 0xcc bytes. `broken` cannot say.
carve::DeviceUuid gpu_uuid(int c) {
  carve::DeviceUuid u;
  u.fill(0xcc);
  u[0] = static_cast<std::uint8_t>(c + 1);
  return u;
}
struct NamedCard : carve::SharedMemoryCard {
  NamedCard(std::size_t capacity, int on_gpu, bool cannot_say = false)
      : carve::SharedMemoryCard(capacity), gpu(on_gpu), broken(cannot_say) {}
  carve::Result<carve::DeviceUuid> device_uuid() const {
    if (broken) {
      return carve::fail(Errc::device_error, "GPU " + std::to_string(gpu) + " fell off the bus");
    }
    return gpu_uuid(gpu);
  }
  int gpu;
  bool broken;
};
static_assert(carve::KnowsItsDevice<NamedCard> && !carve::KnowsItsDevice<carve::SharedMemoryCard>);

// A process's devices as CUDA_VISIBLE_DEVICES shows them: `visible[i]` is the server's GPU that
// this process calls i.
struct VisibleDevices {
  std::vector<int> visible;
  Errc fault = Errc::out_of_range; // what a search for a device it lacks answers
  carve::Result<int> ordinal_of(const carve::DeviceUuid& u) const {
    for (std::size_t i = 0; i < visible.size(); ++i) {
      if (gpu_uuid(visible[i]) == u) {
        return static_cast<int>(i);
      }
    }
    return carve::fail(fault, "not here");
  }
};
static_assert(DeviceDirectory<VisibleDevices>);

} // namespace

TEST_CASE("DeviceUuid reads as nvidia-smi prints it") {
  carve::DeviceUuid u;
  for (std::size_t i = 0; i < u.size(); ++i) {
    u[i] = static_cast<std::uint8_t>(0xa0 + i);
  }
  CHECK(carve::to_string(u) == "GPU-a0a1a2a3-a4a5-a6a7-a8a9-aaabacadaeaf");
  CHECK(carve::to_string(carve::no_device_uuid) == "no device");
  CHECK(carve::names_a_device(u));
  CHECK_FALSE(carve::names_a_device(carve::no_device_uuid));
}

TEST_CASE("AllocationService names GPUs by UUID; a client maps for the devices it sees, as it numbers them") {
  const auto& topo = carve::test::dgx1();
  std::vector<NamedCard> cards;
  for (int i = 0; i < 8; ++i) {
    cards.emplace_back(MiB, i);
  }
  AllocationService<NamedCard> service(topo, cards);
  for (const CardInfo& c : service.cards()) {
    CHECK(c.uuid == gpu_uuid(c.card));
  }
  const ClientId id = service.connect(PeerCredentials{100, 0, 0});
  std::vector<Outgoing> out;
  service.receive(id, encode(Request{Hello{"worker"}}, 1), out);
  const auto allocate = [&](std::uint32_t seq) {
    out.clear();
    service.receive(id, encode(Request{Allocate{MiB, 0}}, seq), out);
    REQUIRE(out.size() == 1);
    return reply_as<Allocated>(out[0]);
  };
  const Allocated own = allocate(2);
  CHECK(own.region.card == 0);
  CHECK(own.device_uuid == gpu_uuid(0));
  CHECK(own.requester_uuid == gpu_uuid(0));
  const Allocated lent = allocate(3); // card 0 is full: borrowed from another GPU
  const int lender = lent.region.card;
  REQUIRE(lender != 0);
  CHECK(lent.region.requester == 0);
  CHECK(lent.device_uuid == gpu_uuid(lender));
  CHECK(lent.requester_uuid == gpu_uuid(0));

  // A worker started with CUDA_VISIBLE_DEVICES=<the server's 0>: its device 0 is card 0, and the
  // lender's GPU is not there at all. It maps for its device 0, whatever the server calls it.
  const VisibleDevices only_mine{{0}};
  CHECK(*card_of(service.cards(), gpu_uuid(0)) == 0);
  auto d = segment_devices(lent, only_mine);
  REQUIRE(d);
  CHECK(d->owner == -1);
  CHECK(d->requester == 0);
  CHECK(d->primary() == 0);
  CHECK(d->secondary() == -1);
  // Both GPUs seen, in another order: the requester's first, the lender's as well.
  d = segment_devices(lent, VisibleDevices{{lender, 0}});
  REQUIRE(d);
  CHECK(d->primary() == 1);
  CHECK(d->secondary() == 0);
  d = segment_devices(own, VisibleDevices{{3, 0}});
  REQUIRE(d);
  CHECK(d->primary() == 1);
  CHECK(d->secondary() == -1);

  // Neither GPU seen: out_of_range naming both; the directory's own faults pass through.
  const auto neither = segment_devices(lent, VisibleDevices{{5, 6}});
  REQUIRE_FALSE(neither);
  CHECK(neither.error().code == Errc::out_of_range);
  CHECK(neither.error().message.find(carve::to_string(gpu_uuid(lender))) != std::string::npos);
  CHECK(neither.error().message.find(carve::to_string(gpu_uuid(0))) != std::string::npos);
  CHECK(neither.error().message.find("CUDA_VISIBLE_DEVICES") != std::string::npos);
  CHECK(segment_devices(lent, VisibleDevices{{0}, Errc::device_error}).error().code == Errc::device_error);

  // A reply naming one device but not the other does not hold together.
  Allocated half = lent;
  half.requester_uuid = carve::no_device_uuid;
  CHECK(segment_devices(half, only_mine).error().code == Errc::bad_message);
  // Host-twin memory names no GPU: the server's numbers are the process's.
  Allocated twin = lent;
  twin.device = 4;
  twin.device_uuid = twin.requester_uuid = carve::no_device_uuid;
  d = segment_devices(twin, only_mine);
  REQUIRE(d);
  CHECK(d->owner == 4);
  CHECK(d->requester == 0);

  CHECK(card_of(service.cards(), gpu_uuid(9)).error().code == Errc::out_of_range);
  CHECK(card_of(service.cards(), carve::no_device_uuid).error().code == Errc::invalid_argument);
}

TEST_CASE("AllocationService lends only between cards whose GPUs can map each other (its Peers policy)") {
  const auto& topo = carve::test::dgx1();
  const auto cards = [] {
    std::vector<carve::SharedMemoryCard> c;
    for (int i = 0; i < 8; ++i) {
      c.emplace_back(MiB);
    }
    return c;
  };
  // Card 0 fills, then borrows `MiB`: where to, and with what answer.
  const auto borrow = [](auto& service) {
    const ClientId id = service.connect(PeerCredentials{100, 0, 0});
    std::vector<Outgoing> out;
    service.receive(id, encode(Request{Hello{"peers"}}, 1), out);
    service.receive(id, encode(Request{Allocate{MiB, 0}}, 2), out);
    out.clear();
    service.receive(id, encode(Request{Allocate{MiB, 0}}, 3), out);
    REQUIRE(out.size() == 1);
    return decode_reply(out[0].bytes)->body;
  };
  AllocationService<carve::SharedMemoryCard> anyone(topo, cards());
  const int first_choice = std::get<Allocated>(borrow(anyone)).region.card;
  REQUIRE(first_choice != 0);
  // Card 0 can map one other card, not the one it would have picked: the borrow goes there.
  const int reachable = first_choice == 1 ? 2 : 1;
  std::vector<std::vector<bool>> can(8, std::vector<bool>(8, true));
  for (int l = 1; l < 8; ++l) {
    can[0][static_cast<std::size_t>(l)] = l == reachable;
  }
  AllocationService<carve::SharedMemoryCard, carve::SimulatedPeerAccess> some(topo, cards(), {},
                                                                              carve::SimulatedPeerAccess(can));
  CHECK(std::get<Allocated>(borrow(some)).region.card == reachable);
  // Card 0 can map none: refused, nothing lent.
  can[0].assign(8, false);
  AllocationService<carve::SharedMemoryCard, carve::SimulatedPeerAccess> none(topo, cards(), {},
                                                                              carve::SimulatedPeerAccess(can));
  CHECK(std::holds_alternative<ErrorReply>(borrow(none)));
  CHECK(none.stats().live_regions == 1);
  // The socket server takes the policy too.
  carve::test::TempDir dir;
  ServerOptions options;
  options.socket_path = dir.path() / "peers.sock";
  const carve::AllocationServer<carve::SharedMemoryCard, carve::SimulatedPeerAccess> server(
      topo, cards(), options, carve::SimulatedPeerAccess(can));
  CHECK_FALSE(server.service().allocator().peer_access().can_access(0, reachable));
  CHECK(server.service().allocator().peer_access().can_access(1, reachable));
  // A policy that needs its matrix must be given it.
  CHECK_THROWS_AS((AllocationService<carve::SharedMemoryCard, carve::SimulatedPeerAccess>(topo, cards())),
                  carve::Exception);
}

TEST_CASE("AllocationService refuses a card that cannot say which GPU it is") {
  std::vector<NamedCard> cards;
  for (int i = 0; i < 8; ++i) {
    cards.emplace_back(MiB, i, i == 5);
  }
  try {
    AllocationService<NamedCard> service(carve::test::dgx1(), cards);
    FAIL("a card without a UUID was accepted");
  } catch (const carve::Exception& e) {
    CHECK(e.code() == Errc::device_error);
    CHECK(std::string(e.what()).find("GPU 5 fell off the bus") != std::string::npos);
  }
}

TEST_CASE("socket directories are checked") {
  carve::test::TempDir dir;
  const auto message = [](const std::filesystem::path& d) {
    try {
      prepare_socket_directory(d);
    } catch (const carve::Exception& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK(message(dir.path()) == "accepted");
  const auto open = dir.path() / "open";
  std::filesystem::create_directory(open);
  ::chmod(open.c_str(), 0775);
  CHECK(message(open) == "socket directory " + open.string() +
                             " is writable by group or others (mode 0775); use a directory only this user can write");
  const auto sticky = dir.path() / "sticky";
  std::filesystem::create_directory(sticky);
  ::chmod(sticky.c_str(), 01777);
  CHECK(message(sticky).find("(mode 1777)") != std::string::npos);
  CHECK(message(dir.path() / "missing" / "deeper").find("No such file or directory") != std::string::npos);
  const auto created = dir.path() / "made";
  CHECK(message(created) == "accepted");
  struct stat st {};
  REQUIRE(::stat(created.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);
  if (::geteuid() == 0) {
    const auto foreign = dir.path() / "foreign";
    std::filesystem::create_directory(foreign);
    REQUIRE(::chown(foreign.c_str(), 65534, 65534) == 0);
    CHECK(message(foreign) ==
          "socket directory " + foreign.string() + " belongs to uid 65534, not to this server's uid 0");
  }
}

TEST_CASE("the default socket path") {
  const char* saved_socket = std::getenv("CARVE_SOCKET");
  const char* saved_run = std::getenv("XDG_RUNTIME_DIR");
  const std::string keep_socket = saved_socket ? saved_socket : "";
  const std::string keep_run = saved_run ? saved_run : "";
  ::setenv("CARVE_SOCKET", "/run/x/carve.sock", 1);
  CHECK(default_socket_path() == "/run/x/carve.sock");
  ::unsetenv("CARVE_SOCKET");
  ::setenv("XDG_RUNTIME_DIR", "/run/user/1000", 1);
  CHECK(default_socket_path() == "/run/user/1000/carve/served.sock");
  ::unsetenv("XDG_RUNTIME_DIR");
  CHECK(default_socket_path() == "/tmp/carve-" + std::to_string(::geteuid()) + "/served.sock");
  if (saved_socket) {
    ::setenv("CARVE_SOCKET", keep_socket.c_str(), 1);
  }
  if (saved_run) {
    ::setenv("XDG_RUNTIME_DIR", keep_run.c_str(), 1);
  }
}

TEST_CASE("carve-served's settings from flags and a file") {
  carve::test::TempDir dir;
  const auto file = dir.path() / "served.conf";
  std::ofstream(file) << "# carve-served\n"
                         "topology = description:/etc/machine.txt\n"
                         "strategy weighted-score:history=1   # spread borrowing\n"
                         "card-memory 2GiB\n"
                         "card-memory 3=512MiB\n"
                         "bandwidth nvlink=25\n"
                         "\n"
                         "max-clients 8\n"
                         "max-unread-descriptors 3\n";
  const std::vector<std::string_view> args{"--config", file.c_str(), "--socket=/tmp/s/x.sock", "--max-clients", "16"};
  const ServerConfig c = parse_server_args(args);
  CHECK(c.topology == "description:/etc/machine.txt");
  CHECK(carve::to_string(c.service.strategy) == "weighted-score:free=1,bandwidth=1,history=1");
  CHECK(c.capacity_of(0) == 2ull << 30);
  CHECK(c.capacity_of(3) == 512ull << 20);
  CHECK(c.bandwidths.nvlink == 25.0);
  CHECK(c.max_clients == 16); // the flag after --config wins
  CHECK(c.socket_path == "/tmp/s/x.sock");
  CHECK(c.server_options().max_clients == 16);
  CHECK(c.server_options().max_unread_descriptors == 3);
  CHECK(ServerConfig{}.server_options().max_unread_descriptors == 64);

  const auto error = [](std::vector<std::string_view> a) {
    try {
      (void)parse_server_args(a);
    } catch (const carve::Exception& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK(error({"--max-clients"}) == "--max-clients needs a value");
  CHECK(error({"topology"}) == "unexpected argument 'topology' (settings are --key value)");
  CHECK(error({"--topology", "smi:x"}) == "--topology: 'smi:x' is not nvidia-smi:FILE, description:FILE or cuda");
  CHECK(error({"--max-clients", "0"}) == "--max-clients: '0' is not a whole number >= 1");
  CHECK(error({"--max-unread-descriptors", "0"}) == "--max-unread-descriptors: '0' is not a whole number >= 1");
  CHECK(error({"--max-hops", "4294967297"}) == "--max-hops: '4294967297' is not a whole number from 1 to 2147483647");
  CHECK(error({"--history-window", "99999999999"}) ==
        "--history-window: '99999999999' is not a whole number from 1 to 16777216");
  CHECK(error({"--bandwidth", "nvlink"}) ==
        "--bandwidth: 'nvlink' is not nvlink=GBPS, pcie=GBPS or inter_socket=GBPS (GB/s per link)");
  CHECK(error({"--backend", "gpu"}) == "--backend: 'gpu' is not shared-memory, host-vmm, cuda or cuda-ipc");
  CHECK(error({"--card-memory", "99=1GiB"}) == "--card-memory: card 99 is past the limit of 64 cards");
  CHECK(error({"--config", "/nonexistent.conf"}) == "config file /nonexistent.conf cannot be read");
  std::ofstream(file) << "strategy weighted-score\nmax-clients\n";
  CHECK(error({"--config", file.c_str()}) == file.string() + " line 2: expected: max-clients VALUE");
  std::ofstream(file) << "\n\nfrobnicate 3\n";
  CHECK(error({"--config", file.c_str()}) == file.string() + " line 3: unknown setting 'frobnicate'");
  CHECK(parse_server_args(std::vector<std::string_view>{"--backend", "cuda"}).topology == "cuda");
  CHECK(parse_server_args(std::vector<std::string_view>{"--backend", "cuda-ipc"}).backend == Backend::cuda_ipc);
  CHECK(parse_server_args(std::vector<std::string_view>{"--backend", "host-vmm"}).backend == Backend::host_vmm);
  CHECK(parse_server_args(std::vector<std::string_view>{"--backend", "host-vmm"}).topology.empty());
}

TEST_CASE("a topology and simulated cards from the settings") {
  ServerConfig c;
  c.topology = "nvidia-smi:" + std::string(CARVE_TEST_DATA_DIR) + "/topology/dgx1_v100.txt";
  c.bandwidths.nvlink = 25.0;
  c.card_memory = 64 * MiB;
  c.card_memory_of[7] = 16 * MiB;
  const carve::Topology t = load_topology(c);
  CHECK(t.gpu_count() == 8);
  CHECK(t.path_bandwidth(t.gpu(0), t.gpu(3)) == 50.0);
  const auto cards = shared_memory_cards(c, t);
  REQUIRE(cards.size() == 8);
  CHECK(cards[0].capacity() == 64 * MiB);
  CHECK(cards[7].capacity() == 16 * MiB);

  c.topology = "description:" + std::string(CARVE_TEST_DATA_DIR) + "/topology/seed_fig1.txt";
  c.max_hops = 3;
  CHECK(load_topology(c).options().max_hops == 3);
  c.topology = "description:" + std::string(CARVE_TEST_DATA_DIR) + "/topology/dgx1_v100.txt";
  try {
    (void)load_topology(c);
    FAIL("an nvidia-smi text is not a description");
  } catch (const carve::Exception& e) {
    CHECK(std::string(e.what()).find("/dgx1_v100.txt: line 1:") != std::string::npos);
  }
}

} // namespace test_service_parts
