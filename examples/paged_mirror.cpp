// Three cards seen as one 96 MiB device: host code writes with plain stores, sync() copies only the
// pages it touched, fetch() brings back what device code wrote, and requests for compute and
// memory are served in priority order. Each card is simulated with 32 MiB of host memory so this
// runs anywhere; on GPUs, use carve::CudaMirrorBackend instead of the host backend.
#include <carve/mirror.hpp>
#include <carve/mr.hpp>

#include <cstdio>
#include <cstring>
#include <vector>

namespace {

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;

void print(const char* what, const carve::SyncReport& r) {
  std::printf("%-34s %4llu pages, %7llu bytes, %3llu copies (", what, static_cast<unsigned long long>(r.pages),
              static_cast<unsigned long long>(r.bytes), static_cast<unsigned long long>(r.copies));
  for (std::size_t d = 0; d < r.device_count; ++d) {
    std::printf("%scard %zu: %llu", d == 0 ? "" : ", ", d, static_cast<unsigned long long>(r.devices[d].copies));
  }
  std::printf(")\n");
}

} // namespace

int main() {
  carve::HostMirrorBackend<> cards;
  for (int c = 0; c < 3; ++c) {
    cards.register_device(carve::SimulatedCard(32 * MiB), {.name = "card " + std::to_string(c), .compute_units = 108});
  }
  carve::PagedMirror mirror(cards, {.page_size = 64 * KiB, .tracking = carve::WriteTracking::automatic},
                            carve::StripePlacement{.stripe_pages = 16});
  std::printf("one device of %zu MiB over %zu cards, %zu KiB pages, dirty pages found by %s\n", mirror.capacity() / MiB,
              mirror.device_count(), mirror.page_size() / KiB, carve::to_string(mirror.tracking_mechanism()));

  // 64 MiB: more than any one card holds, striped over all three.
  auto* table = static_cast<float*>(*mirror.try_allocate_placed(64 * MiB, 1, {.priority = 1}));
  auto* small = static_cast<char*>(*mirror.try_allocate_placed(100 * KiB, 1, {.priority = 5}));

  table[0] = 1.0f;                                                // plain stores: page 0
  table[40 * KiB / sizeof(float)] = 2.0f;                         // page 0 again
  std::memset(table + 20 * MiB / sizeof(float), 7, 3 * 64 * KiB); // pages 320-322
  std::strcpy(small, "a small, urgent buffer");                   // synced first: higher priority
  print("sync after a few stores:", *mirror.sync());
  print("sync with nothing written:", *mirror.sync());
  print("full sync, for comparison:", *mirror.sync_all());

  // Device code writes part of the table; fetch() brings those pages back to the host.
  std::vector<float> kernel_output(64 * KiB / sizeof(float), 42.0f);
  const auto parts = mirror.segments(table + 30 * MiB / sizeof(float), 64 * KiB);
  for (const carve::MirrorSegment& s : *parts) {
    (void)cards.copy_to_device(s.device, s.device_offset, kernel_output.data(), s.bytes); // the "kernel"
  }
  const auto fetched = mirror.fetch(table + 30 * MiB / sizeof(float), 64 * KiB);
  std::printf("fetched %llu page(s); the host now reads %.1f\n", static_cast<unsigned long long>(fetched->pages),
              static_cast<double>(table[30 * MiB / sizeof(float)]));

  // Bad input is an error value, and nothing changes.
  if (auto r = mirror.try_allocate(200 * MiB, 1); !r) {
    std::printf("allocate(200 MiB): %s: %s\n", carve::to_string(r.error()),
                mirror.allocation_failure_message(200 * MiB).c_str());
  }
  if (auto r = mirror.write(small + 100 * KiB, "x", 2); !r) {
    std::printf("write past the end of an allocation: %s\n", carve::to_string(r.error()));
  }

  // The compute side: requests carry a priority; each gets SMs on a card, and its memory.
  (void)mirror.submit({.bytes = 8 * MiB, .priority = 0, .compute_units = 108}); // batch job: a whole card
  (void)mirror.submit({.bytes = 1 * MiB, .priority = 9, .compute_units = 32});  // real-time
  (void)mirror.submit({.bytes = 2 * MiB, .priority = 5, .compute_units = 64});
  for (const carve::ResourceGrant& g : mirror.dispatch()) {
    std::printf("priority %d: card %u SMs [%u, %u), %zu MiB at mirror offset %zu MiB\n", g.compute.priority,
                g.compute.device, g.compute.units.first, static_cast<unsigned>(g.compute.units.end()), g.bytes / MiB,
                static_cast<std::size_t>(static_cast<std::byte*>(g.address) - mirror.host_base()) / MiB);
    (void)mirror.release(g);
  }
  (void)mirror.try_deallocate(small);
  (void)mirror.try_deallocate(table);
  return 0;
}
