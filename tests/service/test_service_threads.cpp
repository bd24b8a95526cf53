// AllocationServer on a thread of this process, and clients on other threads: separate clients,
// and one client shared by several threads (its calls are serialised). Run under ThreadSanitizer
// by the test command (label concurrent).
#include "service_process.hpp"
#include "support/topology_data.hpp"

#include <carve/service.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <cstring>
#include <optional>
#include <random>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using namespace carve::service;

namespace {

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;

// Allocates, stamps, checks and frees `rounds` regions; false at the first surprise.
bool churn(AllocationClient& c, unsigned seed, int rounds) {
  std::mt19937 rng(seed);
  std::vector<Region> held;
  for (int i = 0; i < rounds; ++i) {
    if (held.size() > 8 || (!held.empty() && rng() % 2 == 0)) {
      const Region r = held.back();
      held.pop_back();
      const auto* bytes = static_cast<const unsigned char*>(r.ptr);
      for (std::size_t b = 0; b < r.info.size; b += 97) {
        if (bytes[b] != static_cast<unsigned char>(seed)) {
          return false;
        }
      }
      if (!c.free(r.ptr)) {
        return false;
      }
      continue;
    }
    auto r = c.lease(512 + rng() % (32 * KiB), static_cast<int>(rng() % 8), 256);
    if (!r) {
      return false;
    }
    std::memset(r->ptr, static_cast<int>(seed & 0xff), r->info.size);
    held.push_back(*r);
  }
  for (const Region& r : held) {
    if (!c.free(r.ptr)) {
      return false;
    }
  }
  return true;
}

} // namespace

TEST_CASE("a server thread and client threads") {
  carve::test::TempDir dir;
  std::vector<carve::SharedMemoryCard> cards;
  for (int i = 0; i < 8; ++i) {
    cards.emplace_back(16 * MiB);
  }
  ServerOptions options;
  options.socket_path = dir.path() / "served.sock";
  options.service.strategy = carve::WeightedScore{};
  carve::AllocationServer<carve::SharedMemoryCard> server(carve::test::dgx1(), cards, options); // the pinned names
  std::thread serving([&] { server.run(); });

  std::atomic<int> failures{0};
  {
    std::vector<std::thread> own;
    for (unsigned t = 0; t < 3; ++t) {
      own.emplace_back([&, t] {
        auto c = carve::AllocationClient::connect(ClientOptions{options.socket_path, "own", 30s});
        if (!c || !churn(*c, 11 + t, 400)) {
          ++failures;
        }
      });
    }
    auto shared = AllocationClient::connect(ClientOptions{options.socket_path, "shared", 30s});
    REQUIRE(shared);
    std::vector<std::thread> sharing;
    for (unsigned t = 0; t < 3; ++t) {
      sharing.emplace_back([&, t] {
        if (!churn(*shared, 21 + t, 300)) {
          ++failures;
        }
        if (!shared->stats()) {
          ++failures;
        }
      });
    }
    for (auto& t : own) {
      t.join();
    }
    for (auto& t : sharing) {
      t.join();
    }
    CHECK(shared->live_regions() == 0);
    const auto s = shared->stats();
    REQUIRE(s);
    CHECK(s->live_regions == 0);
    CHECK(s->consistent);
  }
  CHECK(failures.load() == 0);
  server.request_stop();
  serving.join();
  CHECK(server.service().region_count() == 0); // every region was freed by its client
  CHECK(server.service().consistent());
}

TEST_CASE("a client that cannot map the server's kind of memory gets an error and leaks nothing") {
  if (cuda_ipc_available) {
    return; // this client could map it
  }
  carve::test::TempDir dir;
  std::vector<carve::test::CudaIpcLikeCard> cards;
  for (int i = 0; i < 8; ++i) {
    cards.emplace_back(16 * MiB);
  }
  ServerOptions options;
  options.socket_path = dir.path() / "served.sock";
  AllocationServer<carve::test::CudaIpcLikeCard> server(carve::test::dgx1(), cards, options);
  std::thread serving([&] { server.run(); });
  {
    auto c = AllocationClient::connect(ClientOptions{options.socket_path, "host-only", 30s});
    REQUIRE(c);
    CHECK(c->server().backend == carve::ExportKind::cuda_ipc);
    for (int i = 0; i < 2; ++i) { // the second time, the segment is offered as a new mapping again
      const auto r = c->lease(4 * KiB, 0, 256);
      REQUIRE_FALSE(r);
      CHECK(r.error().code == carve::Errc::unsupported_version);
      CHECK(r.error().message ==
            "the server lends CUDA memory (cuda_ipc) but this program was built without the CUDA runtime");
    }
    const auto s = c->stats();
    REQUIRE(s);
    CHECK(s->live_regions == 0);
    CHECK(s->leased_segments == 0);
    CHECK(s->consistent);
    CHECK(c->mapped_segments() == 0);
  }
  server.request_stop();
  serving.join();
}
