// One GPU's whole memory hierarchy as one stack: its own caching pool; then memory borrowed
// from its best-linked peers (at most 32 MiB of it); then its fair share of a spill tier, from a
// tier plan. A StatsResource at each level counts what that level served.
//
// Cards are 64 MiB of host memory here (SimulatedCard) and the spill tier is files in the temp
// directory, so this runs anywhere. With carve::CudaDeviceResource cards the first two levels are
// device memory (kernels on GPU0 reach them directly; a peer's once peer access is on), and the
// spill share stays host memory, reached by copies: the properties printed below say which.
#if __has_include(<cuda_runtime_api.h>)
#define LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE // CCCL's memory-resource properties
#endif
#include <carve/borrow.hpp>
#include <carve/mr.hpp>
#include <carve/tier.hpp>
#include <carve/topology.hpp>

#include <cstdio>
#include <filesystem>
#include <vector>

namespace {
constexpr const char* four_gpus = R"(        GPU0    GPU1    GPU2    GPU3    CPU Affinity
GPU0     X      NV2     NV1     SYS     0-15
GPU1    NV2      X      NV1     SYS     0-15
GPU2    NV1     NV1      X      NV2     0-15
GPU3    SYS     SYS     NV2      X      0-15
)";

template <class Level>
const char* reach() {
#if defined(CARVE_HAS_CUDA_MR)
  return carve::SynchronousResourceWith<Level, cuda::mr::device_accessible> ? "device memory" : "host memory";
#else
  return "(CCCL properties need the CUDA headers)";
#endif
}
} // namespace

using Pool = carve::CachingPool<carve::SimulatedCard>;
using Borrower = carve::BorrowingAllocator<Pool>;
using Local = carve::StatsResource<carve::ResourceRef<Pool>>;
using Borrowed = carve::StatsResource<carve::LimitResource<Borrower::Card>>;
using Spilled = carve::StatsResource<carve::TierShareResource>;
using Hierarchy = carve::FallbackResource<Local, carve::FallbackResource<Borrowed, Spilled>>;

int main() {
  Borrower borrower(carve::Topology::from_nvidia_smi(four_gpus),
                    [](int) { return Pool(carve::SimulatedCard(64 << 20)); });
  const carve::TierPlanner planner({{0, 64 << 20}, {1, 64 << 20}, {2, 64 << 20}, {3, 64 << 20}},
                                   {carve::disk_tier(std::filesystem::temp_directory_path(), 1, "disk", 128 << 20)});
  const carve::TierPlan plan = planner.plan({{512 << 20}}); // a task that needs 128 MiB per GPU: 64 MiB extra each
  Hierarchy gpu0(carve::ref(borrower.resource(0)),
                 carve::FallbackResource<Borrowed, Spilled>(
                     carve::LimitResource<Borrower::Card>(borrower.peers(0), std::size_t{32} << 20),
                     carve::TierShareResource(plan, 0, 0)));

  std::vector<void*> blocks;
  for (auto p = gpu0.try_allocate(4 << 20, 256); p; p = gpu0.try_allocate(4 << 20, 256)) {
    blocks.push_back(*p);
  }
  const auto served = [](const char* level, const carve::ResourceStats& s, const char* memory) {
    std::printf("  %-22s %3llu blocks, %3zu MiB  (%s)\n", level, static_cast<unsigned long long>(s.allocations),
                s.bytes_in_use >> 20, memory);
  };
  std::printf("GPU0 took %zu blocks of 4 MiB:\n", blocks.size());
  served("its own pool", gpu0.primary().stats(), reach<Local>());
  served("borrowed from peers", gpu0.fallback().primary().stats(), reach<Borrowed>());
  served("its share of the tier", gpu0.fallback().fallback().stats(), reach<Spilled>());
  for (void* p : blocks) {
    gpu0.deallocate(p, 4 << 20, 256);
  }
  return borrower.live_blocks() == 0 ? 0 : 1;
}
