// StreamOrderedPool on simulated streams: a block freed on a stream is reused there at once and
// on another stream only after the free's event has completed, checked by hand, against a model
// over random operations, and with threads.
#include <carve/mr.hpp>
#include <carve/mr/trace_resource.hpp>
#include <carve/vmm/expandable_pool.hpp>
#include <carve/vmm/host_memory_mapper.hpp>
#include <support/counting_streams.hpp>
#include <support/errors.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <iterator>
#include <map>
#include <random>
#include <thread>
#include <vector>

// In a namespace of its own: the area's test files compile as one translation unit.
namespace test_stream_ordered_pool {

using carve::Errc;
using carve::SimulatedCard;
using carve::SimulatedStream;
using carve::SimulatedStreams;
using Pool = carve::StreamOrderedPool<SimulatedCard, SimulatedStreams>;

static_assert(carve::MemoryResource<Pool> && carve::OwnsMemory<Pool>);
static_assert(carve::StreamEvents<SimulatedStreams>);

namespace {
constexpr std::size_t KiB = 1024;
constexpr SimulatedStream s0{0};
constexpr SimulatedStream s1{1};
constexpr SimulatedStream s2{2};
} // namespace

TEST_CASE("a freed block: at once on its own stream, on another only after the free's event") {
  Pool pool(SimulatedCard(1 << 20), {}, SimulatedStreams(3));
  void* p = *pool.try_allocate(s0, 4 * KiB, 256);
  pool.streams().enqueue(s0); // a kernel on s0 uses p
  REQUIRE(pool.try_deallocate(s0, p, 4 * KiB, 256));
  // Another stream gets other memory while s0's kernel may still be running.
  void* q = *pool.try_allocate(s1, 4 * KiB, 256);
  CHECK(q != p);
  CHECK(pool.stats().waits_avoided == 1);
  // The same stream may reuse it: its next kernel is queued behind the one that used p.
  void* again = *pool.try_allocate(s0, 4 * KiB, 256);
  CHECK(again == p);
  CHECK(pool.stats().same_stream_reuses == 1);
  pool.streams().enqueue(s0);
  REQUIRE(pool.try_deallocate(s0, again, 4 * KiB, 256));
  // Once s0 has run past the free, any stream may have it.
  void* early = *pool.try_allocate(s2, 4 * KiB, 256);
  CHECK(early != p);
  pool.streams().complete(s0, 1); // the first kernel only: the free came after the second
  void* r = *pool.try_allocate(s2, 4 * KiB, 256);
  CHECK(r != p);
  pool.streams().complete(s0);
  void* t = *pool.try_allocate(s2, 4 * KiB, 256);
  CHECK(t == p);
  CHECK(pool.stats().cross_stream_reuses == 1);
  // The synchronous form: a synchronous free is reusable anywhere, a synchronous allocation
  // takes only blocks whose events have completed.
  REQUIRE(pool.try_deallocate(t, 4 * KiB, 256));
  CHECK(*pool.try_allocate(4 * KiB, 256) == p);
  for (void* b : {p, q, r, early}) {
    REQUIRE(pool.try_deallocate(b, 4 * KiB, 256));
  }
  pool.trim();
  CHECK(pool.stats().bytes_in_use == 0);
  CHECK(pool.upstream().used_bytes() == 0);
}

TEST_CASE("a hundred entries cached, handed out and cached again: each reused entry says what its own free said") {
  // Hand-outs keep up to 64 entries' nodes for later frees; the rest are made anew. A node that
  // held a free on s0 with its event, reused for a synchronous free, must carry neither.
  constexpr std::size_t n = 100;
  constexpr std::size_t bytes = 32 * KiB;
  Pool pool(SimulatedCard(16 << 20), {}, SimulatedStreams(2));
  void* other = *pool.try_allocate(s1, bytes, 256); // a second stream: frees on s0 record events
  std::vector<void*> blocks;
  for (std::size_t i = 0; i < n; ++i) {
    blocks.push_back(*pool.try_allocate(s0, bytes, 256));
  }
  for (void* b : blocks) {
    REQUIRE(pool.try_deallocate(s0, b, bytes, 256));
  }
  std::vector<void*> again;
  for (std::size_t i = 0; i < n; ++i) {
    again.push_back(*pool.try_allocate(s0, bytes, 256));
  }
  CHECK(pool.stats().same_stream_reuses == n);
  CHECK(pool.stats().bytes_in_use == (n + 1) * bytes);
  pool.streams().enqueue(s0); // a kernel on s0 still uses every block
  const std::vector<void*> on_s0(again.begin(), again.begin() + n / 2);
  const std::vector<void*> at_once(again.begin() + n / 2, again.end());
  for (void* b : on_s0) {
    REQUIRE(pool.try_deallocate(s0, b, bytes, 256));
  }
  for (void* b : at_once) {
    REQUIRE(pool.try_deallocate(b, bytes, 256)); // synchronous: reusable anywhere at once
  }
  CHECK(pool.stats().bytes_cached == n * bytes);
  std::vector<void*> taken;
  for (std::size_t i = 0; i < n; ++i) {
    taken.push_back(*pool.try_allocate(s1, bytes, 256));
  }
  for (void* b : on_s0) { // not before s0 has run past its free
    CHECK(std::find(taken.begin(), taken.end(), b) == taken.end());
  }
  for (void* b : at_once) {
    CHECK(std::find(taken.begin(), taken.end(), b) != taken.end());
  }
  pool.streams().complete(s0);
  for (std::size_t i = 0; i < n / 2; ++i) {
    taken.push_back(*pool.try_allocate(s1, bytes, 256)); // now the ones freed on s0
  }
  for (void* b : on_s0) {
    CHECK(std::find(taken.begin(), taken.end(), b) != taken.end());
  }
  for (void* b : taken) {
    REQUIRE(pool.try_deallocate(b, bytes, 256));
  }
  REQUIRE(pool.try_deallocate(other, bytes, 256));
  pool.trim();
  CHECK(pool.stats().bytes_cached == 0);
  CHECK(pool.upstream().used_bytes() == 0);
}

using carve::test::CountingStreams;

TEST_CASE("one stream: its frees record no events; one event answers for them all when asked") {
  SimulatedStreams streams(2);
  int recorded = 0;
  carve::StreamOrderedPool<SimulatedCard, CountingStreams> pool(SimulatedCard(1 << 20), {},
                                                                CountingStreams{&streams, &recorded});
  std::vector<void*> blocks;
  for (int i = 0; i < 8; ++i) {
    blocks.push_back(*pool.try_allocate(s0, 4 * KiB, 256));
  }
  streams.enqueue(s0); // a kernel on s0 uses them
  for (void* p : blocks) {
    REQUIRE(pool.try_deallocate(s0, p, 4 * KiB, 256));
  }
  CHECK(recorded == 0);
  // Reused on its own stream: nothing to ask.
  void* again = *pool.try_allocate(s0, 4 * KiB, 256);
  CHECK(std::find(blocks.begin(), blocks.end(), again) != blocks.end());
  CHECK(recorded == 0);
  // A synchronous request must know that s0 passed the frees: one event, for every free so far,
  // recorded after the kernel, so not yet complete.
  void* sync = *pool.try_allocate(4 * KiB, 256);
  CHECK(std::find(blocks.begin(), blocks.end(), sync) == blocks.end());
  CHECK(recorded == 1);
  CHECK(pool.trim() == 0); // still the same event: nothing went back
  CHECK(recorded == 1);
  streams.complete(s0);
  CHECK(pool.trim() == 7 * 4 * KiB);
  CHECK(recorded == 1);
  pool.deallocate(s0, again, 4 * KiB, 256);
  pool.deallocate(sync, 4 * KiB, 256);
  CHECK(pool.trim() == 2 * 4 * KiB); // s0 has run everything: the event recorded now completes at once
  CHECK(recorded == 2);
  // The second stream: from now on each free on a stream records its own event.
  void* other = *pool.try_allocate(s1, 4 * KiB, 256);
  const int before = recorded;
  streams.enqueue(s1);
  REQUIRE(pool.try_deallocate(s1, other, 4 * KiB, 256));
  CHECK(recorded == before + 1);
  streams.enqueue(s1); // more work on s1, after the free
  streams.complete(s1, 1);
  // s0 may take it: s1 passed the free, though not the work queued after it.
  CHECK(*pool.try_allocate(s0, 4 * KiB, 256) == other);
}

TEST_CASE("held, the pool records no event to ask whether the lone stream passed a free") {
  SimulatedStreams streams(2);
  int recorded = 0;
  carve::StreamOrderedPool<SimulatedCard, CountingStreams> pool(SimulatedCard(1 << 20), {},
                                                                CountingStreams{&streams, &recorded});
  void* p = *pool.try_allocate(s0, 4 * KiB, 256);
  streams.enqueue(s0);
  REQUIRE(pool.try_deallocate(s0, p, 4 * KiB, 256));
  streams.complete(s0);
  pool.hold(true); // s0 may be capturing a graph: an event recorded there would never be recorded
  void* q = *pool.try_allocate(4 * KiB, 256);
  CHECK(q != p);
  void* r = *pool.try_allocate(s1, 4 * KiB, 256);
  CHECK(r != p);
  CHECK(recorded == 0);
  pool.hold(false);
  CHECK(*pool.try_allocate(4 * KiB, 256) == p); // asked now: s0 has run its work
  CHECK(recorded == 1);
}

TEST_CASE("held with two streams in use: a free records no event until the hold ends") {
  SimulatedStreams streams(2);
  int recorded = 0;
  carve::StreamOrderedPool<SimulatedCard, CountingStreams> pool(SimulatedCard(1 << 20), {},
                                                                CountingStreams{&streams, &recorded});
  pool.deallocate(s0, *pool.try_allocate(s0, 4 * KiB, 256), 4 * KiB, 256);
  void* p = *pool.try_allocate(s1, 8 * KiB, 256); // the second stream: each free records its own event
  const int before = recorded;
  pool.hold(true); // s1 may be capturing a graph
  streams.enqueue(s1);
  REQUIRE(pool.try_deallocate(s1, p, 8 * KiB, 256));
  CHECK(recorded == before);
  streams.complete(s1);
  void* q = *pool.try_allocate(s0, 8 * KiB, 256);
  CHECK(q != p); // no event says s1 passed the free
  CHECK(recorded == before);
  void* r = *pool.try_allocate(s1, 8 * KiB, 256);
  CHECK(r == p); // its own stream takes it at once
  streams.enqueue(s1);
  REQUIRE(pool.try_deallocate(s1, r, 8 * KiB, 256));
  CHECK(recorded == before);
  pool.hold(false); // the free's event now, after the kernel
  CHECK(recorded == before + 1);
  void* t = *pool.try_allocate(s0, 8 * KiB, 256);
  CHECK(t != p);
  streams.complete(s1);
  CHECK(*pool.try_allocate(s0, 8 * KiB, 256) == p);
  pool.deallocate(s0, q, 8 * KiB, 256);
  pool.deallocate(s0, t, 8 * KiB, 256);
}

// CountingStreams that can wait for an event (as CudaStreams can): waiting runs the stream's work.
struct WaitingStreams : CountingStreams {
  int* waits;
  void wait(event_type e) noexcept {
    ++*waits;
    streams->complete(SimulatedStream{e.stream});
  }
};
static_assert(carve::StreamEventsThatWait<WaitingStreams>);

TEST_CASE("trim and a refusal wait for the lone stream's work where the streams can") {
  SimulatedStreams streams(1);
  int recorded = 0;
  int waits = 0;
  carve::StreamOrderedPool<SimulatedCard, WaitingStreams> pool(SimulatedCard(4 << 20), {},
                                                               WaitingStreams{{&streams, &recorded}, &waits});
  // trim(): the event it records has not completed (on a GPU the host runs ahead): it waits.
  void* p = *pool.try_allocate(s0, 4 * KiB, 256);
  streams.enqueue(s0);
  REQUIRE(pool.try_deallocate(s0, p, 4 * KiB, 256));
  CHECK(pool.trim() == 2 << 20); // the small block's segment, whole
  CHECK(recorded == 1);
  CHECK(waits == 1);
  // A refusal: the cached 3 MiB block's stream is still busy, so a synchronous request passes it
  // over, the card refuses, and the retry waits for the stream before giving the block back.
  void* big = *pool.try_allocate(s0, 3 << 20, 256);
  streams.enqueue(s0);
  REQUIRE(pool.try_deallocate(s0, big, 3 << 20, 256));
  const auto other = pool.try_allocate(2 << 20, 256);
  REQUIRE(other);
  CHECK(waits == 2);
  CHECK(pool.stats().bytes_cached == 0);
  pool.deallocate(*other, 2 << 20, 256);
}

TEST_CASE("sizes: a cached block serves requests between half its size and its size") {
  Pool pool(SimulatedCard(1 << 20), {.granularity = 512}, SimulatedStreams(1));
  void* big = *pool.try_allocate(s0, 8 * KiB, 256);
  REQUIRE(pool.try_deallocate(s0, big, 8 * KiB, 256));
  void* small = *pool.try_allocate(s0, 1 * KiB, 256);
  CHECK(small != big); // too small for it: would pin 8 KiB
  void* half = *pool.try_allocate(s0, 4 * KiB + 1, 256);
  CHECK(half == big);
  CHECK(pool.stats().bytes_in_use == 8 * KiB + 1 * KiB);
  REQUIRE(pool.try_deallocate(s0, half, 4 * KiB + 1, 256));
  REQUIRE(pool.try_deallocate(s0, small, 1 * KiB, 256));
  // Reserved is what the upstream holds for the pool, in use or cached; the peaks stay.
  const carve::StreamPoolStats st = pool.stats();
  CHECK(st.bytes_in_use == 0);
  CHECK(st.bytes_reserved == 9 * KiB);
  CHECK(st.bytes_reserved == pool.upstream().used_bytes());
  CHECK(st.peak_in_use == 9 * KiB);
  CHECK(st.peak_reserved == 9 * KiB);
  pool.trim();
  CHECK(pool.stats().bytes_reserved == 0);
  CHECK(pool.stats().peak_reserved == 9 * KiB);
}

TEST_CASE("small blocks are cut from segments they share; a larger one is an upstream allocation of its own") {
  constexpr std::size_t MiB = std::size_t{1} << 20;
  Pool pool(SimulatedCard(64 * MiB), {}, SimulatedStreams(2));
  std::vector<void*> small;
  for (int i = 0; i < 16; ++i) {
    small.push_back(*pool.try_allocate(i % 2 == 0 ? s0 : s1, 4 * KiB, 256));
  }
  CHECK(pool.upstream().used_bytes() == 2 * MiB); // one segment for all sixteen
  void* large = *pool.try_allocate(s0, MiB + 512, 256);
  CHECK(pool.upstream().used_bytes() == 2 * MiB + MiB + 512);
  auto st = pool.stats();
  CHECK(st.upstream_allocations == 17);
  CHECK(st.bytes_in_use == 64 * KiB + MiB + 512);
  CHECK(st.bytes_reserved == pool.upstream().used_bytes()); // the segment's rest is reserved too
  CHECK(st.peak_reserved == st.bytes_reserved);
  for (int i = 0; i < 16; ++i) {
    pool.deallocate(i % 2 == 0 ? s0 : s1, small[static_cast<std::size_t>(i)], 4 * KiB, 256);
  }
  pool.deallocate(s0, large, MiB + 512, 256);
  CHECK(pool.upstream().used_bytes() == 3 * MiB + 512); // cached
  CHECK(pool.trim() == MiB + 512 + 2 * MiB);            // the large block, then the segment no small block holds
  CHECK(pool.upstream().used_bytes() == 0);
  CHECK(pool.stats().bytes_reserved == 0);
  // With small_block_max = 0 every block is an allocation of its own.
  Pool own(SimulatedCard(64 * MiB), {.small_block_max = 0}, SimulatedStreams(1));
  void* a = *own.try_allocate(s0, 4 * KiB, 256);
  void* b = *own.try_allocate(s0, 4 * KiB, 256);
  CHECK(own.upstream().used_bytes() == 8 * KiB);
  own.deallocate(s0, a, 4 * KiB, 256);
  own.deallocate(s0, b, 4 * KiB, 256);
}

TEST_CASE("near a full card a cached block serves requests down to 2/3 of its size, not half") {
  // A 64 KiB card; a 40 KiB block freed and cached holds more than half of it. A 24 KiB request
  // would fill it to 60%, below 2/3: it gets memory of its own while the card has some.
  Pool pool(SimulatedCard(64 * KiB), {}, SimulatedStreams(1));
  void* x = *pool.try_allocate(s0, 40 * KiB, 256);
  pool.deallocate(s0, x, 40 * KiB, 256);
  void* p = *pool.try_allocate(s0, 24 * KiB, 256);
  CHECK(p != x);
  void* q = *pool.try_allocate(s0, 27 * KiB, 256); // 27/40 is over 2/3: the block serves it
  CHECK(q == x);
  pool.deallocate(s0, p, 24 * KiB, 256);
  pool.deallocate(s0, q, 27 * KiB, 256);
  // A block freed on s0 while its work runs, and too little room on the card: the narrow window
  // finds nothing, the card refuses, and the block (only s0 may take it) serves as it would have.
  Pool full(SimulatedCard(64 * KiB), {}, SimulatedStreams(1));
  void* big = *full.try_allocate(s0, 40 * KiB, 256);
  void* kept = *full.try_allocate(s0, 16 * KiB, 256);
  full.streams().enqueue(s0);
  full.deallocate(s0, big, 40 * KiB, 256);
  const auto wide = full.try_allocate(s0, 24 * KiB, 256);
  REQUIRE(wide);
  CHECK(*wide == big);
  CHECK(full.stats().upstream_failures == 1);
  full.deallocate(s0, *wide, 24 * KiB, 256);
  full.deallocate(s0, kept, 16 * KiB, 256);
  // Where the pool never counts itself near full, half is enough, as on a card with room.
  Pool roomy(SimulatedCard(64 * KiB), {.near_full_permille = 1000}, SimulatedStreams(1));
  void* y = *roomy.try_allocate(s0, 40 * KiB, 256);
  roomy.deallocate(s0, y, 40 * KiB, 256);
  void* r = *roomy.try_allocate(s0, 24 * KiB, 256);
  CHECK(r == y);
  roomy.deallocate(s0, r, 24 * KiB, 256);
}

TEST_CASE("bad input is refused and changes nothing") {
  Pool pool(SimulatedCard(64 * KiB), {}, SimulatedStreams(2));
  CHECK(pool.try_allocate(s0, 0, 256).error() == Errc::invalid_size);
  CHECK(pool.try_allocate(s0, 64, 3).error() == Errc::invalid_size);
  CHECK(pool.try_allocate(s0, 128 * KiB, 256).error() == Errc::no_space);
  CHECK(pool.try_allocate(s0, ~std::size_t{0}, 256).error() == Errc::invalid_size); // overflows when rounded
  void* p = *pool.try_allocate(s0, 1 * KiB, 256);
  int local = 0;
  CHECK(pool.try_deallocate(s0, &local, 1 * KiB, 256).error() == Errc::not_allocated);
  CHECK(pool.try_deallocate(s0, p, 2 * KiB, 256).error() == Errc::invalid_size);
  CHECK(pool.try_deallocate(s0, p, 1 * KiB, 512).error() == Errc::invalid_size);
  // check_deallocate answers as the free would, and frees nothing.
  CHECK(pool.check_deallocate(&local, 1 * KiB, 256).error() == Errc::not_allocated);
  CHECK(pool.check_deallocate(p, 2 * KiB, 256).error() == Errc::invalid_size);
  CHECK(pool.check_deallocate(p, 1 * KiB, 512).error() == Errc::invalid_size);
  CHECK(pool.check_deallocate(p, 1 * KiB, 256));
  CHECK(pool.check_deallocate(p, 1 * KiB, 256)); // p is still live
  CHECK(pool.owns(p));
  CHECK(pool.owns(static_cast<char*>(p) + KiB - 1)); // inside the block
  CHECK_FALSE(pool.owns(static_cast<char*>(p) + KiB));
  CHECK_FALSE(pool.owns(&local));
  REQUIRE(pool.try_deallocate(s0, p, 1 * KiB, 256));
  CHECK(pool.owns(p));                                                            // cached: still the pool's memory
  CHECK(pool.try_deallocate(s0, p, 1 * KiB, 256).error() == Errc::not_allocated); // twice
  CHECK(pool.check_deallocate(p, 1 * KiB, 256).error() == Errc::not_allocated);
  CHECK(pool.upstream().used_bytes() == 1 * KiB); // p is cached
  CHECK_THROWS_ERRC(carve::Errc::no_space, pool.allocate(s0, 128 * KiB, 256));
  CHECK(pool.upstream().used_bytes() == 0); // the cache went back before the request was refused
  CHECK_FALSE(pool.owns(p));
  CHECK(pool.stats().upstream_failures == 2);
  CHECK_THROWS_AS(Pool(SimulatedCard(KiB), {.granularity = 3}, SimulatedStreams(1)), carve::Exception);
  // A granularity above the small blocks' 2 MiB segments: segments of one granule, no error.
  Pool coarse(SimulatedCard(std::size_t{64} << 20), {.granularity = std::size_t{4} << 20}, SimulatedStreams(1));
  void* c = *coarse.try_allocate(s0, KiB, 256);
  CHECK(coarse.upstream().used_bytes() == std::size_t{4} << 20);
  coarse.deallocate(s0, c, KiB, 256);
  CHECK(pool.trim() == 0);
}

TEST_CASE("a full card: cached blocks whose work is done go back, and the request is retried") {
  Pool pool(SimulatedCard(64 * KiB), {}, SimulatedStreams(2));
  void* a = *pool.try_allocate(s0, 16 * KiB, 256);
  void* b = *pool.try_allocate(s0, 16 * KiB, 256);
  void* c = *pool.try_allocate(s1, 16 * KiB, 256);
  pool.deallocate(s0, a, 16 * KiB, 256);
  pool.deallocate(s0, b, 16 * KiB, 256);
  pool.streams().enqueue(s1); // c's stream still has work queued before its free
  pool.deallocate(s1, c, 16 * KiB, 256);
  // 40 KiB: no cached block fits, and the card has 16 KiB left; a and b go back (their events
  // have completed), c stays cached (its stream's work has not run).
  void* d = *pool.try_allocate(s0, 40 * KiB, 256);
  CHECK(pool.stats().upstream_failures == 1);
  CHECK(pool.stats().bytes_cached == 16 * KiB);
  CHECK(pool.upstream().used_bytes() == 56 * KiB);
  CHECK(pool.try_allocate(s0, 20 * KiB, 256).error() == Errc::no_space); // only c could go, and it may not
  pool.streams().complete(s1);
  void* e = *pool.try_allocate(s0, 20 * KiB, 256); // now c goes back and the card holds it
  pool.deallocate(s0, d, 40 * KiB, 256);
  pool.deallocate(s0, e, 20 * KiB, 256);
}

TEST_CASE("held (a stream capture): nothing goes back by itself; a request the card refuses is refused") {
  Pool pool(SimulatedCard(64 * KiB), {.idle_threshold = 0}, SimulatedStreams(2));
  void* a = *pool.try_allocate(s0, 32 * KiB, 256);
  void* b = *pool.try_allocate(s1, 16 * KiB, 256);
  pool.hold(true);
  pool.deallocate(s0, a, 32 * KiB, 256); // past the threshold, its work run, but held: cached
  CHECK(pool.stats().bytes_cached == 32 * KiB);
  CHECK(pool.try_allocate(s1, 40 * KiB, 256).error() == Errc::no_space); // a would make room: kept
  CHECK(pool.upstream().used_bytes() == 48 * KiB);
  pool.hold(false);
  void* c = *pool.try_allocate(s1, 40 * KiB, 256); // now a goes back and the card holds it
  CHECK(pool.stats().bytes_cached == 0);
  pool.deallocate(s1, b, 16 * KiB, 256);
  pool.deallocate(s1, c, 40 * KiB, 256);
}

TEST_CASE("idle threshold: a free that leaves more cached gives back blocks whose work has run, largest first") {
  Pool pool(SimulatedCard(1 << 20), {.idle_threshold = 16 * KiB}, SimulatedStreams(2));
  void* a = *pool.try_allocate(s0, 16 * KiB, 256);
  void* b = *pool.try_allocate(s0, 8 * KiB, 256);
  void* c = *pool.try_allocate(s1, 32 * KiB, 256);
  pool.deallocate(s0, a, 16 * KiB, 256); // at the threshold: kept
  CHECK(pool.stats().bytes_cached == 16 * KiB);
  pool.streams().enqueue(s1);
  pool.deallocate(s1, c, 32 * KiB, 256); // c's stream still works on it: a goes, c stays
  CHECK(pool.stats().bytes_cached == 32 * KiB);
  CHECK(pool.stats().idle_releases == 1);
  CHECK(pool.upstream().used_bytes() == 40 * KiB);
  pool.streams().complete(s1);
  pool.deallocate(s0, b, 8 * KiB, 256); // now c, the largest, goes, and 8 KiB is under the threshold
  CHECK(pool.stats().bytes_cached == 8 * KiB);
  CHECK(pool.stats().idle_releases == 2);
  CHECK(pool.upstream().used_bytes() == 8 * KiB);
  CHECK(pool.options().idle_threshold == 16 * KiB);
}

TEST_CASE("random streams against a model: never handed to another stream before its event") {
  // The model keeps ranges, not start addresses: small blocks are cut from shared segments, so a
  // block handed out may overlap a freed one without starting where it did.
  for (unsigned seed = 1; seed <= 20; ++seed) {
    CAPTURE(seed);
    std::mt19937 rng(seed);
    constexpr std::uint32_t streams = 4;
    // A low idle threshold, so that cached blocks go back to their segments, to be cut anew.
    Pool pool(SimulatedCard(4 << 20), {.granularity = 256, .idle_threshold = 32 * KiB}, SimulatedStreams(streams));
    struct Held {
      std::size_t bytes;
      std::uint32_t stream;
      unsigned char tag; // every byte of the block, written when handed out
    };
    std::map<std::uintptr_t, Held> held;
    // Each freed range, its stream and the position of its free in that stream's work.
    struct Freed {
      std::uintptr_t end;
      std::uint32_t stream;
      std::uint64_t position;
    };
    std::map<std::uintptr_t, Freed> freed;
    std::vector<std::uint64_t> queued(streams, 0);
    std::vector<std::uint64_t> done(streams, 0);
    // The first entry of `ranges` that may overlap [a, ...): the one before a's position, if any.
    const auto first_near = [](auto& ranges, std::uintptr_t a) {
      auto it = ranges.lower_bound(a);
      return it == ranges.begin() ? it : std::prev(it);
    };
    // The first 1000 steps use one stream, whose frees record no events of their own.
    for (int step = 0; step < 3000; ++step) {
      const auto s = step < 1000 ? 0u : static_cast<std::uint32_t>(rng() % streams);
      const auto dice = static_cast<unsigned>(rng() % 10);
      if (dice < 4) {
        const std::size_t bytes = 64 + rng() % (16 * KiB);
        const bool synchronous = rng() % 8 == 0; // takes only blocks whose stream passed the free
        const auto p = synchronous ? pool.try_allocate(bytes, 256) : pool.try_allocate(SimulatedStream{s}, bytes, 256);
        REQUIRE(p);
        const auto a = reinterpret_cast<std::uintptr_t>(*p);
        for (auto it = first_near(held, a); it != held.end() && it->first < a + bytes; ++it) {
          REQUIRE(it->first + it->second.bytes <= a); // never overlaps a live block
        }
        for (auto it = first_near(freed, a); it != freed.end() && it->first < a + bytes;) {
          if (it->second.end <= a) {
            ++it;
            continue;
          }
          const Freed& f = it->second;
          // The same block again: on the stream that freed it, or once that stream passed the
          // free. Part of one (its memory went back to a segment and was cut anew): only once
          // the free was passed, whatever the stream.
          const bool passed = done[f.stream] >= f.position;
          CHECK((passed || (it->first == a && f.stream == s && !synchronous)));
          it = freed.erase(it);
        }
        const auto tag = static_cast<unsigned char>(1 + rng() % 255);
        held[a] = {bytes, s, tag};
        std::memset(*p, tag, bytes);
      } else if (dice < 8 && !held.empty()) {
        auto it = held.begin();
        std::advance(it, static_cast<long>(rng() % held.size()));
        const auto* bytes = reinterpret_cast<const unsigned char*>(it->first);
        REQUIRE(std::all_of(bytes, bytes + it->second.bytes, [&](unsigned char b) { return b == it->second.tag; }));
        const std::uint32_t on = rng() % 3 == 0 ? s : it->second.stream; // freed on another stream too
        pool.streams().enqueue(SimulatedStream{on});
        ++queued[on];
        REQUIRE(pool.try_deallocate(SimulatedStream{on}, reinterpret_cast<void*>(it->first), it->second.bytes, 256));
        freed[it->first] = {it->first + it->second.bytes, on, queued[on]};
        held.erase(it);
      } else if (rng() % 4 == 0) {
        pool.trim(); // what goes back to a segment may be cut anew, at other starts
      } else {
        const std::uint64_t n = rng() % 3;
        pool.streams().complete(SimulatedStream{s}, n);
        done[s] = std::min(queued[s], done[s] + n);
      }
    }
    for (const auto& [a, h] : held) {
      REQUIRE(pool.try_deallocate(reinterpret_cast<void*>(a), h.bytes, 256));
    }
    for (std::uint32_t s = 0; s < streams; ++s) {
      pool.streams().complete(SimulatedStream{s});
    }
    pool.trim();
    CHECK(pool.stats().bytes_in_use == 0);
    CHECK(pool.stats().bytes_cached == 0);
    CHECK(pool.upstream().used_bytes() == 0);
  }
}

TEST_CASE("threads, each with its stream, never share a block") {
  constexpr unsigned threads = 4;
  Pool pool(SimulatedCard(8 << 20), {.granularity = 256}, SimulatedStreams(threads));
  std::atomic<int> overlaps{0};
  std::vector<std::thread> workers;
  for (unsigned t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      std::mt19937 rng(t + 1);
      const SimulatedStream mine{t};
      std::vector<std::pair<unsigned char*, std::size_t>> held;
      for (int i = 0; i < 2000; ++i) {
        if (held.size() < 8 && rng() % 2 == 0) {
          const std::size_t bytes = 64 + rng() % (4 * KiB);
          auto* p = static_cast<unsigned char*>(*pool.try_allocate(mine, bytes, 256));
          std::memset(p, static_cast<int>(t + 1), bytes);
          held.emplace_back(p, bytes);
        } else if (!held.empty()) {
          auto [p, bytes] = held.back();
          held.pop_back();
          for (std::size_t k = 0; k < bytes; ++k) {
            if (p[k] != static_cast<unsigned char>(t + 1)) {
              ++overlaps;
              break;
            }
          }
          pool.streams().enqueue(mine);
          (void)pool.try_deallocate(mine, p, bytes, 256);
          if (rng() % 4 == 0) {
            pool.streams().complete(mine);
          }
        }
      }
      for (auto [p, bytes] : held) {
        (void)pool.try_deallocate(mine, p, bytes, 256);
      }
      pool.streams().complete(mine);
    });
  }
  for (std::thread& w : workers) {
    w.join();
  }
  CHECK(overlaps == 0);
  CHECK(pool.stats().cross_stream_reuses + pool.stats().same_stream_reuses > 0);
  pool.trim();
  CHECK(pool.upstream().used_bytes() == 0);
}

TEST_CASE("SimulatedStreams: an unknown stream is carve::Exception (out_of_range), not std::out_of_range") {
  SimulatedStreams streams(2);
  CHECK_THROWS_ERRC(Errc::out_of_range, streams.enqueue(SimulatedStream{2}));
  CHECK_THROWS_ERRC(Errc::out_of_range, streams.complete(SimulatedStream{7}));
  CHECK_THROWS_ERRC(Errc::out_of_range, streams.pending(SimulatedStream{2}));
  CHECK_THROWS_ERRC(Errc::out_of_range, streams.completed({5, 0}));
  streams.enqueue(SimulatedStream{1});
  CHECK(streams.pending(SimulatedStream{1}) == 1);
}

namespace one_shape {
// The stream-ordered spellings every stream-ordered carve resource has, stream first, and CCCL
// 3.0's with the stream last.
template <class R, class S = typename R::stream_type>
concept SameStreamSpellings = requires(R& r, S s, void* p, std::size_t n) {
  { r.try_allocate(s, n, n) }
  noexcept->std::same_as<cuda::std::expected<void*, Errc>>;
  { r.try_deallocate(s, p, n, n) }
  noexcept->std::same_as<cuda::std::expected<void, Errc>>;
  { r.deallocate(s, p, n, n) }
  noexcept;
  { r.allocate(s, n, n) } -> std::same_as<void*>;
  { r.allocate_async(n, n, s) } -> std::same_as<void*>;
  { r.deallocate_async(p, n, n, s) }
  noexcept;
  { r.allocate_sync(n, n) } -> std::same_as<void*>;
};
// No spelling takes a default alignment where carve's own calls are concerned.
template <class R, class S = typename R::stream_type>
concept DefaultsAnAlignment = requires(R& r, S s, void* p, std::size_t n) {
  r.try_allocate(s, n);
}
|| requires(R& r, S s, void* p, std::size_t n) { r.deallocate(s, p, n); }
|| requires(R& r, S s, std::size_t n) { r.allocate(s, n); };
using Expandable = carve::ExpandablePool<carve::HostMemoryMapper, SimulatedStreams>;
using Caching = carve::StreamCachingPool<SimulatedCard, SimulatedStreams>;
static_assert(SameStreamSpellings<Pool> && SameStreamSpellings<Expandable> && SameStreamSpellings<Caching>);
static_assert(SameStreamSpellings<carve::TraceResource<Pool>> && SameStreamSpellings<carve::TraceResource<Expandable>>);
static_assert(!DefaultsAnAlignment<Pool> && !DefaultsAnAlignment<Expandable> && !DefaultsAnAlignment<Caching> &&
              !DefaultsAnAlignment<carve::TraceResource<Pool>>);
template <class R>
concept DefaultsAnAlignmentWithoutStreams = requires(R& r, std::size_t n) {
  r.try_allocate(n);
}
|| requires(R& r, void* p, std::size_t n) { r.deallocate(p, n); }
|| requires(R& r, void* p, std::size_t n) { r.try_deallocate(p, n); };
static_assert(!DefaultsAnAlignmentWithoutStreams<carve::CachingPool<SimulatedCard>>); // no default there alone
static_assert(!DefaultsAnAlignmentWithoutStreams<Pool> && !DefaultsAnAlignmentWithoutStreams<Expandable> &&
              !DefaultsAnAlignmentWithoutStreams<Caching>);
} // namespace one_shape

TEST_CASE("the CCCL 3.0 spellings are the stream-first calls under another name") {
  Pool pool(SimulatedCard(1 << 20), {}, SimulatedStreams(2));
  void* p = pool.allocate_async(4 * KiB, 256, s0);
  pool.streams().enqueue(s0);
  pool.deallocate_async(p, 4 * KiB, 256, s0);
  void* again = pool.allocate(s0, 4 * KiB, 256);
  CHECK(again == p); // reused on the stream that freed it
  pool.deallocate(s0, again, 4 * KiB, 256);
  void* other = pool.allocate_async(4 * KiB, 256, s1);
  CHECK(other != p); // not on another stream before the free's event has completed
  pool.deallocate(s1, other, 4 * KiB, 256);
}

} // namespace test_stream_ordered_pool
