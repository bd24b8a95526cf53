// On a machine with GPUs: carve-served lends real device memory (topology from the CUDA runtime)
// and this process maps it: --backend cuda lends CUDA VMM allocations as descriptors (cuda_vmm),
// --backend cuda-ipc the cudaMalloc fallback as legacy CUDA IPC handles (cuda_ipc).
// Exit code 77 (skipped) without a GPU.
#include "service_process.hpp"
#include "support/device_test.hpp"

#include <carve/service.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

namespace {

int failures = 0;

void expect(bool ok, const char* what) {
  if (!ok) {
    std::printf("FAILED: %s\n", what);
    ++failures;
  }
}

bool holds(const void* device_ptr, std::size_t n, unsigned char v) {
  const auto host = carve::test::to_host(static_cast<const unsigned char*>(device_ptr), n);
  return std::all_of(host.begin(), host.end(), [v](unsigned char c) { return c == v; });
}

// One server of `backend` and one client writing through its mappings on every device.
void lend_and_write(const char* backend, carve::ExportKind expected, int devices) {
  using namespace carve::service;
  std::printf("--backend %s\n", backend);
  carve::test::ServedProcess server({"--backend", backend});
  if (!server.listening()) {
    std::printf("FAILED: carve-served did not start:\n%s\n", server.output().c_str());
    ++failures;
    return;
  }
  auto client = AllocationClient::connect(ClientOptions{server.socket(), "cuda-test", std::chrono::seconds(60)});
  if (!client) {
    std::printf("FAILED: connect: %s\n", client.error().message.c_str());
    ++failures;
    return;
  }
  expect(client->server().backend == expected, "the server lends CUDA memory of the kind asked for");
  expect(client->server().cards == devices, "one card per device");
  // Each card names its GPU by UUID, and this process (which sees the same GPUs) finds it again.
  const auto cards = client->cards();
  expect(static_cast<bool>(cards), "the server lists its cards");
  for (int card = 0; cards && card < devices; ++card) {
    const auto uuid = carve::cuda_device_uuid(card);
    const auto found = uuid ? card_of(*cards, *uuid) : carve::Result<int>(-1);
    expect(found && *found == card, "card_of finds each GPU's card by its UUID");
  }

  for (int card = 0; card < devices; ++card) {
    auto a = client->lease(256 << 10, card, 256);
    auto b = client->lease(128 << 10, card, 256);
    if (!a || !b) {
      std::printf("FAILED: allocate on GPU%d: %s\n", card, (!a ? a.error() : b.error()).message.c_str());
      ++failures;
      return;
    }
    expect(a->info.card == card && b->info.card == card, "a card with room serves its own requests");
    expect(a->info.segment != b->info.segment, "every region is a segment of its own");
    expect(client->mapped_segments() == 2, "each segment is mapped once");
    cudaPointerAttributes at{};
    expect(cudaPointerGetAttributes(&at, a->ptr) == cudaSuccess && at.device == card,
           "the segment is memory of the card's GPU, as this process numbers it");
    cudaGetLastError();
    expect(cudaMemset(a->ptr, 0x5a, a->info.size) == cudaSuccess, "cudaMemset through the mapping");
    expect(cudaMemset(b->ptr, 0x3c, b->info.size) == cudaSuccess, "cudaMemset through the mapping");
    expect(holds(a->ptr, a->info.size, 0x5a), "the first region holds what was written");
    expect(holds(b->ptr, b->info.size, 0x3c), "the second region holds what was written");
    const auto q = client->query(static_cast<char*>(b->ptr) + 100);
    expect(q && q->id == b->info.id, "pointer to region id");
    expect(static_cast<bool>(client->free(a->ptr)), "free");
    expect(static_cast<bool>(client->free(b->ptr)), "free");
  }
  const auto stats = client->stats();
  expect(stats && stats->consistent && stats->live_regions == 0, "the server's books balance");
  expect(server.stop() == 0, "carve-served stops cleanly");
}

} // namespace

int main() {
  carve::test::skip_without_device();
  int devices = 0;
  carve::test::check(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
  lend_and_write("cuda", carve::ExportKind::cuda_vmm, devices);     // VMM descriptors, the default
  lend_and_write("cuda-ipc", carve::ExportKind::cuda_ipc, devices); // the cudaMalloc fallback
  std::printf("%s\n", failures == 0 ? "all passed" : "some checks failed");
  return failures == 0 ? 0 : 1;
}
