// A scheduler's loop: jobs wait in a SizeTieredQueue (small ones are not held up behind large
// ones), each job gets its scratch from a slot arena when it starts, and a job that does not fit
// yet goes back to the head of its tier until running jobs finish and free their slots.
#include <carve/mr.hpp>
#include <carve/queue.hpp>
#include <carve/slot.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <vector>

struct Job {
  std::uint32_t bytes, ticks; // the scratch it needs, and how long it runs
  void* scratch = nullptr;
};
struct JobBytes {
  std::uint64_t operator()(const Job& j) const { return j.bytes; }
};

int main() {
  carve::SizeTieredQueue<Job, JobBytes> queue({2048, 8192}, 256); // tiers: up to 2 KiB, up to 8 KiB, larger
  alignas(256) static std::byte memory[64 << 10];
  carve::SlotArena<carve::SlotAllocator<256>> arena(memory, sizeof memory, 256); // 64 KiB: 256 slots of 256 bytes
  for (std::uint32_t i = 0; i < 200; ++i) {
    (void)queue.try_push(Job{256 + i * 7919 % 24000, 1 + i % 5});
  }

  std::vector<Job> running;
  int tick = 0, waited = 0, done = 0;
  for (; done < 200; ++tick) {
    for (auto job = queue.try_pop(); job; job = queue.try_pop()) { // start every job that fits now
      const auto scratch = arena.try_allocate(job->bytes, 64);
      if (!scratch) {
        (void)queue.try_push_front(std::move(*job)); // first in line once room frees up
        ++waited;
        break;
      }
      job->scratch = *scratch;
      running.push_back(*job);
    }
    std::erase_if(running, [&](Job& j) { // one tick of work; finished jobs give their scratch back
      const bool finished = --j.ticks == 0;
      if (finished) {
        arena.deallocate(j.scratch, j.bytes, 64);
        ++done;
      }
      return finished;
    });
  }
  std::printf("%d jobs ran in %d ticks; %d times the next job waited at the head of its tier for room\n", done, tick,
              waited);
  return arena.free_bytes() == arena.capacity() ? 0 : 1;
}
