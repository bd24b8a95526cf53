// The allocation service lending VmmCard memory over the host twin: a server thread exports each
// region as a physical allocation's descriptor, a client in this process maps it through
// map_segment (import, reserve, map, set access) and both sides see each other's bytes. The same
// path runs on GPUs with CudaMemoryMapper (cuda_vmm). Threads meet here: run under ThreadSanitizer
// by the test command (label concurrent).
#include "service/service_process.hpp"
#include "support/topology_data.hpp"

#include <carve/service.hpp>
#include <carve/vmm.hpp>

#include <doctest/doctest.h>

#include <cstring>
#include <optional>
#include <thread>
#include <vector>

// In a namespace of its own: the area's test files compile as one translation unit.
namespace test_vmm_service {

using namespace std::chrono_literals;
using namespace carve::service;

namespace {

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t granule = 64 * KiB;

using Card = carve::VmmCard<carve::HostMemoryMapper>;

// A server thread lending the memory of eight VmmCards of `capacity` (one mapper for the
// server's eight devices; the server touches its memory as any device) on DGX-1's topology.
struct LendingServer {
  explicit LendingServer(std::size_t capacity) {
    for (int d = 0; d < topology.gpu_count(); ++d) {
      cards.emplace_back(mapper, d, capacity);
    }
    options.socket_path = dir.path() / "served.sock";
    server.emplace(topology, cards, options);
    serving = std::thread([this] { server->run(); });
  }
  ~LendingServer() { stop(); }
  void stop() {
    if (serving.joinable()) {
      server->request_stop();
      serving.join();
    }
  }
  carve::test::TempDir dir;
  const carve::Topology topology = carve::test::dgx1();
  carve::HostMemoryMapper mapper{
      {.granularity = granule, .device_count = 8, .cpu_device = carve::HostMemoryMapper::every_device}};
  std::vector<Card> cards; // copies are handles to the server's cards
  ServerOptions options;
  std::optional<carve::AllocationServer<Card>> server;
  std::thread serving;
};

} // namespace

TEST_CASE("a server lends VmmCard memory; the client maps it and both see the same bytes") {
  LendingServer lending(8 * granule);
  const std::vector<Card>& view = lending.cards;
  carve::HostMemoryMapper& mapper = lending.mapper;
  {
    auto client = carve::AllocationClient::connect(ClientOptions{lending.options.socket_path, "vmm", 30s});
    REQUIRE(client);
    CHECK(client->server().backend == carve::ExportKind::host_vmm);
    const auto r = client->lease(3000, 3, 256);
    REQUIRE(r);
    CHECK(r->info.card == 3);
    std::memset(r->ptr, 0x6b, 3000);

    // The server's own mapping of that segment holds the client's bytes, and the other way round.
    const auto held = view[3].allocations();
    REQUIRE(held.size() == 1);
    CHECK(held.front().second == granule);
    auto* served = static_cast<unsigned char*>(held.front().first);
    CHECK(served[r->info.offset] == 0x6b);
    CHECK(served[r->info.offset + 2999] == 0x6b);
    served[r->info.offset + 1] = 0x01;
    CHECK(static_cast<unsigned char*>(r->ptr)[1] == 0x01);
    CHECK(*mapper.access(held.front().first, 3) == carve::Access::read_write);
    CHECK(host_vmm_mapper().mapping_count() == 1);

    // A second region: a segment of its own, mapped anew.
    const auto r2 = client->lease(2 * granule, 3, 256);
    REQUIRE(r2);
    CHECK(r2->info.segment != r->info.segment);
    std::memset(r2->ptr, 0x11, 2 * granule);
    CHECK(host_vmm_mapper().mapping_count() == 2);

    REQUIRE(client->free(r->ptr));
    REQUIRE(client->free(r2->ptr));
    CHECK(host_vmm_mapper().mapping_count() == 0);
    const auto s = client->stats();
    REQUIRE(s);
    CHECK(s->live_regions == 0);
    CHECK(s->consistent);
  }
  lending.stop();
  CHECK(lending.server->service().region_count() == 0);
  CHECK(view[3].used_bytes() == 0);
  CHECK(mapper.physical_count() == 0);
  CHECK(mapper.reservation_count() == 0);
  CHECK(host_vmm_mapper().reservation_count() == 0);
}

TEST_CASE("a borrowed VMM segment is mapped for the requester's device and the lender's") {
  LendingServer served(2 * granule);
  {
    auto client = carve::AllocationClient::connect(ClientOptions{served.options.socket_path, "borrower", 30s});
    REQUIRE(client);
    const auto own = client->lease(2 * granule, 3, 256); // card 3 is full after this
    REQUIRE(own);
    const auto lent = client->lease(granule, 3, 256);
    REQUIRE(lent);
    const int lender = lent->info.card;
    REQUIRE(lender != 3);
    CHECK(lent->info.requester == 3);
    // Card 3's kernels use the borrowed memory where it lies; the lender's GPU keeps its right too.
    CHECK(*host_vmm_mapper().access(lent->ptr, 3) == carve::Access::read_write);
    CHECK(*host_vmm_mapper().access(lent->ptr, lender) == carve::Access::read_write);
    for (int other = 0; other < 8; ++other) {
      if (other != 3 && other != lender) {
        CHECK(*host_vmm_mapper().access(lent->ptr, other) == carve::Access::none);
      }
    }
    CHECK(*host_vmm_mapper().access(own->ptr, 3) == carve::Access::read_write);
    CHECK(*host_vmm_mapper().access(own->ptr, lender) == carve::Access::none);
    REQUIRE(client->free(lent->ptr));
    REQUIRE(client->free(own->ptr));
    CHECK(host_vmm_mapper().mapping_count() == 0);
  }
  served.stop();
  CHECK(served.mapper.physical_count() == 0);
  CHECK(host_vmm_mapper().reservation_count() == 0);
}

TEST_CASE("carve-served --backend host-vmm: another process lends, this one maps, writes and reads") {
  carve::test::ServedProcess server(
      carve::test::served_on_dgx1(CARVE_TEST_DATA_DIR, {"--backend", "host-vmm", "--card-memory", "8MiB"}));
  REQUIRE(server.listening());
  {
    auto client = carve::AllocationClient::connect(ClientOptions{server.socket(), "vmm-process", 30s});
    REQUIRE(client);
    CHECK(client->server().backend == carve::ExportKind::host_vmm);
    std::vector<Region> held;
    for (int card = 0; card < 8; ++card) {
      const auto r = client->lease(100 * KiB, card, 256);
      REQUIRE(r);
      std::memset(r->ptr, card + 1, r->info.size);
      held.push_back(*r);
    }
    // Cards of 8 MiB, regions rounded to the server's 2 MiB granularity: four fit on each.
    const auto stats = client->stats();
    REQUIRE(stats);
    CHECK(stats->cards[0].bytes_reserved == 2 * KiB * KiB);
    for (std::size_t i = 0; i < held.size(); ++i) {
      const auto* bytes = static_cast<const unsigned char*>(held[i].ptr);
      CHECK(std::size_t{bytes[0]} == i + 1);
      CHECK(std::size_t{bytes[held[i].info.size - 1]} == i + 1);
      REQUIRE(client->free(held[i].ptr));
    }
    CHECK(client->mapped_segments() == 0);
    CHECK(host_vmm_mapper().mapping_count() == 0);
  }
  CHECK(server.stop() == 0);
}

} // namespace test_vmm_service
