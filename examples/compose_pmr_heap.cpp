// A standard container on a carve stack: small blocks from a slot arena, everything larger from a
// caching pool whose traffic is counted, all behind one std::pmr::memory_resource.
#include <carve/mr.hpp>
#include <carve/slot.hpp>

#include <cstddef>
#include <cstdio>
#include <memory_resource>
#include <string>
#include <vector>

using SmallBlocks = carve::SlotArena<carve::SlotAllocator<128>>;                    // 128 slots of 256 bytes
using LargeBlocks = carve::StatsResource<carve::CachingPool<carve::SimulatedCard>>; // a 64 MiB card, counted
using Heap = carve::Segregator<4096, SmallBlocks, LargeBlocks>;

int main() {
  alignas(256) static std::byte small_memory[128 * 256];
  Heap heap(SmallBlocks(small_memory, sizeof small_memory, 256), carve::SimulatedCard(64 << 20));
  auto pmr = carve::as_pmr(heap);

  std::pmr::vector<std::pmr::string> names(&pmr);
  names.reserve(256);             // 8 KiB: a large block
  for (int i = 0; i < 100; ++i) { // each name's storage: a small block
    names.emplace_back("tenant-" + std::to_string(i) + ": a name long enough to need storage of its own");
  }

  const carve::ResourceStats large = heap.large().stats();
  std::printf("%zu names: the slot arena holds %zu of its %zu bytes, the pool served %llu blocks (%zu bytes now)\n",
              names.size(), heap.small().capacity() - heap.small().free_bytes(), heap.small().capacity(),
              static_cast<unsigned long long>(large.allocations), large.bytes_in_use);
  return 0;
}
