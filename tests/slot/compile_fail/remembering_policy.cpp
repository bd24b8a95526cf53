// Allocators that cannot report placements must refuse a policy that remembers them, at compile
// time and saying why. Built by the tests in tests/slot/CMakeLists.txt, once per case.
#include <carve/slot.hpp>

#include <vector>

int main() {
#if defined(CARVE_CASE_SLOT_ALLOCATOR) // the allocator that can feed it: compiles
  carve::SlotAllocator<128, carve::ReleaseAlignedFit> slots;
  return slots.allocate(4, carve::ExpectedRelease{100}) ? 0 : 1;
#elif defined(CARVE_CASE_CONCURRENT)
  carve::ConcurrentSlotAllocator<128, carve::ReleaseAlignedFit> slots;
  return slots.allocate(4) ? 0 : 1;
#elif defined(CARVE_CASE_SHARDED)
  std::vector<carve::bits::word> words(64);
  carve::ShardedSlotAllocator<64, 4, carve::ReleaseAlignedFit> slots(words.data());
  return slots.allocate(4) ? 0 : 1;
#elif defined(CARVE_CASE_DYNAMIC)
  carve::DynamicSlotAllocator<carve::ReleaseAlignedFit> slots(64);
  return slots.allocate(4) ? 0 : 1;
#endif
}
