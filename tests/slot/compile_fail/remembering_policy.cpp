// A policy that remembers its placements needs an allocator that reports them: SlotAllocator
// (which owns its policy) or ConcurrentSlotAllocator holding its words, when the policy has a
// shared form. The others must refuse it at compile time and say why. Built by the tests in
// tests/slot/CMakeLists.txt, once per case.
#include <carve/slot.hpp>

#include <vector>

namespace {
// Remembers placements, but has no shared form (for_shared_slots) for threads to update.
struct PrivateMemoryFit {
  template <std::uint32_t N>
  constexpr cuda::std::optional<std::uint32_t> find(const carve::SlotBitmap<N>& b, std::uint32_t m) const noexcept {
    return b.lowest_run_start(m);
  }
  void placed(carve::SlotRange) noexcept {}
};
} // namespace

int main() {
#if defined(CARVE_CASE_SLOT_ALLOCATOR) // the allocator that can feed any of them: compiles
  carve::SlotAllocator<128, carve::ReleaseAlignedFit> slots;
  return slots.allocate(4, carve::ExpectedRelease{100}) ? 0 : 1;
#elif defined(CARVE_CASE_CONCURRENT) // shared form, owned words: compiles, hinted
  static carve::ConcurrentSlotAllocator<128, carve::ReleaseAlignedFit> slots;
  return slots.allocate(4, carve::ExpectedRelease{100}) ? 0 : 1;
#elif defined(CARVE_CASE_CONCURRENT_PRIVATE_MEMORY)
  static carve::ConcurrentSlotAllocator<128, PrivateMemoryFit> slots;
  return slots.allocate(4) ? 0 : 1;
#elif defined(CARVE_CASE_CONCURRENT_BORROWED)
  std::vector<carve::bits::word> words(2);
  carve::ConcurrentSlotAllocatorRef<128, carve::ReleaseAlignedFit> slots{carve::BorrowedSlotWords<128>{words.data()}};
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
