// Three simulated cards of 32 MiB seen as one 96 MiB device. A plain store marks its page dirty;
// sync() copies only the dirty pages.
#include <carve/mirror.hpp>

#include <cstdio>
#include <string>

int main() {
  carve::HostMirrorBackend<> cards; // or carve::CudaMirrorBackend over real GPUs
  for (int c = 0; c < 3; ++c) {
    cards.register_device(carve::SimulatedCard(32 << 20), {.name = "card " + std::to_string(c), .compute_units = 108});
  }
  carve::PagedMirror mirror(cards, {.page_size = 64 << 10, .tracking = carve::WriteTracking::automatic},
                            carve::StripePlacement{.stripe_pages = 16});

  auto* table = static_cast<float*>(*mirror.try_allocate_placed(64 << 20, 1, {.priority = 1})); // expected<void*, Errc>
  table[0] = 1.0f;                                                                              // its page is now dirty
  const carve::SyncReport r = *mirror.sync();
  std::printf("synced %llu page(s), %llu bytes, in %llu copy\n", static_cast<unsigned long long>(r.pages),
              static_cast<unsigned long long>(r.bytes), static_cast<unsigned long long>(r.copies));
  const bool ok = r.pages == 1 && r.bytes == 64 << 10 && r.copies == 1;
  (void)mirror.try_deallocate(table);
  return ok ? 0 : 1;
}
