// The models of PyTorch's CUDA caching allocator (examples/carve_replay/): each rule checked on a
// case small enough to work out by hand.
#include "pytorch_caching_model.hpp"
#include "pytorch_expandable_model.hpp"

#include <carve/mr/simulated_card.hpp>
#include <carve/vmm/host_memory_mapper.hpp>

#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <thread>
#include <vector>

namespace {

using carve::Errc;
using carve::HostMemoryMapper;
using carve::SimulatedCard;
using carve::SimulatedStream;
using carve::replay::PytorchCachingModel;
using carve::replay::PytorchExpandableModel;

constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr SimulatedStream s0{0};
constexpr SimulatedStream s1{1};

using Model = PytorchCachingModel<SimulatedCard>;
using Expandable = PytorchExpandableModel<HostMemoryMapper>;

std::uintptr_t at(void* p) { return reinterpret_cast<std::uintptr_t>(p); }

template <class M>
void* take(M& model, SimulatedStream stream, std::size_t bytes) {
  auto p = model.try_allocate(stream, bytes);
  REQUIRE(p.has_value());
  return *p;
}

// The segment a fresh model allocates for one request, and the bytes the request holds.
struct FirstSegment {
  std::uint64_t reserved;
  std::uint64_t allocated;
};
FirstSegment first_segment(std::size_t bytes) {
  Model model(SimulatedCard(256 * MiB));
  take(model, s0, bytes);
  const auto s = model.stats();
  CHECK(s.device_allocations == 1);
  return {s.reserved_bytes, s.allocated_bytes};
}

// Runs `child` in a forked process, quietly; its wait status.
template <class F>
int in_child(F&& child) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    (void)std::freopen("/dev/null", "w", stderr);
    (void)std::signal(SIGABRT, SIG_DFL); // doctest's handler would report the abort as a crash
    child();
    ::_exit(0);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  return status;
}
bool aborted(int status) { return WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT; }

Expandable expandable(std::size_t capacity, HostMemoryMapper mapper = HostMemoryMapper()) {
  return Expandable(std::move(mapper), {.capacity_bytes = capacity});
}

} // namespace

TEST_CASE("requests are rounded up to 512 bytes, and are at least 512") {
  Model model(SimulatedCard(64 * MiB));
  void* a = take(model, s0, 1);
  void* b = take(model, s0, 513);
  void* c = take(model, s0, 512);
  CHECK(at(b) == at(a) + 512); // the request takes the front of the block it splits
  CHECK(at(c) == at(b) + 1024);
  CHECK(model.stats().allocated_bytes == 2048);
  CHECK(model.try_allocate(s0, 0).error() == Errc::invalid_size);
  CHECK(model.stats().device_allocations == 1);
  CHECK(model.consistent());
}

TEST_CASE("a new segment is 2 MiB for small requests, 20 MiB up to 10 MiB, else rounded to 2 MiB") {
  CHECK(first_segment(1).reserved == 2 * MiB);
  CHECK(first_segment(MiB).reserved == 2 * MiB);
  CHECK(first_segment(MiB + 1).reserved == 20 * MiB);
  CHECK(first_segment(10 * MiB - 512).reserved == 20 * MiB);
  CHECK(first_segment(10 * MiB - 1).reserved == 10 * MiB); // rounds to 10 MiB: not below it
  CHECK(first_segment(10 * MiB + 1).reserved == 12 * MiB);
  // 10 MiB + 512 in 12 MiB: 2 MiB - 512 left, more than 1 MiB, so the block is split.
  CHECK(first_segment(10 * MiB + 1).allocated == 10 * MiB + 512);
  // 21 MiB in 22 MiB: exactly 1 MiB left, not split: the request holds the whole segment.
  CHECK(first_segment(21 * MiB).allocated == 22 * MiB);
}

TEST_CASE("the small and the large pool never lend each other blocks") {
  Model model(SimulatedCard(256 * MiB));
  model.deallocate(take(model, s0, 512)); // a free 2 MiB small segment
  void* large = take(model, s0, MiB + MiB / 2);
  CHECK(model.stats().device_allocations == 2); // a 20 MiB segment, not the free 2 MiB
  take(model, s0, MiB);
  take(model, s0, MiB); // the small segment is full now
  take(model, s0, 512);
  CHECK(model.stats().device_allocations == 3); // 18.5 MiB free in the large pool do not serve it
  CHECK(model.stats().reserved_bytes == 24 * MiB);
  model.deallocate(large);
  CHECK(model.consistent());
}

TEST_CASE("best fit: the smallest free block that holds the request, the lowest address among equals") {
  Model model(SimulatedCard(256 * MiB));
  void* twelve = take(model, s0, 12 * MiB);
  void* sixteen = take(model, s0, 16 * MiB);
  void* fourteen = take(model, s0, 14 * MiB);
  for (void* p : {twelve, sixteen, fourteen}) {
    model.deallocate(p);
  }
  CHECK(take(model, s0, 13 * MiB) == fourteen); // 1 MiB left: not split
  CHECK(take(model, s0, 11 * MiB) == twelve);
  CHECK(take(model, s0, 15 * MiB) == sixteen);
  CHECK(model.stats().device_allocations == 3);
  CHECK(model.stats().allocated_bytes == 42 * MiB);

  void* p[4];
  for (void*& q : p) {
    q = take(model, s0, 512);
  }
  model.deallocate(p[2]);
  model.deallocate(p[0]);
  CHECK(take(model, s0, 512) == p[0]);
  CHECK(take(model, s0, 512) == p[2]);
  CHECK(at(take(model, s0, 512)) == at(p[3]) + 512);
  CHECK(model.consistent());
}

TEST_CASE("the large pool splits only when more than 1 MiB is left; the small pool when 512 bytes are") {
  Model model(SimulatedCard(256 * MiB));
  void* whole = take(model, s0, 19 * MiB); // 20 MiB segment, 1 MiB left
  CHECK(model.stats().allocated_bytes == 20 * MiB);
  model.deallocate(whole);
  void* front = take(model, s0, 19 * MiB - 512); // the same block: 1 MiB + 512 left
  CHECK(front == whole);
  CHECK(model.stats().allocated_bytes == 19 * MiB - 512);
  CHECK(at(take(model, s0, MiB + 1)) == at(front) + 19 * MiB - 512); // the rest, exactly
  CHECK(model.stats().allocated_bytes == 20 * MiB);

  void* a = take(model, s0, MiB);
  take(model, s0, MiB - 512);
  CHECK(at(take(model, s0, 512)) == at(a) + 2 * MiB - 512);
  CHECK(model.stats().device_allocations == 2);
  CHECK(model.consistent());
}

TEST_CASE("freed blocks merge with the free blocks beside them") {
  Model model(SimulatedCard(256 * MiB));
  void* a = take(model, s0, 4 * MiB);
  void* b = take(model, s0, 4 * MiB);
  void* c = take(model, s0, 4 * MiB);
  CHECK(at(c) == at(a) + 8 * MiB);
  model.deallocate(a);
  model.deallocate(c);
  CHECK(model.consistent());
  void* twelve = take(model, s0, 12 * MiB); // c and the 8 MiB after it, merged
  CHECK(twelve == c);
  model.deallocate(twelve);
  model.deallocate(b); // merges with both sides: the segment is one free block again
  CHECK(model.empty_cache() == 20 * MiB);
  CHECK(model.stats().reserved_bytes == 0);
  CHECK(model.upstream().used_bytes() == 0);
}

TEST_CASE("a stream's cached blocks serve that stream only") {
  Model model(SimulatedCard(256 * MiB));
  void* p = take(model, s0, 4 * MiB);
  model.deallocate(p);
  void* q = take(model, s1, 4 * MiB);
  CHECK(model.stats().device_allocations == 2);
  CHECK((at(q) < at(p) || at(q) >= at(p) + 20 * MiB));
  CHECK(take(model, s0, 4 * MiB) == p);
  CHECK(model.empty_cache() == 0); // both segments hold a live block
  CHECK(model.consistent());
}

TEST_CASE("out of memory: cached whole segments are freed and cudaMalloc asked again, once") {
  SimulatedCard card(64 * MiB);
  Model model(card);
  model.deallocate(take(model, s1, 2 * MiB)); // a cached 20 MiB segment of stream 1
  void* y = take(model, s0, 30 * MiB);
  void* z = take(model, s0, 20 * MiB); // 14 MiB free on the card: stream 1's segment goes first
  auto s = model.stats();
  CHECK(s.device_allocations == 3);
  CHECK(s.device_frees == 1);
  CHECK(s.failed_device_allocations == 1);
  CHECK(s.ooms == 0);
  CHECK(s.reserved_bytes == 50 * MiB);

  void* small = take(model, s0, 512); // a 2 MiB segment, in use: never freed for a retry
  model.deallocate(z);
  CHECK(model.try_allocate(s0, 40 * MiB).error() == Errc::no_space);
  s = model.stats();
  CHECK(s.device_frees == 2); // z's cached segment went, as in PyTorch, and stays gone
  CHECK(s.failed_device_allocations == 3);
  CHECK(s.ooms == 1);
  CHECK(s.reserved_bytes == 32 * MiB);
  CHECK(s.allocated_bytes == 30 * MiB + 512);
  CHECK(card.used_bytes() == 32 * MiB);

  // With nothing cached left, a failure changes nothing but the failure counts.
  CHECK(model.try_allocate(s0, 40 * MiB).error() == Errc::no_space);
  const auto after = model.stats();
  CHECK(after.ooms == 2);
  CHECK(after.failed_device_allocations == 5);
  CHECK(after.device_frees == s.device_frees);
  CHECK(after.device_allocations == s.device_allocations);
  CHECK(after.reserved_bytes == s.reserved_bytes);
  CHECK(after.allocated_bytes == s.allocated_bytes);
  CHECK(card.used_bytes() == 32 * MiB);
  model.deallocate(small);
  model.deallocate(y);
  CHECK(model.consistent());
}

TEST_CASE("empty_cache frees every cached whole segment of every stream, and nothing else") {
  SimulatedCard card(256 * MiB);
  Model model(card);
  take(model, s0, 512);
  model.deallocate(take(model, s0, 12 * MiB));
  model.deallocate(take(model, s1, 4 * MiB));
  CHECK(model.empty_cache() == 32 * MiB);
  CHECK(model.empty_cache() == 0);
  CHECK(model.stats().device_frees == 2);
  CHECK(model.stats().reserved_bytes == 2 * MiB);
  CHECK(card.used_bytes() == 2 * MiB);
}

TEST_CASE("a pointer that was never handed out, or is freed twice, ends the program") {
  Model model(SimulatedCard(64 * MiB));
  void* p = take(model, s0, 4096);
  CHECK(aborted(in_child([&] { model.deallocate(static_cast<char*>(p) + 512); })));
  CHECK(aborted(in_child([&] {
    model.deallocate(p);
    model.deallocate(p);
  })));
  auto ex = expandable(64 * MiB);
  CHECK(aborted(in_child([&] { ex.deallocate(p); })));
}

TEST_CASE("the model's books stay whole under threads") {
  Model model(SimulatedCard(512 * MiB));
  auto churn = [&model](SimulatedStream stream) {
    std::vector<void*> live;
    for (std::size_t i = 0; i < 2000; ++i) {
      live.push_back(take(model, stream, (i * 7919) % (3 * MiB) + 1));
      if (live.size() > 8) {
        model.deallocate(live[(i * 31) % live.size()]);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>((i * 31) % live.size()));
      }
    }
    for (void* p : live) {
      model.deallocate(p);
    }
  };
  std::thread other(churn, s1);
  churn(s0);
  other.join();
  CHECK(model.consistent());
  CHECK(model.stats().allocated_bytes == 0);
  const std::uint64_t cached = model.stats().reserved_bytes; // every block is free: all of it
  CHECK(model.empty_cache() == cached);
  CHECK(model.stats().reserved_bytes == 0);
}

TEST_CASE("expandable: pages are 2 MiB in the small pool and 20 MiB in the large, created and mapped one by one") {
  HostMemoryMapper mapper;
  auto model = expandable(200 * MiB, mapper);
  void* small = take(model, s0, 512);
  auto s = model.stats();
  CHECK(s.reservations == 1);
  CHECK(s.device_allocations == 1);
  CHECK(s.maps == 1);
  CHECK(s.set_accesses == 1);
  CHECK(s.device_frees == 1); // the handle goes once mapped; the mapping keeps the page
  CHECK(s.reserved_bytes == 2 * MiB);
  CHECK(mapper.physical_count() == 0);

  void* large = take(model, s0, 50 * MiB); // its own segment, three pages, one set_access
  s = model.stats();
  CHECK(s.reservations == 2);
  CHECK(s.device_allocations == 4);
  CHECK(s.maps == 4);
  CHECK(s.set_accesses == 2);
  CHECK(s.reserved_bytes == 62 * MiB);
  CHECK(s.allocated_bytes == 50 * MiB + 512); // 10 MiB left over is split off
  CHECK(mapper.mapping_count() == 4);
  CHECK(at(small) % (2 * MiB) == 0);
  CHECK(at(large) % (2 * MiB) == 0);
  CHECK(model.consistent());
}

TEST_CASE("expandable: a segment grows at its end, reusing the free block before the unmapped range") {
  auto model = expandable(200 * MiB);
  void* a = take(model, s0, MiB + 1);  // page 0: a, then 19 MiB - 512 free
  void* b = take(model, s0, 30 * MiB); // the free rest and one more page
  CHECK(at(b) == at(a) + MiB + 512);
  const auto s = model.stats();
  CHECK(s.reserved_bytes == 40 * MiB);
  CHECK(s.device_allocations == 2);
  CHECK(s.reservations == 1);
  CHECK(model.consistent());
}

TEST_CASE("expandable: best fit counts the unmapped room after a block, so the growing end goes last") {
  auto model = expandable(200 * MiB);
  void* a = take(model, s0, 10 * MiB);
  take(model, s0, 10 * MiB);            // page 0 full
  void* c = take(model, s0, 12 * MiB);  // page 1: c, then 8 MiB free before the unmapped rest
  model.deallocate(a);                  // 10 MiB free at the start
  CHECK(take(model, s0, 8 * MiB) == a); // not the exact 8 MiB after c
  CHECK(model.stats().reserved_bytes == 40 * MiB);
  CHECK(at(c) == at(a) + 20 * MiB);
  CHECK(model.consistent());
}

TEST_CASE("expandable: any 512 bytes left over are split off, in the large pool too") {
  auto model = expandable(200 * MiB);
  take(model, s0, 19 * MiB);
  CHECK(model.stats().allocated_bytes == 19 * MiB); // the default allocator would hand out 20 MiB
  CHECK(model.consistent());
}

TEST_CASE("expandable: empty_cache unmaps the pages wholly inside free blocks") {
  HostMemoryMapper mapper;
  auto model = expandable(200 * MiB, mapper);
  void* a = take(model, s0, 5 * MiB);
  void* b = take(model, s0, 40 * MiB); // from 5 MiB to 45 MiB: pages 1 and 2 mapped for it
  CHECK(model.stats().reserved_bytes == 60 * MiB);
  model.deallocate(b); // 5 MiB .. 60 MiB free
  CHECK(model.empty_cache() == 40 * MiB);
  auto s = model.stats();
  CHECK(s.unmaps == 2);
  CHECK(s.reserved_bytes == 20 * MiB);
  CHECK(mapper.mapping_count() == 1);
  CHECK(model.consistent());
  CHECK(take(model, s0, 15 * MiB) == static_cast<char*>(a) + 5 * MiB); // the rest of page 0

  model.deallocate(a);
  model.deallocate(static_cast<char*>(a) + 5 * MiB);
  CHECK(model.empty_cache() == 20 * MiB); // nothing mapped is left: the reservation goes too
  s = model.stats();
  CHECK(s.reserved_bytes == 0);
  CHECK(s.reservation_frees == 1);
  CHECK(model.segment_count() == 0);
  CHECK(mapper.reservation_count() == 0);
}

TEST_CASE("expandable: growth fills an unmapped hole before the segment's end") {
  auto model = expandable(200 * MiB);
  void* a = take(model, s0, 20 * MiB);
  void* b = take(model, s0, 20 * MiB);
  void* c = take(model, s0, 20 * MiB);
  model.deallocate(b);
  CHECK(model.empty_cache() == 20 * MiB); // page 1 unmapped: a hole between a and c
  CHECK(take(model, s0, 10 * MiB) == b);
  CHECK(at(c) == at(a) + 40 * MiB);
  CHECK(model.stats().reserved_bytes == 60 * MiB);
  CHECK(model.consistent());
}

TEST_CASE("expandable: capacity_bytes caps the mapped pages; cached pages are unmapped before a retry") {
  HostMemoryMapper mapper;
  auto model = expandable(60 * MiB, mapper);
  void* a = take(model, s0, 30 * MiB);                               // two pages of stream 0's segment
  CHECK(model.try_allocate(s1, 30 * MiB).error() == Errc::no_space); // one page fits, not two
  auto s = model.stats();
  CHECK(s.ooms == 1);
  CHECK(s.reserved_bytes == 40 * MiB);
  CHECK(s.device_allocations == 4); // a's two, then one page for stream 1, twice
  CHECK(s.device_frees == 4);
  CHECK(s.maps == 2);
  CHECK(s.failed_device_allocations == 2);
  CHECK(s.reservations == 2); // stream 1's segment was reserved, and stays for next time

  model.deallocate(a);
  void* b = take(model, s1, 30 * MiB); // fails once, then stream 0's pages are unmapped
  s = model.stats();
  CHECK(s.ooms == 1);
  CHECK(s.unmaps == 2);
  CHECK(s.reservation_frees == 1);
  CHECK(s.reserved_bytes == 40 * MiB);
  CHECK(s.peak_reserved_bytes == 40 * MiB);
  CHECK(mapper.mapping_count() == 2);
  model.deallocate(b);
  CHECK(model.consistent());
}

TEST_CASE("expandable: the destructor unmaps every page and frees every reservation") {
  HostMemoryMapper mapper;
  {
    auto model = expandable(200 * MiB, mapper);
    take(model, s0, 512);
    take(model, s1, 25 * MiB);
    model.deallocate(take(model, s1, 3 * MiB));
    CHECK(mapper.reservation_count() == 2); // stream 0's small segment, stream 1's large one
    CHECK(mapper.mapping_count() == 3);
  }
  CHECK(mapper.mapping_count() == 0);
  CHECK(mapper.reservation_count() == 0);
  CHECK(mapper.physical_count() == 0);
}

TEST_CASE("expandable: settings the model cannot run with are refused") {
  CHECK_THROWS_AS(expandable(0), carve::Exception);
  CHECK_THROWS_AS(expandable(64 * MiB, HostMemoryMapper({.granularity = 4 * MiB})), carve::Exception);
  CHECK(expandable(64 * MiB).options().address_space_bytes == 72 * MiB);
}

TEST_CASE("seeded from a recording's segments: live blocks at their offsets, the rest cached and merged") {
  using carve::trace::TraceBlock;
  using carve::trace::TraceSegment;
  Model model(SimulatedCard(256 * MiB));
  // A small segment with two live blocks and a 1 KiB hole; a large one whose live block leaves 512
  // KiB after it (not split off: PyTorch keeps it in the block) and 12 MiB at the front.
  const std::vector<TraceSegment> segments = {{0x100000000, 2 * MiB, 7, true}, {0x200000000, 20 * MiB, 7, false}};
  const std::vector<TraceBlock> blocks = {{0x100000000, 1000, 7, -1, -1},
                                          {0x100000800, 4096, 7, -1, -1},
                                          {0x200000000 + 12 * MiB, 7 * MiB + 512 * 1024, 7, -1, -1}};
  std::vector<void*> where(blocks.size(), nullptr);
  REQUIRE(model.seed(
      segments, blocks, 3, [](std::uint64_t) { return 0u; }, where));
  CHECK(model.consistent());
  const auto s = model.stats();
  CHECK(s.reserved_bytes == 22 * MiB);
  CHECK(s.allocated_bytes == 1024 + 4096 + 8 * MiB); // the large block holds the 512 KiB after it
  CHECK(at(where[1]) - at(where[0]) == 0x800);
  // The 1 KiB hole after the first block serves a 1 KiB request; the 12 MiB at the front of the
  // large segment a 12 MiB one: no new segment.
  CHECK(at(take(model, s0, 1024)) == at(where[0]) + 1024);
  CHECK(at(take(model, s0, 12 * MiB)) == at(where[2]) - 12 * MiB);
  CHECK(model.stats().device_allocations == 2);
  model.deallocate(where[2]); // merges with nothing: the front is live again
  CHECK(model.consistent());

  Model refused(SimulatedCard(256 * MiB));
  const std::vector<TraceBlock> outside = {{0x300000000, 1000, 7, -1, -1}};
  std::vector<void*> none(1, nullptr);
  CHECK_FALSE(refused.seed(
      segments, outside, 1, [](std::uint64_t) { return 0u; }, none));
  CHECK(refused.stats().reserved_bytes == 0); // nothing kept of a seed that failed
  CHECK(refused.upstream().used_bytes() == 0);
}
