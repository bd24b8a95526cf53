// Four host threads share one lock-free slot allocator. The same type, with
// cuda::thread_scope_block, lives in a kernel's shared memory (examples/compose_block_scratch.cu).
#include <carve/slot.hpp>

#include <cstdint>
#include <cstdio>
#include <thread>
#include <vector>

int main() {
  static carve::ConcurrentSlotAllocator<128, carve::BoundaryNearestFit, cuda::thread_scope_system> slots;

  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([] {
      for (std::uint32_t i = 0; i < 10000; ++i) {
        if (const auto r = slots.allocate(1 + i % 8)) { // no_space is possible: others hold slots
          (void)slots.deallocate(*r);
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  std::printf("all threads done; %u of 128 slots free\n", slots.free_count());
  return slots.free_count() == 128 ? 0 : 1;
}
