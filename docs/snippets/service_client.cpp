// An application borrowing 64 MiB for card 0 from carve-served. Without a running server,
// connect() fails with a message saying where it looked.
#include <carve/service.hpp>

#include <cstdio>
#include <cstring>

int main() {
  auto client = carve::AllocationClient::connect({.name = "docs-snippet"}); // the default socket
  if (!client) {
    std::printf("%s\n", client.error().message.c_str()); // "no carve-served socket at ..."
    return 0;
  }
  auto r = client->lease(64 << 20, /*requesting card*/ 0, /*alignment*/ 256); // carve::Result<Region>
  if (!r) {
    std::printf("%s\n", r.error().message.c_str()); // why no card could lend it
    return 1;
  }
  std::memset(r->ptr, 0, r->info.size); // mapped into this process
  std::printf("64 MiB on card %d%s\n", r->info.card, r->borrowed() ? " (borrowed)" : "");
  return client->free(r->ptr) ? 0 : 1;
}
