// ReleaseAlignedFit on a GPU: an allocator in shared memory replays hinted allocations and
// releases, and every answer matches the host's.
#include "support/device_test.hpp"

#include <carve/slot.hpp>

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <vector>

namespace {

using carve::test::check;
using carve::test::to_device;
using carve::test::to_host;

constexpr std::uint32_t no_fit = 0xffff'ffff;
using Allocator = carve::SlotAllocator<128, carve::ReleaseAlignedFit>;

// One step: allocate `size` slots expected back at `tick` (size > 0), or free live allocation
// number `tick` modulo the live count (size == 0).
struct Op {
  std::uint32_t size;
  std::uint32_t tick;
};

// The same replay on either side; `live` holds up to 256 allocations.
__host__ __device__ void replay(Allocator& slots, carve::SlotRange* live, const Op* ops, std::uint32_t count,
                                carve::SlotRange* out) {
  std::uint32_t n_live = 0;
  for (std::uint32_t k = 0; k < count; ++k) {
    if (ops[k].size != 0) {
      const auto r = slots.allocate(ops[k].size, carve::ExpectedRelease{ops[k].tick});
      out[k] = r ? *r : carve::SlotRange{no_fit, static_cast<std::uint32_t>(r.error())};
      if (r && n_live < 256) {
        live[n_live++] = *r;
      }
    } else if (n_live != 0) {
      const std::uint32_t j = ops[k].tick % n_live;
      out[k] = slots.deallocate(live[j]) ? live[j] : carve::SlotRange{no_fit, no_fit};
      live[j] = live[--n_live];
    } else {
      out[k] = {0, 0};
    }
  }
}

__global__ void replay_in_shared_memory(const Op* ops, std::uint32_t count, carve::SlotRange* out) {
  __shared__ Allocator slots;
  __shared__ carve::SlotRange live[256];
  if (threadIdx.x == 0) {
    slots.reset(); // shared memory starts undefined; the policy reads only what it placed
    replay(slots, live, ops, count, out);
  }
}

} // namespace

int main() {
  carve::test::skip_without_device();
  constexpr std::uint32_t count = 20000;
  std::mt19937_64 rng(7);
  std::vector<Op> ops(count);
  std::uint32_t now = 0;
  for (Op& op : ops) {
    now += static_cast<std::uint32_t>(rng() % 3);
    op = rng() % 2 ? Op{1 + static_cast<std::uint32_t>(rng() % 16), now + static_cast<std::uint32_t>(rng() % 100)}
                   : Op{0, static_cast<std::uint32_t>(rng())};
  }
  Op* d_ops = nullptr;
  carve::SlotRange* d_out = nullptr;
  check(cudaMalloc(&d_ops, count * sizeof(Op)), "cudaMalloc");
  check(cudaMalloc(&d_out, count * sizeof(carve::SlotRange)), "cudaMalloc");
  check(cudaMemcpy(d_ops, ops.data(), count * sizeof(Op), cudaMemcpyHostToDevice), "cudaMemcpy");
  replay_in_shared_memory<<<1, 32>>>(d_ops, count, d_out);
  check(cudaGetLastError(), "replay launch");
  std::vector<carve::SlotRange> got(count);
  check(cudaMemcpy(got.data(), d_out, count * sizeof(carve::SlotRange), cudaMemcpyDeviceToHost), "cudaMemcpy");

  auto host = std::make_unique<Allocator>();
  std::vector<carve::SlotRange> live(256), want(count);
  replay(*host, live.data(), ops.data(), count, want.data());
  int failures = 0;
  for (std::uint32_t k = 0; k < count; ++k) {
    if (!(got[k] == want[k]) && failures++ < 5) {
      std::fprintf(stderr, "step %u: device and host disagree\n", k);
    }
  }
  cudaFree(d_ops);
  cudaFree(d_out);
  std::printf("%s: %d mismatches\n", failures == 0 ? "PASS" : "FAIL", failures);
  return failures == 0 ? 0 : 1;
}
