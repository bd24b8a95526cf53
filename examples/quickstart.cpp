// The README's example: a compute unit's 64 KiB of shared memory as 128 slots of 512 bytes.
#include <carve/slot.hpp>

#include <cstdio>

int main() {
  carve::SlotAllocator<128, carve::BoundaryNearestFit> slots;

  const auto a = slots.allocate(4); // nearest the low end: slots [0, 4)
  const auto b = slots.allocate(5); // nearest the high end: slots [123, 128)
  if (!a || !b) {
    return 1;
  }
  std::printf("a = [%u, %u)  b = [%u, %u)  free %u, largest run %u\n", a->first, a->first + a->count, b->first,
              b->first + b->count, slots.free_count(), slots.largest_free_run());

  if (const auto big = slots.allocate(200); !big) {
    std::printf("allocate(200): %s\n", carve::to_string(big.error())); // invalid size
  }
  (void)slots.deallocate(*a);
  if (const auto again = slots.deallocate(*a); !again) {
    std::printf("second deallocate: %s\n", carve::to_string(again.error())); // not allocated
  }
  return slots.deallocate(*b) && slots.free_count() == 128 ? 0 : 1;
}
