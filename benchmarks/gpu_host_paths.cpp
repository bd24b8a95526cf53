// carve's GPU paths that the host drives, measured on the cards of this machine (host code only:
// compiled by the C++ compiler and linked to the CUDA runtime, no nvcc).
//
// Mirror sync: a PagedMirror over a CudaMirrorBackend (512 MiB of every card, 2 MiB pages,
//   explicit dirty tracking) and one allocation filling it. Timed, wall clock, medians of 5:
//   - a full sync (every page dirty) beside one cudaMemcpyAsync per device run of the same bytes,
//     from the same pinned host memory into the same device memory on the same streams;
//   - a sync of 10% of the pages, chosen at random (new contents each time), beside one
//     cudaMemcpyAsync per dirty page.
//   Checks: each sync reports the bytes it should, and afterwards every device byte equals the
//   host's (copied back and compared). Targets: each sync at least 90% of the plain copies'
//   throughput (source: the same bytes copied without carve in this run; sync adds finding the
//   dirty pages and queuing the copies, and coalesces adjacent ones).
//
// One pointer over the cards: a PagedMirror with a device view (64 MiB of every card, 2 MiB pages
//   striped 8 at a time) and one array over all of it; device 0 reads the array through the one
//   device pointer (mirror.device_pointer), owner by owner, with cudaMemcpyAsync into its own
//   memory (the copy engine reading through the view: this file is not compiled by nvcc, so no
//   load kernel). Printed per owner: GB/s, medians of 5, beside the topology's score for device
//   0's loads from that card (ViewPlacement::load_gbps: the discovered topology's paths with no
//   GPU relaying), and ViewPlacement::explain for the whole array. Checks: every byte read through
//   the view equals the host's. No target: the figures are what this machine gives.
//
// Service IPC: carve-served lending CUDA memory through CUDA IPC (--backend cuda-ipc, topology from
//   the CUDA runtime; --backend cuda lends VMM memory as descriptors and maps no IPC handle)
//   and this process as its client. Per card, 100 allocate + free round trips of 2 MiB: the
//   round trip the client sees, and inside it the time cudaIpcOpenMemHandle takes to map the
//   segment (the client's map_segment), timed by wrapping that call at link time
//   (-Wl,--wrap=cudaIpcOpenMemHandle); beside the same allocate against a carve-served on
//   shared-memory cards and cudaMalloc + cudaFree of 2 MiB in this process. Checks: every
//   region is written through its mapping (cudaMemset) and reads back; the server's books
//   balance at the end. Targets: the allocate round trip without the map within 2x of the
//   shared-memory one (source: carve's host path, measured in this run; docs/service.md has it at
//   48 us p50 on the project's VM), and the map at most a cudaMalloc + cudaFree of the same bytes
//   in this process (source: what a client without the service would do instead, measured in
//   this run).
//
// Needs a GPU; without one it says so and exits with 77.
#include "gpu_targets.hpp"
#include "service/service_process.hpp"

#include <carve/mirror.hpp>
#include <carve/mirror/cuda_backend.hpp>
#include <carve/service.hpp>
#include <carve/topology/cuda_discovery.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace {

using carve::bench::Aim;
using carve::bench::Checks;
using carve::bench::cuda_check;
using carve::bench::percentile;
using clock_type = std::chrono::steady_clock;

double microseconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double, std::micro>(clock_type::now() - t0).count();
}

// The durations of every cudaIpcOpenMemHandle and cudaIpcCloseMemHandle this process made.
std::vector<double> map_us;
std::vector<double> unmap_us;

} // namespace

// The client maps a lent segment inside AllocationClient::allocate (map_segment); with
// -Wl,--wrap the linker sends those calls here, and these time the real ones.
extern "C" cudaError_t __real_cudaIpcOpenMemHandle(void** p, cudaIpcMemHandle_t handle, unsigned int flags);
extern "C" cudaError_t __real_cudaIpcCloseMemHandle(void* p);
extern "C" cudaError_t __wrap_cudaIpcOpenMemHandle(void** p, cudaIpcMemHandle_t handle, unsigned int flags) {
  const auto t0 = clock_type::now();
  const cudaError_t e = __real_cudaIpcOpenMemHandle(p, handle, flags);
  map_us.push_back(microseconds_since(t0));
  return e;
}
extern "C" cudaError_t __wrap_cudaIpcCloseMemHandle(void* p) {
  const auto t0 = clock_type::now();
  const cudaError_t e = __real_cudaIpcCloseMemHandle(p);
  unmap_us.push_back(microseconds_since(t0));
  return e;
}

namespace {

// ---- mirror sync -----------------------------------------------------------------------------

constexpr std::size_t mirror_page = std::size_t{2} << 20;
constexpr std::size_t mirror_per_device = std::size_t{512} << 20;

using Mirror = carve::PagedMirror<carve::CudaMirrorBackend>;

// Waits for every device's copies.
void wait_all(carve::CudaMirrorBackend& gpus, std::size_t devices) {
  for (std::size_t d = 0; d < devices; ++d) {
    if (!gpus.wait(d)) {
      std::fprintf(stderr, "waiting for device %zu failed\n", d);
      std::exit(1);
    }
  }
}

// Whether every device byte behind [p, p + n) equals the host's.
bool device_equals_host(const Mirror& mirror, carve::CudaMirrorBackend& gpus, const std::byte* p, std::size_t n) {
  const auto parts = mirror.segments(p, n);
  if (!parts) {
    return false;
  }
  std::vector<std::byte> back;
  for (const carve::MirrorSegment& s : *parts) {
    back.resize(s.bytes);
    cuda_check(cudaMemcpy(back.data(), gpus.device_pointer(s.device, s.device_offset), s.bytes, cudaMemcpyDeviceToHost),
               "copy back");
    if (std::memcmp(back.data(), s.host, s.bytes) != 0) {
      return false;
    }
  }
  return true;
}

void mirror_sync() {
  carve::CudaMirrorBackend gpus(carve::CudaMirrorOptions{.bytes_per_device = mirror_per_device});
  Mirror mirror(gpus, carve::MirrorOptions{.page_size = mirror_page, .tracking = carve::WriteTracking::explicit_calls});
  const std::size_t devices = mirror.device_count();
  const std::size_t total = mirror.capacity();
  Checks checks;
  const auto allocation = mirror.try_allocate(total, 1);
  if (!checks.expect(allocation.has_value(), "the mirror's whole capacity as one allocation")) {
    std::printf("  %s\n", mirror.allocation_failure_message(total).c_str());
    return;
  }
  auto* data = static_cast<std::byte*>(*allocation);
  const std::size_t pages = total / mirror_page;
  std::printf("mirror sync: %zu devices, %zu MiB each, %zu pages of 2 MiB, medians of 5\n", devices,
              mirror_per_device >> 20, pages);
  auto* words = reinterpret_cast<std::uint64_t*>(data);
  std::iota(words, words + total / sizeof(std::uint64_t), std::uint64_t{1});
  const auto parts = mirror.segments(data, total);
  if (!checks.expect(parts.has_value(), "the allocation's device segments")) {
    return;
  }

  // Full: every page.
  std::vector<double> full_sync, full_plain;
  for (int rep = 0; rep < 5; ++rep) {
    auto t0 = clock_type::now();
    for (const carve::MirrorSegment& s : *parts) {
      cuda_check(cudaMemcpyAsync(gpus.device_pointer(s.device, s.device_offset), s.host, s.bytes,
                                 cudaMemcpyHostToDevice, gpus.stream(s.device)),
                 "cudaMemcpyAsync");
    }
    wait_all(gpus, devices);
    full_plain.push_back(microseconds_since(t0));
    words[static_cast<std::size_t>(rep)] += 1; // new contents for the sync to carry
    checks.expect(mirror.mark_dirty(data, total).has_value(), "every page marked dirty");
    t0 = clock_type::now();
    const auto report = mirror.sync();
    full_sync.push_back(microseconds_since(t0));
    checks.expect(report.has_value() && report->bytes == total, "a full sync moves every byte");
  }
  checks.expect(device_equals_host(mirror, gpus, data, total), "after a full sync every device byte equals the host's");

  // 10% of the pages, chosen at random.
  std::vector<std::size_t> order(pages);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::mt19937_64 rng(42);
  std::shuffle(order.begin(), order.end(), rng);
  const std::vector<std::size_t> dirty(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(pages / 10));
  // Where each page lives, looked up before timing: the plain copies' time is their copies alone.
  std::vector<carve::MirrorSegment> dirty_runs;
  for (const std::size_t page : dirty) {
    const auto at = mirror.segments(data + page * mirror_page, mirror_page);
    if (!checks.expect(at.has_value() && at->size() == 1, "a page lies in one device run")) {
      return;
    }
    dirty_runs.push_back(at->front());
  }
  std::vector<double> dirty_sync, dirty_plain;
  for (int rep = 0; rep < 5; ++rep) {
    auto t0 = clock_type::now();
    for (const carve::MirrorSegment& s : dirty_runs) {
      cuda_check(cudaMemcpyAsync(gpus.device_pointer(s.device, s.device_offset), s.host, s.bytes,
                                 cudaMemcpyHostToDevice, gpus.stream(s.device)),
                 "cudaMemcpyAsync");
    }
    wait_all(gpus, devices);
    dirty_plain.push_back(microseconds_since(t0));
    for (const std::size_t page : dirty) {
      words[page * mirror_page / sizeof(std::uint64_t)] += 1;
      checks.expect(mirror.mark_dirty(data + page * mirror_page, 1).has_value(), "a page marked dirty");
    }
    t0 = clock_type::now();
    const auto report = mirror.sync();
    dirty_sync.push_back(microseconds_since(t0));
    checks.expect(report.has_value() && report->pages == dirty.size(), "a sync moves exactly the dirty pages");
  }
  checks.expect(device_equals_host(mirror, gpus, data, total),
                "after the partial syncs every device byte equals the host's");
  mirror.deallocate(data, total, 1);

  const auto gbps = [](std::size_t bytes, double us) { return us > 0 ? static_cast<double>(bytes) / (us * 1e3) : 0.0; };
  const std::size_t dirty_bytes = dirty.size() * mirror_page;
  const double full_sync_gbps = gbps(total, percentile(full_sync, 0.5));
  const double full_plain_gbps = gbps(total, percentile(full_plain, 0.5));
  const double dirty_sync_gbps = gbps(dirty_bytes, percentile(dirty_sync, 0.5));
  const double dirty_plain_gbps = gbps(dirty_bytes, percentile(dirty_plain, 0.5));
  carve::bench::figure("full sync", full_sync_gbps, "GB/s");
  carve::bench::figure("full, plain cudaMemcpyAsync per device run", full_plain_gbps, "GB/s");
  carve::bench::figure("10% dirty sync", dirty_sync_gbps, "GB/s");
  carve::bench::figure("10% dirty, plain cudaMemcpyAsync per page", dirty_plain_gbps, "GB/s");
  constexpr const char* source =
      "the same bytes copied without carve in this run (same pinned memory, device memory and streams)";
  const auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
  carve::bench::target("mirror full sync over plain cudaMemcpyAsync", ratio(full_sync_gbps, full_plain_gbps), "x",
                       Aim::at_least, 0.9, source, checks.ok());
  carve::bench::target("mirror sync of 10% dirty pages over plain cudaMemcpyAsync per page",
                       ratio(dirty_sync_gbps, dirty_plain_gbps), "x", Aim::at_least, 0.9, source, checks.ok());
}

// ---- one pointer over the cards ---------------------------------------------------------------

void view_reads() {
  constexpr std::size_t per_device = std::size_t{64} << 20;
  carve::CudaMirrorBackend gpus(carve::CudaMirrorOptions{.bytes_per_device = per_device});
  carve::PagedMirror mirror(gpus, carve::MirrorOptions{.page_size = mirror_page, .device_view = true},
                            carve::StripePlacement{.stripe_pages = 8});
  const std::size_t total = mirror.capacity();
  Checks checks;
  const auto allocation = mirror.try_allocate(total, 1);
  if (!checks.expect(allocation.has_value(), "the view's whole capacity as one allocation")) {
    std::printf("  %s\n", mirror.allocation_failure_message(total).c_str());
    return;
  }
  auto* data = static_cast<std::uint64_t*>(*allocation);
  std::iota(data, data + total / sizeof(std::uint64_t), std::uint64_t{7});
  checks.expect(mirror.sync().has_value(), "the array synced to its owners");
  const auto view = mirror.device_pointer(data, 0);
  if (!checks.expect(view.has_value(), "device 0 reaches every owner")) {
    std::printf("  %s\n", view.error().message.c_str());
    return;
  }
  const auto* dview = static_cast<const std::byte*>(*view);
  const auto segments = mirror.segments(data, total);
  if (!checks.expect(segments.has_value(), "the allocation's device segments")) {
    return;
  }
  const auto& parts = *segments;
  const carve::ViewPlacement scores(carve::discover_topology());
  void* scratch = nullptr;
  cuda_check(cudaSetDevice(gpus.cuda_ordinal(0)), "cudaSetDevice");
  cuda_check(cudaMalloc(&scratch, total), "cudaMalloc");
  std::printf("one pointer over %zu card(s): device 0 reads %zu MiB through the view, medians of 5\n",
              mirror.device_count(), total >> 20);
  std::vector<std::byte> back(total);
  for (std::uint32_t owner = 0; owner < mirror.device_count(); ++owner) {
    std::vector<double> us;
    std::size_t bytes = 0;
    for (int rep = 0; rep < 5; ++rep) {
      bytes = 0;
      const auto t0 = clock_type::now();
      for (const carve::MirrorSegment& s : parts) {
        if (s.device == owner) {
          const std::size_t at = static_cast<std::size_t>(s.host - reinterpret_cast<std::byte*>(data));
          cuda_check(cudaMemcpyAsync(static_cast<std::byte*>(scratch) + at, dview + at, s.bytes,
                                     cudaMemcpyDeviceToDevice, gpus.stream(0)),
                     "cudaMemcpyAsync through the view");
          bytes += s.bytes;
        }
      }
      cuda_check(cudaStreamSynchronize(gpus.stream(0)), "cudaStreamSynchronize");
      us.push_back(microseconds_since(t0));
    }
    const double gbps = bytes > 0 ? static_cast<double>(bytes) / (percentile(us, 0.5) * 1e3) : 0.0;
    std::printf("  owner %u: %zu MiB at %.1f GB/s; topology score %.1f GB/s\n", owner, bytes >> 20, gbps,
                scores.load_gbps(0, owner));
  }
  cuda_check(cudaMemcpy(back.data(), scratch, total, cudaMemcpyDeviceToHost), "copy back");
  checks.expect(std::memcmp(back.data(), data, total) == 0, "every byte read through the view equals the host's");
  std::printf("  %s\n", scores.explain(0, parts).text.c_str());
  cuda_check(cudaFree(scratch), "cudaFree");
  mirror.deallocate(data, total, 1);
}

// ---- service IPC -----------------------------------------------------------------------------

constexpr std::size_t region_bytes = std::size_t{2} << 20;
constexpr int round_trips = 100;

carve::service::AllocationClient connect(const carve::test::ServedProcess& server, const char* name) {
  auto c = carve::service::AllocationClient::connect(
      carve::service::ClientOptions{server.socket(), name, std::chrono::seconds(60)});
  if (!c) {
    std::fprintf(stderr, "cannot connect to carve-served: %s\n", c.error().message.c_str());
    std::exit(1);
  }
  return std::move(*c);
}

// Allocate round trips (microseconds) of `region_bytes` on `card`, each freed again; `written`
// (when given) writes each region through its mapping and reads it back.
std::vector<double> allocate_round_trips(carve::service::AllocationClient& client, int card, Checks& checks,
                                         bool written, std::vector<double>* frees = nullptr) {
  std::vector<double> out;
  std::vector<unsigned char> back(region_bytes);
  for (int i = 0; i < round_trips; ++i) {
    const auto t0 = clock_type::now();
    auto r = client.lease(region_bytes, card, 256);
    const double us = microseconds_since(t0);
    if (!checks.expect(r.has_value(), "allocate 2 MiB on card " + std::to_string(card))) {
      std::printf("  %s\n", r.error().message.c_str());
      break;
    }
    out.push_back(us);
    if (written) {
      const auto value = static_cast<unsigned char>(i + 1);
      const bool wrote = cudaMemset(r->ptr, value, region_bytes) == cudaSuccess &&
                         cudaMemcpy(back.data(), r->ptr, region_bytes, cudaMemcpyDeviceToHost) == cudaSuccess;
      checks.expect(wrote && std::all_of(back.begin(), back.end(), [value](unsigned char c) { return c == value; }),
                    "a region written through its IPC mapping reads back");
    }
    const auto t1 = clock_type::now();
    const auto freed = client.free(r->ptr);
    if (frees != nullptr) {
      frees->push_back(microseconds_since(t1));
    }
    checks.expect(freed.has_value(), "free");
  }
  return out;
}

void service_ipc(int devices) {
  Checks checks;
  carve::test::ServedProcess cuda_server({"--backend", "cuda-ipc"});
  if (!checks.expect(cuda_server.listening(), "carve-served --backend cuda-ipc starts")) {
    std::printf("%s\n", cuda_server.output().c_str());
    return;
  }
  auto client = connect(cuda_server, "gpu-bench");
  checks.expect(client.server().backend == carve::ExportKind::cuda_ipc, "the server lends CUDA memory");
  std::printf("service IPC: carve-served on %d CUDA cards, %d allocate + free round trips of 2 MiB per card\n", devices,
              round_trips);
  std::vector<double> allocate_us, free_us, maps, unmaps;
  for (int card = 0; card < devices; ++card) {
    (void)allocate_round_trips(client, card, checks, false); // warm: the server's first cudaMalloc per card
    map_us.clear();
    unmap_us.clear();
    const auto a = allocate_round_trips(client, card, checks, true, &free_us);
    allocate_us.insert(allocate_us.end(), a.begin(), a.end());
    maps.insert(maps.end(), map_us.begin(), map_us.end());
    unmaps.insert(unmaps.end(), unmap_us.begin(), unmap_us.end());
  }
  std::vector<double> query_us;
  if (auto r = client.lease(region_bytes, 0, 256)) {
    for (int i = 0; i < round_trips; ++i) {
      const auto t0 = clock_type::now();
      const auto q = client.query(r->ptr);
      query_us.push_back(microseconds_since(t0));
      checks.expect(q.has_value(), "query");
    }
    (void)client.free(r->ptr);
  }
  const auto stats = client.stats();
  checks.expect(stats.has_value() && stats->consistent && stats->live_regions == 0, "the server's books balance");

  // The same call on shared-memory cards, and what the client would do without the service.
  carve::test::ServedProcess host_server(
      {"--topology", std::string("nvidia-smi:") + CARVE_BENCH_TOPOLOGY, "--card-memory", "256MiB"});
  std::vector<double> host_allocate_us;
  if (checks.expect(host_server.listening(), "carve-served on shared-memory cards starts")) {
    {
      auto host_client = connect(host_server, "gpu-bench-host");
      (void)allocate_round_trips(host_client, 0, checks, false);
      host_allocate_us = allocate_round_trips(host_client, 0, checks, false);
    }
    checks.expect(host_server.stop() == 0, "carve-served on shared-memory cards stops cleanly");
  }
  std::vector<double> malloc_us;
  cuda_check(cudaSetDevice(0), "cudaSetDevice");
  for (int i = 0; i <= round_trips; ++i) {
    const auto t0 = clock_type::now();
    void* p = nullptr;
    cuda_check(cudaMalloc(&p, region_bytes), "cudaMalloc");
    cuda_check(cudaFree(p), "cudaFree");
    if (i > 0) { // the first carries the context's set-up
      malloc_us.push_back(microseconds_since(t0));
    }
  }

  const double allocate_p50 = percentile(allocate_us, 0.5);
  const double map_p50 = percentile(maps, 0.5);
  carve::bench::figure("allocate round trip, CUDA cards (with the map), p50", allocate_p50, "us");
  carve::bench::figure("allocate round trip, CUDA cards (with the map), p99", percentile(allocate_us, 0.99), "us");
  carve::bench::figure("free round trip, CUDA cards (with the unmap), p50", percentile(free_us, 0.5), "us");
  carve::bench::figure(
      "cudaIpcOpenMemHandle calls per allocate",
      allocate_us.empty() ? 0.0 : static_cast<double>(maps.size()) / static_cast<double>(allocate_us.size()), "");
  carve::bench::figure("cudaIpcCloseMemHandle, p50", percentile(unmaps, 0.5), "us");
  carve::bench::figure("query round trip, CUDA server, p50", percentile(query_us, 0.5), "us");
  carve::bench::figure("allocate round trip, shared-memory cards, p50", percentile(host_allocate_us, 0.5), "us");
  carve::bench::figure("cudaMalloc + cudaFree of 2 MiB in this process, p50", percentile(malloc_us, 0.5), "us");
  checks.expect(!maps.empty(), "the client mapped segments through cudaIpcOpenMemHandle");
  checks.expect(cuda_server.stop() == 0, "carve-served --backend cuda-ipc stops cleanly");
  carve::bench::target("service allocate 2 MiB on CUDA cards, round trip without the map, p50", allocate_p50 - map_p50,
                       "us", Aim::at_most, 2.0 * percentile(host_allocate_us, 0.5),
                       "2x the same call on shared-memory cards in this run (carve's host path; docs/service.md: 48 us "
                       "p50 on the project's VM)",
                       checks.ok());
  carve::bench::target("service IPC map of a 2 MiB segment (cudaIpcOpenMemHandle in the client), p50", map_p50, "us",
                       Aim::at_most, percentile(malloc_us, 0.5),
                       "cudaMalloc + cudaFree of the same bytes in this process, measured in this run (what a client "
                       "without the service would do)",
                       checks.ok());
}

} // namespace

int main() {
  // Each line reaches the report's file as it is printed, whatever happens later.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const int devices = carve::bench::require_devices("gpu_host_paths");
  try {
    mirror_sync();
    view_reads();
    service_ipc(devices);
  } catch (const std::exception& e) { // a device that cannot be opened, a server that will not start
    std::printf("FAILED: %s\n", e.what());
    return 1;
  }
  return carve::bench::failed_checks() == 0 ? 0 : 1;
}
