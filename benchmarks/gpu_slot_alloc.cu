// GPU throughput of carve's concurrent slot allocation beside two baselines, in one kernel in
// which every thread allocates once.
//   100k threads: m slots each (m = 1, 4, 16, 64), per thread and warp-aggregated, under first fit
//                 and boundary-nearest, sharded (1063 shards of 6400 slots), per thread again on
//                 the same slots as one-word shards (106300 of 64 slots: a home for each thread),
//                 and on one bitmap of 6.8M slots (64 per thread and a sixteenth to spare);
//   1M and 10M:   one slot each from the same 640M slots, sharded (100k shards of 6400 slots), per
//                 thread and warp-aggregated, both policies (one kernel per policy and mode serves
//                 both scales, which keeps compiling short); at 1M also per thread on one-word
//                 shards (10M of them), and warp-aggregated once more in a kernel held to 32
//                 registers, so that an SM holds all the threads it can.
// Sharded, every claimant has a home shard, spread evenly over the shards: warp w of W starts at
// shard w * shards / W where warps aggregate (0.34 shards apart at 100k, where m = 64 asks 0.32
// shards a warp; 3.2 apart at 1M), thread t of T at t * shards / T where threads allocate alone.
// A claimant's requests fill the shards from its home towards the next one's, instead of every
// overflow walking through the homes of all the claimants after it. A home per claimant, not per
// block: a shard's claimants race for its lowest free words, since exact placement sends them
// there, and each lost race costs the loser another search. The H200 run of 2026-11-29, with a
// home per block, had a block's 8 warp leaders (or 256 threads) in one shard; the aggregated
// rows took 2.4x (100k) and 4.1x (1M) the hashed time.
// Baselines, measured in the same run:
//   hashed single-bit (100k, 1M, 10M): claims single bits at hashed positions on a bitmap of 64
//     slots per thread, the shape of the fastest published GPU heap allocators, which give up any
//     placement policy. The hash (MurmurHash3's finaliser) scatters threads over the words at
//     random, so some share a word and race for its bits, as in those allocators;
//   CUDA's device malloc/free (100k, 1M): every thread mallocs 64 bytes and writes its index into
//     them; a second kernel checks the index and frees. 64 bytes: a slot stands for one small
//     fixed-size block (carve's time does not depend on its size, a slot is an index), and small
//     blocks are what GPU heaps are compared with CUDA's malloc on. carve is compared with the
//     malloc kernel alone (allocation against allocation); free is timed and shown on its own.
// Order: the rows the targets need first (baselines, then sharded), the one-bitmap rows last. One
// bitmap shared by 100k threads sends them all to its lowest free words (what an exact policy on
// one bitmap asks for), and a thread that loses a claim searches again, so the cost grows with the
// square of the threads: those rows show that cost and may take seconds a launch.
// Kernel time by CUDA events (KernelTimer: the host's launch latency is not in it), median of up
// to 7 launches; every result is checked (every
// allocation succeeded, no slot or block went to two threads) before it counts. Failures are
// counted and shown, never retried by the benchmark. The run ends within a minute whatever the
// card does: see Note [time limits]. Target lines follow each row:
//   100k single-slot allocations <= 5 us of kernel time (published GPU heap allocators take
//     5.5-10 us for 100k on RTX 2080 Ti / TITAN V class cards; carve aims below that on an
//     H100-class card), and no cliff up to m = 64 (no m slower than 4x m = 1);
//   1M <= 50 us and 10M <= 500 us: the 100k target scaled linearly, i.e. no slowdown per
//     allocation at scale. 100k threads fit in one wave of an H100 (132 SMs x 2048 threads);
//     1M and 10M are several waves, where launch and tail latency weigh less, so linear
//     is the conservative reading;
//   sharded, 100k and 1M single-slot: >= 20x faster than CUDA's device malloc (published GPU
//     heaps report 10-400x over it), and <= 1.5x the hashed single-bit time (what exact
//     placement may cost beside none).
// Needs a GPU; without one it says so and exits with 77.
#include "gpu_targets.hpp"

#include <carve/slot.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <span>
#include <string>
#include <unistd.h>
#include <vector>

namespace {

using carve::bench::Aim;
using carve::bench::cuda_check;
using carve::bench::device_ns;

constexpr std::uint32_t max_m = 64;
constexpr std::uint32_t shard_slots = 6400; // 100 whole words
constexpr std::uint32_t not_allocated = 0xffff'ffffu;
constexpr std::uint32_t stopped = 0xffff'fffeu; // the thread started past its launch's deadline
constexpr std::uint32_t full_warp = 0xffff'ffffu;
constexpr std::size_t block_bytes = 64; // CUDA's device malloc: see the file's comment

// Note [time limits]
// A launch cannot be cancelled from the host, and how long the one-bitmap launches take depends
// on how the card serialises atomics on a few hot words, so no launch's time is known in advance.
// The run stays within a minute by four limits, each a backstop for the one before:
//   - a row stops repeating its launches once it has run for row_s (its median is then of fewer,
//     and says so);
//   - each thread reads the card's clock before it allocates, and one that starts more than
//     launch_ns after its launch began records "stopped" instead (a failure, counted): this cuts launches of
//     several waves short, though not one whose threads are all already running;
//   - no row starts after measure_budget_s of the run, nor where the longest row so far (its
//     launches, copies and checks), or the same configuration's last size scaled to this one
//     (m = 1 took 12 s on one bitmap on an H200, and m = 4 asks four times the slots), would
//     pass hard_limit_s: it prints "skipped: over time budget", and its targets are MISSED with
//     "skipped" for a number;
//   - at hard_limit_s an alarm prints what was being measured and exits with 1.
// stdout is line-buffered, so whatever was measured before any of these is already out.
constexpr double row_s = 2.0;
constexpr std::uint64_t launch_ns = 3'000'000'000;
constexpr double measure_budget_s = 45.0;
constexpr unsigned hard_limit_s = 55;
constexpr std::size_t max_launches = 7;

char measuring[192] = "the setup"; // what the hard limit's message names
double longest_row_s = 0;          // of every row measured so far: its launches, copies and checks
static_assert(hard_limit_s == 55, "at_hard_limit's message states the limit");

extern "C" void at_hard_limit(int) {
  // Only async-signal-safe calls here: write and _exit.
  constexpr char head[] = "stopped: hard time limit (55 s) reached while measuring ";
  constexpr char tail[] = "; the lines above are everything measured\n";
  [[maybe_unused]] ssize_t n = write(STDOUT_FILENO, head, sizeof head - 1);
  n = write(STDOUT_FILENO, measuring, strnlen(measuring, sizeof measuring));
  n = write(STDOUT_FILENO, tail, sizeof tail - 1);
  _exit(1);
}

void now_measuring(const std::string& what) { std::snprintf(measuring, sizeof measuring, "%s", what.c_str()); }

__global__ void read_device_clock(std::uint64_t* out) { *out = device_ns(); }

// Wall time since the run began, and launch deadlines in the card's clock (%globaltimer, ns),
// which runs at the host's rate but from another origin: read once, then offset.
class Clock {
public:
  Clock() : start_(std::chrono::steady_clock::now()) {}

  double seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }
  bool over_budget() const { return seconds() >= measure_budget_s; }

  void calibrate() {
    std::uint64_t* d_now = nullptr;
    cuda_check(cudaMalloc(&d_now, sizeof *d_now), "cudaMalloc");
    host_at_ = std::chrono::steady_clock::now(); // before the card's read, so deadlines err late
    read_device_clock<<<1, 1>>>(d_now);
    cuda_check(cudaMemcpy(&device_at_, d_now, sizeof device_at_, cudaMemcpyDeviceToHost), "read the card's clock");
    cudaFree(d_now);
  }

  // The card's clock launch_ns from now.
  std::uint64_t device_deadline() const {
    const auto since =
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - host_at_);
    return device_at_ + static_cast<std::uint64_t>(since.count()) + launch_ns;
  }

private:
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point host_at_{};
  std::uint64_t device_at_ = 0;
};

// One scale of the benchmark: `Threads` allocating threads, 64 slots per thread, and with `Spare`
// a sixteenth more in whole shards. The 100k rows ask for all 64 slots per thread, and a
// warp-aggregated claim that loses a race gives back the words it took: a lane searching
// meanwhile would find a full bitmap and fail rightly, so those rows need room to spare.
template <std::uint32_t Threads, bool Spare>
struct Scale {
  static constexpr std::uint32_t threads = Threads;
  static constexpr std::uint32_t asked = Threads * max_m;
  static constexpr std::uint32_t slots =
      Spare ? (asked + asked / 16 + shard_slots - 1) / shard_slots * shard_slots : asked;
  static constexpr std::uint32_t words = carve::bits::word_count(slots);
  static constexpr std::uint32_t shards = slots / shard_slots;
  static_assert(slots % shard_slots == 0 && slots % 64 == 0 && slots <= carve::max_slots);

  template <class Fit>
  using Sharded = carve::ShardedSlotAllocator<shard_slots, shards, Fit, cuda::thread_scope_device>;
  // The same slots as shards of one word each (a thread's 64 slots): a home of its own for every
  // thread that allocates alone, where shards of 6400 give about 94 threads one home at 100k.
  template <class Fit>
  using WordSharded = carve::ShardedSlotAllocator<64, slots / 64, Fit, cuda::thread_scope_device>;
};

using Small = Scale<100'000, true>;     // 6.8M slots, 1063 shards
using Large = Scale<10'000'000, false>; // 640M slots, 100k shards: one slot per thread leaves plenty
static_assert(Small::slots == 6'803'200 && Small::shards == 1063 && Large::shards == 100'000);

template <class Sharded>
__global__ void reset_shards(carve::bits::word* storage) {
  for (std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < Sharded::shard_count; i += gridDim.x * blockDim.x) {
    Sharded(storage).shard(i).reset();
  }
}

// Every shard free, a thread per shard.
template <class Sharded>
void reset_all(carve::bits::word* storage) {
  reset_shards<Sharded><<<(Sharded::shard_count + 255) / 256, 256>>>(storage);
}

// `home_step`: shards between two claimants' homes, in 32.32 fixed point (home_step_for), so
// that a home costs every thread a multiply: the exact quotient (claimant * shards / claimants)
// is a 64-bit division, a subroutine of some 70 instructions that the hashed baseline does not pay.
template <class Sharded, bool Aggregated>
__device__ __forceinline__ void allocate_from_home(carve::bits::word* storage, std::uint32_t threads, std::uint32_t m,
                                                   std::uint64_t home_step, std::uint64_t deadline,
                                                   carve::SlotRange* out) {
  const std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  const bool late = device_ns() > deadline;
  const unsigned members = __ballot_sync(full_warp, i < threads && !late); // the lanes that go on: warp_allocate's
  if (i >= threads) {
    return;
  }
  if (late) {
    out[i] = {stopped, 0};
    return;
  }
  // A home per claimant (a warp's leader, or a thread), spread evenly: see the file's comment.
  const std::uint64_t claimant = Aggregated ? i / 32 : i;
  const Sharded s(storage, static_cast<std::uint32_t>(claimant * home_step >> 32));
  const auto r = Aggregated ? carve::warp_allocate(members, s, m) : s.allocate(m);
  out[i] = r ? *r : carve::SlotRange{not_allocated, 0};
}

template <class Sharded, bool Aggregated>
__global__ void allocate_sharded(carve::bits::word* storage, std::uint32_t threads, std::uint32_t m,
                                 std::uint64_t home_step, std::uint64_t deadline, carve::SlotRange* out) {
  allocate_from_home<Sharded, Aggregated>(storage, threads, m, home_step, deadline, out);
}

// The same, held to 32 registers a thread (8 blocks of 256, 2048 threads: all an SM can hold),
// where ptxas otherwise takes 32 to 40 and so keeps 1536 or 1280 threads per SM: on the 1M rows,
// where four to six waves of threads each wait on their claims, this shows what the threads the
// registers cost are worth, against a few bytes of spills.
template <class Sharded, bool Aggregated>
__global__ void __launch_bounds__(256, 8)
    allocate_sharded_at_32_registers(carve::bits::word* storage, std::uint32_t threads, std::uint32_t m,
                                     std::uint64_t home_step, std::uint64_t deadline, carve::SlotRange* out) {
  allocate_from_home<Sharded, Aggregated>(storage, threads, m, home_step, deadline, out);
}

// The home step for `claimants` claimants (threads, or warps where they aggregate) over `shards`.
std::uint64_t home_step_for(std::uint32_t shards, std::uint32_t threads, bool aggregated) {
  const std::uint64_t claimants = aggregated ? (std::uint64_t{threads} + 31) / 32 : threads;
  return (std::uint64_t{shards} << 32) / claimants;
}

template <std::uint32_t N, class Fit, bool Aggregated>
__global__ void allocate_once(carve::bits::word* bitmap, std::uint32_t threads, std::uint32_t m, std::uint64_t deadline,
                              carve::SlotRange* out) {
  const std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  const bool late = device_ns() > deadline;
  const unsigned members = __ballot_sync(full_warp, i < threads && !late); // the lanes that go on: warp_allocate's
  if (i >= threads) {
    return;
  }
  if (late) {
    out[i] = {stopped, 0};
    return;
  }
  carve::ConcurrentSlotAllocatorRef<N, Fit, cuda::thread_scope_device> alloc{carve::BorrowedSlotWords<N>{bitmap}};
  const auto r = Aggregated ? carve::warp_allocate(members, alloc, m) : alloc.allocate(m);
  out[i] = r ? *r : carve::SlotRange{not_allocated, 0};
}

// MurmurHash3's 32-bit finaliser: every bit of `h` moves every bit of the result.
__device__ std::uint32_t scatter(std::uint32_t h) {
  h ^= h >> 16;
  h *= 0x85eb'ca6bu;
  h ^= h >> 13;
  h *= 0xc2b2'ae35u;
  return h ^ (h >> 16);
}

// Baseline: claim one bit at a position hashed from the thread id, probing word by word (at most
// every word once: a full bitmap is a failure, not a wait).
__global__ void hashed_single_bit(carve::bits::word* bitmap, std::uint32_t words, std::uint32_t threads,
                                  std::uint64_t deadline, carve::SlotRange* out) {
  const std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= threads) {
    return;
  }
  if (device_ns() > deadline) {
    out[i] = {stopped, 0};
    return;
  }
  std::uint32_t k = scatter(i) % words;
  for (std::uint32_t probe = 0; probe < words; ++probe, k = (k + 1) % words) {
    cuda::atomic_ref<carve::bits::word, cuda::thread_scope_device> word(bitmap[k]);
    carve::bits::word current = word.load(cuda::std::memory_order_relaxed);
    while (current != 0) { // each pass clears at least one bit of `current`: at most 64
      const carve::bits::word bit = current & (~current + 1);
      const carve::bits::word old = word.fetch_and(~bit, cuda::std::memory_order_acq_rel);
      if ((old & bit) != 0) {
        out[i] = {k * 64 + static_cast<std::uint32_t>(__ffsll(static_cast<long long>(bit)) - 1), 1};
        return;
      }
      current = old & ~bit;
    }
  }
  out[i] = {not_allocated, 0};
}

// Baseline: CUDA's own heap. Every thread takes one block and writes its index into it.
__global__ void device_malloc(std::uint32_t threads, std::uint64_t deadline, std::uint32_t** blocks,
                              unsigned* stopped_threads) {
  const std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= threads) {
    return;
  }
  if (device_ns() > deadline) {
    blocks[i] = nullptr;
    atomicAdd(stopped_threads, 1u);
    return;
  }
  auto* p = static_cast<std::uint32_t*>(malloc(block_bytes));
  if (p != nullptr) {
    *p = i;
  }
  blocks[i] = p;
}

// Frees every block after checking that it still holds its thread's index: a block handed to two
// threads would hold one of them the other's (overlaps that miss the index are found on the host,
// from the addresses).
__global__ void device_free(std::uint32_t threads, std::uint32_t* const* blocks, unsigned* overwritten) {
  const std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= threads || blocks[i] == nullptr) {
    return;
  }
  if (*blocks[i] != i) {
    atomicAdd(overwritten, 1u);
  }
  free(blocks[i]);
}

struct Run {
  float median_us = 0;
  std::size_t launches = 0;  // 0: not measured (skipped)
  std::uint32_t failed = 0;  // refused, or answered with something that is no range of the slots
  std::uint32_t stopped = 0; // started past the launch deadline
  bool disjoint = true;      // no slot (block) went to two threads
  bool measured() const { return launches > 0; }
  bool sound() const { return measured() && failed == 0 && stopped == 0 && disjoint; }
};

constexpr unsigned block = 256;
unsigned grid_for(std::uint32_t threads) { return (threads + block - 1) / block; }

// Of an even count, the mean of the middle two: of two launches, not the slower.
float median(std::vector<float> v) {
  if (v.empty()) {
    return 0.0f;
  }
  std::sort(v.begin(), v.end());
  const std::size_t half = v.size() / 2;
  return v.size() % 2 == 1 ? v[half] : (v[half - 1] + v[half]) / 2;
}

// Times `launch(deadline)` up to max_launches times, calling `reset` (which must leave every slot
// free) before each, for at most about row_s; then checks the last launch's results: every
// allocation of `threads` succeeded, no slot of `slots` went to two of them.
template <class Reset, class Launch>
Run measure(const Clock& clock, Reset reset, Launch launch, carve::SlotRange* d_out, std::uint32_t threads,
            std::uint32_t slots) {
  std::vector<float> times;
  carve::bench::KernelTimer timer;
  const double began = clock.seconds();
  while (times.size() < max_launches && (times.empty() || clock.seconds() - began < row_s)) {
    reset();
    cuda_check(cudaDeviceSynchronize(), "reset");
    const std::uint64_t deadline = clock.device_deadline();
    times.push_back(static_cast<float>(timer.us([&] { launch(deadline); })));
  }
  std::vector<carve::SlotRange> out(threads);
  cuda_check(cudaMemcpy(out.data(), d_out, threads * sizeof(carve::SlotRange), cudaMemcpyDeviceToHost), "copy");
  std::vector<bool> taken(slots, false);
  Run run;
  run.launches = times.size();
  run.median_us = median(times);
  for (const auto& r : out) {
    if (r.first == stopped && r.count == 0) {
      ++run.stopped;
      continue;
    }
    if (r.first == not_allocated || r.count == 0 || r.first >= slots || r.count > slots - r.first) {
      ++run.failed;
      continue;
    }
    for (std::uint32_t s = r.first; s < r.first + r.count; ++s) {
      run.disjoint = run.disjoint && !taken[s];
      taken[s] = true;
    }
  }
  return run;
}

// CUDA's device malloc at one scale: the malloc kernel's times (with its checks) and the free
// kernel's median.
struct MallocRun {
  Run alloc;
  float free_us = 0;
};

MallocRun measure_malloc(const Clock& clock, std::uint32_t threads, std::uint32_t** d_blocks, unsigned* d_counts) {
  std::vector<float> alloc_times;
  std::vector<float> free_times;
  std::vector<std::uint32_t*> blocks(threads);
  unsigned counts[2] = {}; // threads stopped at the deadline, blocks found overwritten
  unsigned overwritten = 0;
  carve::bench::KernelTimer timer;
  const double began = clock.seconds();
  while (alloc_times.size() < max_launches && (alloc_times.empty() || clock.seconds() - began < row_s)) {
    cuda_check(cudaMemset(d_counts, 0, sizeof counts), "reset counts");
    cuda_check(cudaDeviceSynchronize(), "reset");
    const std::uint64_t deadline = clock.device_deadline();
    alloc_times.push_back(static_cast<float>(timer.us(
        [&] { device_malloc<<<grid_for(threads), block>>>(threads, deadline, d_blocks, d_counts); }, "device malloc")));
    cuda_check(cudaMemcpy(blocks.data(), d_blocks, threads * sizeof(std::uint32_t*), cudaMemcpyDeviceToHost), "copy");
    free_times.push_back(static_cast<float>(
        timer.us([&] { device_free<<<grid_for(threads), block>>>(threads, d_blocks, d_counts + 1); }, "device free")));
    cuda_check(cudaMemcpy(counts, d_counts, sizeof counts, cudaMemcpyDeviceToHost), "copy");
    overwritten += counts[1];
  }
  MallocRun run;
  run.alloc.launches = alloc_times.size();
  run.alloc.median_us = median(alloc_times);
  run.free_us = median(free_times);
  run.alloc.stopped = counts[0];
  // The last launch's blocks: none null but the stopped threads', none overlapping another.
  std::vector<std::uintptr_t> at;
  at.reserve(threads);
  for (std::uint32_t* p : blocks) {
    if (p != nullptr) {
      at.push_back(reinterpret_cast<std::uintptr_t>(p));
    }
  }
  run.alloc.failed = threads - static_cast<std::uint32_t>(at.size()) - run.alloc.stopped;
  std::sort(at.begin(), at.end());
  run.alloc.disjoint = overwritten == 0;
  for (std::size_t k = 1; k < at.size(); ++k) {
    run.alloc.disjoint = run.alloc.disjoint && at[k] - at[k - 1] >= block_bytes;
  }
  return run;
}

// One line per run, printed at once (the hard limit's message must not land inside it).
void report(const std::string& what, std::uint32_t m, const Run& r) {
  char line[320];
  std::size_t n = 0;
  const auto add = [&](int written) {
    n = std::min(sizeof line - 1, n + static_cast<std::size_t>(std::max(written, 0)));
  };
  add(std::snprintf(line, sizeof line, "  %-52s m=%2u  %10.1f us  %s", what.c_str(), m,
                    static_cast<double>(r.median_us), r.disjoint ? "disjoint" : "OVERLAP"));
  if (r.failed != 0) {
    add(std::snprintf(line + n, sizeof line - n, "  %u failed", r.failed));
  }
  if (r.stopped != 0) {
    add(std::snprintf(line + n, sizeof line - n, "  %u stopped at the launch deadline", r.stopped));
  }
  if (r.launches < max_launches) {
    add(std::snprintf(line + n, sizeof line - n, "  (median of %zu launches: row time limit)", r.launches));
  }
  std::printf("%s\n", line);
}

// `expected_s`: what this run is expected to take from the same configuration's smaller size.
bool skipped(const Clock& clock, const std::string& what, double expected_s = 0) {
  // The next row may take as long as the longest so far: see Note [time limits].
  if (!clock.over_budget() && clock.seconds() + std::max({longest_row_s, row_s, expected_s}) < hard_limit_s - 1) {
    return false;
  }
  std::printf("  %s: skipped: over time budget (%.0f s used of %.0f; longest row %.1f s, this one expected to "
              "take %.1f s)\n",
              what.c_str(), clock.seconds(), measure_budget_s, longest_row_s, expected_s);
  return true;
}

// One configuration at one scale: a run per size m.
struct Row {
  std::string name; // as its target lines begin
  std::vector<std::uint32_t> sizes;
  std::vector<Run> runs; // one per size
};

template <class Reset, class Launch>
Row run_row(const Clock& clock, std::string name, std::span<const std::uint32_t> sizes, Reset reset, Launch launch,
            carve::SlotRange* d_out, std::uint32_t threads, std::uint32_t slots) {
  Row row{std::move(name), {sizes.begin(), sizes.end()}, {}};
  double last_launch_s = 0; // the last size's time per launch (its resets and checks shared out), and that size
  std::uint32_t last_m = 0;
  for (const std::uint32_t m : sizes) {
    const std::string what = row.name + ", m=" + std::to_string(m);
    // A larger m asks for more slots per thread: each launch at least as long per slot as the
    // last size's, and launches repeated until row_s has passed (see measure).
    const double launch_s = last_m != 0 ? last_launch_s * m / last_m : 0;
    if (skipped(clock, what, std::min(static_cast<double>(max_launches) * launch_s, row_s + launch_s))) {
      row.runs.emplace_back();
      continue;
    }
    now_measuring(what);
    const double began = clock.seconds();
    row.runs.push_back(measure(
        clock, reset, [&](std::uint64_t deadline) { launch(m, deadline); }, d_out, threads, slots));
    const double took = clock.seconds() - began;
    last_launch_s = took / static_cast<double>(std::max<std::size_t>(row.runs.back().launches, 1));
    last_m = m;
    longest_row_s = std::max(longest_row_s, took);
    report(row.name, m, row.runs.back());
  }
  return row;
}

constexpr const char* slot_source =
    "published GPU heap allocators: 100k single allocations in 5.5-10 us of kernel time on RTX 2080 Ti / "
    "TITAN V class cards; carve aims below 5 us on an H100-class card";
constexpr const char* scaled_source =
    "the 100k target scaled linearly (no slowdown per allocation at scale; 100k threads are one wave of an "
    "H100-class card, 1M and 10M several)";
constexpr const char* cliff_source = "carve's own rule: no cliff in m (each m within 4x of m = 1)";
constexpr const char* malloc_source =
    "published GPU heaps report 10-400x over CUDA's device malloc (Ouroboros 118x on average on a TITAN V; "
    "Gallatin up to 374x over the next best); carve's exact placement aims at 20x, the low end, measured "
    "against the malloc kernel of the same run";
constexpr const char* hashed_source =
    "carve's own aim: exact placement within 1.5x the time of a policy-free hashed single-bit claim (the shape "
    "of the fastest published GPU heaps) measured in the same run";
constexpr double slot_target_us = 5.0;
constexpr double cliff_factor = 4.0;
constexpr double malloc_factor = 20.0;
constexpr double hashed_factor = 1.5;
constexpr std::uint32_t sizes[] = {1, 4, 16, 64};
constexpr std::uint32_t single[] = {1};

// A target line whose number comes from `runs`: MISSED when one of them failed its checks, and
// with "skipped" for a number when one was not measured.
template <class Value>
void target_from(const std::string& name, std::initializer_list<Run> runs, Value value, const char* unit, Aim aim,
                 double goal, const char* source) {
  bool measured = true;
  bool sound = true;
  for (const Run& r : runs) {
    measured = measured && r.measured();
    sound = sound && r.sound();
  }
  if (!measured) {
    carve::bench::not_measured(name, unit, aim, goal, source, "skipped: over time budget");
    return;
  }
  carve::bench::target(name, value(), unit, aim, goal, source, sound);
}

// The baselines beside one carve row's single-slot run; `malloc` is null where it did not run.
struct Baselines {
  const Run* hashed = nullptr;
  const MallocRun* malloc = nullptr;
};

void beside(const Run& carve_run, const Baselines& base) {
  if (!carve_run.measured() || carve_run.median_us <= 0) {
    return;
  }
  char line[160];
  int n = 0;
  if (base.malloc != nullptr && base.malloc->alloc.measured()) {
    n = std::snprintf(line, sizeof line, "%.1fx faster than device malloc",
                      static_cast<double>(base.malloc->alloc.median_us / carve_run.median_us));
  }
  if (base.hashed->measured() && base.hashed->median_us > 0) {
    std::snprintf(line + n, sizeof line - static_cast<std::size_t>(n), "%s%.2fx the hashed single-bit time",
                  n > 0 ? ", " : "", static_cast<double>(carve_run.median_us / base.hashed->median_us));
  } else if (n == 0) {
    return;
  }
  std::printf("    m=1 beside the baselines: %s\n", line);
}

void baseline_targets(const std::string& name, const Run& carve_run, const Baselines& base) {
  target_from(
      name + ", speed-up over device malloc", {carve_run, base.malloc->alloc},
      [&] { return carve_run.median_us > 0 ? base.malloc->alloc.median_us / carve_run.median_us : 0.0f; }, "x",
      Aim::at_least, malloc_factor, malloc_source);
  target_from(
      name + ", time over hashed single-bit", {carve_run, *base.hashed},
      [&] { return base.hashed->median_us > 0 ? carve_run.median_us / base.hashed->median_us : 0.0f; }, "x",
      Aim::at_most, hashed_factor, hashed_source);
}

// The 100k targets of a row over every m.
void small_targets(const Row& row) {
  const Run& one = row.runs[0];
  target_from(
      row.name + ", m=1", {one}, [&] { return one.median_us; }, "us", Aim::at_most, slot_target_us, slot_source);
  target_from(
      row.name + ", worst m<=64 over m=1", {row.runs[0], row.runs[1], row.runs[2], row.runs[3]},
      [&] {
        float worst = 0;
        for (const Run& r : row.runs) {
          worst = std::max(worst, r.median_us);
        }
        return one.median_us > 0 ? worst / one.median_us : 0.0f;
      },
      "x", Aim::at_most, cliff_factor, cliff_source);
}

// One bitmap of 64 slots per thread (one word each).
Run hashed_baseline(const Clock& clock, const char* scale, std::uint32_t threads, carve::bits::word* d_bitmap,
                    carve::SlotRange* d_out) {
  const std::uint32_t words = threads;
  const Row row = run_row(
      clock, std::string("baseline ") + scale + ", hashed single-bit claim (no policy)", single,
      [&] { cuda_check(cudaMemset(d_bitmap, 0xff, std::size_t{words} * 8), "reset bitmap"); },
      [&](std::uint32_t, std::uint64_t deadline) {
        hashed_single_bit<<<grid_for(threads), block>>>(d_bitmap, words, threads, deadline, d_out);
      },
      d_out, threads, threads * max_m);
  return row.runs[0];
}

MallocRun malloc_baseline(const Clock& clock, const char* scale, std::uint32_t threads, std::uint32_t** d_blocks,
                          unsigned* d_counts) {
  const std::string name = std::string("baseline ") + scale + ", CUDA device malloc of 64 bytes";
  if (skipped(clock, name)) {
    return {};
  }
  now_measuring(name);
  const double began = clock.seconds();
  const MallocRun run = measure_malloc(clock, threads, d_blocks, d_counts);
  longest_row_s = std::max(longest_row_s, clock.seconds() - began);
  report(name, 1, run.alloc);
  std::printf("  %-52s free  %10.1f us  (its free kernel, timed apart)\n", "", static_cast<double>(run.free_us));
  return run;
}

// 100k threads, sharded: every m, per thread and warp-aggregated, with the targets of each row.
template <class Fit>
void sharded_small(const Clock& clock, const char* policy, carve::bits::word* d_sharded, carve::SlotRange* d_out,
                   const Baselines& base) {
  using S = Small;
  using Sharded = typename S::template Sharded<Fit>;
  const auto reset = [&] { reset_all<Sharded>(d_sharded); };
  const unsigned grid = grid_for(S::threads);
  const std::string prefix = std::string("slot alloc 100k, ") + policy + ", sharded, ";
  const Row per_thread = run_row(
      clock, prefix + "per thread", sizes, reset,
      [&](std::uint32_t m, std::uint64_t deadline) {
        allocate_sharded<Sharded, false>
            <<<grid, block>>>(d_sharded, S::threads, m, home_step_for(S::shards, S::threads, false), deadline, d_out);
      },
      d_out, S::threads, S::slots);
  beside(per_thread.runs[0], base);
  small_targets(per_thread);
  baseline_targets(per_thread.name + ", m=1", per_thread.runs[0], base);
  const Row aggregated = run_row(
      clock, prefix + "warp-aggregated", sizes, reset,
      [&](std::uint32_t m, std::uint64_t deadline) {
        allocate_sharded<Sharded, true>
            <<<grid, block>>>(d_sharded, S::threads, m, home_step_for(S::shards, S::threads, true), deadline, d_out);
      },
      d_out, S::threads, S::slots);
  beside(aggregated.runs[0], base);
  small_targets(aggregated);
  baseline_targets(aggregated.name + ", m=1", aggregated.runs[0], base);
  using WordSharded = typename S::template WordSharded<Fit>;
  const Row word_shards = run_row(
      clock, prefix + "per thread, one-word shards", sizes, [&] { reset_all<WordSharded>(d_sharded); },
      [&](std::uint32_t m, std::uint64_t deadline) {
        allocate_sharded<WordSharded, false><<<grid, block>>>(
            d_sharded, S::threads, m, home_step_for(WordSharded::shard_count, S::threads, false), deadline, d_out);
      },
      d_out, S::threads, S::slots);
  beside(word_shards.runs[0], base);
  small_targets(word_shards);
  baseline_targets(word_shards.name + ", m=1", word_shards.runs[0], base);
}

// 100k threads on one bitmap: every m, per thread and warp-aggregated (no baseline targets: these
// rows show what one shared bitmap costs an exact policy).
template <class Fit>
void one_bitmap_small(const Clock& clock, const char* policy, carve::bits::word* d_bitmap, carve::SlotRange* d_out,
                      const Baselines& base) {
  using S = Small;
  const auto reset = [&] { cuda_check(cudaMemset(d_bitmap, 0xff, S::words * 8), "reset bitmap"); };
  const unsigned grid = grid_for(S::threads);
  const std::string prefix = std::string("slot alloc 100k, ") + policy + ", one bitmap, ";
  const Row per_thread = run_row(
      clock, prefix + "per thread", sizes, reset,
      [&](std::uint32_t m, std::uint64_t deadline) {
        allocate_once<S::slots, Fit, false><<<grid, block>>>(d_bitmap, S::threads, m, deadline, d_out);
      },
      d_out, S::threads, S::slots);
  beside(per_thread.runs[0], base);
  small_targets(per_thread);
  const Row aggregated = run_row(
      clock, prefix + "warp-aggregated", sizes, reset,
      [&](std::uint32_t m, std::uint64_t deadline) {
        allocate_once<S::slots, Fit, true><<<grid, block>>>(d_bitmap, S::threads, m, deadline, d_out);
      },
      d_out, S::threads, S::slots);
  beside(aggregated.runs[0], base);
  small_targets(aggregated);
}

// 1M and 10M threads: one slot each from the same sharded 640M slots (one kernel per policy and
// mode serves both scales); baseline targets where `with_targets`.
template <class Fit>
void sharded_large(const Clock& clock, const char* scale, std::uint32_t threads, const char* policy, double target_us,
                   carve::bits::word* d_sharded, carve::SlotRange* d_out, const Baselines& base, bool with_targets) {
  using S = Large;
  using Sharded = typename S::template Sharded<Fit>;
  const auto reset = [&] { reset_all<Sharded>(d_sharded); };
  const unsigned grid = grid_for(threads);
  const std::string prefix = std::string("slot alloc ") + scale + ", " + policy + ", sharded, ";
  using WordSharded = typename S::template WordSharded<Fit>;
  // Per thread, warp-aggregated, and with the targets (at 1M) also per thread on one-word shards
  // and warp-aggregated at 32 registers.
  enum class Mode { per_thread, aggregated, per_thread_word_shards, aggregated_at_32_registers };
  for (const Mode mode :
       {Mode::per_thread, Mode::aggregated, Mode::per_thread_word_shards, Mode::aggregated_at_32_registers}) {
    if ((mode == Mode::per_thread_word_shards || mode == Mode::aggregated_at_32_registers) && !with_targets) {
      continue;
    }
    const bool aggregated = mode == Mode::aggregated || mode == Mode::aggregated_at_32_registers;
    const bool words = mode == Mode::per_thread_word_shards;
    const std::uint64_t step = home_step_for(words ? WordSharded::shard_count : S::shards, threads, aggregated);
    const char* name = mode == Mode::per_thread               ? "per thread"
                       : mode == Mode::aggregated             ? "warp-aggregated"
                       : mode == Mode::per_thread_word_shards ? "per thread, one-word shards"
                                                              : "warp-aggregated, 32 registers";
    const auto reset_row = [&] { words ? reset_all<WordSharded>(d_sharded) : reset(); };
    const Row row = run_row(
        clock, prefix + name, single, reset_row,
        [&](std::uint32_t, std::uint64_t deadline) {
          if (mode == Mode::per_thread) {
            allocate_sharded<Sharded, false><<<grid, block>>>(d_sharded, threads, 1, step, deadline, d_out);
          } else if (mode == Mode::aggregated) {
            allocate_sharded<Sharded, true><<<grid, block>>>(d_sharded, threads, 1, step, deadline, d_out);
          } else if (mode == Mode::per_thread_word_shards) {
            allocate_sharded<WordSharded, false><<<grid, block>>>(d_sharded, threads, 1, step, deadline, d_out);
          } else {
            allocate_sharded_at_32_registers<Sharded, true>
                <<<grid, block>>>(d_sharded, threads, 1, step, deadline, d_out);
          }
        },
        d_out, threads, S::slots);
    const Run& run = row.runs[0];
    beside(run, base);
    target_from(
        row.name, {run}, [&] { return run.median_us; }, "us", Aim::at_most, target_us, scaled_source);
    if (with_targets) {
      baseline_targets(row.name, run, base);
    }
  }
}

} // namespace

int main() {
  Clock clock;
  // Each line reaches a pipe or file as it is printed, so a run stopped from outside still shows
  // what it measured.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  // Every kernel is loaded with the context, not in its first timed launch (unless the user chose).
  setenv("CUDA_MODULE_LOADING", "EAGER", 0);
  carve::bench::require_devices("gpu_slot_alloc");
  std::signal(SIGALRM, at_hard_limit);
  alarm(hard_limit_s);
  // Before any kernel runs (the heap cannot grow after): 1M blocks of 64 bytes are 64 MiB; 16x
  // that leaves room for the heap's own bookkeeping and fragmentation.
  cuda_check(cudaDeviceSetLimit(cudaLimitMallocHeapSize, std::size_t{1} << 30), "device malloc heap size");
  cudaDeviceProp prop{};
  cuda_check(cudaGetDeviceProperties(&prop, 0), "device properties");
  std::printf("%s: every thread allocates once; median of up to %zu kernels; stops starting rows after %.0f s\n",
              prop.name, max_launches, measure_budget_s);
  carve::bits::word* d_bitmap = nullptr;
  carve::bits::word* d_sharded = nullptr;
  carve::SlotRange* d_out = nullptr;
  std::uint32_t** d_blocks = nullptr;
  unsigned* d_counts = nullptr;
  constexpr std::uint32_t million = 1'000'000;
  cuda_check(cudaMalloc(&d_bitmap, Large::words * sizeof(carve::bits::word)), "cudaMalloc");
  cuda_check(cudaMalloc(&d_sharded, Large::words * sizeof(carve::bits::word)), "cudaMalloc");
  cuda_check(cudaMalloc(&d_out, Large::threads * sizeof(carve::SlotRange)), "cudaMalloc");
  cuda_check(cudaMalloc(&d_blocks, million * sizeof(std::uint32_t*)), "cudaMalloc");
  cuda_check(cudaMalloc(&d_counts, 2 * sizeof(unsigned)), "cudaMalloc");
  clock.calibrate();
  // Untimed: the card leaves its idle clocks before the first baseline is timed.
  carve::bench::hold_card<<<static_cast<unsigned>(prop.multiProcessorCount), 32>>>(200'000'000);
  cuda_check(cudaDeviceSynchronize(), "warm-up");

  std::printf("100k threads\n");
  const Run hashed_100k = hashed_baseline(clock, "100k", Small::threads, d_bitmap, d_out);
  const MallocRun malloc_100k = malloc_baseline(clock, "100k", Small::threads, d_blocks, d_counts);
  const Baselines base_100k{&hashed_100k, &malloc_100k};
  sharded_small<carve::FirstFit>(clock, "first-fit", d_sharded, d_out, base_100k);
  sharded_small<carve::BoundaryNearestFit>(clock, "boundary-nearest", d_sharded, d_out, base_100k);

  std::printf("1M threads\n");
  const Run hashed_1m = hashed_baseline(clock, "1M", million, d_bitmap, d_out);
  const MallocRun malloc_1m = malloc_baseline(clock, "1M", million, d_blocks, d_counts);
  const Baselines base_1m{&hashed_1m, &malloc_1m};
  sharded_large<carve::FirstFit>(clock, "1M", million, "first-fit", 50.0, d_sharded, d_out, base_1m, true);
  sharded_large<carve::BoundaryNearestFit>(clock, "1M", million, "boundary-nearest", 50.0, d_sharded, d_out, base_1m,
                                           true);

  std::printf("10M threads\n");
  const Run hashed_10m = hashed_baseline(clock, "10M", Large::threads, d_bitmap, d_out);
  const Baselines base_10m{&hashed_10m, nullptr};
  sharded_large<carve::FirstFit>(clock, "10M", Large::threads, "first-fit", 500.0, d_sharded, d_out, base_10m, false);
  sharded_large<carve::BoundaryNearestFit>(clock, "10M", Large::threads, "boundary-nearest", 500.0, d_sharded, d_out,
                                           base_10m, false);

  std::printf("100k threads on one bitmap (slowest last)\n");
  one_bitmap_small<carve::FirstFit>(clock, "first-fit", d_bitmap, d_out, base_100k);
  one_bitmap_small<carve::BoundaryNearestFit>(clock, "boundary-nearest", d_bitmap, d_out, base_100k);

  alarm(0);
  std::printf("done in %.1f s (a run counts only if every allocation succeeded and no slot went to two threads)\n",
              clock.seconds());
  cudaFree(d_bitmap);
  cudaFree(d_sharded);
  cudaFree(d_out);
  cudaFree(d_blocks);
  cudaFree(d_counts);
  return 0;
}
