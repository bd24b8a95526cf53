// The contract of mr/resource_contract.hpp inside kernels: the device-capable resources and the
// stacks the guides build, in shared and global memory, at block and device scope, passed to the
// kernel by value and built inside it. One thread runs the whole contract on a resource it has to
// itself; then every thread of the grid shares it (run_shared_contract). A failed check is printed
// by the kernel with its name and counted; main reports each resource. Built by nvcc for every
// architecture in CI; run where a GPU is present (exit code 77 without one).
#include "mr/resource_contract.hpp"
#include "support/device_test.hpp"

#include <carve/mr.hpp>
#include <carve/mr/cuda_device_resource.hpp>
#include <carve/slot.hpp>

#include <cuda/std/span>
#include <cuda/std/tuple>
#include <cuda/std/utility>

#include <cstdio>
#include <type_traits>
#include <vector>

namespace {

using carve::test::ContractBlock;
using carve::test::ContractResult;
using carve::test::ResourceShape;

// A block's arena in shared memory (block scope) and a grid's arena in global memory (device
// scope, a handle on words in device memory: copies passed to kernels share them), as
// test_device_stacks.cu and examples/compose_block_scratch.cu build them.
using Local =
    carve::SlotArena<carve::ConcurrentSlotAllocator<128, carve::BoundaryNearestFit, cuda::thread_scope_block>>;
constexpr std::uint32_t global_slots = 2048;
using Global = carve::SlotArena<carve::ConcurrentSlotAllocatorRef<global_slots, carve::FirstFit>>;
using Sharded = carve::SlotArena<carve::ShardedSlotAllocator<256, 8, carve::FirstFit>>;
// test_device_stacks.cu's Stack.
using Counted = carve::StatsResource<carve::LimitResource<Global>>;
using Stack = carve::FallbackResource<Local, carve::Segregator<512, Counted, Global>>;
// examples/compose_block_scratch.cu's Scratch (its block arena: 64 slots of 128 bytes).
using ScratchLocal =
    carve::SlotArena<carve::ConcurrentSlotAllocator<64, carve::BoundaryNearestFit, cuda::thread_scope_block>>;
using Scratch = carve::FallbackResource<ScratchLocal, Global>;
// Built inside a kernel by one thread: a single-owner arena behind a block-scope budget and
// counters, and the same arena in front of the global one.
using Plain = carve::SlotArena<carve::SlotAllocator<64, carve::FirstFit>>;
using Budgeted = carve::StatsResource<carve::LimitResource<Plain, cuda::thread_scope_block>, cuda::thread_scope_block>;
using PlainOrGlobal = carve::Segregator<256, Plain, Global>;
// The global arena shared by reference (carve::ref): the handle lives in device memory and the
// kernel gets a ResourceRef to it by value, alone and under an arena built in the kernel.
using Referenced = carve::FallbackResource<Plain, carve::ResourceRef<Global>>;
static_assert(std::is_trivially_copyable_v<Global> && std::is_trivially_copyable_v<carve::ResourceRef<Global>>,
              "the handle and the reference are copied between host and device byte for byte");

constexpr std::size_t slot = 64;
constexpr unsigned blocks = 8;
constexpr unsigned threads = 128;

// What each resource's kernels count, by case.
enum Case : unsigned {
  local_arena,
  global_arena,
  global_arena_by_value,
  sharded_arena,
  plain_in_shared,
  plain_in_global,
  budgeted_plain,
  plain_or_global,
  stack_in_shared,
  scratch_in_shared,
  counted_by_value,
  ref_by_value,
  case_count
};
__host__ __device__ constexpr const char* case_name(Case c) {
  switch (c) {
  case local_arena:
    return "SlotArena<ConcurrentSlotAllocator<128, block>> in __shared__, block scope";
  case global_arena:
    return "SlotArena<ConcurrentSlotAllocatorRef<2048>> in global memory, device scope";
  case global_arena_by_value:
    return "SlotArena<ConcurrentSlotAllocatorRef<2048>> passed by value, every thread of the grid";
  case sharded_arena:
    return "SlotArena<ShardedSlotAllocator<256, 8>> passed by value, each block at home in its shard";
  case plain_in_shared:
    return "SlotArena<SlotAllocator<64>> built in a kernel over __shared__ bytes";
  case plain_in_global:
    return "SlotArena<SlotAllocator<64>> built in a kernel over global memory";
  case budgeted_plain:
    return "StatsResource<LimitResource<SlotArena<SlotAllocator<64>>, block>, block> built in a kernel";
  case plain_or_global:
    return "Segregator<256, SlotArena<SlotAllocator<64>>, global arena> built in a kernel";
  case stack_in_shared:
    return "test_device_stacks.cu's Stack in __shared__, every thread of the block";
  case scratch_in_shared:
    return "compose_block_scratch.cu's Scratch in __shared__, every thread of the block";
  case counted_by_value:
    return "StatsResource<LimitResource<global arena>> passed by value";
  case ref_by_value:
    return "ResourceRef<global arena in device memory> passed by value, alone and under an arena";
  default:
    return "?";
  }
}

struct Tally {
  unsigned long long checks = 0;
  unsigned long long failures = 0;
};

__device__ void report(Case c, const ContractResult& r, Tally* tally) {
  if (!r.passed()) {
    printf("FAILED in a kernel: %s: %s (%u of %u checks)\n", case_name(c), r.what(), r.failures, r.checks);
  }
  atomicAdd(&tally[c].checks, static_cast<unsigned long long>(r.checks));
  atomicAdd(&tally[c].failures, static_cast<unsigned long long>(r.failures));
}

__device__ void expect(Case c, bool ok, const char* check, Tally* tally) {
  ContractResult r;
  r.expect(ok, check);
  report(c, r, tally);
}

// The whole contract, by one thread, on a resource it has to itself.
template <class R>
__device__ void contract(Case c, R& r, const ResourceShape& shape, ContractBlock* scratch, Tally* tally) {
  report(c, carve::test::run_contract(r, shape, cuda::std::span<ContractBlock>(scratch, carve::test::max_batch)),
         tally);
}

// Every thread at once, on a resource they share.
template <class R>
__device__ void shared_contract(Case c, R& r, unsigned thread, std::size_t largest, Tally* tally) {
  report(c, carve::test::run_shared_contract(r, thread, 8, largest, 8), tally);
}

__device__ constexpr ResourceShape arena_shape(std::size_t capacity, std::size_t largest, std::size_t batch) {
  return {.largest_request = largest, .batch = batch, .max_alignment = slot, .never_fits = capacity + 1};
}

// The block arena alone, then the block sharing it; each block its own.
__global__ void block_arena(ContractBlock* scratch, Tally* tally) {
  __shared__ alignas(slot) std::byte memory[128 * slot];
  __shared__ Local arena;
  if (threadIdx.x == 0) {
    arena.reset(memory, sizeof memory, slot);
    contract(local_arena, arena, arena_shape(sizeof memory, 400, 12), scratch + blockIdx.x * carve::test::max_batch,
             tally);
  }
  __syncthreads();
  shared_contract(local_arena, arena, threadIdx.x, 120, tally);
  __syncthreads();
  if (threadIdx.x == 0) {
    expect(local_arena, arena.free_bytes() == arena.capacity(), "every byte back after the block shared it", tally);
  }
}

__global__ void reset_slots(Global global) { global.slots().reset(); }

__global__ void global_contract(Global global, ContractBlock* scratch, Tally* tally) {
  contract(global_arena, global, arena_shape(global.capacity(), 1000, 24), scratch, tally);
}

__global__ void global_shared(Global global, Tally* tally) {
  shared_contract(global_arena_by_value, global, blockIdx.x * blockDim.x + threadIdx.x, 1000, tally);
}

__global__ void global_all_back(Global global, Case c, Tally* tally) {
  expect(c, global.free_bytes() == global.capacity(), "every byte of the global arena back", tally);
}

__global__ void reset_shards(Sharded sharded) { sharded.slots().reset(); }

__global__ void sharded_contract(Sharded sharded, ContractBlock* scratch, Tally* tally) {
  contract(sharded_arena, sharded, arena_shape(sharded.capacity(), 1000, 24), scratch, tally);
}

__global__ void sharded_shared(Sharded sharded, Tally* tally) {
  Sharded home(sharded.base(), sharded.capacity(), sharded.slot_bytes(), sharded.slots().with_home(blockIdx.x));
  shared_contract(sharded_arena, home, blockIdx.x * blockDim.x + threadIdx.x, 1000, tally);
}

__global__ void sharded_all_back(Sharded sharded, Tally* tally) {
  expect(sharded_arena, sharded.free_bytes() == sharded.capacity(), "every byte of the shards back", tally);
}

// Single-owner arenas and stacks, each built in its kernel by the one thread that uses it.
__global__ void plain_shared(ContractBlock* scratch, Tally* tally) {
  __shared__ alignas(slot) std::byte memory[64 * slot];
  Plain arena(memory, sizeof memory, slot);
  contract(plain_in_shared, arena, arena_shape(sizeof memory, 400, 8), scratch, tally);
}

__global__ void plain_global(std::byte* global_bytes, ContractBlock* scratch, Tally* tally) {
  Plain arena(global_bytes, 64 * slot, slot);
  contract(plain_in_global, arena, arena_shape(64 * slot, 400, 8), scratch, tally);
}

__global__ void budgeted(ContractBlock* scratch, Tally* tally) {
  __shared__ alignas(slot) std::byte memory[64 * slot];
  Budgeted counted(cuda::std::piecewise_construct,
                   cuda::std::forward_as_tuple(cuda::std::piecewise_construct,
                                               cuda::std::forward_as_tuple(memory, sizeof memory, std::size_t{slot}),
                                               std::size_t{2048}));
  contract(budgeted_plain, counted, arena_shape(2048, 200, 8), scratch, tally);
  const carve::ResourceStats s = counted.stats();
  expect(budgeted_plain, s.bytes_in_use == 0 && s.allocations == s.deallocations && s.failed > 0,
         "the counters balance", tally);
}

__global__ void segregated(Global global, ContractBlock* scratch, Tally* tally) {
  __shared__ alignas(slot) std::byte memory[64 * slot];
  PlainOrGlobal both(cuda::std::piecewise_construct,
                     cuda::std::forward_as_tuple(memory, sizeof memory, std::size_t{slot}),
                     cuda::std::forward_as_tuple(global));
  contract(plain_or_global, both, arena_shape(both.capacity(), 1000, 16), scratch, tally);
}

// The guides' stacks in shared memory, set up by one thread (shared memory is not constructed).
struct SharedStacks {
  alignas(slot) std::byte stack_memory[128 * slot];
  alignas(128) std::byte scratch_memory[64 * 128];
  Stack stack;
  Scratch scratch;
};

__device__ void set_up(SharedStacks& s, const Global& global) {
  s.stack.primary().reset(s.stack_memory, sizeof s.stack_memory, slot);
  s.stack.fallback().small() = Counted(carve::LimitResource<Global>(global, 32 << 10));
  s.stack.fallback().large() = global;
  s.scratch.primary().reset(s.scratch_memory, sizeof s.scratch_memory, 128);
  s.scratch.fallback() = global;
}

// One thread runs the whole contract on each (the global arena is shared with no other block).
__global__ void stack_alone(Global global, ContractBlock* scratch, Tally* tally) {
  __shared__ SharedStacks s;
  set_up(s, global);
  contract(stack_in_shared, s.stack, arena_shape(s.stack.capacity(), 1000, 24), scratch, tally);
}

__global__ void scratch_alone(Global global, ContractBlock* scratch, Tally* tally) {
  __shared__ SharedStacks s;
  set_up(s, global);
  // Its block arena's slots start at 128 bytes, the global arena's at 64: the stack serves 64 for
  // sure, and 128 while the block arena has room, so a coarser alignment is not always refused.
  ResourceShape shape = arena_shape(s.scratch.capacity(), 1000, 24);
  shape.refuses_coarser_alignment = false;
  contract(scratch_in_shared, s.scratch, shape, scratch, tally);
}

// Every thread of every block shares its block's stacks, and through them the global arena.
__global__ void stacks_shared(Global global, Tally* tally) {
  __shared__ SharedStacks s;
  if (threadIdx.x == 0) {
    set_up(s, global);
  }
  __syncthreads();
  const unsigned thread = blockIdx.x * blockDim.x + threadIdx.x;
  shared_contract(stack_in_shared, s.stack, thread, 700, tally);
  shared_contract(scratch_in_shared, s.scratch, thread, 700, tally);
  __syncthreads();
  if (threadIdx.x == 0) {
    const carve::ResourceStats c = s.stack.fallback().small().stats();
    expect(stack_in_shared,
           c.bytes_in_use == 0 && c.allocations == c.deallocations &&
               s.stack.primary().free_bytes() == sizeof s.stack_memory,
           "the block's stack has every byte back and its counters balance", tally);
    expect(scratch_in_shared, s.scratch.primary().free_bytes() == sizeof s.scratch_memory,
           "the block's scratch arena has every byte back", tally);
  }
}

// A stack built on the host and passed by value: the kernel works on its own copy of the budget
// and counters, and on the global arena they refer to.
__global__ void counted_copy(Counted counted, ContractBlock* scratch, Tally* tally) {
  contract(counted_by_value, counted, arena_shape(32 << 10, 1000, 24), scratch, tally);
  const carve::ResourceStats s = counted.stats();
  expect(counted_by_value, s.bytes_in_use == 0 && s.allocations == s.deallocations, "the copy's counters balance",
         tally);
}

__global__ void make_ref(Global* global, carve::ResourceRef<Global>* out) { *out = carve::ref(*global); }

// A ResourceRef to an arena in device memory, passed by value, used alone, then as the fallback of
// an arena built in the kernel over shared memory.
__global__ void referenced(carve::ResourceRef<Global> global, ContractBlock* scratch, Tally* tally) {
  contract(ref_by_value, global, arena_shape(global.capacity(), 1000, 24), scratch, tally);
  __shared__ alignas(slot) std::byte memory[16 * slot];
  Referenced both(cuda::std::piecewise_construct, cuda::std::forward_as_tuple(memory, sizeof memory, std::size_t{slot}),
                  cuda::std::forward_as_tuple(global));
  contract(ref_by_value, both, arena_shape(both.capacity(), 1000, 24), scratch, tally);
}

} // namespace

int main() {
  using namespace carve::test;
  skip_without_device();

  // cudaMalloc itself, from the host: its addresses cannot be written here, and its free_bytes is
  // the device's, which other users change.
  {
    carve::CudaDeviceResource gpu(0);
    std::vector<ContractBlock> scratch(max_batch);
    const ContractResult r = run_contract(gpu,
                                          {.largest_request = 64 << 10,
                                           .batch = 12,
                                           .max_alignment = 256,
                                           .refuses_coarser_alignment = false,
                                           .never_fits = gpu.capacity() + 1,
                                           .bytes_addressable = false,
                                           .free_bytes_exact = false},
                                          scratch);
    if (!r.passed()) {
      std::printf("CudaDeviceResource: %s\n", r.what());
    }
    expect(r.passed() && r.checks > 20, "CudaDeviceResource keeps the contract");
  }

  std::byte* memory = nullptr;
  std::byte* sharded_memory = nullptr;
  std::byte* plain_memory = nullptr;
  carve::bits::word* words = nullptr;
  carve::bits::word* shard_words = nullptr;
  using ShardSlots = Sharded::slots_type;
  check(cudaMalloc(&memory, global_slots * slot), "cudaMalloc arena");
  check(cudaMalloc(&sharded_memory, ShardSlots::size() * slot), "cudaMalloc sharded arena");
  check(cudaMalloc(&plain_memory, 64 * slot), "cudaMalloc plain arena");
  check(cudaMalloc(&words, carve::bits::word_count(global_slots) * sizeof(carve::bits::word)), "cudaMalloc words");
  check(cudaMalloc(&shard_words, ShardSlots::word_count * sizeof(carve::bits::word)), "cudaMalloc shard words");
  const Global global(
      memory, global_slots * slot, slot,
      carve::ConcurrentSlotAllocatorRef<global_slots, carve::FirstFit>(carve::BorrowedSlotWords<global_slots>(words)));
  const Sharded sharded(sharded_memory, ShardSlots::size() * slot, slot, ShardSlots(shard_words));
  ContractBlock* scratch = to_device(std::vector<ContractBlock>(blocks * max_batch));
  Tally* tally = to_device(std::vector<Tally>(case_count));

  block_arena<<<blocks, threads>>>(scratch, tally);
  reset_slots<<<1, 1>>>(global);
  global_contract<<<1, 1>>>(global, scratch, tally);
  global_all_back<<<1, 1>>>(global, global_arena, tally);
  global_shared<<<blocks, threads>>>(global, tally);
  global_all_back<<<1, 1>>>(global, global_arena_by_value, tally);
  reset_shards<<<1, 1>>>(sharded);
  sharded_contract<<<1, 1>>>(sharded, scratch, tally);
  sharded_shared<<<blocks, threads>>>(sharded, tally);
  sharded_all_back<<<1, 1>>>(sharded, tally);
  plain_shared<<<1, 1>>>(scratch, tally);
  plain_global<<<1, 1>>>(plain_memory, scratch, tally);
  budgeted<<<1, 1>>>(scratch, tally);
  segregated<<<1, 1>>>(global, scratch, tally);
  global_all_back<<<1, 1>>>(global, plain_or_global, tally);
  stack_alone<<<1, 1>>>(global, scratch, tally);
  scratch_alone<<<1, 1>>>(global, scratch, tally);
  stacks_shared<<<blocks, threads>>>(global, tally);
  global_all_back<<<1, 1>>>(global, stack_in_shared, tally);
  counted_copy<<<1, 1>>>(Counted(carve::LimitResource<Global>(global, 32 << 10)), scratch, tally);
  global_all_back<<<1, 1>>>(global, counted_by_value, tally);
  // The handle copied into device memory (its bytes whole), a ResourceRef to it made there (the
  // host never names device memory as an object), copied back and passed by value.
  Global* global_on_device = to_device(std::vector<Global>{global});
  carve::ResourceRef<Global>* ref_on_device = nullptr;
  check(cudaMalloc(&ref_on_device, sizeof *ref_on_device), "cudaMalloc ref");
  make_ref<<<1, 1>>>(global_on_device, ref_on_device);
  Global host_twin = global; // only for a ResourceRef to exist here; its bytes are overwritten
  carve::ResourceRef<Global> ref = carve::ref(host_twin);
  check(cudaMemcpy(&ref, ref_on_device, sizeof ref, cudaMemcpyDeviceToHost), "cudaMemcpy ref");
  referenced<<<1, 1>>>(ref, scratch, tally);
  global_all_back<<<1, 1>>>(global, ref_by_value, tally);
  check(cudaGetLastError(), "launch");
  check(cudaDeviceSynchronize(), "kernels");

  const std::vector<Tally> tallies = to_host(tally, case_count);
  for (unsigned c = 0; c < case_count; ++c) {
    std::printf("%-90s %llu checks, %llu failed\n", case_name(static_cast<Case>(c)), tallies[c].checks,
                tallies[c].failures);
    expect(tallies[c].failures == 0 && tallies[c].checks > 20, case_name(static_cast<Case>(c)));
  }
  std::printf(failures == 0 ? "all passed\n" : "%d failed\n", failures);
  return failures == 0 ? 0 : 1;
}
