// GPU0 runs out of memory and borrows from its best-linked peers, on a DGX-1
// (8x V100, hybrid cube-mesh NVLink) read from `nvidia-smi topo -m` output. Each card is
// simulated with 64 MiB of host memory standing in for its 16 GB, so this runs anywhere; with
// GPUs, pass carve::CudaDeviceResource(i) upstreams instead.
#include <carve/borrow.hpp>
#include <carve/mr.hpp>
#include <carve/topology.hpp>

#include <cstdio>
#include <string>
#include <vector>

namespace {

// nvidia-smi topo -m on a DGX-1 class machine (from Oneflow-Inc/DLPerf's V100 reports).
constexpr const char* dgx1_topo =
    R"(        GPU0    GPU1    GPU2    GPU3    GPU4    GPU5    GPU6    GPU7    mlx5_0  CPU Affinity
GPU0     X      NV1     NV1     NV2     NV2     SYS     SYS     SYS     NODE    0-11,24-35
GPU1    NV1      X      NV2     NV1     SYS     NV2     SYS     SYS     NODE    0-11,24-35
GPU2    NV1     NV2      X      NV2     SYS     SYS     NV1     SYS     PIX     0-11,24-35
GPU3    NV2     NV1     NV2      X      SYS     SYS     SYS     NV1     PIX     0-11,24-35
GPU4    NV2     SYS     SYS     SYS      X      NV1     NV1     NV2     SYS     12-23,36-47
GPU5    SYS     NV2     SYS     SYS     NV1      X      NV2     NV1     SYS     12-23,36-47
GPU6    SYS     SYS     NV1     SYS     NV1     NV2      X      NV2     SYS     12-23,36-47
GPU7    SYS     SYS     SYS     NV1     NV2     NV1     NV2      X      SYS     12-23,36-47
mlx5_0  NODE    NODE    PIX     PIX     SYS     SYS     SYS     SYS      X
)";

constexpr std::size_t MiB = std::size_t{1} << 20;

std::string mib(std::size_t bytes) { return std::to_string(bytes / MiB) + " MiB"; }

void print_decision(const carve::Topology& topo, const carve::BorrowDecision& d) {
  std::printf("GPU%d asks for %s: ", d.requester, mib(d.bytes).c_str());
  if (d.lender == d.requester) {
    std::printf("fits locally\n");
    return;
  }
  // The path the requester's loads take: no GPU relays them (the picker scores the same).
  const carve::Topology loads = topo.with_options({topo.options().max_hops, carve::GpuRelay::never});
  std::string path;
  for (const carve::NodeId n : loads.path(loads.gpu(d.requester), loads.gpu(d.lender))) {
    path += (path.empty() ? "" : " -> ") + loads.node(n).name;
  }
  std::printf("GPU%d has only %s free in one piece -> borrows on GPU%d at %.0f GB/s (%s)\n", d.requester,
              mib(d.cards[static_cast<std::size_t>(d.requester)].largest_free_block).c_str(), d.lender,
              d.bandwidth_gbps, path.c_str());
  std::printf("    candidates:");
  for (std::size_t c = 0; c < d.cards.size(); ++c) {
    if (static_cast<int>(c) != d.requester) {
      const bool room = d.cards[c].largest_free_block >= d.bytes;
      std::printf(" GPU%zu %.0f GB/s %s%s;", c, d.bandwidths[c], mib(d.cards[c].largest_free_block).c_str(),
                  room ? "" : " (too little)");
    }
  }
  std::printf("\n");
}

} // namespace

int main() {
  const carve::Topology topo = carve::Topology::from_nvidia_smi(dgx1_topo); // 20 GB/s per NVLink
  std::vector<carve::SimulatedCard> cards;
  for (int i = 0; i < topo.gpu_count(); ++i) {
    cards.emplace_back(64 * MiB);
  }
  // Other jobs already use part of GPU3 and all but 16 MiB of GPU4.
  void* job3 = *cards[3].try_allocate(40 * MiB, 256);
  void* job4 = *cards[4].try_allocate(48 * MiB, 256);

  // One caching pool per card, over that card's memory.
  using Pool = carve::CachingPool<carve::SimulatedCard>;
  carve::BorrowingAllocator<Pool> alloc(topo, [&](int gpu) {
    return Pool(cards[static_cast<std::size_t>(gpu)], {.granularity = 512, .segment_size = 2 * MiB});
  });
  alloc.on_decision([&](const carve::BorrowDecision& d) { print_decision(topo, d); });

  std::vector<carve::BorrowHandle> held;
  for (const std::size_t size : {32 * MiB, 24 * MiB, 16 * MiB, 20 * MiB, 12 * MiB}) {
    if (auto h = alloc.borrow_explained(0, size, 256)) {
      held.push_back(*h);
    }
  }
  if (const auto too_big = alloc.borrow_explained(0, 80 * MiB, 256); !too_big) {
    std::printf("GPU0 asks for 80 MiB: %s\n", too_big.error().message.c_str());
  }

  for (const carve::BorrowHandle& h : held) {
    (void)alloc.give_back(h);
  }
  const carve::PoolStats s = alloc.resource(0).stats();
  std::printf("GPU0's pool after freeing: %s cached in %zu block(s), %llu upstream allocations, %llu cache hits\n",
              mib(s.bytes_cached).c_str(), s.cached_blocks, static_cast<unsigned long long>(s.upstream_allocations),
              static_cast<unsigned long long>(s.cache_hits));
  std::size_t released = 0;
  for (int c = 0; c < alloc.card_count(); ++c) {
    released += alloc.resource(c).trim();
  }
  std::printf("trim() gave %s back to the cards\n", mib(released).c_str());
  cards[3].deallocate(job3, 40 * MiB, 256);
  cards[4].deallocate(job4, 48 * MiB, 256);
  return 0;
}
