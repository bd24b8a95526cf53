// The slot code on a GPU gives exactly the host's answers: every policy over many bitmaps, and
// an allocator in shared memory replaying a random allocate/free sequence.
#include "support/device_test.hpp"

#include <carve/slot.hpp>

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

namespace {

using carve::test::check;
using carve::test::to_device;
using carve::test::to_host;

constexpr std::uint32_t no_fit = 0xffff'ffff;

struct Answers {
  std::uint32_t first, last, best, boundary_nearest, run_starts, largest;
  bool operator==(const Answers&) const = default;
};

template <std::uint32_t N>
__host__ __device__ Answers answer(const carve::SlotBitmap<N>& b, std::uint32_t m) {
  const auto pick = [](cuda::std::optional<std::uint32_t> s) { return s ? *s : no_fit; };
  return {pick(carve::FirstFit{}.find(b, m)), pick(carve::LastFit{}.find(b, m)),
          pick(carve::BestFit{}.find(b, m)),  pick(carve::BoundaryNearestFit{}.find(b, m)),
          b.run_starts(m).free_count(),       b.largest_free_run()};
}

template <std::uint32_t N>
__global__ void answer_all(const carve::SlotBitmap<N>* bitmaps, const std::uint32_t* ms, Answers* out,
                           std::uint32_t count) {
  const std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < count) {
    out[i] = answer(bitmaps[i], ms[i]);
  }
}

// op > 0: allocate op slots; op <= 0: free the live allocation number -op (if any).
__global__ void replay_in_shared_memory(const int* ops, std::uint32_t count, carve::SlotRange* out) {
  __shared__ carve::SlotAllocator<128> slots;
  __shared__ carve::SlotRange live[256];
  if (threadIdx.x != 0) {
    return;
  }
  slots.reset(); // shared memory starts undefined
  std::uint32_t n_live = 0;
  for (std::uint32_t k = 0; k < count; ++k) {
    if (ops[k] > 0) {
      const auto r = slots.allocate(static_cast<std::uint32_t>(ops[k]));
      out[k] = r ? *r : carve::SlotRange{no_fit, static_cast<std::uint32_t>(r.error())};
      if (r && n_live < 256) {
        live[n_live++] = *r;
      }
    } else if (n_live != 0) {
      const std::uint32_t j = static_cast<std::uint32_t>(-ops[k]) % n_live;
      out[k] = slots.deallocate(live[j]) ? live[j] : carve::SlotRange{no_fit, no_fit};
      live[j] = live[--n_live];
    } else {
      out[k] = {0, 0};
    }
  }
}

template <std::uint32_t N>
int check_policies(std::mt19937_64& rng) {
  constexpr std::uint32_t count = 4096;
  std::vector<carve::SlotBitmap<N>> bitmaps(count);
  std::vector<std::uint32_t> ms(count);
  std::uniform_int_distribution<std::uint32_t> slot(0, N - 1);
  for (std::uint32_t i = 0; i < count; ++i) {
    for (std::uint32_t k = 0; k < i % 97; ++k) {
      const std::uint32_t s = slot(rng);
      bitmaps[i].occupy({s, 1 + (s + k) % (N - s)});
      bitmaps[i].release({slot(rng), 1});
    }
    ms[i] = 1 + static_cast<std::uint32_t>(rng() % (i % 3 == 0 ? N : 16));
  }
  auto* d_bitmaps = to_device(bitmaps);
  auto* d_ms = to_device(ms);
  Answers* d_out = nullptr;
  check(cudaMalloc(&d_out, count * sizeof(Answers)), "cudaMalloc");
  answer_all<N><<<count / 128, 128>>>(d_bitmaps, d_ms, d_out, count);
  check(cudaGetLastError(), "answer_all launch");
  const auto got = to_host(d_out, count);
  int failures = 0;
  for (std::uint32_t i = 0; i < count; ++i) {
    if (!(got[i] == answer(bitmaps[i], ms[i]))) {
      if (failures++ < 5) {
        std::fprintf(stderr, "N=%u input %u (m=%u): device and host disagree\n", N, i, ms[i]);
      }
    }
  }
  cudaFree(d_bitmaps);
  cudaFree(d_ms);
  cudaFree(d_out);
  return failures;
}

int check_replay(std::mt19937_64& rng) {
  constexpr std::uint32_t count = 20000;
  std::vector<int> ops(count);
  for (auto& op : ops) {
    op = rng() % 2 ? 1 + static_cast<int>(rng() % 16) : -static_cast<int>(rng() % 1000);
  }
  auto* d_ops = to_device(ops);
  carve::SlotRange* d_out = nullptr;
  check(cudaMalloc(&d_out, count * sizeof(carve::SlotRange)), "cudaMalloc");
  replay_in_shared_memory<<<1, 32>>>(d_ops, count, d_out);
  check(cudaGetLastError(), "replay launch");
  const auto got = to_host(d_out, count);

  carve::SlotAllocator<128> slots;
  std::vector<carve::SlotRange> live;
  int failures = 0;
  for (std::uint32_t k = 0; k < count; ++k) {
    carve::SlotRange want{0, 0};
    if (ops[k] > 0) {
      const auto r = slots.allocate(static_cast<std::uint32_t>(ops[k]));
      want = r ? *r : carve::SlotRange{no_fit, static_cast<std::uint32_t>(r.error())};
      if (r && live.size() < 256) {
        live.push_back(*r);
      }
    } else if (!live.empty()) {
      const std::size_t j = static_cast<std::size_t>(-ops[k]) % live.size();
      want = slots.deallocate(live[j]) ? live[j] : carve::SlotRange{no_fit, no_fit};
      live[j] = live.back();
      live.pop_back();
    }
    if (!(got[k] == want) && failures++ < 5) {
      std::fprintf(stderr, "replay step %u: device and host disagree\n", k);
    }
  }
  cudaFree(d_ops);
  cudaFree(d_out);
  return failures;
}

} // namespace

int main() {
  carve::test::skip_without_device();
  std::mt19937_64 rng(42);
  const int failures = check_policies<128>(rng) + check_policies<1000>(rng) + check_replay(rng);
  std::printf("%s: %d mismatches\n", failures == 0 ? "PASS" : "FAIL", failures);
  return failures == 0 ? 0 : 1;
}
