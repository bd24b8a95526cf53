// A persistent kernel that gives each work item shared-memory scratch from a slot allocator.
//
// One block per SM stays resident; its dynamic shared memory is an arena of 128 slots of 256
// bytes (32 KiB) managed by a block-scope carve::ConcurrentSlotAllocator. Each warp pulls work
// items from a global queue; an item asks for a histogram with its own number of bins, so it
// needs ceil(bins * 4 / 256) contiguous slots. The warp allocates them, builds the histogram in
// that scratch with shared-memory atomics, copies it out and frees the slots. The host checks
// every histogram.
#include <carve/slot.hpp>

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

namespace {

constexpr std::uint32_t slots = 128;
constexpr std::uint32_t slot_bytes = 256;
using Scratch = carve::ConcurrentSlotAllocator<slots, carve::BoundaryNearestFit, cuda::thread_scope_block>;

struct Item {
  std::uint32_t first;  // offset of the item's values in the value array
  std::uint32_t count;  // number of values
  std::uint32_t bins;   // histogram size; values are binned by value % bins
  std::uint32_t output; // offset of the item's histogram in the output array
};

__global__ void run_items(const Item* items, std::uint32_t item_count, const std::uint32_t* values,
                          std::uint32_t* histograms, std::uint32_t* next_item) {
  extern __shared__ std::uint32_t arena[]; // slots * slot_bytes bytes
  __shared__ Scratch scratch;
  if (threadIdx.x == 0) {
    scratch.reset();
  }
  __syncthreads();

  const unsigned lane = threadIdx.x % 32;
  for (;;) {
    std::uint32_t index = 0;
    if (lane == 0) {
      index = atomicAdd(next_item, 1u);
    }
    index = __shfl_sync(0xffff'ffffu, index, 0);
    if (index >= item_count) {
      break;
    }
    const Item item = items[index];
    const std::uint32_t m = (item.bins * 4 + slot_bytes - 1) / slot_bytes;

    // Lane 0 takes the scratch; when the arena is full, other warps are about to free theirs. Any
    // other refusal (more slots than the arena has) would never pass: waiting for it would hang.
    std::uint32_t first = 0;
    if (lane == 0) {
      for (auto r = scratch.allocate(m);; r = scratch.allocate(m)) {
        if (r) {
          first = r->first;
          break;
        }
        if (r.error() != carve::Errc::no_space) {
          __trap(); // the launch fails, and the host's check says so
        }
        __nanosleep(200);
      }
    }
    first = __shfl_sync(0xffff'ffffu, first, 0);
    // A shuffle orders no memory: this does, so the other lanes write the scratch only after
    // lane 0's claim, and so after the previous owner's last reads of it.
    __syncwarp();
    std::uint32_t* bins = arena + first * (slot_bytes / 4);

    for (std::uint32_t b = lane; b < item.bins; b += 32) {
      bins[b] = 0;
    }
    __syncwarp();
    for (std::uint32_t i = lane; i < item.count; i += 32) {
      atomicAdd(&bins[values[item.first + i] % item.bins], 1u);
    }
    __syncwarp();
    for (std::uint32_t b = lane; b < item.bins; b += 32) {
      histograms[item.output + b] = bins[b];
    }
    __syncwarp();
    if (lane == 0) {
      (void)scratch.deallocate({first, m});
    }
  }
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

template <class T>
T* to_device(const std::vector<T>& v) {
  T* p = nullptr;
  check(cudaMalloc(&p, v.size() * sizeof(T)), "cudaMalloc");
  check(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), "copy to device");
  return p;
}

} // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::puts("persistent_scheduler: no CUDA device here, nothing to run");
    return 77;
  }
  // Items with 16 to 8192 bins (1 to 128 slots of scratch) over random values.
  std::mt19937 rng(2024);
  std::vector<Item> items(20000);
  std::vector<std::uint32_t> values;
  std::uint32_t outputs = 0;
  for (auto& item : items) {
    item.first = static_cast<std::uint32_t>(values.size());
    item.count = 64 + rng() % 4096;
    item.bins = 16u << (rng() % 10);
    item.output = outputs;
    outputs += item.bins;
    for (std::uint32_t i = 0; i < item.count; ++i) {
      values.push_back(static_cast<std::uint32_t>(rng()));
    }
  }

  int sms = 0;
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "SM count");
  auto* d_items = to_device(items);
  auto* d_values = to_device(values);
  std::uint32_t* d_histograms = nullptr;
  std::uint32_t* d_next = nullptr;
  check(cudaMalloc(&d_histograms, outputs * sizeof(std::uint32_t)), "cudaMalloc");
  check(cudaMalloc(&d_next, sizeof(std::uint32_t)), "cudaMalloc");
  check(cudaMemset(d_next, 0, sizeof(std::uint32_t)), "cudaMemset");

  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "event");
  check(cudaEventCreate(&stop), "event");
  check(cudaEventRecord(start), "event");
  run_items<<<static_cast<unsigned>(sms), 256, slots * slot_bytes>>>(d_items, static_cast<std::uint32_t>(items.size()),
                                                                     d_values, d_histograms, d_next);
  check(cudaGetLastError(), "launch");
  check(cudaEventRecord(stop), "event");
  check(cudaEventSynchronize(stop), "kernel");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, start, stop), "elapsed");

  std::vector<std::uint32_t> histograms(outputs);
  check(cudaMemcpy(histograms.data(), d_histograms, outputs * sizeof(std::uint32_t), cudaMemcpyDeviceToHost),
        "copy back");
  std::size_t wrong = 0;
  for (const auto& item : items) {
    std::vector<std::uint32_t> want(item.bins, 0);
    for (std::uint32_t i = 0; i < item.count; ++i) {
      ++want[values[item.first + i] % item.bins];
    }
    for (std::uint32_t b = 0; b < item.bins; ++b) {
      wrong += histograms[item.output + b] != want[b] ? 1u : 0u;
    }
  }
  std::printf("persistent_scheduler: %zu items on %d SMs in %.3f ms, %zu wrong bins\n", items.size(), sms,
              static_cast<double>(ms), wrong);
  cudaFree(d_items);
  cudaFree(d_values);
  cudaFree(d_histograms);
  cudaFree(d_next);
  return wrong == 0 ? 0 : 1;
}
