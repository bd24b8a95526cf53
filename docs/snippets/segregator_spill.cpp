// Small requests to a small pool, large ones to a large pool, and small requests spilling to the
// large pool once the small one is full: the small side is a FallbackResource whose fallback
// refers to the large pool. A Segregator alone would answer no_space when its small side is full.
// The whole stack is built in one expression, its pools in place (a CachingPool does not move).
#include <carve/mr.hpp>

#include <cstddef>
#include <cstdio>
#include <tuple>
#include <utility>
#include <vector>

int main() {
  using Pool = carve::CachingPool<carve::SimulatedCard>;
  using SmallSide = carve::FallbackResource<Pool, carve::ResourceRef<Pool>>; // full? the large pool
  Pool large(carve::SimulatedCard(64 << 20));

  carve::Segregator<4096, SmallSide, carve::ResourceRef<Pool>> heap(
      std::piecewise_construct,
      std::forward_as_tuple(std::piecewise_construct, // the small side: a 64 KiB pool, then the large one
                            std::forward_as_tuple(carve::SimulatedCard(64 << 10),
                                                  carve::PoolOptions{.granularity = 512, .segment_size = 64 << 10}),
                            std::forward_as_tuple(carve::ref(large))),
      std::forward_as_tuple(carve::ref(large))); // the large side

  std::vector<void*> blocks;
  for (int i = 0; i < 80; ++i) { // 80 KiB of 1 KiB requests: 64 fit the small pool, 16 spill
    blocks.push_back(heap.allocate(1024, 256));
  }
  const std::size_t small_blocks = heap.small().primary().stats().live_blocks;
  const std::size_t spilled = large.stats().live_blocks;
  std::printf("small pool: %zu blocks, spilled to the large pool: %zu\n", small_blocks, spilled);
  for (void* p : blocks) {
    heap.deallocate(p, 1024, 256); // each goes back to the pool that owns it
  }
  return small_blocks == 64 && spilled == 16 && large.stats().live_blocks == 0 ? 0 : 1;
}
