// GPU0's caching pool over memory that GPU0 borrows from its best-linked peers when it is full:
// CachingPool over borrower.card(0), over a Topology read from `nvidia-smi topo -m` text. Each
// card is 64 MiB of host memory here (SimulatedCard); with GPUs, CudaDeviceResource(i) instead.
#include <carve/borrow.hpp>
#include <carve/mr.hpp>
#include <carve/topology.hpp>

#include <cstdio>
#include <vector>

namespace {
// `nvidia-smi topo -m` on a DGX-1 (8x V100, hybrid cube-mesh NVLink).
constexpr const char* dgx1 = R"(        GPU0    GPU1    GPU2    GPU3    GPU4    GPU5    GPU6    GPU7    CPU Affinity
GPU0     X      NV1     NV1     NV2     NV2     SYS     SYS     SYS     0-11,24-35
GPU1    NV1      X      NV2     NV1     SYS     NV2     SYS     SYS     0-11,24-35
GPU2    NV1     NV2      X      NV2     SYS     SYS     NV1     SYS     0-11,24-35
GPU3    NV2     NV1     NV2      X      SYS     SYS     SYS     NV1     0-11,24-35
GPU4    NV2     SYS     SYS     SYS      X      NV1     NV1     NV2     12-23,36-47
GPU5    SYS     NV2     SYS     SYS     NV1      X      NV2     NV1     12-23,36-47
GPU6    SYS     SYS     NV1     SYS     NV1     NV2      X      NV2     12-23,36-47
GPU7    SYS     SYS     SYS     NV1     NV2     NV1     NV2      X      12-23,36-47
)";
} // namespace

int main() {
  using Card = carve::CachingPool<carve::SimulatedCard>;
  carve::BorrowingAllocator<Card> borrower(carve::Topology::from_nvidia_smi(dgx1),
                                           [](int) { return Card(carve::SimulatedCard(64 << 20)); });
  carve::CachingPool gpu0(borrower.card(0)); // GPU0's working pool: 2 MiB segments, borrowed when GPU0 is full

  std::vector<void*> tensors;
  for (int i = 0; i < 10; ++i) { // 160 MiB for a 64 MiB card
    tensors.push_back(*gpu0.try_allocate(16 << 20, 256));
  }
  for (int gpu = 0; gpu < borrower.card_count(); ++gpu) {
    std::printf("GPU%d holds %3zu MiB for GPU0\n", gpu, borrower.resource(gpu).stats().bytes_in_use >> 20);
  }
  for (void* t : tensors) {
    gpu0.deallocate(t, 16 << 20, 256);
  }
  std::printf("after freeing, GPU0's pool caches %zu MiB", gpu0.stats().bytes_cached >> 20);
  std::printf("; trim() gives it back to the cards: %zu MiB\n", gpu0.trim() >> 20);
  return 0;
}
