// Three simulated devices of 8 MiB seen as one 24 MiB device, and one device pointer over all
// of it: a kernel written for one GPU runs unchanged. A plain store marks its page dirty; sync()
// copies only the dirty pages; fetch() brings back what device code wrote.
#include <carve/mirror.hpp>

#include <cstddef>
#include <cstdio>

// "Device code" for one GPU and one pointer (on a GPU: a __global__ kernel taking the same pair).
void scale(float* x, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    x[i] *= 2.0f;
  }
}

int main() {
  // The host twin of three GPUs' memory (on GPUs: carve::CudaMirrorBackend, 2 MiB pages).
  carve::HostMemoryMapper memory(
      {.granularity = 64 << 10, .device_count = 3, .cpu_device = carve::HostMemoryMapper::every_device});
  carve::VmmMirrorBackend<> devices(memory);
  for (int d = 0; d < 3; ++d) {
    devices.register_device(d, 8 << 20);
  }
  carve::PagedMirror mirror(devices, {.page_size = 64 << 10, .device_view = true},
                            carve::StripePlacement{.stripe_pages = 16});

  const std::size_t n = (16 << 20) / sizeof(float);                          // 16 MiB: pages on all three
  auto* x = static_cast<float*>(*mirror.try_allocate(n * sizeof(float), 1)); // expected<void*, Errc>
  x[0] = 1.0f;                                                               // its page is now dirty
  const carve::SyncReport r = *mirror.sync();                                // one page copied
  scale(static_cast<float*>(*mirror.device_pointer(x)), n);                  // one pointer, one launch
  (void)mirror.fetch(x, n * sizeof(float));                                  // device writes come back
  std::printf("synced %llu page(s); x[0] = %.1f after the kernel\n", static_cast<unsigned long long>(r.pages),
              static_cast<double>(x[0]));
  const bool ok = r.pages == 1 && x[0] == 2.0f;
  (void)mirror.try_deallocate(x);
  return ok ? 0 : 1;
}
