// StreamCachingPool on simulated streams: PyTorch's caching rule (a block serves only the stream
// it was allocated on), frees on another stream held until that stream's work has passed them,
// the retry that trims the other streams' settled pools, the idle threshold, misuse, a model over
// random operations, and threads.
#include <carve/mr/simulated_card.hpp>
#include <carve/mr/stream_caching_pool.hpp>
#include <carve/mr/stream_events.hpp>
#include <support/counting_streams.hpp>
#include <support/errors.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <new>
#include <random>
#include <thread>
#include <utility>
#include <vector>

// In a namespace of its own: the area's test files compile as one translation unit.
namespace test_stream_caching_pool {

using carve::Errc;
using carve::PoolOptions;
using carve::SimulatedCard;
using carve::SimulatedStream;
using carve::SimulatedStreams;
using Pool = carve::StreamCachingPool<SimulatedCard, SimulatedStreams>;

static_assert(carve::MemoryResource<Pool> && carve::OwnsMemory<Pool> && carve::Trimmable<Pool> &&
              carve::ReportsStats<Pool> && carve::ChecksDeallocation<Pool> && carve::UpstreamResource<Pool>);
static_assert(carve::MemoryResource<carve::StreamCachingPool<SimulatedCard>>); // SynchronousStreams by default

namespace {
constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;
constexpr SimulatedStream s0{0};
constexpr SimulatedStream s1{1};
constexpr SimulatedStream s2{2};
} // namespace

namespace {
// Streams whose first recording on stream 1 fails and whose later ones there throw, as CUDA's do
// when an event cannot be made and host memory then runs out building the error.
struct FlakyStreams {
  using stream_type = int;
  using event_type = int;
  int recorded_on_1 = 0;
  carve::Result<int> record(int s) {
    if (s == 1 && recorded_on_1++ > 0) {
      throw std::bad_alloc();
    }
    if (s == 1) {
      return carve::fail(Errc::unsupported, "no event");
    }
    return s;
  }
  bool completed(int) const { return true; }
  void release(int) noexcept {}
};
} // namespace

TEST_CASE("frees waiting on other streams: one whose stream throws stays, the rest still come home") {
  FlakyStreams streams;
  carve::detail::CrossStreamFrees<FlakyStreams, int> waiting;
  waiting.add(streams, 10, 1); // its event failed: recorded again at the next collect
  waiting.add(streams, 20, 2);
  waiting.add(streams, 30, 2);
  std::vector<int> home;
  const auto freed = [&](int block) {
    if (block == 30) {
      return false; // its pool cannot take it yet: stays
    }
    home.push_back(block);
    return true;
  };
  CHECK_THROWS_AS(waiting.collect(streams, freed), std::bad_alloc); // thrown at the end
  CHECK(home == std::vector<int>{20});
  CHECK(waiting.size() == 2);
  CHECK(waiting.any_of([](int b) { return b == 10; }));
  CHECK(waiting.any_of([](int b) { return b == 30; }));
}

TEST_CASE("held (a stream capture): a free on another stream records its event only when the hold ends") {
  SimulatedStreams streams(2);
  int recorded = 0;
  carve::StreamCachingPool<SimulatedCard, carve::test::CountingStreams> pool(
      SimulatedCard(16 * MiB), {}, carve::test::CountingStreams{&streams, &recorded});
  void* x = *pool.try_allocate(s0, 4 * KiB, 512);
  pool.hold(true);     // s1 may be capturing a graph: an event recorded there would never be recorded
  streams.enqueue(s1); // s1's kernel reads x
  REQUIRE(pool.try_deallocate(s1, x, 4 * KiB, 512));
  CHECK(pool.stats().pending_frees == 1);
  streams.complete(s1);
  void* y = *pool.try_allocate(s0, 4 * KiB, 512);
  CHECK(y != x); // no event says s1 passed the free
  CHECK(recorded == 0);
  pool.hold(false);
  streams.enqueue(s1); // more work on s1: the event recorded now comes after it
  void* z = *pool.try_allocate(s0, 4 * KiB, 512);
  CHECK(z != x);
  CHECK(recorded == 1);
  streams.complete(s1);
  void* w = *pool.try_allocate(s0, 4 * KiB, 512);
  CHECK(w == x);
  CHECK(pool.stats().pending_frees == 0);
  for (void* p : {y, z, w}) {
    REQUIRE(pool.try_deallocate(s0, p, 4 * KiB, 512));
  }
  CHECK(pool.consistent());
}

TEST_CASE("a block serves only the stream it was allocated on, which may reuse it at once") {
  Pool pool(SimulatedCard(16 * MiB), {}, SimulatedStreams(2));
  void* p = *pool.try_allocate(s0, 4 * KiB, 512);
  pool.streams().enqueue(s0); // a kernel on s0 still uses p
  REQUIRE(pool.try_deallocate(s0, p, 4 * KiB, 512));
  void* again = *pool.try_allocate(s0, 4 * KiB, 512);
  CHECK(again == p); // s0's next kernel runs after the last
  REQUIRE(pool.try_deallocate(s0, again, 4 * KiB, 512));
  pool.streams().complete(s0);
  void* other = *pool.try_allocate(s1, 4 * KiB, 512);
  CHECK(other != p); // s1 has a pool of its own, even with s0's work done
  CHECK(pool.owns(p));
  CHECK(pool.owns(other));
  const carve::StreamCachingPoolStats s = pool.stats();
  CHECK(s.pools == 3); // s0, s1 and the synchronous calls'
  CHECK(s.segments == 2);
  CHECK(s.cache_hits == 1);
  CHECK(s.bytes_in_use == 4 * KiB);
  CHECK(s.bytes_reserved == 4 * MiB);
  CHECK(s.peak_reserved == 4 * MiB);
  CHECK(s.peak_in_use == 8 * KiB);                // the streams' peaks summed: an upper bound with two streams
  CHECK(pool.upstream().used_bytes() == 4 * MiB); // one upstream under both: the pools share it
  REQUIRE(pool.try_deallocate(s1, other, 4 * KiB, 512));
  CHECK(pool.trim() == 4 * MiB);
  CHECK(pool.upstream().used_bytes() == 0);
  CHECK(pool.consistent());
}

TEST_CASE("a block freed on another stream goes home once that stream has passed the free") {
  Pool pool(SimulatedCard(16 * MiB), {}, SimulatedStreams(3));
  void* x = *pool.try_allocate(s0, 4 * KiB, 512);
  pool.streams().enqueue(s1); // s1's kernel reads x
  REQUIRE(pool.try_deallocate(s1, x, 4 * KiB, 512));
  CHECK(pool.stats().pending_frees == 1);
  CHECK(pool.stats().cross_stream_frees == 1);
  CHECK(pool.stats().bytes_in_use == 4 * KiB); // still x's pool's, until s1 passes the free
  void* y = *pool.try_allocate(s0, 4 * KiB, 512);
  CHECK(y != x);
  pool.streams().enqueue(s1); // work queued after the free does not hold it back
  pool.streams().complete(s1, 1);
  void* z = *pool.try_allocate(s0, 4 * KiB, 512);
  CHECK(z == x);
  CHECK(pool.stats().pending_frees == 0);
  // A block freed on a stream that never allocated, and freed synchronously: no pool is made.
  pool.streams().enqueue(s2);
  REQUIRE(pool.try_deallocate(s2, y, 4 * KiB, 512));
  REQUIRE(pool.try_deallocate(z, 4 * KiB, 512)); // synchronous: home at once
  CHECK(pool.stats().pools == 2);
  CHECK(pool.stats().bytes_in_use == 4 * KiB); // y, waiting on s2
  CHECK(pool.trim() == 0);                     // y's segment is not free until s2 has run
  pool.streams().complete(s2);
  CHECK(pool.trim() == 2 * MiB);
  CHECK(pool.stats().bytes_reserved == 0);
  CHECK(pool.consistent());
}

TEST_CASE("the upstream says no: the other streams' settled pools give back their segments, and it retries") {
  Pool pool(SimulatedCard(8 * MiB), {.shared_segment_size = 0}, SimulatedStreams(2));
  void* a = *pool.try_allocate(s0, 3 * MiB, 512); // a segment of 4 MiB (of its own: none shared)
  REQUIRE(pool.try_deallocate(s0, a, 3 * MiB, 512));
  void* b = *pool.try_allocate(s1, 6 * MiB, 512); // 4 MiB free on the card: s0's cache goes back
  const carve::StreamCachingPoolStats after = pool.stats();
  CHECK(after.pressure_retries == 1);
  CHECK(after.bytes_given_back == 4 * MiB);
  CHECK(after.bytes_reserved == 6 * MiB);
  CHECK(after.peak_reserved == 6 * MiB);

  // Freed while s1's work is queued: s0 may not have its memory until that work has run.
  pool.streams().enqueue(s1);
  REQUIRE(pool.try_deallocate(s1, b, 6 * MiB, 512));
  CHECK(pool.try_allocate(s0, 6 * MiB, 512).error() == Errc::no_space);
  CHECK(pool.upstream().used_bytes() == 6 * MiB);
  pool.streams().complete(s1);
  void* c = *pool.try_allocate(s0, 6 * MiB, 512);
  CHECK(pool.stats().pressure_retries == 3);
  REQUIRE(pool.try_deallocate(s0, c, 6 * MiB, 512));
  CHECK(pool.consistent());
}

TEST_CASE("held (a stream capture): a refused request takes nothing from the other streams") {
  Pool pool(SimulatedCard(8 * MiB), {.shared_segment_size = 0}, SimulatedStreams(2));
  void* a = *pool.try_allocate(s0, 3 * MiB, 512); // a segment of 4 MiB (of its own: none shared)
  REQUIRE(pool.try_deallocate(s0, a, 3 * MiB, 512));
  pool.hold(true);
  CHECK(pool.try_allocate(s1, 6 * MiB, 512).error() == Errc::no_space);
  CHECK(pool.stats().pressure_retries == 0);
  CHECK(pool.upstream().used_bytes() == 4 * MiB); // s0's cache stays
  pool.hold(false);
  void* b = *pool.try_allocate(s1, 6 * MiB, 512);
  CHECK(pool.stats().pressure_retries == 1);
  REQUIRE(pool.try_deallocate(s1, b, 6 * MiB, 512));
  CHECK(pool.consistent());
}

namespace {
// Streams whose recordings on stream 0 let the test act while one is under way: each says it has
// begun, then waits up to 200 ms for `held` (the pool's hold(true) returning).
struct PausingStreams {
  struct Signals {
    std::atomic<bool> recording{false};
    std::atomic<bool> held{false};
    bool held_while_recording = false;
  };
  using stream_type = int;
  using event_type = int;
  Signals* signals = nullptr;
  carve::Result<int> record(int s) {
    if (s == 0) {
      signals->recording = true;
      for (int i = 0; i < 100 && !signals->held; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      signals->held_while_recording = signals->held;
    }
    return s;
  }
  bool completed(int) const { return true; }
  void release(int) noexcept {}
};

// Once `under_way` is recording on stream 0, another thread holds `pool`; whether the recording
// saw the hold (hold(true) must wait for it to end first).
template <class P>
bool held_while_recording(P& pool, PausingStreams::Signals& signals, std::thread& under_way) {
  while (!signals.recording) {
    std::this_thread::yield();
  }
  std::thread capture([&] {
    pool.hold(true);
    signals.held = true;
  });
  under_way.join();
  capture.join();
  return signals.held_while_recording;
}
} // namespace

TEST_CASE("hold(true) returns only once a release from the other streams under way has ended") {
  PausingStreams::Signals signals;
  carve::StreamCachingPool<SimulatedCard, PausingStreams> pool(SimulatedCard(8 * MiB), {}, PausingStreams{&signals});
  void* a = *pool.try_allocate(0, 3 * MiB, 512); // a segment of 4 MiB, cached on stream 0
  REQUIRE(pool.try_deallocate(0, a, 3 * MiB, 512));
  void* b = nullptr;
  std::thread pressed([&] { // refused at first: stream 0's settled cache goes back, then served
    const auto r = pool.try_allocate(1, 6 * MiB, 512);
    b = r ? *r : nullptr;
  });
  CHECK_FALSE(held_while_recording(pool, signals, pressed));
  REQUIRE(b != nullptr); // the release was under way before the hold: it finished
  pool.hold(false);
  REQUIRE(pool.try_deallocate(1, b, 6 * MiB, 512));
  CHECK(pool.consistent());
}

TEST_CASE("under pressure, a block freed on another stream comes home once that stream has run") {
  Pool pool(SimulatedCard(8 * MiB), {}, SimulatedStreams(2));
  void* x = *pool.try_allocate(s0, 3 * MiB, 512); // a segment of 4 MiB
  pool.streams().enqueue(s1);
  REQUIRE(pool.try_deallocate(s1, x, 3 * MiB, 512));
  CHECK(pool.try_allocate(s0, 6 * MiB, 512).error() == Errc::no_space); // x is s1's work's still
  pool.streams().complete(s1);
  void* y = *pool.try_allocate(s0, 6 * MiB, 512); // x home, its segment back, then 6 MiB fits
  CHECK(pool.stats().pending_frees == 0);
  CHECK(pool.upstream().used_bytes() == 6 * MiB);
  REQUIRE(pool.try_deallocate(s0, y, 6 * MiB, 512));
}

TEST_CASE("idle threshold: each stream's pool keeps at most that much in whole free segments") {
  SUBCASE("0: a segment goes back as soon as it is wholly free") {
    Pool pool(SimulatedCard(16 * MiB), {.idle_threshold = 0}, SimulatedStreams(2));
    void* p = *pool.try_allocate(s0, 1 * MiB, 512);
    void* q = *pool.try_allocate(s1, 1 * MiB, 512);
    REQUIRE(pool.try_deallocate(s0, p, 1 * MiB, 512));
    CHECK(pool.upstream().used_bytes() == 2 * MiB);
    REQUIRE(pool.try_deallocate(s1, q, 1 * MiB, 512));
    CHECK(pool.upstream().used_bytes() == 0);
    CHECK(pool.stats().upstream_frees == 2);
  }
  SUBCASE("2 MiB: each stream keeps one segment") {
    Pool pool(SimulatedCard(16 * MiB), {.idle_threshold = 2 * MiB}, SimulatedStreams(2));
    std::vector<void*> blocks;
    for (const SimulatedStream s : {s0, s0, s1, s1}) {
      blocks.push_back(*pool.try_allocate(s, 2 * MiB, 512)); // a segment each
    }
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      REQUIRE(pool.try_deallocate(i < 2 ? s0 : s1, blocks[i], 2 * MiB, 512));
    }
    CHECK(pool.stats().segments == 2);
    CHECK(pool.stats().bytes_cached == 4 * MiB);
    CHECK(pool.upstream().used_bytes() == 4 * MiB);
  }
}

TEST_CASE("trim gives back what every settled stream caches, never a stream's with work queued") {
  Pool pool(SimulatedCard(16 * MiB), {}, SimulatedStreams(2));
  void* a = *pool.try_allocate(s0, 1 * MiB, 512);
  void* b = *pool.try_allocate(s1, 1 * MiB, 512);
  void* c = *pool.try_allocate(1 * MiB, 512); // the synchronous calls' pool
  pool.streams().enqueue(s1);
  REQUIRE(pool.try_deallocate(s0, a, 1 * MiB, 512));
  REQUIRE(pool.try_deallocate(s1, b, 1 * MiB, 512));
  REQUIRE(pool.try_deallocate(c, 1 * MiB, 512));
  CHECK(pool.trim() == 4 * MiB); // s0's segment and the synchronous one
  CHECK(pool.upstream().used_bytes() == 2 * MiB);
  pool.streams().complete(s1);
  CHECK(pool.trim() == 2 * MiB);
  CHECK(pool.upstream().used_bytes() == 0);

  // SynchronousStreams: every event is complete, so trim gives everything back.
  carve::StreamCachingPool<SimulatedCard> plain(SimulatedCard(16 * MiB));
  void* p = plain.allocate(carve::SynchronousStream{}, 3 * KiB, 512);
  void* q = plain.allocate(3 * KiB, 512);
  plain.deallocate(carve::SynchronousStream{}, p, 3 * KiB, 512);
  plain.deallocate(q, 3 * KiB, 512);
  CHECK(plain.trim() == 4 * MiB);
  CHECK(plain.upstream().used_bytes() == 0);
}

TEST_CASE("hold(true) returns only once a collection about to record its event has recorded it") {
  PausingStreams::Signals signals;
  carve::StreamCachingPool<SimulatedCard, PausingStreams> pool(SimulatedCard(8 * MiB), {}, PausingStreams{&signals});
  void* x = *pool.try_allocate(1, 4 * KiB, 512);
  pool.hold(true);
  REQUIRE(pool.try_deallocate(0, x, 4 * KiB, 512)); // freed on stream 0 while held: no event yet
  pool.hold(false);
  void* y = nullptr;
  std::thread collecting([&] { // its collection records the free's event on stream 0, pausing
    const auto r = pool.try_allocate(1, 4 * KiB, 512);
    y = r ? *r : nullptr;
  });
  CHECK_FALSE(held_while_recording(pool, signals, collecting));
  pool.hold(false);
  REQUIRE(y != nullptr);
  REQUIRE(pool.try_deallocate(1, y, 4 * KiB, 512));
  CHECK(pool.consistent());
}

TEST_CASE("held (a stream capture): trim records no event and keeps the streams' caches") {
  SimulatedStreams streams(2);
  int recorded = 0;
  carve::StreamCachingPool<SimulatedCard, carve::test::CountingStreams> pool(
      SimulatedCard(16 * MiB), {}, carve::test::CountingStreams{&streams, &recorded});
  void* a = *pool.try_allocate(s0, 1 * MiB, 512);
  void* c = *pool.try_allocate(1 * MiB, 512); // the synchronous calls' pool
  REQUIRE(pool.try_deallocate(s0, a, 1 * MiB, 512));
  REQUIRE(pool.try_deallocate(c, 1 * MiB, 512));
  pool.hold(true);
  CHECK(pool.trim() == 2 * MiB); // the synchronous pool's callers have synchronised
  CHECK(recorded == 0);
  CHECK(pool.upstream().used_bytes() == 2 * MiB);
  pool.hold(false);
  CHECK(pool.trim() == 2 * MiB);
  CHECK(recorded == 1);
}

namespace {
// SimulatedStreams whose next recording on stream 0, once the event is made, runs `meddle` before
// it returns: another thread's work on that stream, queued after the event.
struct MeddlingStreams {
  using stream_type = SimulatedStream;
  using event_type = SimulatedStreams::event_type;
  SimulatedStreams* streams;
  std::function<void()>* meddle;
  carve::Result<event_type> record(SimulatedStream s) {
    auto e = streams->record(s);
    if (s == s0 && *meddle) {
      std::exchange(*meddle, nullptr)();
    }
    return e;
  }
  bool completed(event_type e) const { return streams->completed(e); }
  void release(event_type e) noexcept { streams->release(e); }
};
} // namespace

TEST_CASE("trim never gives back a segment a block went back to after the stream's work was checked") {
  SimulatedStreams streams(2);
  std::function<void()> meddle;
  carve::StreamCachingPool<SimulatedCard, MeddlingStreams> pool(SimulatedCard(16 * MiB), {},
                                                                MeddlingStreams{&streams, &meddle});
  void* a = *pool.try_allocate(s0, 1 * MiB, 512);
  REQUIRE(pool.try_deallocate(s0, a, 1 * MiB, 512)); // s0's 2 MiB segment, idle
  meddle = [&] { // between trim's check of s0 and its release: a kernel on s0 uses the segment again
    void* b = *pool.try_allocate(s0, 1 * MiB, 512);
    CHECK(b == a);
    streams.enqueue(s0);
    REQUIRE(pool.try_deallocate(s0, b, 1 * MiB, 512)); // freed on s0 for work queued after it
  };
  CHECK(pool.trim() == 0);
  CHECK(pool.upstream().used_bytes() == 2 * MiB); // still s0's: its kernel may be reading it
  streams.complete(s0);
  CHECK(pool.trim() == 2 * MiB);
}

TEST_CASE("misuse is refused and changes nothing") {
  Pool pool(SimulatedCard(8 * MiB), {}, SimulatedStreams(2));
  CHECK(pool.try_allocate(s0, 0, 512).error() == Errc::invalid_size);
  CHECK(pool.try_allocate(s0, 64, 3).error() == Errc::invalid_size);
  CHECK(pool.try_allocate(s0, 64, 1024).error() == Errc::no_space);                 // above the granularity
  CHECK(pool.try_allocate(s1, ~std::size_t{0}, 512).error() == Errc::invalid_size); // overflows when rounded
  CHECK(pool.stats().pools == 1); // the synchronous calls' only: a bad request makes s0 or s1 none
  CHECK(pool.try_allocate(s0, 9 * MiB, 512).error() == Errc::no_space);
  CHECK(pool.try_allocate(s0, ~std::size_t{0}, 512).error() == Errc::invalid_size);
  CHECK(pool.try_allocate(0, 512).error() == Errc::invalid_size);
  CHECK(pool.stats().pools == 2); // s0's, made by the request its card refused
  CHECK_THROWS_ERRC(Errc::no_space, (void)pool.allocate(s1, 9 * MiB, 512));
  void* p = *pool.try_allocate(s0, 1 * KiB, 512);
  int local = 0;
  for (const auto& free_on :
       {std::optional<SimulatedStream>(s0), std::optional<SimulatedStream>(s1), std::optional<SimulatedStream>()}) {
    const auto free = [&](void* q, std::size_t bytes) {
      return free_on ? pool.try_deallocate(*free_on, q, bytes, 512) : pool.try_deallocate(q, bytes, 512);
    };
    CHECK(free(&local, 1 * KiB).error() == Errc::not_allocated);
    CHECK(free(static_cast<char*>(p) + 512, 512).error() == Errc::not_allocated); // inside p
    CHECK(free(p, 2 * KiB).error() == Errc::invalid_size);
  }
  // check_deallocate answers as a free on any stream would, and frees nothing.
  CHECK(pool.check_deallocate(&local, 1 * KiB, 512).error() == Errc::not_allocated);
  CHECK(pool.check_deallocate(p, 2 * KiB, 512).error() == Errc::invalid_size);
  CHECK(pool.check_deallocate(p, 1 * KiB, 512));
  CHECK(pool.stats().live_blocks == 1);
  CHECK(pool.stats().pending_frees == 0);
  // Freed on s1 (waiting for s1's work), then again: on any stream, or synchronously.
  pool.streams().enqueue(s1);
  REQUIRE(pool.try_deallocate(s1, p, 1 * KiB, 512));
  CHECK(pool.check_deallocate(p, 1 * KiB, 512).error() == Errc::not_allocated);
  CHECK(pool.try_deallocate(s1, p, 1 * KiB, 512).error() == Errc::not_allocated);
  CHECK(pool.try_deallocate(s0, p, 1 * KiB, 512).error() == Errc::not_allocated);
  CHECK(pool.try_deallocate(p, 1 * KiB, 512).error() == Errc::not_allocated);
  pool.streams().complete(s1);
  CHECK(pool.trim() == 2 * MiB);
  CHECK(pool.try_deallocate(s0, p, 1 * KiB, 512).error() == Errc::not_allocated); // home, and gone
  CHECK(pool.stats().deallocations == 1);
  CHECK_THROWS_AS(Pool(SimulatedCard(KiB), {.granularity = 3}, SimulatedStreams(1)), carve::Exception);
  CHECK_THROWS_AS(Pool(SimulatedCard(KiB), {.segment_size = 1000}, SimulatedStreams(1)), carve::Exception);
  CHECK(pool.consistent());
}

TEST_CASE("random streams against a model: a block never reaches another stream while one may use it") {
  for (unsigned seed = 1; seed <= 20; ++seed) {
    CAPTURE(seed);
    std::mt19937 rng(seed);
    constexpr std::uint32_t streams = 4;
    // A card large enough that no stream's pool is refused: memory moves between streams only
    // through trim(), which waits for the streams' work.
    Pool pool(SimulatedCard(256 * MiB), {.granularity = 512, .segment_size = 256 * KiB}, SimulatedStreams(streams));
    struct Held {
      std::size_t bytes;
      std::uint32_t stream; // allocated on
    };
    std::map<void*, Held> held;
    std::map<void*, std::uint32_t> cached_for; // freed blocks: the stream whose pool has them
    struct Waiting {
      void* p;
      std::uint32_t stream; // freed on
      std::uint64_t position;
    };
    std::vector<Waiting> waiting; // frees on another stream, not yet passed
    std::vector<std::uint64_t> queued(streams, 0);
    std::vector<std::uint64_t> done(streams, 0);
    for (int step = 0; step < 2000; ++step) {
      const auto s = static_cast<std::uint32_t>(rng() % streams);
      const auto dice = static_cast<unsigned>(rng() % 20);
      if (dice < 8) {
        const std::size_t bytes = 64 + rng() % (64 * KiB);
        const auto p = pool.try_allocate(SimulatedStream{s}, bytes, 512);
        REQUIRE(p);
        REQUIRE(held.count(*p) == 0); // never owned twice
        for (const Waiting& w : waiting) {
          CHECK(w.p != *p); // never before the freeing stream has passed the free
        }
        if (const auto c = cached_for.find(*p); c != cached_for.end()) {
          CHECK(c->second == s); // a cached block serves only its stream
          cached_for.erase(c);
        }
        held[*p] = {bytes, s};
        std::memset(*p, static_cast<int>(s), bytes);
      } else if (dice < 16 && !held.empty()) {
        auto it = held.begin();
        std::advance(it, static_cast<long>(rng() % held.size()));
        const std::uint32_t on = rng() % 3 == 0 ? s : it->second.stream;
        pool.streams().enqueue(SimulatedStream{on});
        ++queued[on];
        REQUIRE(pool.try_deallocate(SimulatedStream{on}, it->first, it->second.bytes, 512));
        if (on != it->second.stream) {
          waiting.push_back({it->first, on, queued[on]});
        }
        cached_for[it->first] = it->second.stream;
        held.erase(it);
      } else if (dice < 19) {
        const std::uint64_t n = rng() % 3;
        pool.streams().complete(SimulatedStream{s}, n);
        done[s] = std::min(queued[s], done[s] + n);
        std::erase_if(waiting, [&](const Waiting& w) { return done[w.stream] >= w.position; });
      } else {
        pool.trim(); // memory of settled streams' free segments may go anywhere now
        cached_for.clear();
      }
    }
    CHECK(pool.consistent());
    for (const auto& [p, h] : held) {
      REQUIRE(pool.try_deallocate(p, h.bytes, 512));
    }
    for (std::uint32_t s = 0; s < streams; ++s) {
      pool.streams().complete(SimulatedStream{s});
    }
    pool.trim();
    const carve::StreamCachingPoolStats s = pool.stats();
    CHECK(s.bytes_in_use == 0);
    CHECK(s.bytes_reserved == 0);
    CHECK(s.pending_frees == 0);
    CHECK(pool.upstream().used_bytes() == 0);
    CHECK(pool.consistent());
  }
}

TEST_CASE("threads, each on its stream, handing a quarter of their blocks to the next to free") {
  constexpr unsigned threads = 4;
  Pool pool(SimulatedCard(64 * MiB), {.granularity = 512, .segment_size = 256 * KiB}, SimulatedStreams(threads));
  std::atomic<int> overwritten{0};
  // Each block carries a byte of its own (its thread and its number there), so a block handed to
  // two callers at once shows the other's bytes.
  struct Block {
    unsigned char* p;
    std::size_t bytes;
    unsigned char tag;
  };
  struct Handoff {
    std::mutex mutex;
    std::vector<Block> blocks;
  };
  std::vector<Handoff> handoffs(threads);
  std::vector<std::thread> workers;
  for (unsigned t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      std::mt19937 rng(t + 1);
      const SimulatedStream mine{t};
      const auto release = [&](const Block& b) {
        for (std::size_t k = 0; k < b.bytes; ++k) {
          if (b.p[k] != b.tag) {
            ++overwritten;
            break;
          }
        }
        pool.streams().enqueue(mine);
        CHECK(pool.try_deallocate(mine, b.p, b.bytes, 512));
      };
      std::vector<Block> held;
      for (int i = 0; i < 1500; ++i) {
        if (held.size() < 8 && rng() % 2 == 0) {
          const std::size_t bytes = 64 + rng() % (32 * KiB);
          const auto p = pool.try_allocate(mine, bytes, 512);
          REQUIRE(p);
          const Block b{static_cast<unsigned char*>(*p), bytes,
                        static_cast<unsigned char>(t + threads * static_cast<unsigned>(i % 61))};
          std::memset(b.p, b.tag, bytes);
          if (rng() % 4 == 0) { // the next thread frees it, on its own stream
            Handoff& next = handoffs[(t + 1) % threads];
            const std::lock_guard lock(next.mutex);
            next.blocks.push_back(b);
          } else {
            held.push_back(b);
          }
        } else if (!held.empty()) {
          release(held.back());
          held.pop_back();
        }
        std::vector<Block> given;
        {
          const std::lock_guard lock(handoffs[t].mutex);
          given.swap(handoffs[t].blocks);
        }
        for (const Block& b : given) {
          release(b);
        }
        if (rng() % 8 == 0) {
          pool.streams().complete(mine);
        }
        if (i % 500 == 499) {
          pool.trim();
        }
      }
      for (const Block& b : held) {
        release(b);
      }
      pool.streams().complete(mine);
    });
  }
  for (std::thread& w : workers) {
    w.join();
  }
  for (Handoff& h : handoffs) { // handed to a thread that had finished
    for (const Block& b : h.blocks) {
      REQUIRE(pool.try_deallocate(b.p, b.bytes, 512));
    }
  }
  CHECK(overwritten == 0);
  CHECK(pool.stats().cross_stream_frees > 0);
  for (unsigned t = 0; t < threads; ++t) {
    pool.streams().complete(SimulatedStream{t});
  }
  pool.trim();
  CHECK(pool.stats().bytes_in_use == 0);
  CHECK(pool.upstream().used_bytes() == 0);
  CHECK(pool.consistent());
}

} // namespace test_stream_caching_pool
