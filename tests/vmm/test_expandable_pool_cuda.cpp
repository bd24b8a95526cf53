// ExpandablePool over CudaMemoryMapper, host code linked with the CUDA runtime only. Without a
// driver (this machine) the pool refuses to be built, saying why; with a driver but no device the
// test is skipped (77); on a GPU: blocks written and read back through the device, chunks mapped
// and unmapped by the driver, and the test's own snapshot replayed on the card beside the host twin
// (HostMemoryMapper with the card's granularity), which must reserve and call the driver exactly
// as the card does: the replay's prediction checked against the real thing; the shared real
// snapshot too, where it is beside the repository; a hole lent to a large block, and to a small
// one past a cap, written through one address and read through the other; and what the driver's
// calls cost per chunk size.
#include "support/device_test.hpp"

#include <carve/trace/trace_file.hpp>
#include <carve/vmm.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

using carve::test::expect;
using carve::test::failures;

void without_driver() {
  bool refused = false;
  try {
    carve::ExpandablePool<carve::CudaMemoryMapper> pool(carve::CudaMemoryMapper{});
  } catch (const carve::Exception& e) {
    refused = e.code() == carve::Errc::unsupported;
    std::printf("(as expected) %s\n", e.what());
  }
  expect(refused, "no pool without a driver");
}

// The replay of `t` through `pool`: its peak reserved bytes and driver calls.
template <class Pool>
std::pair<std::size_t, std::uint64_t> replay(const carve::trace::AllocationTrace& t, Pool& pool, double* ns) {
  std::vector<void*> at(t.blocks.size(), nullptr);
  const auto start = std::chrono::steady_clock::now();
  for (std::uint32_t b = 0; b < t.start_blocks; ++b) {
    at[b] = pool.allocate(t.blocks[b].bytes, 512);
  }
  for (const auto& q : t.requests) {
    if (q.allocate) {
      at[q.block] = pool.allocate(t.blocks[q.block].bytes, 512);
    } else {
      pool.deallocate(at[q.block], t.blocks[q.block].bytes, 512);
      at[q.block] = nullptr;
    }
  }
  if (ns != nullptr) {
    *ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count() /
          static_cast<double>(t.blocks.size());
  }
  for (std::uint32_t b = 0; b < at.size(); ++b) {
    if (at[b] != nullptr) {
      pool.deallocate(at[b], t.blocks[b].bytes, 512);
    }
  }
  const auto s = pool.stats();
  return {s.peak_reserved, s.device_calls()};
}

void on_gpu() {
  carve::ExpandablePool<carve::CudaMemoryMapper> pool(carve::CudaMemoryMapper{}, {.device = 0});
  const std::size_t g = pool.granule();
  std::printf("device 0 granularity: %zu bytes\n", g);
  std::vector<std::pair<void*, std::size_t>> blocks;
  for (const std::size_t bytes : {std::size_t{1000}, 3 * g + 17, std::size_t{64} << 10, 9 * g}) {
    void* p = pool.allocate(bytes, 256);
    blocks.emplace_back(p, bytes);
  }
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    carve::test::check(cudaMemset(blocks[i].first, static_cast<int>(0x30 + i), blocks[i].second), "cudaMemset");
  }
  carve::test::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const auto seen = carve::test::to_host(static_cast<const unsigned char*>(blocks[i].first), blocks[i].second);
    expect(std::all_of(seen.begin(), seen.end(), [&](unsigned char c) { return c == 0x30 + i; }),
           "every block holds what the device wrote, none overlapping another");
  }
  auto s = pool.stats();
  std::printf("4 blocks: %zu bytes mapped in %zu chunks, %llu driver calls\n", s.bytes_reserved, s.chunks,
              static_cast<unsigned long long>(s.device_calls()));
  expect(pool.consistent(), "the pool's books agree");
  for (auto [p, bytes] : blocks) {
    pool.deallocate(p, bytes, 256);
  }
  expect(pool.trim() == s.bytes_reserved, "trim unmaps every chunk");
  expect(pool.stats().bytes_reserved == 0, "nothing mapped after trim");

  // The shared snapshot lies beside the checkout; where only the checkout was copied (a GPU
  // machine), CARVE_REAL_SNAPSHOT names a copy of it.
  const char* copy = std::getenv("CARVE_REAL_SNAPSHOT");
  for (const char* path : {CARVE_SMALL_SNAPSHOT, copy != nullptr ? copy : CARVE_REAL_SNAPSHOT}) {
    const auto t = carve::trace::read_trace_file(path);
    if (!t) {
      expect(path != std::string(CARVE_SMALL_SNAPSHOT), "the test's own snapshot reads");
      std::printf("%s\n", t.error().message.c_str()); // the shared snapshot may be absent
      continue;
    }
    carve::ExpandablePool<carve::CudaMemoryMapper> card(carve::CudaMemoryMapper{}, {.device = 0});
    double ns = 0;
    const auto real = replay(*t, card, &ns);
    const bool parts = !card.stats().lending_refused; // the card's answer, given to its twin
    carve::ExpandablePool<carve::HostMemoryMapper> twin(
        carve::HostMemoryMapper({.granularity = g, .maps_partial_allocations = parts}),
        {.address_space_bytes = card.options().address_space_bytes});
    const auto predicted = replay(*t, twin, nullptr);
    std::printf("%s on the card: peak reserved %zu bytes, %llu driver calls, %.0f ns per allocate+free with the "
                "driver's calls; the host twin predicted %zu bytes and %llu calls\n",
                path, real.first, static_cast<unsigned long long>(real.second), ns, predicted.first,
                static_cast<unsigned long long>(predicted.second));
    expect(real == predicted, "the replay on the host twin predicts the card's reserve and driver calls exactly");
  }
}

// A hole lent on the card (ExpandablePoolOptions::lend_min_bytes): one physical allocation mapped
// at two addresses. CUDA documents that cuMemMap's offset must be 0; the mapper asks the driver
// whether it maps part of an allocation, and the test says what it answered. Yes: the hole serves
// the block. No: the pool never tries, and the block maps new memory with no call refused. The
// answer must agree with what the driver does: a yes whose lend is refused fails. `capped`: the
// pool may hold the chunk's 8 granules only and lends at its default lend_min_bytes (512 MiB), so
// the block borrows the hole once the cap refuses it, or without partial maps is refused itself.
void lending_on_card(std::size_t g, bool capped) {
  carve::CudaMemoryMapper driver;
  const auto answer = driver.partial_map_answer(0);
  if (!answer) {
    std::printf("the driver could not be asked whether it maps part of an allocation: %s\n",
                answer.error().message.c_str());
  } else if (capped) {
    std::printf("under a cap of 8 granules:\n");
  } else if (answer->maps) {
    std::printf("the driver maps part of an allocation (an offset other than 0, or fewer bytes than it holds), "
                "and the parts show the allocation's bytes\n");
  } else {
    std::printf("the driver does not map part of an allocation (an offset other than 0, or fewer bytes than it "
                "holds): %s\n",
                answer->why.c_str());
  }
  expect(answer.has_value(), "the driver answers whether it maps part of an allocation");
  const auto parts = driver.maps_partial_allocations(0);
  expect(parts.has_value() && answer && *parts == answer->maps, "the answer is kept");
  carve::ExpandablePoolOptions options{
      .device = 0, .growth_divisor = 0, .headroom_permille = 0, .lend_min_bytes = 4 * g};
  if (capped) {
    options.max_reserved_bytes = 8 * g;
    options.lend_min_bytes = carve::ExpandablePoolOptions{}.lend_min_bytes;
  }
  carve::ExpandablePool<carve::CudaMemoryMapper> pool(driver, options);
  expect(pool.stats().lending_refused == !(parts && *parts), "the pool lends exactly where the driver said yes");
  void* x = pool.allocate(8 * g, 512); // one chunk of 8 granules
  pool.deallocate(x, 8 * g, 512);
  void* a = pool.allocate(2 * g, 512);
  void* b = pool.allocate(2 * g, 512);
  void* c = pool.allocate(2 * g, 512);
  pool.deallocate(b, 2 * g, 512); // a hole that a and c pin
  carve::test::check(cudaMemset(a, 0x11, 2 * g), "cudaMemset");
  const auto got = pool.try_allocate(4 * g, 512); // the chunk's free end and two granules past it
  const auto s = pool.stats();
  const auto* base = static_cast<const char*>(x);
  expect(a == x && static_cast<const char*>(c) == base + 4 * g, "the blocks land best fit from the chunk's start");
  expect(s.mapper_failures == 0, "no driver call refused");
  void* d = got ? *got : nullptr;
  if (parts && *parts) {
    expect(static_cast<const char*>(d) == base + 6 * g, "d lands over granules 6 to 9");
    carve::test::check(cudaMemset(d, 0x5a, 4 * g), "cudaMemset");
    carve::test::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    const auto hole = carve::test::to_host(static_cast<const unsigned char*>(x) + 2 * g, 2 * g);
    std::printf("a hole lent: %zu bytes mapped a second time, %zu bytes reserved for blocks spanning 10 granules\n",
                s.lent_bytes, s.bytes_reserved);
    expect(s.lent_bytes == 2 * g && s.bytes_reserved == 8 * g, "the hole served the block, no new memory");
    expect(std::all_of(hole.begin(), hole.end(), [](unsigned char v) { return v == 0x5a; }),
           "what the device wrote through the block is in the hole's memory");
    expect(!s.lending_refused, "a pool that lent says lending is on");
  } else if (capped) {
    std::printf("no hole lent: the block past the cap is refused\n");
    expect(!got && got.error() == carve::Errc::no_space && s.bytes_reserved == 8 * g, "refused, nothing changed");
  } else {
    std::printf("no hole lent (%zu bytes reserved for blocks spanning 10 granules): carve_replay's "
                "expandable-pool:partial-maps=0 replays this driver\n",
                s.bytes_reserved);
    expect(static_cast<const char*>(d) == base + 6 * g, "d lands over granules 6 to 9");
    expect(s.lent_bytes == 0 && s.bytes_reserved == 10 * g, "the block maps new memory");
  }
  carve::test::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  const auto kept = carve::test::to_host(static_cast<const unsigned char*>(a), 2 * g);
  expect(std::all_of(kept.begin(), kept.end(), [](unsigned char v) { return v == 0x11; }), "its neighbour is intact");
  expect(pool.consistent(), "the pool's books agree");
  for (void* p : {a, c}) {
    pool.deallocate(p, 2 * g, 512);
  }
  if (d != nullptr) {
    pool.deallocate(d, 4 * g, 512);
  }
  pool.trim();
  expect(pool.stats().bytes_reserved == 0 && pool.stats().lent_bytes == 0, "nothing mapped after trim");
}

// What the driver calls a pool makes cost on this card, per chunk size: a chunk mapped (create,
// map, set_access) and unmapped (unmap, release), the mean of 16 rounds after one to warm up. With
// each step's driver calls (the training-step check's report) it prices the headroom line and
// ExpandablePoolOptions::max_chunk_bytes on a card (not yet run on one).
void driver_call_prices(std::size_t g) {
  carve::CudaMemoryMapper driver;
  for (const std::size_t bytes : {g, 4 * g, 32 * g}) {
    const auto va = driver.reserve(bytes, g);
    expect(va.has_value(), "addresses for one chunk");
    if (!va) {
      return;
    }
    double map_us = 0;
    double unmap_us = 0;
    constexpr int rounds = 16;
    for (int round = 0; round <= rounds; ++round) {
      const auto start = std::chrono::steady_clock::now();
      const auto h = driver.create(0, bytes);
      const bool mapped =
          h && driver.map(*va, bytes, *h) && driver.set_access(*va, bytes, 0, carve::Access::read_write);
      const auto middle = std::chrono::steady_clock::now();
      const bool unmapped = (!mapped || driver.unmap(*va, bytes)) && (!h || driver.release(*h));
      const auto end = std::chrono::steady_clock::now();
      expect(mapped && unmapped, "a chunk created, mapped, opened, unmapped and released");
      if (round > 0) { // the first round warms the driver up
        map_us += std::chrono::duration<double, std::micro>(middle - start).count() / rounds;
        unmap_us += std::chrono::duration<double, std::micro>(end - middle).count() / rounds;
      }
    }
    std::printf("a chunk of %zu MiB: %.1f us to create, map and open it, %.1f us to unmap and release it\n",
                bytes >> 20, map_us, unmap_us);
    expect(driver.free_reservation(*va, bytes).has_value(), "the addresses go back");
  }
}

} // namespace

int main() {
  if (!carve::CudaMemoryMapper::driver_available()) {
    // Where the runtime sees a GPU, the driver's memory calls must be reachable: without them
    // nothing below would test the card.
    int devices = 0;
    expect(cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0, "a machine with a GPU reaches its driver");
    without_driver();
  } else {
    carve::test::skip_without_device();
    on_gpu();
    const std::size_t g = *carve::CudaMemoryMapper{}.granularity(0);
    lending_on_card(g, false);
    lending_on_card(g, true);
    driver_call_prices(g);
  }
  std::printf("%s\n", failures == 0 ? "all passed" : "FAILED");
  return failures == 0 ? 0 : 1;
}
