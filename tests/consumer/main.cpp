#include <carve/carve.hpp>

#include <cstdio>

int main() {
  carve::SlotAllocator<128> slots;
  const auto a = slots.allocate(4);
  const auto b = slots.allocate(5);
  if (!a || !b || a->first != 0 || b->first != 123 || !slots.deallocate(*a)) {
    std::puts("consumer: unexpected allocation result");
    return 1;
  }
  std::printf("consumer: carve %d.%d.%d works\n", carve::version_major, carve::version_minor, carve::version_patch);
  return 0;
}
