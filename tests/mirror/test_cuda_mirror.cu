// PagedMirror over the GPUs of this machine: plain host stores tracked automatically, sync() with
// cudaMemcpyAsync on each device's stream, device memory compared with the host, a kernel writing
// mirror memory on every device and fetch() bringing it back; then compute grants backed by green
// contexts (CudaGreenContexts): two grants on one device, a kernel in each recording the SMs its
// blocks ran on, which must be as many as granted at most and disjoint between the grants, and the
// grants' SMs and memory coming back once the kernels have run. Exit code 77 (skipped) without a GPU.
#include "support/device_test.hpp"

#include <carve/mirror.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iterator>
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

// Each block writes the SM it runs on.
__global__ void record_sm(unsigned* sm_of_block) {
  unsigned sm = 0;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  if (threadIdx.x == 0) {
    sm_of_block[blockIdx.x] = sm;
  }
}

constexpr std::size_t MiB = std::size_t{1} << 20;

// Two grants on device 0, a kernel on each grant's stream: with green contexts each kernel runs
// on at most its grant's SM count and on SMs the other does not use. Released, they come back
// once the kernels have run.
void green_contexts() {
  carve::CudaMirrorBackend gpus(
      {.devices = {0}, .bytes_per_device = 8 * MiB, .free_fraction = 0.5, .pin_host_memory = true});
  carve::PagedMirror<carve::CudaMirrorBackend, carve::FillPlacement, carve::FirstFit, carve::CudaGreenContexts> mirror(
      gpus, {.page_size = 64 << 10, .tracking = carve::WriteTracking::explicit_calls}, {},
      carve::CudaGreenContexts({0}));
  const bool enforced = mirror.compute_enforced(0);
  std::printf("device 0: compute grants %s%s\n", enforced ? "enforced by green contexts" : "advisory: ",
              enforced ? "" : mirror.partitioner().advisory_reason(0).c_str());
  const std::size_t free_before = mirror.free_bytes();
  expect(mirror.submit({.bytes = 1 * MiB, .priority = 2, .compute_units = 1}).has_value(), "submit a small grant");
  expect(mirror.submit({.bytes = 1 * MiB, .priority = 1, .compute_units = 1}).has_value(), "submit another");
  const auto grants = mirror.dispatch();
  expect(grants.size() == 2, "both granted");
  constexpr unsigned blocks = 1024;
  std::vector<std::vector<unsigned>> sms;
  carve::test::check(cudaSetDevice(0), "cudaSetDevice");
  for (const carve::ResourceGrant& g : grants) {
    expect(g.compute.enforced == enforced, "each grant says whether it is enforced");
    unsigned* d_sms = nullptr;
    carve::test::check(cudaMalloc(&d_sms, blocks * sizeof(unsigned)), "cudaMalloc");
    const auto stream = mirror.compute_stream(g);
    expect(stream.has_value(), "a grant has a stream");
    record_sm<<<blocks, 64, 0, *stream>>>(d_sms);
    carve::test::check(cudaGetLastError(), "launch on the grant's stream");
    carve::test::check(cudaStreamSynchronize(*stream), "the grant's kernel");
    sms.push_back(carve::test::to_host(d_sms, blocks));
    carve::test::check(cudaFree(d_sms), "cudaFree");
    expect(mirror.release(g).has_value(), "release");
  }
  if (enforced && sms.size() == 2) {
    std::vector<unsigned> a = sms[0];
    std::vector<unsigned> b = sms[1];
    std::sort(a.begin(), a.end());
    a.erase(std::unique(a.begin(), a.end()), a.end());
    std::sort(b.begin(), b.end());
    b.erase(std::unique(b.begin(), b.end()), b.end());
    std::printf("grant SMs: %u and %u granted, %zu and %zu used\n", grants[0].compute.units.count,
                grants[1].compute.units.count, a.size(), b.size());
    expect(a.size() <= grants[0].compute.units.count && b.size() <= grants[1].compute.units.count,
           "a kernel runs on no more SMs than its grant holds");
    std::vector<unsigned> both;
    std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(both));
    expect(both.empty(), "two grants' kernels share no SM");
  }
  for (int i = 0; i < 1000 && mirror.held_grants() != 0; ++i) {
    (void)mirror.reclaim();
  }
  expect(mirror.held_grants() == 0, "released grants come back once their work has run");
  expect(mirror.free_bytes() == free_before, "and so does their memory");
}

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
  green_contexts();
  std::printf("%s\n", failures == 0 ? "all passed" : "FAILED");
  return failures == 0 ? 0 : 1;
}
