// PagedMirror over the GPUs of this machine: plain host stores tracked automatically, sync() with
// cudaMemcpyAsync on each device's stream, device memory compared with the host, a kernel writing
// mirror memory on every device and fetch() bringing it back. Exit code 77 (skipped) without a GPU.
#include "support/device_test.hpp"

#include <carve/mirror.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

namespace {

using carve::test::expect;
using carve::test::failures;

__global__ void add_one(unsigned char* p, std::size_t n) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    p[i] = static_cast<unsigned char>(p[i] + 1);
  }
}

constexpr std::size_t MiB = std::size_t{1} << 20;

// Every segment of [p, p + n) as its device holds it, compared with the host copy.
template <class Mirror>
bool devices_match(const Mirror& mirror, const carve::CudaMirrorBackend& gpus, const unsigned char* p, std::size_t n) {
  const auto parts = mirror.segments(p, n);
  if (!parts) {
    return false;
  }
  for (const carve::MirrorSegment& s : *parts) {
    const auto device = carve::test::to_host(
        static_cast<const unsigned char*>(gpus.device_pointer(s.device, s.device_offset)), s.bytes);
    if (std::memcmp(device.data(), s.host, s.bytes) != 0) {
      return false;
    }
  }
  return true;
}

} // namespace

int main() {
  carve::test::skip_without_device();
  carve::CudaMirrorBackend gpus(
      {.devices = {}, .bytes_per_device = 64 * MiB, .free_fraction = 0.5, .pin_host_memory = true});
  carve::PagedMirror mirror(gpus, {.page_size = 64 << 10, .tracking = carve::WriteTracking::automatic},
                            carve::StripePlacement{.stripe_pages = 4});
  std::printf("%zu device(s), %zu MiB mirror, tracking by %s\n", mirror.device_count(), mirror.capacity() / MiB,
              carve::to_string(mirror.tracking_mechanism()));
  expect(mirror.capacity() == mirror.device_count() * 64 * MiB, "64 MiB of every device");

  const std::size_t bytes = 48 * MiB;
  auto* p = static_cast<unsigned char*>(*mirror.try_allocate(bytes));
  expect(mirror.sync_all().has_value(), "initial full sync");
  expect(devices_match(mirror, gpus, p, bytes), "a new allocation is zero on the devices");

  std::mt19937_64 rng(3);
  std::vector<std::size_t> pages;
  for (int i = 0; i < 100; ++i) {
    const std::size_t at = rng() % bytes;
    p[at] = static_cast<unsigned char>(rng() | 1);
    pages.push_back(at / (64 << 10));
  }
  std::sort(pages.begin(), pages.end());
  pages.erase(std::unique(pages.begin(), pages.end()), pages.end());
  const auto r = mirror.sync();
  expect(r.has_value(), "sync");
  expect(r && r->pages == pages.size(), "sync copies exactly the pages written");
  expect(r && r->bytes == pages.size() * (64 << 10), "bytes = dirty pages x page size");
  expect(devices_match(mirror, gpus, p, bytes), "every device page equals the host after sync");

  // A kernel on each device adds one to its part of the first 8 MiB; fetch brings it back.
  std::vector<unsigned char> before(p, p + 8 * MiB);
  const auto parts = mirror.segments(p, 8 * MiB);
  for (const carve::MirrorSegment& s : *parts) {
    carve::test::check(cudaSetDevice(gpus.cuda_ordinal(s.device)), "cudaSetDevice");
    add_one<<<64, 256, 0, gpus.stream(s.device)>>>(
        static_cast<unsigned char*>(gpus.device_pointer(s.device, s.device_offset)), s.bytes);
    carve::test::check(cudaGetLastError(), "launch");
  }
  const auto f = mirror.fetch(p, 8 * MiB);
  expect(f.has_value() && f->pages == 8 * MiB / (64 << 10), "fetch moves the 8 MiB back");
  bool all = true;
  for (std::size_t i = 0; i < 8 * MiB; ++i) {
    all = all && p[i] == static_cast<unsigned char>(before[i] + 1);
  }
  expect(all, "the host reads what the kernels wrote");
  expect(mirror.sync()->pages == 0, "fetched pages are clean");
  expect(mirror.try_deallocate(p).has_value(), "deallocate");
  std::printf("%s\n", failures == 0 ? "all passed" : "FAILED");
  return failures == 0 ? 0 : 1;
}
