// An application borrowing memory from carve-served: it asks for regions for one card, the
// server places them on that card or borrows from its best-linked peers, and the regions are
// mapped into this process, ready to use.
//
//   service_client [--socket PATH] [--card N] [--size SIZE] [--count K]
#include <carve/service.hpp>

#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace {

std::string mib(std::uint64_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

int fail(const carve::Error& e) {
  std::fprintf(stderr, "service_client: %s (%s)\n", e.message.c_str(), carve::to_string(e.code));
  return 1;
}

} // namespace

int main(int argc, char** argv) {
  carve::service::ClientOptions options{.name = "service_client"};
  int card = 0;
  std::uint64_t size = 24 << 20;
  int count = 4;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string_view flag = argv[i];
    if (flag == "--socket") {
      options.socket_path = argv[i + 1];
    } else if (flag == "--card") {
      card = std::stoi(argv[i + 1]);
    } else if (flag == "--size") {
      size = carve::parse_bytes(argv[i + 1]);
    } else if (flag == "--count") {
      count = std::stoi(argv[i + 1]);
    }
  }

  auto client = carve::AllocationClient::connect(options);
  if (!client) {
    return fail(client.error());
  }
  const auto cards = client->cards();
  if (!cards) {
    return fail(cards.error());
  }
  std::printf("connected to carve-served (pid %u) as client %u: %zu cards\n", client->server().server_pid,
              client->server().client_id, cards->size());

  std::vector<carve::service::Region> held;
  for (int i = 0; i < count; ++i) {
    auto r = client->lease(size, card, carve::default_alignment);
    if (!r) {
      std::printf("%s for GPU%d: %s\n", mib(size).c_str(), card, r.error().message.c_str());
      break;
    }
    const auto& where = (*cards)[static_cast<std::size_t>(r->info.card)];
    std::printf("region %llu: %s for GPU%d on %s", static_cast<unsigned long long>(r->info.id), mib(size).c_str(), card,
                where.name.c_str());
    if (r->borrowed()) {
      std::printf(" (borrowed, %.0f GB/s from GPU%d)\n", where.bandwidth_gbps[static_cast<std::size_t>(card)], card);
    } else {
      std::printf(" (local)\n");
    }
    std::memset(r->ptr, 0x5a, r->info.size); // the memory is mapped here: use it
    held.push_back(*r);
  }

  const auto stats = client->stats();
  if (!stats) {
    return fail(stats.error());
  }
  std::printf("server: %llu live regions from %llu clients; this client maps %zu segments\n",
              static_cast<unsigned long long>(stats->live_regions), static_cast<unsigned long long>(stats->clients),
              client->mapped_segments());
  for (const auto& r : held) {
    if (const auto freed = client->free(r.ptr); !freed) {
      return fail(freed.error());
    }
  }
  std::printf("freed %zu regions\n", held.size());
  return 0;
}
