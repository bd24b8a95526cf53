// Every slot call that returns an expected is [[nodiscard]]: dropping a run leaks it, dropping a
// deallocate's answer hides a double free. Before, `slots.allocate(4);` compiled silently. Built
// by the tests in tests/slot/CMakeLists.txt, once per case; the diagnostic is made an error here
// so that the check does not depend on the flags it is built with.
#include <carve/mr/slot_arena.hpp>
#include <carve/slot.hpp>

#include <cstddef>
#include <vector>

#pragma GCC diagnostic error "-Wunused-result"

int main() {
  carve::SlotAllocator<128> slots;
#if defined(CARVE_CASE_KEPT) // the answer used, or dropped on purpose: compiles
  const auto r = slots.allocate(4);
  (void)slots.allocate(4);
  return r ? 0 : 1;
#elif defined(CARVE_CASE_ALLOCATE)
  slots.allocate(4);
#elif defined(CARVE_CASE_DEALLOCATE)
  carve::ConcurrentSlotAllocator<128> shared;
  shared.deallocate({0, 4});
#elif defined(CARVE_CASE_ARENA)
  alignas(64) static std::byte heap[128 * 64];
  carve::SlotArena<carve::SlotAllocator<128>> arena(heap, sizeof heap, 64);
  arena.try_allocate(100, 8);
#elif defined(CARVE_CASE_SHARDED)
  std::vector<carve::bits::word> words(carve::ShardedSlotAllocator<64, 4>::word_count);
  carve::ShardedSlotAllocator<64, 4>(words.data()).allocate_near(4, 1);
#endif
  (void)slots;
  return 0;
}
