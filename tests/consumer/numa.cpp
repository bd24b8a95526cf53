#include <carve/tier.hpp> // NumaNodeResource

#include <cstdio>
#include <cstring>

int main() {
  if (::numa_available() < 0) {
    std::puts("consumer_numa: no NUMA on this machine");
    return 0;
  }
  carve::NumaNodeResource node0(0, 1 << 20);
  const auto got = node0.try_allocate(1 << 20, 4096);
  if (!got) {
    std::puts("consumer_numa: node 0 refused 1 MiB");
    return 1;
  }
  std::memset(*got, 1, 1 << 20);
  node0.deallocate(*got, 1 << 20, 4096);
  std::puts("consumer_numa: carve::numa works");
  return 0;
}
