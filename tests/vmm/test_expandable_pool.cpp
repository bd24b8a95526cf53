// ExpandablePool on the host twin of the VMM driver: placement and mappings against a reference
// model, growth by chunks, the cap and the device's refusals (nothing changes), streams, the idle
// threshold, stacking under the combinators, threads, and memory that is never touched.
#include "support/errors.hpp"
#include "support/refusing_mapper.hpp"
#include "support/resident_memory.hpp"
#include "support/waiting_streams.hpp"

#include <carve/mr.hpp>
#include <carve/vmm.hpp>
#include <carve/vmm/detail/partial_map_probe.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

// In a namespace of its own: the area's test files compile as one translation unit.
namespace test_expandable_pool {

using carve::Errc;
using carve::ExpandablePool;
using carve::ExpandablePoolOptions;
using carve::HostMemoryMapper;

namespace {

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t granule = 64 * KiB;

using Pool = ExpandablePool<HostMemoryMapper>;

static_assert(carve::MemoryResource<Pool> && carve::UpstreamResource<Pool> && carve::OwnsMemory<Pool> &&
              carve::Trimmable<Pool> && carve::ReportsStats<Pool> && carve::ChecksDeallocation<Pool>);
static_assert(carve::SynchronousResource<Pool>);
static_assert(std::is_nothrow_move_constructible_v<Pool>);

HostMemoryMapper mapper() { return HostMemoryMapper({.granularity = granule}); }

// A small pool: 64 KiB granules, 16 MiB of addresses per stream.
ExpandablePoolOptions small(ExpandablePoolOptions o = {}) {
  o.address_space_bytes = 16 * MiB;
  return o;
}

std::vector<std::pair<std::uintptr_t, std::size_t>> chunks_of(const auto& pool) {
  std::vector<std::pair<std::uintptr_t, std::size_t>> out;
  pool.for_each_chunk([&](std::uintptr_t start, std::size_t bytes) { out.emplace_back(start, bytes); });
  return out;
}

// The pool's rules written the slow way, for one reservation with growth_divisor 0 and
// release_threshold 0: blocks placed best fit (smallest free range, lowest address); each run of
// unmapped granules a block touches becomes one chunk; a chunk no block touches is unmapped.
struct ReferencePool {
  std::uintptr_t base = 0;
  std::size_t bytes = 0;
  std::map<std::uintptr_t, std::size_t> free; // start -> size
  std::map<std::uintptr_t, std::size_t> live; // start -> size
  std::map<std::size_t, std::size_t> chunks;  // first granule -> granules

  std::uintptr_t allocate(std::size_t size) {
    auto best = free.end();
    for (auto it = free.begin(); it != free.end(); ++it) {
      if (it->second >= size && (best == free.end() || it->second < best->second)) {
        best = it;
      }
    }
    REQUIRE(best != free.end());
    const auto [start, length] = *best;
    free.erase(best);
    if (length > size) {
      free[start + size] = length - size;
    }
    live[start] = size;
    const std::size_t first = (start - base) / granule;
    const std::size_t last = (start - base + size - 1) / granule;
    for (std::size_t g = first; g <= last;) {
      if (mapped(g)) {
        ++g;
        continue;
      }
      std::size_t end = g;
      while (end <= last && !mapped(end)) {
        ++end;
      }
      chunks[g] = end - g;
      g = end;
    }
    return start;
  }
  void deallocate(std::uintptr_t start) {
    std::size_t size = live.at(start);
    live.erase(start);
    std::uintptr_t at = start;
    auto next = free.lower_bound(at);
    if (next != free.end() && next->first == at + size) {
      size += next->second;
      next = free.erase(next);
    }
    if (next != free.begin() && std::prev(next)->first + std::prev(next)->second == at) {
      at = std::prev(next)->first;
      size += std::prev(next)->second;
    }
    free[at] = size;
    for (auto it = chunks.begin(); it != chunks.end();) {
      const std::uintptr_t c0 = base + it->first * granule;
      const std::uintptr_t c1 = c0 + it->second * granule;
      const bool touched =
          std::any_of(live.begin(), live.end(), [&](const auto& b) { return b.first < c1 && b.first + b.second > c0; });
      it = touched ? std::next(it) : chunks.erase(it);
    }
  }
  bool mapped(std::size_t g) const {
    auto it = chunks.upper_bound(g);
    return it != chunks.begin() && g < std::prev(it)->first + std::prev(it)->second;
  }
  std::vector<std::pair<std::uintptr_t, std::size_t>> chunk_list() const {
    std::vector<std::pair<std::uintptr_t, std::size_t>> out;
    for (const auto& [g, n] : chunks) {
      out.emplace_back(base + g * granule, n * granule);
    }
    return out;
  }
};

using carve::test::RefusingMapper;

// One chunk of 8 granules: a at [0, 2) and c at [4, 6) pin it around a hole at [2, 4), where b
// was; its end, [6, 8), is free and mapped.
struct PinnedHole {
  unsigned char* base;
  void* a;
  void* c;
};
PinnedHole pin_a_hole(Pool& pool) {
  const auto at = [](void* p) { return static_cast<unsigned char*>(p); };
  void* x = *pool.try_allocate(8 * granule, 512);
  pool.deallocate(x, 8 * granule, 512);
  void* a = *pool.try_allocate(2 * granule, 512); // a, b and c refill the chunk from its start
  void* b = *pool.try_allocate(2 * granule, 512);
  void* c = *pool.try_allocate(2 * granule, 512);
  REQUIRE((at(a) == at(x) && at(b) == at(x) + 2 * granule && at(c) == at(x) + 4 * granule));
  pool.deallocate(b, 2 * granule, 512);
  return {at(x), a, c};
}

// d, four granules at 6 on the chunk's end and two past it, holds the hole's memory there with no
// new memory mapped, and a and c keep their bytes.
void check_lent_to(const Pool& pool, const PinnedHole& h, void* d) {
  const auto at = [](void* p) { return static_cast<unsigned char*>(p); };
  CHECK(at(d) == h.base + 6 * granule);
  const auto st = pool.stats();
  CHECK(st.bytes_reserved == 8 * granule);
  CHECK(st.lent_bytes == 2 * granule);
  CHECK(st.creates == 1);
  CHECK(pool.consistent());
  std::memset(h.a, 1, 2 * granule);
  std::memset(h.c, 3, 2 * granule);
  std::memset(d, 4, 4 * granule);
  CHECK(h.base[2 * granule] == 4);
  CHECK((at(h.a)[2 * granule - 1] == 1 && at(h.c)[0] == 3 && at(h.c)[2 * granule - 1] == 3));
}

// Frees `blocks`, trims, and checks that nothing is left mapped.
void free_all(Pool& pool, const HostMemoryMapper& m, std::initializer_list<std::pair<void*, std::size_t>> blocks) {
  for (auto [p, n] : blocks) {
    pool.deallocate(p, n, 512);
  }
  pool.trim();
  CHECK(pool.stats().bytes_reserved == 0);
  CHECK(m.mapping_count() == 0);
  CHECK(m.physical_count() == 0);
  CHECK(pool.consistent());
}

} // namespace

TEST_CASE("blocks land best fit in one reservation, and memory is mapped where they land") {
  Pool pool(mapper(), small({.growth_divisor = 0}));
  CHECK(pool.stats().address_spaces == 0); // nothing reserved until the first allocation
  auto* a = static_cast<char*>(*pool.try_allocate(100 * KiB, 256));
  auto* b = static_cast<char*>(*pool.try_allocate(1000, 256));
  auto* c = static_cast<char*>(*pool.try_allocate(10 * KiB, 4096));
  CHECK(reinterpret_cast<std::uintptr_t>(a) % granule == 0); // the reservation's start
  CHECK(b == a + 100 * KiB);
  CHECK(c == b + 4 * KiB); // b is 1000 bytes rounded to 1 KiB; c starts at the next 4 KiB boundary
  std::memset(a, 1, 100 * KiB);
  std::memset(b, 2, 1000);
  std::memset(c, 3, 10 * KiB);
  auto s = pool.stats();
  CHECK(s.bytes_in_use == 111 * KiB);
  CHECK(s.bytes_reserved == 2 * granule); // a touches two granules; b and c fall in the second
  CHECK(s.chunks == 1);
  CHECK(s.device_calls() == 2); // one create and one map
  CHECK(s.accesses == 1);
  CHECK(pool.owns(a + 127 * KiB));
  CHECK_FALSE(pool.owns(a + 128 * KiB));
  pool.deallocate(b, 1000, 256);
  void* d = *pool.try_allocate(512, 256);
  CHECK(d == b); // the smallest hole that fits: b's 1 KiB and the 3 KiB before c
  pool.deallocate(a, 100 * KiB, 256);
  pool.deallocate(c, 10 * KiB, 4096);
  pool.deallocate(d, 512, 256);
  CHECK(pool.stats().bytes_reserved == 2 * granule); // kept for reuse by default
  CHECK(pool.trim() == 2 * granule);
  CHECK(pool.stats().bytes_reserved == 0);
  CHECK(pool.consistent());
}

TEST_CASE("placement and mappings follow a reference model, and no block's bytes are disturbed") {
  Pool pool(mapper(), small({.growth_divisor = 0, .release_threshold = 0}));
  ReferencePool ref;
  std::mt19937_64 rng(11);
  struct Block {
    std::uintptr_t start;
    std::size_t bytes;
    unsigned char fill;
  };
  std::vector<Block> live;
  for (int step = 0; step < 3000; ++step) {
    if (live.empty() || rng() % 100 < 52) {
      const std::size_t bytes = rng() % 8 == 0 ? (rng() % 300 + 1) * KiB : rng() % (16 * KiB) + 1;
      const auto p = pool.try_allocate(bytes, 512);
      REQUIRE(p);
      const auto start = reinterpret_cast<std::uintptr_t>(*p);
      if (ref.base == 0) {
        ref.base = start;
        ref.bytes = 16 * MiB;
        ref.free[start] = ref.bytes;
      }
      const std::size_t size = (bytes + 511) / 512 * 512;
      REQUIRE(ref.allocate(size) == start);
      const auto fill = static_cast<unsigned char>(rng());
      std::memset(*p, fill, bytes);
      live.push_back({start, bytes, fill});
    } else {
      const std::size_t k = rng() % live.size();
      const Block b = live[k];
      live[k] = live.back();
      live.pop_back();
      const auto* bytes = reinterpret_cast<const unsigned char*>(b.start);
      REQUIRE(std::all_of(bytes, bytes + b.bytes, [&](unsigned char v) { return v == b.fill; }));
      REQUIRE(pool.try_deallocate(reinterpret_cast<void*>(b.start), b.bytes, 512));
      ref.deallocate(b.start);
    }
    REQUIRE(chunks_of(pool) == ref.chunk_list());
    if (step % 101 == 0) {
      REQUIRE(pool.consistent());
    }
  }
  std::size_t in_use = 0;
  for (const Block& b : live) {
    in_use += (b.bytes + 511) / 512 * 512;
  }
  const auto s = pool.stats();
  CHECK(s.bytes_in_use == in_use);
  std::size_t mapped = 0;
  for (const auto& [start, bytes] : ref.chunk_list()) {
    mapped += bytes;
  }
  CHECK(s.bytes_reserved == mapped);
  CHECK(s.peak_reserved >= s.bytes_reserved);
  CHECK(pool.consistent());
}

TEST_CASE("growth by chunks: few driver calls, and the unused end bounded by the growth divisor") {
  constexpr std::size_t no_line = std::numeric_limits<std::size_t>::max(); // growth alone decides
  Pool pool(mapper(), small({.growth_divisor = 8, .headroom_permille = no_line}));
  std::vector<void*> blocks;
  for (int i = 0; i < 1000; ++i) { // 8 MiB of 8 KiB blocks: 128 granules
    blocks.push_back(*pool.try_allocate(8 * KiB, 512));
    const auto s = pool.stats();
    REQUIRE(s.bytes_reserved - s.bytes_in_use <= std::max(granule, s.bytes_reserved / 8));
  }
  const auto s = pool.stats();
  CHECK(s.chunks < 40); // one per granule would be 125
  CHECK(s.device_calls() == 2 * s.chunks);
  for (void* p : blocks) {
    pool.deallocate(p, 8 * KiB, 512);
  }
  CHECK(pool.trim() == s.bytes_reserved);
}

TEST_CASE("bad requests and bad frees get an error and change nothing") {
  Pool pool(mapper(), small());
  void* p = *pool.try_allocate(5000, 256);
  const auto before = pool.stats();
  CHECK(pool.try_allocate(0, 256).error() == Errc::invalid_size);
  CHECK(pool.try_allocate(64, 3).error() == Errc::invalid_size);
  CHECK(pool.try_allocate(64, 2 * granule).error() == Errc::no_space);   // beyond the device's granularity
  CHECK(pool.try_allocate(SIZE_MAX, 256).error() == Errc::invalid_size); // overflows when rounded
  CHECK(pool.try_allocate(17 * MiB, 256).error() == Errc::no_space);     // beyond the address space
  int on_stack = 0;
  CHECK(pool.try_deallocate(&on_stack, 4, 256).error() == Errc::not_allocated);
  CHECK(pool.try_deallocate(nullptr, 4, 256).error() == Errc::not_allocated);
  CHECK(pool.try_deallocate(p, 6000, 256).error() == Errc::invalid_size);
  // check_deallocate answers as the free would, and frees nothing.
  CHECK(pool.check_deallocate(&on_stack, 4, 256).error() == Errc::not_allocated);
  CHECK(pool.check_deallocate(p, 6000, 256).error() == Errc::invalid_size);
  CHECK(pool.check_deallocate(p, 5000, 256));
  const auto after = pool.stats();
  CHECK(after.bytes_in_use == before.bytes_in_use);
  CHECK(after.bytes_reserved == before.bytes_reserved);
  CHECK(after.allocations == before.allocations);
  CHECK(pool.consistent());
  CHECK(pool.try_deallocate(p, 5000, 256));
  CHECK(pool.check_deallocate(p, 5000, 256).error() == Errc::not_allocated);
  CHECK(pool.try_deallocate(p, 5000, 256).error() == Errc::not_allocated);
  CHECK(carve::test::thrown_code([] { Pool(mapper(), {.granularity = 3}); }) == Errc::invalid_argument);
  CHECK(carve::test::thrown_code([] { Pool(mapper(), {.granularity = 2 * granule}); }) == Errc::invalid_argument);
  CHECK(carve::test::thrown_code([] { Pool(mapper(), {.device = 3}); }) == Errc::out_of_range);
}

TEST_CASE("the cap: idle chunks are unmapped to make room, and a request past it changes nothing") {
  Pool pool(mapper(), small({.max_reserved_bytes = 8 * granule, .growth_divisor = 0}));
  void* a = *pool.try_allocate(2 * granule, 512);
  void* b = *pool.try_allocate(3 * granule, 512);
  void* c = *pool.try_allocate(3 * granule, 512);
  const auto full = pool.stats();
  CHECK(full.bytes_reserved == 8 * granule);
  CHECK(pool.try_allocate(1, 512).error() == Errc::no_space);
  CHECK(pool.stats().bytes_reserved == full.bytes_reserved);
  CHECK(pool.stats().bytes_in_use == full.bytes_in_use);
  CHECK(pool.free_bytes() == 0);
  pool.deallocate(a, 2 * granule, 512); // idle, still mapped
  pool.deallocate(c, 3 * granule, 512);
  CHECK(pool.stats().bytes_reserved == 8 * granule);
  void* d = *pool.try_allocate(2 * granule, 512); // a's range, mapped already
  CHECK(d == a);
  CHECK(pool.stats().device_calls() == full.device_calls());
  pool.deallocate(d, 2 * granule, 512);
  // Four granules fit only after b: one more granule than is mapped there, and none left under the
  // cap until the idle chunks are unmapped.
  void* e = *pool.try_allocate(4 * granule, 512);
  CHECK(e == c);
  CHECK(pool.stats().bytes_reserved == 7 * granule);
  CHECK(pool.try_allocate(2 * granule, 512).error() == Errc::no_space); // 9 granules would pass the cap
  CHECK(pool.stats().bytes_reserved == 7 * granule);
  pool.deallocate(b, 3 * granule, 512);
  pool.deallocate(e, 4 * granule, 512);
  CHECK(pool.consistent());
}

TEST_CASE("grant_access: a peer reads and writes every chunk, mapped before or after, in every reservation") {
  using carve::Access;
  RefusingMapper m({.granularity = granule, .device_count = 3});
  ExpandablePool<RefusingMapper> pool(m, small({.growth_divisor = 0}));
  const auto right = [&](void* p, int device) { return *m.access(p, device); };
  void* a = *pool.try_allocate(granule, 512);
  CHECK(right(a, 1) == Access::none);
  const auto before = pool.stats().accesses;
  REQUIRE(pool.grant_access(1));
  CHECK(pool.stats().accesses == before + 1); // one grant for the one chunk
  CHECK(right(a, 1) == Access::read_write);
  CHECK(right(a, 2) == Access::none);
  void* b = *pool.try_allocate(3 * granule, 512); // a chunk mapped after the grant
  CHECK(right(b, 1) == Access::read_write);
  CHECK(right(b, 0) == Access::read_write);
  void* c = *pool.try_allocate(carve::SynchronousStreams::stream_type{}, granule, 512); // a stream's own reservation
  CHECK(pool.stats().address_spaces == 2);
  CHECK(right(c, 1) == Access::read_write);

  // The pool's own device, a device already granted: nothing to do.
  const auto granted = pool.stats().accesses;
  REQUIRE(pool.grant_access(0));
  REQUIRE(pool.grant_access(1));
  CHECK(pool.stats().accesses == granted);
  CHECK(pool.grant_access(64).error().code == Errc::invalid_argument);
  CHECK(pool.grant_access(-1).error().code == Errc::invalid_argument);

  // Refused on the second of three chunks: the first is closed again, and later chunks are not opened.
  *m.peer_grants_left = 1;
  const auto refused = pool.grant_access(2);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().message.find("CUDA_ERROR_INVALID_DEVICE") != std::string::npos);
  CHECK(right(a, 2) == Access::none);
  CHECK(right(b, 2) == Access::none);
  CHECK(right(c, 2) == Access::none);
  *m.peer_grants_left = 1 << 30;
  void* d = *pool.try_allocate(granule, 512);
  CHECK(right(d, 2) == Access::none);
  CHECK(right(d, 1) == Access::read_write);

  // A new chunk the driver refuses to open to a peer serves its own device, closed to that peer;
  // the next chunk is offered to the peer again.
  *m.peer_grants_left = 0;
  void* e = *pool.try_allocate(2 * granule, 512);
  CHECK(right(e, 0) == Access::read_write);
  CHECK(right(e, 1) == Access::none);
  CHECK(pool.stats().peer_refusals == 1);
  *m.peer_grants_left = 1 << 30;
  void* f = *pool.try_allocate(granule, 512);
  CHECK(right(f, 1) == Access::read_write);

  for (void* p : {a, d, f}) {
    pool.deallocate(p, granule, 512);
  }
  pool.deallocate(e, 2 * granule, 512);
  pool.deallocate(b, 3 * granule, 512);
  pool.deallocate(carve::SynchronousStreams::stream_type{}, c, granule, 512);
  CHECK(pool.consistent());
}

TEST_CASE("a device that refuses memory: no_space, its reason kept, nothing left mapped") {
  RefusingMapper m({.granularity = granule});
  ExpandablePool<RefusingMapper> pool(m, small({.growth_divisor = 0}));
  void* a = *pool.try_allocate(granule, 512);
  *m.creates_left = 0;
  const auto before = pool.stats();
  CHECK(pool.try_allocate(3 * granule, 512).error() == Errc::no_space);
  CHECK(pool.last_failure().find("CUDA_ERROR_OUT_OF_MEMORY") != std::string::npos);
  CHECK(pool.stats().bytes_reserved == before.bytes_reserved);
  CHECK(m.mapping_count() == 1);
  CHECK(m.physical_count() == 1); // a mapped chunk keeps its handle; refused ones never made
  *m.creates_left = 1 << 30;
  *m.maps_left = 0;
  CHECK(pool.try_allocate(3 * granule, 512).error() == Errc::no_space);
  CHECK(pool.last_failure().find("cuMemMap") != std::string::npos);
  CHECK(m.mapping_count() == 1);
  CHECK(m.physical_count() == 1); // the refused map's handle was released; a's chunk keeps its own
  *m.maps_left = 1 << 30;
  void* b = *pool.try_allocate(3 * granule, 512);
  CHECK(pool.consistent());
  pool.deallocate(a, granule, 512);
  pool.deallocate(b, 3 * granule, 512);
  CHECK(pool.stats().mapper_failures == 2);
}

TEST_CASE("streams: a block freed on another stream waits for that stream's work") {
  using StreamPool = ExpandablePool<HostMemoryMapper, carve::SimulatedStreams>;
  StreamPool pool(mapper(), small({.growth_divisor = 0}), carve::SimulatedStreams(2));
  const carve::SimulatedStream s0{0};
  const carve::SimulatedStream s1{1};
  void* a = *pool.try_allocate(s0, 4 * KiB, 256);
  void* b = *pool.try_allocate(s1, 4 * KiB, 256);
  CHECK(pool.stats().address_spaces == 2); // one reservation per stream
  pool.deallocate(s0, a, 4 * KiB, 256);
  CHECK(*pool.try_allocate(s0, 4 * KiB, 256) == a); // the same stream: at once
  pool.streams().enqueue(s1);                       // s1 still has work that may use `a`
  pool.deallocate(s1, a, 4 * KiB, 256);
  CHECK(pool.stats().pending_frees == 1);
  void* c = *pool.try_allocate(s0, 4 * KiB, 256);
  CHECK(c != a);
  pool.streams().complete(s1);
  void* d = *pool.try_allocate(s0, 4 * KiB, 256);
  CHECK(d == a); // s1 passed the free: `a` is free again in s0's reservation
  CHECK(pool.stats().pending_frees == 0);
  pool.deallocate(a, 4 * KiB, 256); // synchronous: free at once
  CHECK(*pool.try_allocate(s0, 4 * KiB, 256) == a);
  CHECK(pool.consistent());
  pool.deallocate(s0, a, 4 * KiB, 256);
  pool.deallocate(s0, c, 4 * KiB, 256);
  pool.deallocate(s1, b, 4 * KiB, 256);
  CHECK(pool.trim() == 2 * granule);
}

// SimulatedStreams that count the events the pool holds, so a test sees each one given back.
struct CountingStreams {
  using stream_type = carve::SimulatedStream;
  using event_type = carve::SimulatedStreams::event_type;
  carve::SimulatedStreams inner{2};
  std::shared_ptr<long> held = std::make_shared<long>(0);
  carve::Result<event_type> record(stream_type s) {
    auto e = inner.record(s);
    *held += e ? 1 : 0;
    return e;
  }
  bool completed(event_type e) const { return inner.completed(e); }
  void release(event_type) noexcept { --*held; }
};
static_assert(carve::StreamEvents<CountingStreams> && !carve::StreamEventsThatWait<CountingStreams>);

TEST_CASE("streams: memory freed on a stream stays mapped until the stream's work has run") {
  using StreamPool = ExpandablePool<HostMemoryMapper, CountingStreams>;
  const carve::SimulatedStream s0{0};
  const carve::SimulatedStream s1{1};
  std::shared_ptr<long> held;
  std::shared_ptr<long> held_capped;
  {
    StreamPool pool(mapper(), small({.growth_divisor = 0, .release_threshold = 0}));
    held = pool.streams().held;
    void* a = *pool.try_allocate(s0, granule, 512);
    void* b = *pool.try_allocate(s0, granule, 512);
    pool.streams().inner.enqueue(s0); // a kernel that uses a and b
    pool.deallocate(s0, a, granule, 512);
    CHECK(pool.stats().bytes_reserved == 2 * granule); // idle past the threshold, but the kernel may run yet
    CHECK(pool.trim() == 0);                           // these streams cannot be waited on: nothing goes
    CHECK(*pool.try_allocate(s0, granule, 512) == a);  // the stream itself may reuse it at once
    pool.deallocate(s0, a, granule, 512);
    pool.streams().inner.complete(s0);
    pool.deallocate(s0, b, granule, 512); // the kernel has run: both chunks go at this free
    CHECK(pool.stats().bytes_reserved == 0);
    CHECK(pool.consistent());

    // Under pressure, another stream does not get memory s0's queued work may still touch.
    StreamPool capped(mapper(), small({.max_reserved_bytes = 2 * granule, .growth_divisor = 0}));
    void* c = *capped.try_allocate(s0, 2 * granule, 512);
    capped.streams().inner.enqueue(s0);
    capped.deallocate(s0, c, 2 * granule, 512);
    CHECK(capped.try_allocate(s1, granule, 512).error() == Errc::no_space);
    CHECK(capped.stats().bytes_reserved == 2 * granule);
    capped.streams().inner.complete(s0);
    void* d = *capped.try_allocate(s1, granule, 512); // s0's chunk unmapped, s1's mapped
    CHECK(capped.stats().bytes_reserved == granule);
    capped.streams().inner.enqueue(s0);
    capped.deallocate(s0, d, granule, 512); // freed on another stream: its event is held when the pool goes
    CHECK(capped.stats().pending_frees == 1);
    CHECK(*capped.streams().held == 1);
    held_capped = capped.streams().held;
  }
  CHECK(*held == 0); // every event recorded was given back, the last ones at destruction
  CHECK(*held_capped == 0);
}

TEST_CASE("headroom: a growth chunk stops at the line, and the pool stays within it") {
  // 5%: 128 granules of 8 KiB blocks map in chunks of at most 5% of the peak, never past it.
  Pool pool(mapper(), small({.growth_divisor = 2, .headroom_permille = 50}));
  std::vector<void*> blocks;
  for (int i = 0; i < 1000; ++i) {
    blocks.push_back(*pool.try_allocate(8 * KiB, 512));
    const auto s = pool.stats();
    const std::size_t line = s.peak_in_use + s.peak_in_use / 1000 * 50;
    const std::size_t touched = (s.bytes_in_use + granule - 1) / granule * granule;
    REQUIRE(s.bytes_reserved <= std::max(line, touched)); // a chunk may map only what its block touches
  }
  const auto s = pool.stats();
  CHECK(s.chunks > 20);  // growth by halves alone would make about 7; the line makes more, smaller ones
  CHECK(s.chunks < 125); // one per granule
  for (void* p : blocks) {
    pool.deallocate(p, 8 * KiB, 512);
  }
  CHECK(pool.consistent());
}

TEST_CASE("headroom: before mapping past the line the pool unmaps idle chunks, highest first") {
  // Exact chunks; blocks [0,2) k [3,5) k [6,10) in granules, k kept live.
  const auto layout = [](Pool& pool) {
    std::vector<void*> b;
    for (const std::size_t n : {2u, 1u, 2u, 1u, 4u}) {
      b.push_back(*pool.try_allocate(n * granule, 512));
    }
    REQUIRE(chunks_of(pool).size() == 5);
    pool.deallocate(b[0], 2 * granule, 512);
    pool.deallocate(b[2], 2 * granule, 512); // two idle chunks of two granules: [0,2) and [3,5)
    return b;
  };
  const auto base = [](Pool& pool) { return chunks_of(pool).front().first; };
  { // No line: the 5-granule block maps at [10,15) and the idle chunks stay.
    Pool pool(mapper(), small({.growth_divisor = 0, .headroom_permille = std::numeric_limits<std::size_t>::max()}));
    layout(pool);
    void* big = *pool.try_allocate(5 * granule, 512);
    CHECK(pool.stats().bytes_reserved == 15 * granule);
    CHECK(pool.stats().unmaps == 0);
    pool.deallocate(big, 5 * granule, 512);
  }
  { // A line 20% over the peak of 11 granules (13.2): [3,5) goes, [0,2) is enough to keep.
    Pool pool(mapper(), small({.growth_divisor = 0, .headroom_permille = 200}));
    layout(pool);
    const std::uintptr_t start = base(pool);
    void* big = *pool.try_allocate(5 * granule, 512);
    CHECK(reinterpret_cast<std::uintptr_t>(big) == start + 10 * granule);
    const auto s = pool.stats();
    CHECK(s.bytes_reserved == 13 * granule);
    CHECK(s.peak_reserved == 13 * granule);
    CHECK(s.unmaps == 1);
    const auto now = chunks_of(pool);
    CHECK(std::find(now.begin(), now.end(), std::pair{start, 2 * granule}) != now.end());
    CHECK(std::find(now.begin(), now.end(), std::pair{start + 3 * granule, 2 * granule}) == now.end());
    CHECK(pool.consistent());
  }
  { // No headroom: both idle chunks go, and the pool never held more than its live peak.
    Pool pool(mapper(), small({.growth_divisor = 0, .headroom_permille = 0}));
    layout(pool);
    void* big = *pool.try_allocate(5 * granule, 512);
    CHECK(pool.stats().bytes_reserved == 11 * granule);
    CHECK(pool.stats().peak_reserved == 11 * granule);
    CHECK(pool.stats().unmaps == 2);
    pool.deallocate(big, 5 * granule, 512);
    CHECK(pool.consistent());
  }
}

TEST_CASE("held mappings: nothing is unmapped, by the line, the threshold, trim or the retry") {
  Pool pool(
      mapper(),
      small({.max_reserved_bytes = 4 * granule, .growth_divisor = 0, .release_threshold = 0, .headroom_permille = 0}));
  void* a = *pool.try_allocate(2 * granule, 512);
  void* keep = *pool.try_allocate(granule, 512);
  pool.hold(true); // a stream capture begins
  pool.deallocate(a, 2 * granule, 512);
  CHECK(pool.stats().bytes_reserved == 3 * granule); // threshold 0, yet still mapped
  CHECK(pool.trim() == 0);
  CHECK(pool.try_allocate(3 * granule, 512).error() == Errc::no_space); // past the cap: would need an unmap
  CHECK(pool.stats().unmaps == 0);
  pool.hold(false);                               // the capture ended
  void* b = *pool.try_allocate(3 * granule, 512); // the headroom line unmaps a's idle chunk now
  CHECK(pool.stats().unmaps == 1);
  CHECK(pool.stats().refusals_served == 0); // so the cap never refused it
  CHECK(pool.stats().bytes_reserved == 4 * granule);
  pool.deallocate(b, 3 * granule, 512);
  pool.deallocate(keep, granule, 512);
  CHECK(pool.consistent());
}

TEST_CASE("idle chunks: a hole mapped a second time is listed, to unmap in turn, but holds no memory") {
  carve::detail::IdleChunks idle;
  idle.fell_idle(0, 0x10000, 4 * KiB, 1);
  idle.fell_idle(0, 0x30000, 8 * KiB, 2, /*own_memory=*/false);
  CHECK(idle.bytes() == 4 * KiB); // what the release threshold weighs: memory, not mappings
  REQUIRE(idle.oldest());
  CHECK(idle.oldest()->start == 0x10000);
  idle.drop_oldest();
  CHECK(idle.bytes() == 0);
  REQUIRE(idle.oldest());
  CHECK(idle.oldest()->bytes == 8 * KiB);
  idle.unmapped(0, 0x30000, 8 * KiB);
  CHECK_FALSE(idle.oldest());
  CHECK(idle.bytes() == 0);
}

TEST_CASE("held: a block freed on another stream records its event only when the hold ends") {
  using StreamPool = ExpandablePool<HostMemoryMapper, CountingStreams>;
  const carve::SimulatedStream s0{0};
  const carve::SimulatedStream s1{1};
  StreamPool pool(mapper(), small({.growth_divisor = 0}));
  void* a = *pool.try_allocate(s0, granule, 512);
  pool.hold(true); // s1 may be capturing a graph: an event recorded there would never be recorded
  pool.streams().inner.enqueue(s1);
  pool.deallocate(s1, a, granule, 512);
  CHECK(pool.stats().pending_frees == 1);
  pool.streams().inner.complete(s1);
  void* b = *pool.try_allocate(s0, granule, 512);
  CHECK(b != a); // no event says s1 passed the free
  CHECK(*pool.streams().held == 0);
  pool.hold(false);
  pool.streams().inner.enqueue(s1); // the event recorded now comes after this work
  void* c = *pool.try_allocate(s0, granule, 512);
  CHECK(c != a);
  CHECK(*pool.streams().held == 1);
  pool.streams().inner.complete(s1);
  void* d = *pool.try_allocate(s0, granule, 512);
  CHECK(d == a);
  CHECK(*pool.streams().held == 0);
  for (void* p : {b, c, d}) {
    pool.deallocate(s0, p, granule, 512);
  }
  CHECK(pool.consistent());
}

TEST_CASE("headroom: memory freed on a stream whose work has not run is never unmapped for it") {
  using StreamPool = ExpandablePool<HostMemoryMapper, carve::SimulatedStreams>;
  StreamPool pool(mapper(), small({.growth_divisor = 0, .headroom_permille = 0}), carve::SimulatedStreams(1));
  const carve::SimulatedStream s0{0};
  void* a = *pool.try_allocate(s0, 2 * granule, 512);
  void* keep = *pool.try_allocate(s0, granule, 512);
  pool.streams().enqueue(s0); // a kernel still reading `a`
  pool.deallocate(s0, a, 2 * granule, 512);
  void* big = *pool.try_allocate(s0, 3 * granule, 512); // past the line: but `a`'s chunk is busy
  CHECK(pool.stats().unmaps == 0);
  CHECK(pool.stats().bytes_reserved == 6 * granule);
  pool.streams().complete(s0);
  pool.deallocate(s0, big, 3 * granule, 512);
  void* bigger = *pool.try_allocate(s0, 4 * granule, 512); // the line is 5 granules: idle memory goes
  CHECK(pool.stats().unmaps > 0);
  CHECK(pool.stats().bytes_reserved <= 5 * granule);
  pool.deallocate(s0, bigger, 4 * granule, 512);
  pool.deallocate(s0, keep, granule, 512);
  CHECK(pool.consistent());
}

// SimulatedStreams that can also wait, as CudaStreams can: waiting runs the stream's queued work
// (a GPU catching up with the host) and is counted.
class WaitingStreams {
public:
  using stream_type = carve::SimulatedStream;
  using event_type = carve::SimulatedStreams::event_type;

  carve::Result<event_type> record(stream_type s) { return streams.record(s); }
  bool completed(event_type e) const { return streams.completed(e); }
  void release(event_type e) noexcept { streams.release(e); }
  void wait(event_type e) noexcept {
    ++waits;
    streams.complete(stream_type{e.stream});
  }

  carve::SimulatedStreams streams{1};
  int waits = 0;
};
static_assert(carve::StreamEventsThatWait<WaitingStreams>);

TEST_CASE("headroom: where the streams can wait, idle chunks whose stream is still running are waited for") {
  ExpandablePool<HostMemoryMapper, WaitingStreams> pool(mapper(), small({.growth_divisor = 0, .headroom_permille = 0}),
                                                        WaitingStreams{});
  const carve::SimulatedStream s0{0};
  void* a = *pool.try_allocate(s0, 2 * granule, 512);
  void* keep = *pool.try_allocate(s0, granule, 512);
  pool.streams().streams.enqueue(s0); // a kernel still reading `a`
  pool.deallocate(s0, a, 2 * granule, 512);
  void* spare = *pool.try_allocate(s0, granule, 512); // fits in `a`'s chunk: nothing to map, no wait
  pool.deallocate(s0, spare, granule, 512);
  CHECK(pool.streams().waits == 0);
  void* big = *pool.try_allocate(s0, 3 * granule, 512); // past the line (4 granules): `a`'s chunk must go
  CHECK(pool.streams().waits == 1);
  CHECK(pool.stats().stream_waits == 1); // the pool counts the host sync it made
  CHECK(pool.streams().streams.pending(s0) == 0);
  CHECK(pool.stats().unmaps > 0);
  CHECK(pool.stats().bytes_reserved == 4 * granule);
  CHECK(pool.stats().peak_reserved == 4 * granule);
  pool.deallocate(s0, big, 3 * granule, 512);
  pool.deallocate(s0, keep, granule, 512);
  CHECK(pool.trim() == 4 * granule); // the stream's work has run: trim unmaps without waiting
  CHECK(pool.streams().waits == 1);
  CHECK(pool.stats().stream_waits == 1);
  CHECK(pool.consistent());
}

TEST_CASE("headroom: a chunk is unmapped once the work before its last free has run, not all the work queued since") {
  ExpandablePool<HostMemoryMapper, carve::test::WaitingSimulatedStreams> pool(
      mapper(), small({.growth_divisor = 0, .headroom_permille = 0}), carve::test::WaitingSimulatedStreams(1));
  const carve::SimulatedStream s0{0};
  // The first time, the pool has no event after `a`'s free (it records them once it has had to
  // wait): it waits for everything queued. The second time, for the kernel before `a`'s free only.
  for (const std::uint64_t left : {0u, 40u}) {
    CAPTURE(left);
    void* a = *pool.try_allocate(s0, 2 * granule, 512);
    void* keep = *pool.try_allocate(s0, 512, 512); // keep and wall pin the granule after `a`'s chunk
    void* filler = *pool.try_allocate(s0, granule - 1024, 512);
    void* wall = *pool.try_allocate(s0, 512, 512);
    REQUIRE(static_cast<char*>(keep) == static_cast<char*>(a) + 2 * granule);
    pool.streams().enqueue(s0); // a kernel reading `a`
    pool.deallocate(s0, a, 2 * granule, 512);
    pool.deallocate(s0, filler, granule - 1024, 512); // its hole: where best fit puts the blocks below
    for (int i = 0; i < 40; ++i) { // later kernels and frees on the same stream, away from `a`'s chunk
      void* t = *pool.try_allocate(s0, 512, 512);
      pool.streams().enqueue(s0);
      pool.deallocate(s0, t, 512, 512);
    }
    REQUIRE(pool.streams().pending(s0) == 41);
    const auto waits = pool.stats().stream_waits;
    void* big = *pool.try_allocate(s0, 3 * granule, 512); // past the line: `a`'s chunk must go
    CHECK(pool.stats().stream_waits == waits + 1);
    CHECK(pool.streams().pending(s0) == left);
    CHECK(pool.stats().bytes_reserved == 4 * granule);
    CHECK(pool.stats().peak_reserved == 4 * granule);
    pool.deallocate(s0, big, 3 * granule, 512);
    pool.deallocate(s0, keep, 512, 512);
    pool.deallocate(s0, wall, 512, 512);
    CHECK(pool.consistent());
    pool.streams().complete(s0);
    CHECK(pool.trim() == 4 * granule);
  }
  CHECK(pool.stats().stream_waits == 2);
}

TEST_CASE("headroom: a reservation whose stream has run is used before one is waited for") {
  ExpandablePool<HostMemoryMapper, WaitingStreams> pool(mapper(), small({.growth_divisor = 0, .headroom_permille = 0}),
                                                        WaitingStreams{});
  void* a = *pool.try_allocate(2 * granule, 512); // the synchronous reservation: its frees are settled
  const carve::SimulatedStream s0{0};
  void* b = *pool.try_allocate(s0, granule, 512);
  void* keep = *pool.try_allocate(s0, granule, 512);
  pool.streams().streams.enqueue(s0);
  pool.deallocate(s0, b, granule, 512);                 // idle, its stream still running
  pool.deallocate(a, 2 * granule, 512);                 // idle, settled
  void* big = *pool.try_allocate(s0, 2 * granule, 512); // line 4 granules: unmapping `a`'s chunk is enough
  CHECK(pool.streams().waits == 0);
  CHECK(pool.stats().stream_waits == 0);
  CHECK(pool.stats().bytes_reserved <= 4 * granule);
  pool.deallocate(s0, big, 2 * granule, 512);
  pool.deallocate(s0, keep, granule, 512);
  CHECK(pool.consistent());
}

TEST_CASE("the release threshold unmaps the least recently idle chunks first") {
  Pool pool(mapper(), small({.growth_divisor = 0, .release_threshold = 2 * granule}));
  std::vector<void*> blocks;
  for (int i = 0; i < 4; ++i) {
    blocks.push_back(*pool.try_allocate(granule, 512)); // four chunks of one granule
  }
  const auto chunks = chunks_of(pool);
  REQUIRE(chunks.size() == 4);
  pool.deallocate(blocks[2], granule, 512);
  pool.deallocate(blocks[0], granule, 512);
  CHECK(pool.stats().bytes_reserved == 4 * granule); // two idle: at the threshold
  pool.deallocate(blocks[3], granule, 512);          // three idle: the oldest (blocks[2]) goes
  auto now = chunks_of(pool);
  CHECK(now.size() == 3);
  CHECK(std::find(now.begin(), now.end(), chunks[2]) == now.end());
  void* again = *pool.try_allocate(granule, 512); // reuses a mapped idle chunk: no new mapping
  CHECK(pool.stats().bytes_reserved == 3 * granule);
  pool.deallocate(again, granule, 512);
  pool.deallocate(blocks[1], granule, 512);
  CHECK(pool.stats().bytes_reserved == 2 * granule);
  CHECK(pool.consistent());
}

TEST_CASE("it stacks under the combinators and under a caching pool") {
  using Counted = carve::StatsResource<Pool>;
  Counted counted(std::piecewise_construct, std::forward_as_tuple(mapper(), small()));
  void* p = *counted.try_allocate(1000, 256);
  CHECK(counted.stats().bytes_in_use == 1000);
  CHECK(counted.upstream().stats().bytes_in_use == 1024);
  counted.deallocate(p, 1000, 256);

  carve::LimitResource<Pool> limited(Pool(mapper(), small()), 64 * KiB); // moved in
  void* q = *limited.try_allocate(60 * KiB, 256);
  CHECK(limited.try_allocate(8 * KiB, 256).error() == Errc::no_space);
  limited.deallocate(q, 60 * KiB, 256);

  using Spill = carve::FallbackResource<Pool, carve::SimulatedCard>;
  Spill spill(Pool(mapper(), small({.max_reserved_bytes = 2 * granule})), carve::SimulatedCard(1 * MiB));
  void* r = *spill.try_allocate(granule, 256);
  void* s = *spill.try_allocate(3 * granule, 256); // past the pool's cap: from the card
  CHECK(spill.primary().owns(r));
  CHECK_FALSE(spill.primary().owns(s));
  spill.deallocate(s, 3 * granule, 256);
  spill.deallocate(r, granule, 256);

  carve::CachingPool<Pool> cached(Pool(mapper(), small()));
  void* t = *cached.try_allocate(3000, 256);
  CHECK(cached.upstream().stats().bytes_in_use == 2 * MiB); // one 2 MiB segment from the pool
  cached.deallocate(t, 3000, 256);
  CHECK(cached.trim() == 2 * MiB);
}

TEST_CASE("threads allocate, write, check and free through one pool") {
  Pool pool(mapper(), small({.address_space_bytes = 64 * MiB, .release_threshold = 4 * granule}));
  std::atomic<bool> corrupt{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t));
      std::vector<std::pair<unsigned char*, std::size_t>> mine;
      const auto fill = static_cast<unsigned char>(t + 1);
      for (int i = 0; i < 1500; ++i) {
        if (mine.size() < 40 && rng() % 3 != 0) {
          const std::size_t bytes = rng() % 8 == 0 ? (rng() % 200 + 1) * KiB : rng() % 4096 + 1;
          if (auto p = pool.try_allocate(bytes, 256)) {
            std::memset(*p, fill, bytes);
            mine.emplace_back(static_cast<unsigned char*>(*p), bytes);
          }
        } else if (!mine.empty()) {
          const auto [p, bytes] = mine.back();
          mine.pop_back();
          if (!std::all_of(p, p + bytes, [&](unsigned char v) { return v == fill; })) {
            corrupt = true;
          }
          pool.deallocate(p, bytes, 256);
        }
      }
      for (auto [p, bytes] : mine) {
        pool.deallocate(p, bytes, 256);
      }
    });
  }
  for (auto& t : threads) {
    t.join();
  }
  CHECK_FALSE(corrupt.load());
  CHECK(pool.consistent());
  CHECK(pool.stats().bytes_in_use == 0);
  pool.trim();
  CHECK(pool.stats().bytes_reserved == 0);
}

TEST_CASE("memory handed out is never touched by the pool: a replay of gigabytes costs no memory") {
  const std::size_t before = carve::test::resident_bytes();
  ExpandablePool<HostMemoryMapper> pool(HostMemoryMapper({.granularity = 2 * MiB}),
                                        {.address_space_bytes = std::size_t{16} << 30});
  std::vector<void*> blocks;
  for (int i = 0; i < 12; ++i) {
    blocks.push_back(*pool.try_allocate(std::size_t{1} << 30, 512)); // 12 GiB mapped
  }
  CHECK(pool.stats().bytes_reserved >= std::size_t{12} << 30);
  CHECK(carve::test::resident_bytes() < before + 64 * MiB);
  for (void* p : blocks) {
    pool.deallocate(p, std::size_t{1} << 30, 512);
  }
}

TEST_CASE("lending: a large block past the headroom line maps the holes live blocks pin, not new memory") {
  HostMemoryMapper m = mapper(); // copies share the tables
  Pool pool(m, small({.growth_divisor = 0, .headroom_permille = 0, .lend_min_bytes = 4 * granule}));
  const auto at = [](void* p) { return static_cast<unsigned char*>(p); };
  const PinnedHole h = pin_a_hole(pool);
  const auto [base, a, c] = h;
  CHECK(pool.stats().creates == 1);

  // d lands on the chunk's free end and two granules past it: those are the hole, mapped again.
  void* d = *pool.try_allocate(4 * granule, 512);
  check_lent_to(pool, h, d);
  CHECK(pool.stats().peak_reserved == 8 * granule);
  CHECK(pool.stats().maps == 2);

  // The hole's own addresses are out of best fit's way while d holds its memory.
  void* e = *pool.try_allocate(granule, 512);
  CHECK((at(e) < base + 2 * granule || at(e) >= base + 4 * granule));
  CHECK(pool.stats().creates == 2);

  // d freed, its second mapping idles; trim unmaps it, and the hole is a free range again.
  pool.deallocate(d, 4 * granule, 512);
  CHECK(pool.stats().lent_bytes == 2 * granule);
  CHECK(pool.trim() == 0); // a second mapping frees no memory, and the chunk is still pinned
  CHECK(pool.stats().lent_bytes == 0);
  CHECK(pool.consistent());
  void* f = *pool.try_allocate(2 * granule, 512);
  CHECK(at(f) == base + 2 * granule);
  CHECK(pool.stats().creates == 2);
  free_all(pool, m, {{a, 2 * granule}, {c, 2 * granule}, {e, granule}, {f, 2 * granule}});
}

TEST_CASE("lending under pressure: a block of any size the cap refuses maps holes; failing, it leaves none lent") {
  // lend_min_bytes is 512 MiB: no block here lends until it is refused.
  HostMemoryMapper m = mapper();
  Pool pool(m, small({.max_reserved_bytes = 8 * granule, .growth_divisor = 0}));
  const PinnedHole h = pin_a_hole(pool); // its chunk is the cap

  // Six granules land at 6 and need four more than the cap allows; the hole covers two of them,
  // the cap refuses the rest, and the hole's second mapping goes again with the refusal.
  CHECK(pool.try_allocate(6 * granule, 512).error() == Errc::no_space);
  const auto st = pool.stats();
  CHECK(st.lent_bytes == 0);
  CHECK(st.bytes_reserved == 8 * granule);
  CHECK(st.creates == 1);
  CHECK(pool.consistent());

  // Four granules land at 6 and need two: refused by the cap, then mapped on the hole.
  void* d = *pool.try_allocate(4 * granule, 512);
  check_lent_to(pool, h, d);
  CHECK(pool.stats().refusals_served == 1);
  CHECK(pool.try_allocate(granule, 512).error() == Errc::no_space); // no hole left, nothing idle
  CHECK(pool.stats().bytes_in_use == 8 * granule);
  free_all(pool, m, {{h.a, 2 * granule}, {h.c, 2 * granule}, {d, 4 * granule}});
}

TEST_CASE("lending under pressure: a block the device has no memory for maps holes; none, and it is refused once") {
  RefusingMapper m({.granularity = granule});
  ExpandablePool<RefusingMapper> pool(m, small({.growth_divisor = 0}));
  void* x = *pool.try_allocate(6 * granule, 512);
  pool.deallocate(x, 6 * granule, 512);
  void* a = *pool.try_allocate(granule, 512);
  void* b = *pool.try_allocate(3 * granule, 512);
  void* c = *pool.try_allocate(granule, 512);
  pool.deallocate(b, 3 * granule, 512);           // holes at [1, 4) and [5, 6)
  *m.creates_left = 0;                            // the device is full
  void* d = *pool.try_allocate(4 * granule, 512); // at 5: three granules more, on the larger hole
  CHECK(static_cast<char*>(d) == static_cast<char*>(a) + 5 * granule);
  CHECK(pool.stats().lent_bytes == 3 * granule);
  CHECK(pool.stats().mapper_failures == 1);
  CHECK(pool.stats().refusals_served == 1);
  std::memset(d, 5, 4 * granule);
  CHECK(pool.try_allocate(granule, 512).error() == Errc::no_space); // no hole left: no second try
  CHECK(pool.stats().mapper_failures == 2);
  CHECK(pool.stats().refusals_served == 1);
  CHECK(pool.last_failure().find("CUDA_ERROR_OUT_OF_MEMORY") != std::string::npos);
  CHECK(pool.consistent());
  *m.creates_left = 1 << 30;
  for (auto [p, n] : {std::pair{a, granule}, {c, granule}, {d, 4 * granule}}) {
    pool.deallocate(p, n, 512);
  }
  pool.trim();
  CHECK(m.mapping_count() == 0);
  CHECK(pool.consistent());
}

TEST_CASE("bring_holes_home: once no block touches a hole's chunk nor its second mapping, the hole comes home") {
  // a, b (then the hole) and c fill one chunk; d past the line takes the hole's memory. Kept lent
  // after d and the chunk's blocks die, the hole would cut the chunk in two for good.
  for (const bool chunk_first : {true, false}) {
    CAPTURE(chunk_first);
    HostMemoryMapper m = mapper();
    Pool pool(
        m,
        small({.growth_divisor = 0, .headroom_permille = 0, .lend_min_bytes = 4 * granule, .bring_holes_home = true}));
    void* x = *pool.try_allocate(8 * granule, 512);
    const auto base = static_cast<unsigned char*>(x);
    pool.deallocate(x, 8 * granule, 512);
    void* a = *pool.try_allocate(2 * granule, 512);
    void* b = *pool.try_allocate(2 * granule, 512);
    void* c = *pool.try_allocate(2 * granule, 512);
    pool.deallocate(b, 2 * granule, 512);
    void* d = *pool.try_allocate(4 * granule, 512);
    REQUIRE(pool.stats().lent_bytes == 2 * granule);
    // Whichever dies last, the chunk's blocks or d, brings the hole home; not before.
    if (chunk_first) {
      pool.deallocate(a, 2 * granule, 512);
      pool.deallocate(c, 2 * granule, 512);
      CHECK(pool.stats().lent_bytes == 2 * granule); // d still uses the hole's memory
      pool.deallocate(d, 4 * granule, 512);
    } else {
      pool.deallocate(d, 4 * granule, 512);
      pool.deallocate(a, 2 * granule, 512);
      CHECK(pool.stats().lent_bytes == 2 * granule); // c still pins the chunk
      pool.deallocate(c, 2 * granule, 512);
    }
    auto st = pool.stats();
    CHECK(st.lent_bytes == 0);
    CHECK(st.holes_home == 1);
    CHECK(st.unmaps == 1);                   // the second mapping; the chunk's memory stays mapped where it lives
    CHECK(st.bytes_reserved == 8 * granule); // d lay on the chunk's end and the hole's memory: none new
    CHECK(pool.consistent());
    void* whole = *pool.try_allocate(8 * granule, 512); // the chunk is one free range again
    CHECK(static_cast<unsigned char*>(whole) == base);
    CHECK(pool.stats().maps == st.maps);
    std::memset(whole, 7, 8 * granule);
    pool.deallocate(whole, 8 * granule, 512);
    pool.trim();
    CHECK(pool.stats().bytes_reserved == 0);
    CHECK(m.mapping_count() == 0);
    CHECK(m.physical_count() == 0);
  }
}

// A pool on SimulatedStreams that brings holes home, with one hole lent on stream 0: a chunk of
// eight granules held a, a hole and c, and d past the line borrowed the hole; a and c are freed
// since, so only d stands between the hole and home. Returns d (four granules).
using HomePool = ExpandablePool<HostMemoryMapper, carve::SimulatedStreams>;
HomePool home_pool(std::uint32_t streams) {
  return HomePool(
      mapper(),
      small({.growth_divisor = 0, .headroom_permille = 0, .lend_min_bytes = 4 * granule, .bring_holes_home = true}),
      carve::SimulatedStreams(streams));
}
void* lend_a_hole(HomePool& pool) {
  const carve::SimulatedStream s0{0};
  void* x = *pool.try_allocate(s0, 8 * granule, 512);
  pool.deallocate(s0, x, 8 * granule, 512);
  void* a = *pool.try_allocate(s0, 2 * granule, 512);
  void* b = *pool.try_allocate(s0, 2 * granule, 512);
  void* c = *pool.try_allocate(s0, 2 * granule, 512);
  pool.deallocate(s0, b, 2 * granule, 512);
  void* d = *pool.try_allocate(s0, 4 * granule, 512);
  REQUIRE(pool.stats().lent_bytes == 2 * granule);
  pool.deallocate(s0, a, 2 * granule, 512);
  pool.deallocate(s0, c, 2 * granule, 512);
  return d;
}

TEST_CASE("bring_holes_home: a free never waits; a later allocation brings the hole home once the work has run") {
  HomePool pool = home_pool(1);
  const carve::SimulatedStream s0{0};
  void* d = lend_a_hole(pool);
  pool.streams().enqueue(s0); // a kernel still reading d: an unmap now would fault
  pool.deallocate(s0, d, 4 * granule, 512);
  CHECK(pool.stats().lent_bytes == 2 * granule);
  CHECK(pool.stats().unmaps == 0);
  void* e = *pool.try_allocate(s0, 4 * granule, 512); // the work still runs: the hole stays lent
  CHECK(pool.stats().lent_bytes == 2 * granule);
  pool.deallocate(s0, e, 4 * granule, 512);
  pool.streams().complete(s0);
  void* f = *pool.try_allocate(s0, 4 * granule, 512); // it has run: home first, then f
  const auto st = pool.stats();
  CHECK(st.lent_bytes == 0);
  CHECK(st.holes_home == 1);
  CHECK(pool.consistent());
  pool.deallocate(s0, f, 4 * granule, 512);
  pool.trim();
  CHECK(pool.stats().bytes_reserved == 0);
}

TEST_CASE("bring_holes_home: a block on the chunk before the work has run keeps the hole lent") {
  HomePool pool = home_pool(1);
  const carve::SimulatedStream s0{0};
  void* d = lend_a_hole(pool);
  pool.streams().enqueue(s0);
  pool.deallocate(s0, d, 4 * granule, 512);
  void* e = *pool.try_allocate(s0, granule, 512); // best fit: the chunk's two free granules
  pool.streams().complete(s0);
  void* f = *pool.try_allocate(s0, granule, 512); // the work has run, but e pins the chunk
  CHECK(pool.stats().lent_bytes == 2 * granule);
  CHECK(pool.stats().holes_home == 0);
  pool.deallocate(s0, e, granule, 512);
  CHECK(pool.stats().holes_home == 0);  // f still pins it
  pool.deallocate(s0, f, granule, 512); // nothing queued since: home at this free
  CHECK(pool.stats().lent_bytes == 0);
  CHECK(pool.stats().holes_home == 1);
  CHECK(pool.consistent());
}

TEST_CASE("bring_holes_home: not while held; the first allocation after the hold brings it home") {
  HomePool pool = home_pool(1);
  const carve::SimulatedStream s0{0};
  void* d = lend_a_hole(pool);
  pool.hold(true); // a capture: nothing is unmapped
  pool.deallocate(s0, d, 4 * granule, 512);
  void* e = *pool.try_allocate(s0, 4 * granule, 512);
  CHECK(pool.stats().lent_bytes == 2 * granule);
  pool.deallocate(s0, e, 4 * granule, 512);
  pool.hold(false);
  void* f = *pool.try_allocate(s0, 4 * granule, 512);
  CHECK(pool.stats().lent_bytes == 0);
  CHECK(pool.stats().holes_home == 1);
  CHECK(pool.consistent());
  pool.deallocate(s0, f, 4 * granule, 512);
}

TEST_CASE("bring_holes_home: a borrower freed on another stream counts until its free is collected") {
  HomePool pool = home_pool(2);
  const carve::SimulatedStream s0{0};
  const carve::SimulatedStream s1{1};
  void* d = lend_a_hole(pool);
  pool.streams().enqueue(s1); // s1 still reads d
  pool.deallocate(s1, d, 4 * granule, 512);
  CHECK(pool.stats().pending_frees == 1);
  CHECK(pool.stats().lent_bytes == 2 * granule); // d still holds its second mapping
  CHECK(pool.consistent());
  pool.streams().complete(s1);
  void* e = *pool.try_allocate(s0, granule, 512); // collects d's free, which brings the hole home
  auto st = pool.stats();
  CHECK(st.pending_frees == 0);
  CHECK(st.lent_bytes == 0);
  CHECK(st.holes_home == 1);
  CHECK(pool.consistent());
  pool.deallocate(s0, e, granule, 512);
  pool.trim();
  CHECK(pool.stats().bytes_reserved == 0);
}

TEST_CASE("max_chunk_bytes: a chunk is made of allocations that size at most, each unmapped on its own") {
  // For a driver that maps whole allocations only: no hole can be lent there, so the granules a
  // dead block leaves between live ones go back to the device where whole allocations lie there.
  const auto at = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p); };
  HostMemoryMapper m({.granularity = granule});
  Pool pool(m,
            small({.growth_divisor = 0, .max_chunk_bytes = 2 * granule + granule / 2, .headroom_permille = SIZE_MAX}));
  void* x = *pool.try_allocate(5 * granule, 512);
  CHECK(chunks_of(pool) == std::vector<std::pair<std::uintptr_t, std::size_t>>{{at(x), 2 * granule},
                                                                               {at(x) + 2 * granule, 2 * granule},
                                                                               {at(x) + 4 * granule, granule}});
  CHECK(pool.stats().creates == 3);
  CHECK(pool.stats().maps == 3);
  pool.deallocate(x, 5 * granule, 512);
  auto* b = static_cast<unsigned char*>(*pool.try_allocate(2 * granule, 512)); // [0, 2)
  void* c = *pool.try_allocate(2 * granule, 512);                              // [2, 4)
  auto* d = static_cast<unsigned char*>(*pool.try_allocate(granule, 512));     // [4, 5)
  std::memset(b, 0x21, 2 * granule);
  std::memset(d, 0x43, granule);
  pool.deallocate(c, 2 * granule, 512);
  CHECK(pool.trim() == 2 * granule); // the allocation under c alone: one chunk would have stayed
  CHECK(pool.stats().bytes_reserved == 3 * granule);
  CHECK(std::all_of(b, b + 2 * granule, [](unsigned char v) { return v == 0x21; }));
  CHECK(std::all_of(d, d + granule, [](unsigned char v) { return v == 0x43; }));
  void* e = *pool.try_allocate(2 * granule, 512); // best fit: the range c left, mapped anew
  CHECK(at(e) == at(b) + 2 * granule);
  CHECK(pool.stats().creates == 4);
  CHECK(pool.consistent());
  for (auto [p, n] :
       {std::pair{static_cast<void*>(b), 2 * granule}, {e, 2 * granule}, {static_cast<void*>(d), granule}}) {
    pool.deallocate(p, n, 512);
  }
  pool.trim();
  CHECK(m.mapping_count() == 0);
  CHECK(m.physical_count() == 0);
  // A piece refused in the middle of a run: the pieces made before it are unmapped and released.
  RefusingMapper refusing({.granularity = granule});
  *refusing.creates_left = 2;
  ExpandablePool<RefusingMapper> cut(
      refusing, small({.growth_divisor = 0, .max_chunk_bytes = granule, .headroom_permille = SIZE_MAX}));
  const auto refused = cut.try_allocate(3 * granule, 512);
  REQUIRE_FALSE(refused);
  CHECK(refused.error() == Errc::no_space);
  CHECK(refusing.mapping_count() == 0);
  CHECK(refusing.physical_count() == 0);
  CHECK(cut.stats().bytes_reserved == 0);
  CHECK(cut.consistent());
  *refusing.creates_left = 3;
  void* whole = *cut.try_allocate(3 * granule, 512);
  CHECK(cut.stats().chunks == 3);
  cut.deallocate(whole, 3 * granule, 512);
  CHECK(cut.trim() == 3 * granule);
  // The undo of the pieces made is refused too: they stay mapped, counted, and go at the next unmap.
  *refusing.creates_left = 1;
  *refusing.unmaps_refused = 1;
  CHECK(cut.try_allocate(2 * granule, 512).error() == Errc::no_space);
  CHECK(cut.stats().bytes_reserved == refusing.physical_count() * granule);
  CHECK(cut.consistent());
  *refusing.creates_left = 1 << 30;
  void* after = *cut.try_allocate(granule, 512); // the device is well again: served
  cut.deallocate(after, granule, 512);
  const std::size_t held = cut.stats().bytes_reserved;
  CHECK(held != 0);
  CHECK(cut.trim() == held); // everything idle goes, the piece the undo left among it
  CHECK(cut.stats().bytes_reserved == 0);
  CHECK(refusing.physical_count() == 0);
  // A chunk the device cannot open, whose unmap is refused too: kept mapped (counted) out of every
  // block's way, and unmapped once the mapper lets it go.
  *refusing.own_grants_refused = 1;
  *refusing.unmaps_refused = 1;
  CHECK(cut.try_allocate(granule, 512).error() == Errc::no_space);
  CHECK(refusing.mapping_count() == 1);
  CHECK(cut.stats().bytes_reserved == refusing.physical_count() * granule);
  CHECK(cut.consistent());
  void* fine_now = *cut.try_allocate(granule, 512); // maps where the stuck chunk was, once it is unmapped
  CHECK(refusing.mapping_count() == 1);
  CHECK(cut.stats().bytes_reserved == granule);
  cut.deallocate(fine_now, granule, 512);
  CHECK(cut.trim() == granule);
  CHECK(refusing.physical_count() == 0);
  // Below one granule it is one granule.
  Pool fine(m, small({.growth_divisor = 0, .max_chunk_bytes = 1, .headroom_permille = SIZE_MAX}));
  void* y = *fine.try_allocate(3 * granule, 512);
  CHECK(fine.stats().creates == 3);
  fine.deallocate(y, 3 * granule, 512);
}

TEST_CASE("lending: a mapper that refuses a second mapping turns lending off, and the block maps new memory") {
  RefusingMapper m({.granularity = granule});
  *m.refuse_offsets = true;
  ExpandablePool<RefusingMapper> pool(
      m, small({.growth_divisor = 0, .headroom_permille = 0, .lend_min_bytes = 3 * granule}));
  void* x = *pool.try_allocate(8 * granule, 512);
  pool.deallocate(x, 8 * granule, 512);
  void* a = *pool.try_allocate(granule, 512); // holes at [1, 3) and [4, 8) once b is freed
  void* b = *pool.try_allocate(2 * granule, 512);
  void* c = *pool.try_allocate(granule, 512);
  pool.deallocate(b, 2 * granule, 512);
  void* d = *pool.try_allocate(6 * granule, 512); // lands at 4: granules 8 and 9 need memory; the lend is refused
  REQUIRE(d != nullptr);
  auto st = pool.stats();
  CHECK(st.lent_bytes == 0);
  CHECK(st.mapper_failures == 1);
  CHECK(st.lending_refused);
  CHECK(st.bytes_reserved == 10 * granule);
  std::memset(d, 7, 6 * granule);
  void* e = *pool.try_allocate(4 * granule, 512); // lending is off: no second refusal
  CHECK(pool.stats().mapper_failures == 1);
  CHECK(pool.consistent());
  for (auto [p, n] : {std::pair{a, granule}, {c, granule}, {d, 6 * granule}, {e, 4 * granule}}) {
    pool.deallocate(p, n, 512);
  }
  pool.trim();
  CHECK(m.mapping_count() == 0);
}

TEST_CASE("lending: a second mapping the device has no memory for leaves lending on for later blocks") {
  RefusingMapper m({.granularity = granule});
  *m.offset_maps_short = 1;
  ExpandablePool<RefusingMapper> pool(
      m, small({.growth_divisor = 0, .headroom_permille = 0, .lend_min_bytes = 3 * granule}));
  // The same blocks twice, the pool trimmed between: a hole at [1, 3) once b is freed, and d over
  // [4, 10) needing granules 8 and 9. The first time the lend runs short of memory.
  for (int round = 0; round < 2; ++round) {
    CAPTURE(round);
    void* x = *pool.try_allocate(8 * granule, 512);
    pool.deallocate(x, 8 * granule, 512);
    void* a = *pool.try_allocate(granule, 512);
    void* b = *pool.try_allocate(2 * granule, 512);
    void* c = *pool.try_allocate(granule, 512);
    pool.deallocate(b, 2 * granule, 512);
    void* d = *pool.try_allocate(6 * granule, 512);
    REQUIRE(d != nullptr);
    std::memset(d, 7, 6 * granule);
    const auto st = pool.stats();
    CHECK_FALSE(st.lending_refused);
    CHECK(st.mapper_failures == 1);
    CHECK(st.lent_bytes == (round == 0 ? 0 : 2 * granule));
    CHECK(st.bytes_reserved == (round == 0 ? 10 * granule : 8 * granule));
    CHECK(pool.consistent());
    for (auto [p, n] : {std::pair{a, granule}, {c, granule}, {d, 6 * granule}}) {
      pool.deallocate(p, n, 512);
    }
    pool.trim();
    CHECK(m.mapping_count() == 0);
  }
}

TEST_CASE("lending: a mapper that maps whole allocations only says so, and the pool never tries to lend") {
  // CUDA documents that cuMemMap's offset must be 0; a driver that keeps to it is replayed by
  // carve_replay as expandable-pool:partial-maps=0, whose pool must make exactly the calls the
  // card's does: none refused, the block on new memory.
  constexpr std::size_t page = 4 * KiB;
  HostMemoryMapper m({.granularity = page, .maps_partial_allocations = false});
  const auto told = m.maps_partial_allocations(0);
  REQUIRE(told);
  CHECK_FALSE(*told);
  CHECK_FALSE(carve::may_map_partial_allocations(m, 0));
  Pool pool(m, small({.growth_divisor = 0, .headroom_permille = 0, .lend_min_bytes = 3 * page}));
  CHECK(pool.stats().lending_refused); // known before any block
  void* x = *pool.try_allocate(8 * page, 512);
  pool.deallocate(x, 8 * page, 512);
  void* b = *pool.try_allocate(3 * page, 512);                              // [0, 3)
  auto* d = static_cast<unsigned char*>(*pool.try_allocate(3 * page, 512)); // [3, 6): pins the chunk
  pool.deallocate(b, 3 * page, 512);                                        // a hole at the chunk's start
  std::memset(d, 0x11, 3 * page);
  auto* e = static_cast<unsigned char*>(*pool.try_allocate(5 * page, 512)); // [6, 11): 3 pages unmapped
  auto st = pool.stats();
  CHECK(st.lent_bytes == 0);
  CHECK(st.mapper_failures == 0); // never asked
  CHECK(st.bytes_reserved == 11 * page);
  std::memset(e, 0x5a, 5 * page);
  CHECK(std::all_of(d, d + 3 * page, [](unsigned char v) { return v == 0x11; }));
  // The mapper refuses part of an allocation from any offset, 0 included, and takes a whole one.
  auto h = m.create(0, 2 * page);
  REQUIRE(h);
  auto va = m.reserve(4 * page, page);
  REQUIRE(va);
  for (const std::size_t offset : {std::size_t{0}, page}) {
    const auto refused = m.map(*va, page, *h, offset);
    REQUIRE_FALSE(refused);
    CHECK(refused.error().code == Errc::invalid_argument);
    CHECK(refused.error().message.find("whole allocations only") != std::string::npos);
  }
  CHECK(m.mapping_count() == 2); // the pool's two chunks; the refusals mapped nothing
  CHECK(m.map(*va, 2 * page, *h, 0));
  CHECK(m.unmap(*va, 2 * page));
  CHECK(m.release(*h));
  CHECK(m.free_reservation(*va, 4 * page));
  pool.deallocate(d, 3 * page, 512);
  pool.deallocate(e, 5 * page, 512);
  CHECK(pool.consistent());
}

TEST_CASE(
    "the partial-map probe: yes where parts map and show the allocation's bytes, no with the reason, else an error") {
  constexpr std::size_t page = 4 * KiB;
  const auto options = [](bool parts) {
    return carve::HostMapperOptions{
        .granularity = page, .cpu_device = HostMemoryMapper::every_device, .maps_partial_allocations = parts};
  };
  const auto fill = [](void* va, std::uint8_t byte, std::size_t bytes) {
    std::memset(va, byte, bytes);
    return carve::Result<void>();
  };
  const auto read = [](const void* va, std::uint8_t* out, std::size_t bytes) {
    std::memcpy(out, va, bytes);
    return carve::Result<void>();
  };
  for (const bool parts : {true, false}) {
    CAPTURE(parts);
    HostMemoryMapper m(options(parts));
    const auto answer = carve::detail::probe_partial_maps(m, 0, fill, read);
    REQUIRE(answer);
    CHECK(answer->maps == parts);
    CHECK(answer->why.find(parts ? "" : "whole allocations only") != std::string::npos);
    CHECK(m.mapping_count() == 0); // nothing left mapped
  }
  // A driver that takes the offset and maps the allocation's start instead is a no, not a yes.
  struct IgnoresOffsets : HostMemoryMapper {
    using HostMemoryMapper::HostMemoryMapper;
    carve::Result<void> map(void* va, std::size_t bytes, physical_handle h, std::size_t = 0) {
      return HostMemoryMapper::map(va, bytes, h, 0);
    }
  };
  IgnoresOffsets wrong(options(true));
  const auto fooled = carve::detail::probe_partial_maps(wrong, 0, fill, read);
  REQUIRE(fooled);
  CHECK_FALSE(fooled->maps);
  CHECK(fooled->why == "map: 8192 bytes from offset 4096 mapped, but they do not show the allocation's bytes there");
  CHECK(wrong.mapping_count() == 0);
  // A fill that fails, or a device out of memory, is no answer.
  HostMemoryMapper m(options(true));
  const auto broken = carve::detail::probe_partial_maps(
      m, 0, [](void*, std::uint8_t, std::size_t) { return carve::fail(Errc::device_error, "cudaMemset: lost"); }, read);
  REQUIRE_FALSE(broken);
  CHECK(broken.error().message == "cudaMemset: lost");
  CHECK(m.mapping_count() == 0);
  struct NoMemoryForParts : HostMemoryMapper {
    using HostMemoryMapper::HostMemoryMapper;
    carve::Result<void> map(void* va, std::size_t bytes, physical_handle h, std::size_t offset = 0) {
      return offset == 0 && bytes == 3 * page ? HostMemoryMapper::map(va, bytes, h, 0)
                                              : carve::fail(Errc::no_space, "cuMemMap: CUDA_ERROR_OUT_OF_MEMORY");
    }
  };
  NoMemoryForParts full(options(true));
  const auto none = carve::detail::probe_partial_maps(full, 0, fill, read);
  REQUIRE_FALSE(none);
  CHECK(none.error().code == Errc::no_space);
  CHECK(full.mapping_count() == 0);
}

TEST_CASE("lending: a pool that never lends does not ask the mapper") {
  struct Counting : HostMemoryMapper {
    using HostMemoryMapper::HostMemoryMapper;
    std::shared_ptr<int> asked = std::make_shared<int>(0);
    carve::Result<bool> maps_partial_allocations(int device) {
      ++*asked;
      return HostMemoryMapper::maps_partial_allocations(device);
    }
  };
  static_assert(carve::TellsPartialMaps<Counting>);
  Counting m({.granularity = granule});
  { ExpandablePool<Counting> never(m, small({.lend_min_bytes = SIZE_MAX})); }
  CHECK(*m.asked == 0);
  ExpandablePool<Counting> lends(m, small({}));
  CHECK(*m.asked == 1);
  CHECK_FALSE(lends.stats().lending_refused);
}

TEST_CASE("lending: a second mapping unmapped leaves the idle list, so no later eviction hits a live block") {
  // With a release threshold, chunks that fall idle are listed; a second mapping is one too. Once
  // trim() has unmapped it, a block's chunk made later inside its old range must not be evicted
  // in its name.
  Pool pool(mapper(), small({.growth_divisor = 0,
                             .release_threshold = 9 * granule,
                             .headroom_permille = 0,
                             .lend_min_bytes = 2 * granule}));
  void* x = *pool.try_allocate(7 * granule, 512); // one chunk, [0, 7)
  pool.deallocate(x, 7 * granule, 512);
  void* a = *pool.try_allocate(2 * granule, 512);
  void* b = *pool.try_allocate(2 * granule, 512);
  void* c = *pool.try_allocate(3 * granule, 512);
  pool.deallocate(b, 2 * granule, 512);           // the hole [2, 4)
  void* d = *pool.try_allocate(4 * granule, 512); // at 7: the hole mapped again at [7, 9), new memory at [9, 11)
  CHECK(pool.stats().lent_bytes == 2 * granule);
  pool.deallocate(d, 4 * granule, 512);
  pool.trim(); // unmaps [7, 9) and [9, 11)
  pool.deallocate(a, 2 * granule, 512);
  pool.deallocate(c, 3 * granule, 512);
  pool.trim();                                    // unmaps [0, 7)
  void* e = *pool.try_allocate(8 * granule, 512); // a chunk [0, 8)
  void* h = *pool.try_allocate(granule, 512);     // a chunk [8, 9), inside the second mapping's old range
  REQUIRE(static_cast<unsigned char*>(h) == static_cast<unsigned char*>(x) + 8 * granule);
  pool.deallocate(e, 8 * granule, 512); // 8 granules idle: under the threshold, nothing evicted
  REQUIRE(pool.owns(h));                // evicted in the second mapping's name, it would not be
  CHECK(pool.consistent());
  std::memset(h, 1, granule);
  pool.deallocate(h, granule, 512);
}

TEST_CASE("lending: random blocks keep their bytes, and every hole comes back") {
  // Idle chunks kept, or unmapped past a small threshold and at trim() every 97 steps: second
  // mappings fall idle and go like chunks, and must leave no trace on the idle list. Pages as
  // granules keep the bytes checked after every step few (and the test quick under sanitizers).
  // Chunks cut into allocations of two pages (max_chunk_bytes) run the same steps, and so does a
  // pool whose cap refuses some requests: those change nothing, and small blocks borrow holes.
  constexpr std::size_t page = 4 * KiB;
  for (int run = 0; run < 16; ++run) {
    const bool threshold = (run & 1) != 0;
    const bool cut = (run & 2) != 0;
    const bool home = (run & 4) != 0; // holes come home too (bring_holes_home)
    const std::size_t cap = (run & 8) != 0 ? 40 * page : SIZE_MAX;
    CAPTURE(threshold);
    CAPTURE(cut);
    CAPTURE(home);
    CAPTURE(cap);
    HostMemoryMapper m({.granularity = page});
    Pool pool(m, small({.max_reserved_bytes = cap,
                        .growth_divisor = 0,
                        .max_chunk_bytes = cut ? 2 * page : SIZE_MAX,
                        .release_threshold = threshold ? 4 * page : SIZE_MAX,
                        .headroom_permille = 0,
                        .lend_min_bytes = 3 * page,
                        .bring_holes_home = home}));
    std::mt19937_64 rng(29);
    struct Block {
      unsigned char* p;
      std::size_t bytes;
      unsigned char fill;
    };
    std::vector<Block> live;
    std::vector<unsigned char> expected(8 * page);
    std::size_t most_lent = 0;
    int refused = 0;
    int small_borrowed = 0; // blocks below lend_min_bytes that borrowed holes, refused memory first
    bool intact = true;
    for (int step = 0; step < 3000 && intact; ++step) {
      if (live.size() < 24 && (live.empty() || rng() % 2 == 0)) {
        const std::size_t bytes = (rng() % 4 == 0 ? 3 * page + rng() % (5 * page) : 1 + rng() % (2 * page));
        const auto before = pool.stats();
        const auto p = pool.try_allocate(bytes, 512);
        if (!p) {
          REQUIRE(cap != SIZE_MAX);
          CHECK(p.error() == Errc::no_space);
          CHECK(pool.stats().bytes_in_use == before.bytes_in_use);
          ++refused;
          continue;
        }
        small_borrowed += bytes < 3 * page && pool.stats().lent_bytes > before.lent_bytes ? 1 : 0;
        const auto fill = static_cast<unsigned char>(step);
        std::memset(*p, fill, bytes);
        live.push_back({static_cast<unsigned char*>(*p), bytes, fill});
      } else {
        const std::size_t i = rng() % live.size();
        pool.deallocate(live[i].p, live[i].bytes, 512);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
      }
      for (const Block& blk : live) {
        std::memset(expected.data(), blk.fill, blk.bytes);
        intact = intact && std::memcmp(blk.p, expected.data(), blk.bytes) == 0;
      }
      most_lent = std::max(most_lent, pool.stats().lent_bytes);
      CHECK(pool.stats().bytes_reserved <= cap);
      if (threshold && step % 97 == 0) {
        pool.trim();
      }
      if (step % 100 == 0) {
        CHECK(pool.consistent());
      }
    }
    CHECK(intact);
    CHECK(most_lent > 0); // holes were lent, so the check above covered them
    CHECK((pool.stats().holes_home > 0) == home);
    CHECK((refused > 0 && small_borrowed > 0) == (cap != SIZE_MAX));
    CHECK(pool.consistent());
    for (const Block& blk : live) {
      pool.deallocate(blk.p, blk.bytes, 512);
    }
    pool.trim();
    CHECK(pool.stats().lent_bytes == 0);
    CHECK(pool.stats().bytes_reserved == 0);
    CHECK(m.mapping_count() == 0);
  }
}

} // namespace test_expandable_pool
