// Every memory resource carve has, and the stacks the guides build, run the one contract of
// mr/resource_contract.hpp on the host. contract_runs below is the list: one entry per resource
// (and per slot allocator under a SlotArena), each naming the header that declares it; a test
// reads carve's headers and fails when one declares a try_allocate that no entry runs and no
// line of run_elsewhere accounts for, so a new resource cannot go untested by accident. The
// device-capable ones run the same contract in kernels too (test_resource_contract.cu), and the
// thread-safe ones with threads at once (test_contract_threads.cpp).
#include "mr/budget_resource.hpp"
#include "mr/contract_fixtures.hpp"
#include "mr/resource_contract.hpp"
#include "support/topology_data.hpp"

#include <carve/borrow.hpp>
#include <carve/mirror.hpp>
#include <carve/mr.hpp>
#include <carve/service.hpp>
#include <carve/slot.hpp>
#include <carve/tier.hpp>
#include <carve/vmm.hpp>

#include <doctest/doctest.h>

#include <stdlib.h>

#include <array>
#include <cctype>
#include <chrono>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

// In a namespace of its own: the area's test files may compile as one translation unit.
namespace test_resource_contract {

using namespace carve::test; // the contract, and the arenas and pools it is run on

namespace {

// The shape of a resource that serves `largest`-byte requests at up to `alignment`, and can never
// hold more than its capacity.
template <class R>
ResourceShape shape_of(const R& r, std::size_t largest, std::size_t batch, std::size_t alignment,
                       bool refuses_coarser_alignment) {
  return {.largest_request = largest,
          .batch = batch,
          .max_alignment = alignment,
          .refuses_coarser_alignment = refuses_coarser_alignment,
          .never_fits = r.capacity() + 1};
}

template <class R>
ContractResult check(R& r, const ResourceShape& shape) {
  std::array<ContractBlock, carve::test::max_batch> blocks{};
  return carve::test::run_contract(r, shape, blocks);
}

// A directory of its own under the system's temporary directory, removed with everything in it.
class TempDir {
public:
  TempDir() {
    std::string name = (std::filesystem::temp_directory_path() / "carve-contract-XXXXXX").string();
    if (::mkdtemp(name.data()) == nullptr) {
      throw std::runtime_error("mkdtemp failed");
    }
    path_ = name;
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const noexcept { return path_; }

private:
  std::filesystem::path path_;
};

// A slot arena over `Slots` built by `make(words)` (the words: room for handles on borrowed ones).
template <class Slots>
ContractResult arena_over_handle(Slots slots) {
  const auto heap = std::make_unique<ArenaBytes>();
  carve::SlotArena<Slots> arena(heap->bytes, sizeof heap->bytes, slot_bytes, std::move(slots));
  arena.reset(); // handles on borrowed words find them as they are: every slot free
  return check(arena, arena_shape);
}
template <class Slots>
ContractResult arena_of() {
  const auto heap = std::make_unique<ArenaBytes>();
  carve::SlotArena<Slots> arena(heap->bytes, sizeof heap->bytes, slot_bytes);
  return check(arena, arena_shape);
}

// The allocator of test_device_stacks.cu: a block's arena, then a segregated, limited and
// counted global arena; here on the host.
using Local =
    carve::SlotArena<carve::ConcurrentSlotAllocator<128, carve::BoundaryNearestFit, cuda::thread_scope_block>>;
using Global = carve::SlotArena<carve::ConcurrentSlotAllocatorRef<2048, carve::FirstFit>>;
using Counted = carve::StatsResource<carve::LimitResource<Global>>;
using DeviceStack = carve::FallbackResource<Local, carve::Segregator<512, Counted, Global>>;

// compose_memory_hierarchy.cpp's stack at a sixty-fourth of its size: a GPU's pool, then memory
// borrowed from its peers under a cap, then its share of a disk tier.
constexpr const char* four_gpus = R"(        GPU0    GPU1    GPU2    GPU3    CPU Affinity
GPU0     X      NV2     NV1     SYS     0-15
GPU1    NV2      X      NV1     SYS     0-15
GPU2    NV1     NV1      X      NV2     0-15
GPU3    SYS     SYS     NV2      X      0-15
)";
using Borrower = carve::BorrowingAllocator<Pool>;
using Hierarchy =
    carve::FallbackResource<carve::StatsResource<carve::ResourceRef<Pool>>,
                            carve::FallbackResource<carve::StatsResource<carve::LimitResource<Borrower::Card>>,
                                                    carve::StatsResource<carve::TierShareResource>>>;

auto borrower_pools() {
  return [](int) { return Pool(carve::SimulatedCard(1 * MiB), pool_options); };
}

/// One run of the contract: the resource, the header that declares it, and the run (nullopt when
/// this machine cannot make the resource, which the test says).
struct ContractRun {
  const char* resource;
  const char* header;
  std::function<std::optional<ContractResult>()> run;
};

const std::vector<ContractRun>& contract_runs() {
  static const std::vector<ContractRun> runs = {
      // Every slot allocator kind under a SlotArena, and the fit policies of the plain one.
      {"SlotArena<SlotAllocator<256, BoundaryNearestFit>>", "mr/slot_arena.hpp",
       [] { return arena_of<carve::SlotAllocator<arena_slots, carve::BoundaryNearestFit>>(); }},
      {"SlotArena<SlotAllocator<256, FirstFit>>", "mr/slot_arena.hpp",
       [] { return arena_of<carve::SlotAllocator<arena_slots, carve::FirstFit>>(); }},
      {"SlotArena<SlotAllocator<256, LastFit>>", "mr/slot_arena.hpp",
       [] { return arena_of<carve::SlotAllocator<arena_slots, carve::LastFit>>(); }},
      {"SlotArena<SlotAllocator<256, BestFit>>", "mr/slot_arena.hpp",
       [] { return arena_of<carve::SlotAllocator<arena_slots, carve::BestFit>>(); }},
      {"SlotArena<ConcurrentSlotAllocator<256, BoundaryNearestFit, system>>", "mr/slot_arena.hpp",
       [] {
         return arena_of<
             carve::ConcurrentSlotAllocator<arena_slots, carve::BoundaryNearestFit, cuda::thread_scope_system>>();
       }},
      {"SlotArena<ConcurrentSlotAllocator<256, FirstFit, block>>", "mr/slot_arena.hpp",
       [] {
         return arena_of<carve::ConcurrentSlotAllocator<arena_slots, carve::FirstFit, cuda::thread_scope_block>>();
       }},
      {"SlotArena<ConcurrentSlotAllocatorRef<256, FirstFit>>", "mr/slot_arena.hpp",
       [] {
         std::vector<carve::bits::word> words(carve::bits::word_count(arena_slots));
         return arena_over_handle(carve::ConcurrentSlotAllocatorRef<arena_slots, carve::FirstFit>(
             carve::BorrowedSlotWords<arena_slots>(words.data())));
       }},
      {"SlotArena<ShardedSlotAllocator<64, 4, FirstFit>>", "mr/slot_arena.hpp",
       [] {
         using Sharded = carve::ShardedSlotAllocator<64, 4, carve::FirstFit>;
         std::vector<carve::bits::word> words(Sharded::word_count);
         return arena_over_handle(Sharded(words.data(), /*home*/ 1));
       }},
      {"SlotArena<DynamicSlotAllocator<FirstFit>>", "mr/slot_arena.hpp",
       [] { return arena_over_handle(carve::DynamicSlotAllocator<carve::FirstFit>(arena_slots)); }},

      // The combinators, each over parts that check their frees.
      {"LimitResource<SlotArena<SlotAllocator<256>>>", "mr/limit_resource.hpp",
       [] {
         const auto heap = std::make_unique<ArenaBytes>();
         carve::LimitResource<carve::SlotArena<carve::SlotAllocator<arena_slots>>> limited(
             std::piecewise_construct, std::forward_as_tuple(heap->bytes, sizeof heap->bytes, slot_bytes), 8 * KiB);
         ResourceShape shape = arena_shape;
         shape.never_fits = 8 * KiB + 1; // past the budget, though the arena has the room
         return check(limited, shape);
       }},
      {"StatsResource<SlotArena<ConcurrentSlotAllocator<256>>>", "mr/stats_resource.hpp",
       [] {
         const auto heap = std::make_unique<ArenaBytes>();
         carve::StatsResource<carve::SlotArena<carve::ConcurrentSlotAllocator<arena_slots>>> counted(
             std::piecewise_construct, std::forward_as_tuple(heap->bytes, sizeof heap->bytes, slot_bytes));
         const ContractResult result = check(counted, arena_shape);
         const carve::ResourceStats s = counted.stats();
         CHECK(s.bytes_in_use == 0);
         CHECK(s.allocations == s.deallocations);
         CHECK(s.failed > 0); // the contract's refused calls were counted
         return result;
       }},
      {"ResourceRef<CachingPool<SimulatedCard>>", "mr/resource_ref.hpp",
       [] {
         Pool pool(carve::SimulatedCard(4 * MiB), pool_options);
         auto ref = carve::ref(pool);
         return check(ref, shape_of(pool, 100 * KiB, 24, 512, true));
       }},
      {"Segregator<256, SlotArena<SlotAllocator<256>>, CachingPool<SimulatedCard>>", "mr/segregator.hpp",
       [] {
         const auto heap = std::make_unique<ArenaBytes>();
         carve::Segregator<256, carve::SlotArena<carve::SlotAllocator<arena_slots>>, Pool> both(
             std::piecewise_construct, std::forward_as_tuple(heap->bytes, sizeof heap->bytes, slot_bytes),
             std::forward_as_tuple(carve::SimulatedCard(4 * MiB), pool_options));
         // A small request at an alignment the arena cannot give is no_space: a Segregator does
         // not move it to the pool.
         return check(both, shape_of(both, 2000, 16, slot_bytes, true));
       }},
      {"FallbackResource<SlotArena<SlotAllocator<256>>, CachingPool<SimulatedCard>>", "mr/fallback_resource.hpp",
       [] {
         const auto heap = std::make_unique<ArenaBytes>();
         carve::FallbackResource<carve::SlotArena<carve::SlotAllocator<arena_slots>>, Pool> stack(
             std::piecewise_construct, std::forward_as_tuple(heap->bytes, sizeof heap->bytes, slot_bytes),
             std::forward_as_tuple(carve::SimulatedCard(1 * MiB), pool_options));
         // Alignments the arena cannot give go to the pool: the stack serves up to the pool's.
         return check(stack, shape_of(stack, 3000, 24, 512, true));
       }},
      {"FallbackResource<Local, Segregator<512, StatsResource<LimitResource<Global>>, Global>> "
       "(test_device_stacks.cu's stack)",
       "mr/fallback_resource.hpp",
       [] {
         struct alignas(64) Bytes {
           std::byte local[128 * 64];
           std::byte global[2048 * 64];
         };
         const auto heap = std::make_unique<Bytes>();
         std::vector<carve::bits::word> words(carve::bits::word_count(2048));
         Global global(
             heap->global, sizeof heap->global, 64,
             carve::ConcurrentSlotAllocatorRef<2048, carve::FirstFit>(carve::BorrowedSlotWords<2048>(words.data())));
         global.slots().reset();
         DeviceStack stack(std::piecewise_construct, std::forward_as_tuple(heap->local, sizeof heap->local, 64),
                           std::forward_as_tuple(Counted(carve::LimitResource<Global>(global, 64 * KiB)), global));
         return check(stack, shape_of(stack, 1000, 24, 64, true));
       }},

      // The guides' host stacks.
      {"Segregator<4096, SlotArena<SlotAllocator<128>>, StatsResource<CachingPool<SimulatedCard>>> "
       "(docs/memory-resources.md's Heap)",
       "mr/segregator.hpp",
       [] {
         struct alignas(256) Bytes {
           std::byte bytes[128 * 256];
         };
         const auto small = std::make_unique<Bytes>();
         using SmallBlocks = carve::SlotArena<carve::SlotAllocator<128>>;
         using LargeBlocks = carve::StatsResource<Pool>;
         carve::Segregator<4096, SmallBlocks, LargeBlocks> heap(SmallBlocks(small->bytes, sizeof small->bytes, 256),
                                                                carve::SimulatedCard(4 * MiB));
         return check(heap, shape_of(heap, 6000, 24, 256, true));
       }},
      {"Segregator<4096, FallbackResource<CachingPool, ResourceRef<CachingPool>>, ResourceRef<CachingPool>> "
       "(docs/snippets/segregator_spill.cpp)",
       "mr/segregator.hpp",
       [] {
         using SmallSide = carve::FallbackResource<Pool, carve::ResourceRef<Pool>>;
         Pool large(carve::SimulatedCard(4 * MiB));
         carve::Segregator<4096, SmallSide, carve::ResourceRef<Pool>> heap(
             std::piecewise_construct,
             std::forward_as_tuple(
                 std::piecewise_construct,
                 std::forward_as_tuple(carve::SimulatedCard(64 * KiB),
                                       carve::PoolOptions{.granularity = 512, .segment_size = 64 * KiB}),
                 std::forward_as_tuple(carve::ref(large))),
             std::forward_as_tuple(carve::ref(large)));
         ResourceShape shape = shape_of(heap, 6000, 24, 512, true);
         shape.never_fits = 64 * KiB + 4 * MiB + 1; // capacity() counts the shared large pool twice
         return check(heap, shape);
       }},
      {"LimitResource<CachingPool<SimulatedCard>> (docs/memory-resources.md's tenant)", "mr/limit_resource.hpp",
       [] {
         carve::LimitResource<Pool> tenant(std::piecewise_construct,
                                           std::forward_as_tuple(carve::SimulatedCard(4 * MiB), pool_options), 1 * MiB);
         return check(tenant, shape_of(tenant, 30 * KiB, 24, 512, true));
       }},
      {"FallbackResource<pool, FallbackResource<borrowed under a cap, tier share>> "
       "(examples/compose_memory_hierarchy.cpp)",
       "borrow/borrowing_allocator.hpp",
       [] {
         TempDir dir;
         Borrower borrower(carve::Topology::from_nvidia_smi(four_gpus), borrower_pools());
         const carve::TierPlanner planner({{0, 1 * MiB}, {1, 1 * MiB}, {2, 1 * MiB}, {3, 1 * MiB}},
                                          {carve::disk_tier(dir.path(), 1, "disk", 2 * MiB)});
         const carve::TierPlan plan = planner.plan({{8 * MiB}});
         Hierarchy gpu0(carve::ref(borrower.resource(0)),
                        carve::FallbackResource<carve::StatsResource<carve::LimitResource<Borrower::Card>>,
                                                carve::StatsResource<carve::TierShareResource>>(
                            carve::LimitResource<Borrower::Card>(borrower.peers(0), 512 * KiB),
                            carve::TierShareResource(plan, 0, 0)));
         // Coarser alignments than the pools' fall through to the tier share, which gives any.
         const ContractResult result = check(gpu0, shape_of(gpu0, 100 * KiB, 24, 512, false));
         CHECK(borrower.live_blocks() == 0);
         return result;
       }},

      // Pools and cards.
      {"SimulatedCard", "mr/simulated_card.hpp",
       [] {
         carve::SimulatedCard card(1 * MiB);
         return check(card, shape_of(card, 20 * KiB, 24, 4 * KiB, false));
       }},
      {"CachingPool<SimulatedCard>", "mr/caching_pool.hpp",
       [] {
         Pool pool(carve::SimulatedCard(4 * MiB), pool_options);
         const ContractResult result = check(pool, shape_of(pool, 100 * KiB, 24, 512, true));
         CHECK(pool.consistent());
         return result;
       }},
      {"StreamOrderedPool<SimulatedCard, SimulatedStreams>", "mr/stream_ordered_pool.hpp",
       [] {
         carve::StreamOrderedPool<carve::SimulatedCard, carve::SimulatedStreams> pool(carve::SimulatedCard(4 * MiB), {},
                                                                                      carve::SimulatedStreams(2));
         // Any alignment the card gives; no capacity of its own, so the card's bounds it.
         return check(pool, {.largest_request = 100 * KiB,
                             .batch = 24,
                             .max_alignment = 4 * KiB,
                             .refuses_coarser_alignment = false,
                             .never_fits = 4 * MiB + 1});
       }},
      {"StreamOrderedPool<ResourceRef<BudgetResource>, SimulatedStreams>", "mr/stream_ordered_pool.hpp",
       [] {
         // An upstream that refuses a free at another alignment than its allocation's: a cached
         // block serves requests at other alignments, and must go back at its own.
         carve::test::BudgetResource budget(4 * MiB);
         std::optional<ContractResult> result;
         {
           carve::StreamOrderedPool<carve::ResourceRef<carve::test::BudgetResource>, carve::SimulatedStreams> pool(
               carve::ref(budget), {}, carve::SimulatedStreams(2));
           result = check(pool, {.largest_request = 100 * KiB,
                                 .batch = 24,
                                 .max_alignment = 4 * KiB,
                                 .refuses_coarser_alignment = false,
                                 .never_fits = 4 * MiB + 1});
           CHECK(pool.trim() > 0);
         }
         CHECK(budget.live_blocks() == 0);
         return result;
       }},
      {"StreamCachingPool<SimulatedCard, SimulatedStreams>", "mr/stream_caching_pool.hpp",
       [] {
         carve::StreamCachingPool<carve::SimulatedCard, carve::SimulatedStreams> pool(
             carve::SimulatedCard(4 * MiB), pool_options, carve::SimulatedStreams(2));
         const ContractResult result = check(pool, shape_of(pool, 100 * KiB, 24, 512, true));
         CHECK(pool.consistent());
         return result;
       }},
      {"StreamUsesPool<StreamCachingPool<SimulatedCard, SimulatedStreams>>", "mr/stream_uses_pool.hpp",
       [] {
         using Caching = carve::StreamCachingPool<carve::SimulatedCard, carve::SimulatedStreams>;
         carve::StreamUsesPool<Caching> pool(
             std::piecewise_construct,
             std::forward_as_tuple(carve::SimulatedCard(4 * MiB), pool_options, carve::SimulatedStreams(2)),
             carve::SimulatedStreams(2));
         const ContractResult result = check(pool, shape_of(pool.pool(), 100 * KiB, 24, 512, true));
         CHECK(pool.pool().consistent());
         CHECK(pool.stats().held_frees == 0);
         return result;
       }},
      {"TraceResource<CachingPool<SimulatedCard>>", "mr/trace_resource.hpp",
       [] {
         std::ostringstream lines;
         carve::TraceResource<Pool> traced(std::piecewise_construct,
                                           std::forward_as_tuple(carve::SimulatedCard(4 * MiB), pool_options),
                                           std::make_shared<carve::TraceLog>(lines));
         const ContractResult result = check(traced, shape_of(traced, 100 * KiB, 24, 512, true));
         CHECK(lines.str().find("not allocated") != std::string::npos); // the refused frees, recorded
         return result;
       }},
      {"AddressOnlyCard", "mr/address_only_card.hpp",
       [] {
         carve::AddressOnlyCard card(128 * MiB);
         ResourceShape shape = shape_of(card, 3 * MiB, 16, 4 * KiB, false);
         shape.bytes_addressable = false; // its addresses fault when touched
         return check(card, shape);
       }},

      // Cards other processes can map.
      {"SharedMemoryCard", "service/shared_memory_card.hpp",
       [] {
         carve::SharedMemoryCard card(4 * MiB);
         return check(card, shape_of(card, 100 * KiB, 16, carve::os_page_size(), true));
       }},
      {"LeasedUpstream<SharedMemoryCard>", "service/leased_upstream.hpp",
       [] {
         carve::service::LeasedUpstream<carve::SharedMemoryCard> card(carve::SharedMemoryCard(4 * MiB));
         return check(card, shape_of(card, 100 * KiB, 16, carve::os_page_size(), true));
       }},
      {"VmmCard<HostMemoryMapper>", "vmm/vmm_card.hpp",
       [] {
         carve::VmmCard<carve::HostMemoryMapper> card(carve::HostMemoryMapper({.granularity = 64 * KiB}), 0, 4 * MiB);
         return check(card, shape_of(card, 70 * KiB, 16, 64 * KiB, true));
       }},
      {"ExpandablePool<HostMemoryMapper>", "vmm/expandable_pool.hpp",
       [] {
         carve::ExpandablePool<carve::HostMemoryMapper> pool(carve::HostMemoryMapper({.granularity = 64 * KiB}),
                                                             {.max_reserved_bytes = 4 * MiB});
         const ContractResult result = check(pool, shape_of(pool, 100 * KiB, 24, 64 * KiB, true));
         CHECK(pool.consistent());
         return result;
       }},
      {"AllocationClient (a server thread in this process)", "service/allocation_client.hpp",
       []() -> std::optional<ContractResult> {
         using namespace std::chrono_literals;
         TempDir dir;
         std::vector<carve::SharedMemoryCard> cards;
         for (int i = 0; i < carve::test::dgx1().gpu_count(); ++i) {
           cards.emplace_back(1 * MiB);
         }
         carve::service::ServerOptions options;
         options.socket_path = dir.path() / "served.sock";
         carve::AllocationServer<carve::SharedMemoryCard> server(carve::test::dgx1(), cards, options);
         std::thread serving([&] { server.run(); });
         std::optional<ContractResult> result;
         {
           auto client = carve::AllocationClient::connect({options.socket_path, "contract", 30s});
           if (client) {
             // Its regions are mapped pages; a request past card 0 is borrowed from the others,
             // so only more than all eight cards hold never fits.
             result = check(*client, {.largest_request = 20 * KiB,
                                      .batch = 12,
                                      .max_alignment = 4 * KiB,
                                      .refuses_coarser_alignment = false,
                                      .never_fits = 8 * MiB + 1});
           }
           CHECK(client.has_value());
         }
         server.request_stop();
         serving.join();
         return result;
       }},

      // Borrowed memory and mirrors.
      {"BorrowingAllocator<CachingPool<SimulatedCard>>::Card (card and peers)", "borrow/borrowing_allocator.hpp",
       [] {
         Borrower borrower(carve::Topology::from_nvidia_smi(four_gpus), borrower_pools());
         auto card = borrower.card(0);
         ContractResult result = check(card, shape_of(card, 100 * KiB, 16, 512, true));
         auto peers = borrower.peers(0);
         const ContractResult borrowed = check(peers, shape_of(peers, 100 * KiB, 16, 512, true));
         CHECK_MESSAGE(borrowed.passed(), (std::string("peers(0): ") + borrowed.what()));
         CHECK(borrower.live_blocks() == 0);
         return result;
       }},
      {"PagedMirror<HostMirrorBackend<>>", "mirror/paged_mirror.hpp",
       [] {
         carve::HostMirrorBackend<> devices;
         devices.register_device(carve::SimulatedCard(1 * MiB));
         devices.register_device(carve::SimulatedCard(1 * MiB));
         carve::PagedMirror mirror(devices, {.page_size = 64 * KiB, .tracking = carve::WriteTracking::explicit_calls});
         return check(mirror, shape_of(mirror, 60 * KiB, 12, 64 * KiB, true));
       }},

      // Spill tiers.
      {"MappedFileResource", "tier/tier_resources.hpp",
       [] {
         TempDir dir;
         carve::MappedFileResource files(dir.path(), 4 * MiB);
         return check(files, shape_of(files, 100 * KiB, 12, 4 * KiB, false)); // any alignment up to 1 GiB
       }},
      {"NumaNodeResource", "tier/tier_resources.hpp",
       []() -> std::optional<ContractResult> {
         std::optional<carve::NumaNodeResource> node;
         try {
           node.emplace(0, 4 * MiB);
         } catch (const carve::Exception&) { // no libnuma in this build, or no NUMA here
           return std::nullopt;
         }
         return check(*node, shape_of(*node, 100 * KiB, 12, 4 * KiB, false));
       }},
      {"TierShareResource", "tier/tier_share_resource.hpp",
       [] {
         TempDir dir;
         const carve::TierPlanner planner({{0, 4 * MiB}, {1, 4 * MiB}},
                                          {carve::disk_tier(dir.path(), 1, "disk", 16 * MiB)});
         const auto plan = planner.plan({{20 * MiB, {10 * MiB, 10 * MiB}}});
         carve::TierShareResource share(plan, 1, 0);
         return check(share, shape_of(share, 100 * KiB, 12, 4 * KiB, false));
       }},
  };
  return runs;
}

// Headers that declare a try_allocate no entry above runs, and why.
const std::vector<std::pair<std::string, std::string>> run_elsewhere = {
    {"mr/memory_resource.hpp", "the concept's archetypes, never called"},
    {"mr/cuda_device_resource.hpp", "cudaMalloc: test_resource_contract.cu runs it where a GPU is"},
    {"mr/detail/shared_upstream.hpp", "the upstream handle of StreamCachingPool's streams' pools: run through it"},
};

// A slot arena with one flaw of the kind the contract is there to find.
enum class Flaw { none, overlapping, misaligned, leaking, wrong_error, full_is_invalid, double_free_accepted };

class FlawedArena {
public:
  explicit FlawedArena(Flaw flaw) : flaw_(flaw), arena_(heap_->bytes, sizeof heap_->bytes, slot_bytes) {}

  cuda::std::expected<void*, carve::Errc> try_allocate(std::size_t bytes, std::size_t alignment) noexcept {
    if (flaw_ == Flaw::wrong_error && bytes == 0) {
      return cuda::std::unexpected(carve::Errc::no_space);
    }
    auto p = arena_.try_allocate(bytes, alignment);
    if (flaw_ == Flaw::full_is_invalid && !p && p.error() == carve::Errc::no_space) {
      return cuda::std::unexpected(carve::Errc::invalid_size);
    }
    if (p && flaw_ == Flaw::overlapping && bytes > 1) {
      last_ = static_cast<std::byte*>(*p) + bytes / 2; // the back half of this block, again
      return p;
    }
    if (p && flaw_ == Flaw::overlapping && last_ != nullptr && alignment == 1) {
      return static_cast<void*>(last_);
    }
    if (p && flaw_ == Flaw::misaligned && alignment == 8) {
      return static_cast<void*>(static_cast<std::byte*>(*p) + 4);
    }
    return p;
  }
  void deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept {
    (void)try_deallocate(p, bytes, alignment);
  }
  cuda::std::expected<void, carve::Errc> try_deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept {
    if (flaw_ == Flaw::leaking) {
      return {};
    }
    const auto r = arena_.try_deallocate(p, bytes, alignment);
    if (flaw_ == Flaw::overlapping || flaw_ == Flaw::misaligned) {
      return {}; // the blocks it made up go nowhere
    }
    const bool slot_start =
        arena_.owns(p) && (static_cast<const std::byte*>(p) - static_cast<const std::byte*>(arena_.base())) %
                                  static_cast<std::ptrdiff_t>(slot_bytes) ==
                              0;
    if (flaw_ == Flaw::double_free_accepted && slot_start) {
      return {};
    }
    return r;
  }
  bool owns(const void* p) const noexcept { return arena_.owns(p); }
  std::size_t free_bytes() const noexcept { return arena_.free_bytes(); }

private:
  Flaw flaw_;
  std::unique_ptr<ArenaBytes> heap_ = std::make_unique<ArenaBytes>();
  carve::SlotArena<carve::SlotAllocator<arena_slots>> arena_;
  std::byte* last_ = nullptr;
};
static_assert(carve::MemoryResource<FlawedArena> && carve::ChecksDeallocation<FlawedArena>);

} // namespace

TEST_CASE("the contract finds each flaw it is there to find") {
  const auto first_failure = [](Flaw flaw) {
    FlawedArena arena(flaw);
    const ContractResult r = check(arena, arena_shape);
    return std::string(r.what());
  };
  CHECK(first_failure(Flaw::none).empty());
  CHECK(first_failure(Flaw::overlapping) == "no two live blocks overlap");
  CHECK(first_failure(Flaw::misaligned) == "every block is aligned as asked");
  CHECK(first_failure(Flaw::leaking) == "every byte comes back: free_bytes as it started");
  CHECK(first_failure(Flaw::wrong_error) == "0 bytes: invalid_size");
  CHECK(first_failure(Flaw::full_is_invalid) == "more than it could ever hold: no_space");
  CHECK(first_failure(Flaw::double_free_accepted) == "a double free: not_allocated");
}

TEST_CASE("every memory resource keeps the contract") {
  std::size_t ran = 0;
  for (const ContractRun& r : contract_runs()) {
    const std::string resource = r.resource;
    INFO(resource);
    const std::optional<ContractResult> result = r.run();
    if (!result) {
      MESSAGE((resource + ": cannot be made on this machine, not run"));
      continue;
    }
    ++ran;
    CHECK_MESSAGE(result->passed(), (resource + ": " + result->what() + " (" + std::to_string(result->failures) +
                                     " of " + std::to_string(result->checks) + " checks failed)"));
    CHECK(result->checks > 20); // the run made the contract's checks, not a few
  }
  CHECK(ran + 1 >= contract_runs().size()); // at most NUMA nodes missing here
}

// Calls visit(path, path under include/carve, text) for every header carve has.
template <class Visit>
void for_each_header(Visit&& visit) {
  const std::filesystem::path root = CARVE_INCLUDE_DIR "/carve";
  for (const auto& entry : std::filesystem::recursive_directory_iterator(root)) {
    if (entry.path().extension() != ".hpp") {
      continue;
    }
    std::ifstream in(entry.path());
    std::ostringstream text;
    text << in.rdbuf();
    visit(entry.path(), entry.path().lexically_relative(root).generic_string(), text.str());
  }
}

TEST_CASE("every header that declares a try_allocate has its resource in the contract's list") {
  std::set<std::string> listed;
  for (const ContractRun& r : contract_runs()) {
    listed.insert(r.header);
  }
  for (const auto& [header, why] : run_elsewhere) {
    listed.insert(header);
  }
  const std::regex declaration(R"(expected<void\*, (carve::)?Errc>\s*try_allocate\()");
  std::size_t declaring = 0;
  for_each_header([&](const std::filesystem::path&, const std::string& header, const std::string& text) {
    if (!std::regex_search(text, declaration)) {
      return;
    }
    ++declaring;
    CHECK_MESSAGE(listed.count(header) == 1, (header + " declares a resource the contract does not run"));
  });
  CHECK(declaring >= 20); // the search found carve's resources at all
}

TEST_CASE("every resource that can allocate in device code runs the contract in kernels too") {
  // A class with a __host__ __device__ try_allocate (outside detail namespaces) must be built in
  // test_resource_contract.cu, whose kernels run the contract where a GPU is present: its name,
  // carve::Name, must appear there. The class is the header's, named as the file is.
  // Any spelling of the return type: the macro, then no statement or body before the name.
  const std::regex device_allocate(R"(CARVE_HOST_DEVICE[^;{}]*\btry_allocate\s*\()");
  std::ifstream kernels(CARVE_TESTS_DIR "/mr/test_resource_contract.cu");
  std::ostringstream kernel_text;
  kernel_text << kernels.rdbuf();
  REQUIRE(kernel_text.str().find("run_contract") != std::string::npos);
  std::size_t capable = 0;
  for_each_header([&](const std::filesystem::path& path, const std::string&, const std::string& text) {
    std::string code = text; // without its detail namespaces (std::regex recurses per character on them)
    for (std::size_t at = code.find("namespace detail {"); at != std::string::npos;
         at = code.find("namespace detail {", at)) {
      const std::size_t end = code.find("} // namespace detail", at);
      REQUIRE_MESSAGE(end != std::string::npos, (path.string() + ": a detail namespace without its closing comment"));
      code.erase(at, end - at);
    }
    if (!std::regex_search(code, device_allocate)) {
      return;
    }
    ++capable;
    std::string name; // limit_resource.hpp -> LimitResource
    bool upper = true;
    for (const char c : path.stem().string()) {
      if (c == '_') {
        upper = true;
        continue;
      }
      name += upper ? static_cast<char>(std::toupper(static_cast<unsigned char>(c))) : c;
      upper = false;
    }
    CHECK_MESSAGE(kernel_text.str().find("carve::" + name + "<") != std::string::npos,
                  (path.filename().string() + ": carve::" + name +
                   " can allocate in device code but test_resource_contract.cu never builds it"));
  });
  CHECK(capable >= 6); // the arena and the combinators were found at all
}

} // namespace test_resource_contract
