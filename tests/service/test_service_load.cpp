// Load: 8 client processes x 4000 allocations (1000 under a sanitizer; each freed again) against one carve-served.
// Every region is filled with a pattern of its own and checked before it is freed, so two clients handed overlapping
// memory would see each other's writes; every region id is written down, so an id handed out twice would show; the
// server's books must balance at the end.
#include "service_process.hpp"
#include "support/sanitizers.hpp"

#include <carve/service.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

// In a namespace of its own: the area's test files compile as one translation unit.
namespace test_service_load {

using namespace std::chrono_literals;
using carve::service::AllocationClient;
using carve::service::ClientOptions;
using carve::test::ServedProcess;

namespace {

constexpr int clients = 8;
// Each a fresh segment: a memfd, two mappings, a descriptor passed.
constexpr int allocations_per_client = carve::test::under_asan || carve::test::under_tsan ? 1000 : 4000;

std::uint8_t pattern(carve::service::RegionId id, int client) {
  return static_cast<std::uint8_t>((id * 131 + static_cast<unsigned>(client)) % 255 + 1);
}

// One client's run; writes "<allocations> <failures> <ids...>" to `out`. Exit code: 0, or
// what went wrong.
int client_run(const std::filesystem::path& socket, int k, const std::filesystem::path& out) {
  auto c = AllocationClient::connect(ClientOptions{socket, "load-" + std::to_string(k), 30s});
  if (!c) {
    return 10;
  }
  std::mt19937 rng(static_cast<unsigned>(k) * 7919u + 1u);
  std::vector<carve::service::Region> live;
  std::vector<carve::service::RegionId> ids;
  int failures = 0;
  int borrowed = 0;
  const auto release = [&](std::size_t i) {
    const carve::service::Region r = live[i];
    const auto* bytes = static_cast<const std::uint8_t*>(r.ptr);
    const std::uint8_t want = pattern(r.info.id, k);
    for (std::size_t b = 0; b < r.info.size; ++b) {
      if (bytes[b] != want) {
        return false; // someone else wrote into this region
      }
    }
    live[i] = live.back();
    live.pop_back();
    return c->free(r.ptr).has_value();
  };
  int made = 0;
  while (made < allocations_per_client) {
    if (live.size() >= 24 || (!live.empty() && rng() % 2 == 0)) {
      if (!release(rng() % live.size())) {
        return 11;
      }
      continue;
    }
    const std::size_t bytes = 256 + rng() % (16 * 1024);
    const int card = rng() % 3 == 0 ? static_cast<int>(rng() % 8) : static_cast<int>(rng() % 2);
    auto r = c->lease(bytes, card, 256);
    ++made;
    if (!r) {
      if (r.error().code != carve::Errc::no_space) {
        return 12;
      }
      ++failures;
      continue;
    }
    if (r->info.size != bytes || r->info.requester != card) {
      return 13;
    }
    borrowed += r->borrowed() ? 1 : 0;
    std::memset(r->ptr, pattern(r->info.id, k), bytes);
    ids.push_back(r->info.id);
    live.push_back(*r);
  }
  while (!live.empty()) {
    if (!release(live.size() - 1)) {
      return 14;
    }
  }
  std::ofstream f(out);
  f << ids.size() << ' ' << failures << ' ' << borrowed;
  for (const auto id : ids) {
    f << ' ' << id;
  }
  return f ? 0 : 15;
}

} // namespace

TEST_CASE("8 client processes x thousands of allocations: nothing lost, nothing owned twice") {
  const std::string topo = std::string(CARVE_TEST_DATA_DIR) + "/topology/dgx1_v100.txt";
  // Cards 0 and 1, which most requests name, are small: they fill up and borrow from peers.
  ServedProcess server({"--topology", "nvidia-smi:" + topo, "--card-memory", "4MiB", "--card-memory", "0=384KiB",
                        "--card-memory", "1=384KiB"});
  REQUIRE(server.listening());

  const auto start = std::chrono::steady_clock::now();
  std::vector<pid_t> pids;
  for (int k = 0; k < clients; ++k) {
    pids.push_back(carve::test::fork_child(
        [&, k] { return client_run(server.socket(), k, server.directory() / ("ids-" + std::to_string(k))); }));
  }
  for (int k = 0; k < clients; ++k) {
    CHECK_MESSAGE(carve::test::wait_exit(pids[static_cast<std::size_t>(k)]) == 0, "client " << k);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::set<carve::service::RegionId> seen;
  std::uint64_t made = 0;
  std::uint64_t failed = 0;
  std::uint64_t borrowed = 0;
  for (int k = 0; k < clients; ++k) {
    std::ifstream f(server.directory() / ("ids-" + std::to_string(k)));
    std::uint64_t n = 0;
    std::uint64_t failures = 0;
    std::uint64_t b = 0;
    REQUIRE(static_cast<bool>(f >> n >> failures >> b));
    made += n;
    failed += failures;
    borrowed += b;
    for (std::uint64_t i = 0; i < n; ++i) {
      carve::service::RegionId id = 0;
      REQUIRE(static_cast<bool>(f >> id));
      CHECK(seen.insert(id).second); // no id was handed out twice
    }
  }
  CHECK(made + failed == static_cast<std::uint64_t>(clients) * allocations_per_client);
  CHECK(borrowed > 0);
  MESSAGE(made << " allocations (" << borrowed << " borrowed, " << failed << " refused) and as many frees by "
               << clients << " processes in " << seconds << " s: " << 2.0 * static_cast<double>(made) / seconds
               << " calls/s");

  auto observer = AllocationClient::connect(ClientOptions{server.socket(), "observer", 10s});
  REQUIRE(observer);
  auto s = observer->stats();
  REQUIRE(s);
  CHECK(s->allocations == made);
  CHECK(s->frees == made);
  CHECK(s->failed_allocations == failed);
  CHECK(s->reclaimed_regions == 0);
  CHECK(s->live_regions == 0);
  CHECK(s->consistent);
  for (const auto& card : s->cards) {
    CHECK(card.bytes_in_use == 0);
    CHECK(card.live_blocks == 0);
  }
  CHECK(server.stop() == 0);
}

} // namespace test_service_load
