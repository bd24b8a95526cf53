// What libcarve_torch's C functions cost over the carve pool they call: allocate + free through
// carve_torch_malloc / carve_torch_free (the host backend, as PyTorch would call them) beside the
// same pool called directly, on the same sequence of requests.
//
//   bench_torch_plugin [--pool=expandable|stream-ordered|caching] [benchmark flags]
//
// Each iteration frees the oldest of 64 live blocks and allocates the next size of a fixed
// pattern (512 bytes to 1 MiB, most of them small, as in a training step), on one stream; the
// blocks are not touched. Target: the C functions within 1.2x of the direct pool.
#include "compare.hpp"

#include <carve_torch.h>
#include <host_streams.hpp>

#include <carve/mr/simulated_card.hpp>
#include <carve/mr/stream_caching_pool.hpp>
#include <carve/mr/stream_ordered_pool.hpp>
#include <carve/vmm/expandable_pool.hpp>
#include <carve/vmm/host_memory_mapper.hpp>

#include <benchmark/benchmark.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr std::size_t live_blocks = 64;
constexpr std::size_t alignment = 512;

// Sizes: three in four below 64 KiB, the rest up to 1 MiB; deterministic.
std::vector<std::size_t> size_pattern() {
  std::vector<std::size_t> sizes(1024);
  std::uint32_t x = 12345;
  for (auto& s : sizes) {
    x = x * 1664525u + 1013904223u;
    const unsigned shift = (x >> 8) % 4 == 0 ? 12 + (x >> 12) % 9 : 9 + (x >> 12) % 8; // 4 KiB..1 MiB or 512..64 KiB
    s = (std::size_t{1} << shift) + (x >> 20) % 512;
  }
  return sizes;
}

// The same loop over any allocate / free pair.
template <class Allocate, class Free>
void run(benchmark::State& state, Allocate allocate, Free free) {
  const std::vector<std::size_t> sizes = size_pattern();
  std::array<std::pair<void*, std::size_t>, live_blocks> ring{};
  std::size_t next = 0;
  for (auto& slot : ring) {
    slot = {allocate(sizes[next % sizes.size()]), sizes[next % sizes.size()]};
    ++next;
  }
  std::size_t oldest = 0;
  for (auto _ : state) {
    free(ring[oldest].first, ring[oldest].second);
    const std::size_t bytes = sizes[next++ % sizes.size()];
    void* p = allocate(bytes);
    if (p == nullptr) {
      state.SkipWithError("allocation failed");
      break;
    }
    ring[oldest] = {p, bytes};
    oldest = (oldest + 1) % live_blocks;
  }
  for (auto& [p, bytes] : ring) {
    if (p != nullptr) {
      free(p, bytes);
    }
  }
}

const carve::torch::HostStream stream{0};

template <class Pool>
void direct_stream_pool(benchmark::State& state, Pool& pool) {
  run(
      state,
      [&](std::size_t bytes) {
        const auto p = pool.try_allocate(stream, bytes, alignment);
        return p ? *p : nullptr;
      },
      [&](void* p, std::size_t bytes) { (void)pool.try_deallocate(stream, p, bytes, alignment); });
}

void direct(benchmark::State& state, const std::string& pool) {
  if (pool == "expandable") {
    carve::ExpandablePoolOptions o;
    o.granularity = alignment;
    carve::ExpandablePool<carve::HostMemoryMapper, carve::torch::HostStreams> p(
        carve::HostMemoryMapper(carve::HostMapperOptions{.granularity = std::size_t{2} << 20, .cpu_device = -1}), o);
    direct_stream_pool(state, p);
  } else if (pool == "stream-ordered") {
    carve::StreamOrderedPool<carve::SimulatedCard, carve::torch::HostStreams> p(
        carve::SimulatedCard(std::size_t{1} << 40));
    direct_stream_pool(state, p);
  } else {
    carve::PoolOptions o;
    o.granularity = alignment;
    carve::StreamCachingPool<carve::SimulatedCard, carve::torch::HostStreams> p(
        carve::SimulatedCard(std::size_t{1} << 40), o);
    direct_stream_pool(state, p);
  }
}

void through_c_functions(benchmark::State& state) {
  run(
      state, [](std::size_t bytes) { return carve_torch_malloc(static_cast<ssize_t>(bytes), 0, nullptr); },
      [](void* p, std::size_t bytes) { carve_torch_free(p, static_cast<ssize_t>(bytes), 0, nullptr); });
}

} // namespace

int main(int argc, char** argv) {
  std::string pool = "expandable";
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--pool=", 7) == 0) {
      pool = argv[i] + 7;
    } else {
      rest.push_back(argv[i]);
    }
  }
  if (pool != "expandable" && pool != "stream-ordered" && pool != "caching") {
    std::fprintf(stderr, "bench_torch_plugin: --pool=%s: expandable, stream-ordered or caching\n", pool.c_str());
    return 2;
  }
  // The library reads these once, at its first call.
  setenv("CARVE_TORCH_BACKEND", "host", 1);
  setenv("CARVE_TORCH_POOL", pool.c_str(), 1);
  if (const char* error = carve_torch_config_error()) {
    std::fprintf(stderr, "%s\n", error);
    return 2;
  }
  const std::string direct_name = pool + " pool, called directly";
  const std::string c_name = pool + " pool, through carve_torch_malloc/free";
  benchmark::RegisterBenchmark(direct_name.c_str(), [pool](benchmark::State& s) { direct(s, pool); });
  benchmark::RegisterBenchmark(c_name.c_str(), through_c_functions);
  carve::bench::MedianCollector c;
  carve::bench::run_with_medians(static_cast<int>(rest.size()), rest.data(), c);
  std::printf("\nallocate + free, 64 blocks live, 512 bytes to 1 MiB, one stream (host backend):\n");
  carve::bench::print_overhead(c, "C functions / the pool called directly", c_name, direct_name, 1.2);
  return 0;
}
