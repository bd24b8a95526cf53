// A memory resource of your own: any type with try_allocate and deallocate. Here, a bump arena
// over a fixed buffer, which frees nothing until reset(). Stacked in front of a counted caching
// pool, it serves what fits and passes the rest on.
#include <carve/mr.hpp>

#include <cstddef>
#include <cstdio>

class BumpArena {
public:
  BumpArena(std::byte* memory, std::size_t bytes) : base_(memory), size_(bytes) {}

  cuda::std::expected<void*, carve::Errc> try_allocate(std::size_t bytes, std::size_t alignment) noexcept {
    if (const auto ok = carve::check_request(bytes, alignment); !ok) return cuda::std::unexpected(ok.error());
    const std::size_t start = (used_ + alignment - 1) & ~(alignment - 1);
    if (start > size_ || bytes > size_ - start) return cuda::std::unexpected(carve::Errc::no_space); // fall back
    used_ = start + bytes;
    return base_ + start;
  }
  void deallocate(void*, std::size_t, std::size_t) noexcept {}                        // freed all at once, by reset()
  bool owns(const void* p) const noexcept { return p >= base_ && p < base_ + size_; } // FallbackResource needs it
  void reset() noexcept { used_ = 0; }

private:
  std::byte* base_;
  std::size_t size_;
  std::size_t used_ = 0;
};
static_assert(carve::MemoryResource<BumpArena> && carve::OwnsMemory<BumpArena>);

int main() {
  alignas(256) static std::byte buffer[64 << 10];
  using Pool = carve::StatsResource<carve::CachingPool<carve::SimulatedCard>>;
  carve::FallbackResource<BumpArena, Pool> stack(BumpArena(buffer, sizeof buffer), carve::SimulatedCard(16 << 20));

  void* small = *stack.try_allocate(4096, 256);    // from the arena
  void* large = *stack.try_allocate(1 << 20, 256); // too large for it: from the pool
  const bool ok = stack.primary().owns(small) && !stack.primary().owns(large);
  stack.deallocate(large, 1 << 20, 256);
  stack.deallocate(small, 4096, 256);
  std::printf("the pool served %llu allocation(s)\n",
              static_cast<unsigned long long>(stack.fallback().stats().allocations));
  return ok ? 0 : 1;
}
