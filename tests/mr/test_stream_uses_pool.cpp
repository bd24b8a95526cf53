// StreamUsesPool over each of carve's stream-ordered pools, on simulated streams: a block named on
// another stream (record_stream) is not handed out again, on any stream, until that stream has
// run the work it had queued by the free; then the pool's own rules apply. Refusals, a capture's
// hold, streams on which no event can be recorded, and four threads at once.
#include <carve/mr/address_only_card.hpp>
#include <carve/mr/stream_caching_pool.hpp>
#include <carve/mr/stream_ordered_pool.hpp>
#include <carve/mr/stream_uses_pool.hpp>
#include <carve/vmm/expandable_pool.hpp>
#include <carve/vmm/host_memory_mapper.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <random>
#include <set>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

// In a namespace of its own: the area's test files compile as one translation unit.
namespace test_stream_uses_pool {

using carve::Errc;
using carve::SimulatedCard;
using carve::SimulatedStream;
using carve::SimulatedStreams;

namespace {

constexpr std::size_t KiB = 1024;
constexpr SimulatedStream compute{0};
constexpr SimulatedStream side{1};
constexpr SimulatedStream other{2};

// One SimulatedStreams (thread-safe) that the pool and the adaptor both record on, so that a test
// completes work once for both. `unrecordable` names a stream on which no event can be recorded
// (as CUDA refuses one on another device's stream).
struct SharedStreams {
  using stream_type = SimulatedStream;
  using event_type = SimulatedStreams::event_type;
  SimulatedStreams* work = nullptr;
  std::uint32_t unrecordable = ~std::uint32_t{0};
  carve::Result<event_type> record(SimulatedStream s) {
    if (s.id == unrecordable) {
      return carve::fail(Errc::unsupported, "no event on that stream");
    }
    return work->record(s);
  }
  bool completed(event_type e) const { return work->completed(e); }
  void release(event_type) noexcept {}
};
static_assert(carve::StreamEvents<SharedStreams> && !carve::StreamEventsThatSynchronize<SharedStreams>);

// SharedStreams that can also synchronise a stream: its queued work runs, as when the host waits.
struct SynchronizingStreams : SharedStreams {
  std::atomic<int>* synchronized = nullptr;
  void synchronize(SimulatedStream s) noexcept {
    work->complete(s);
    synchronized->fetch_add(1);
  }
};
static_assert(carve::StreamEventsThatSynchronize<SynchronizingStreams>);

// Streams over `work` on which no event can be recorded on `side`, synchronising it instead
// (counted in `synchronized`).
SynchronizingStreams unrecordable_side(SimulatedStreams& work, std::atomic<int>& synchronized) {
  SynchronizingStreams streams;
  streams.work = &work;
  streams.unrecordable = side.id;
  streams.synchronized = &synchronized;
  return streams;
}

// A 16 KiB block of `pool` named on `side`, freed on `compute` while `side` has work queued: the
// free is held.
template <class Pool>
void free_while_side_works(Pool& pool, SimulatedStreams& work) {
  void* p = *pool.try_allocate(compute, 16 * KiB, 256);
  REQUIRE(pool.record_stream(p, side));
  work.enqueue(side);
  REQUIRE(pool.try_deallocate(compute, p, 16 * KiB, 256));
  CHECK(pool.stats().held_frees == 1);
}

// The three pools, over the shared streams, each with room for 256 KiB of blocks.
template <class Streams>
struct OrderedOver {
  using Pool = carve::StreamOrderedPool<SimulatedCard, Streams>;
  static carve::StreamUsesPool<Pool> make(Streams s) {
    return carve::StreamUsesPool<Pool>(
        std::piecewise_construct, std::forward_as_tuple(SimulatedCard(256 * KiB), carve::StreamPoolOptions{}, s), s);
  }
};
template <class Streams>
struct CachingOver {
  using Pool = carve::StreamCachingPool<SimulatedCard, Streams>;
  static carve::StreamUsesPool<Pool> make(Streams s) {
    return carve::StreamUsesPool<Pool>(std::piecewise_construct,
                                       std::forward_as_tuple(SimulatedCard(256 * KiB), carve::PoolOptions{}, s), s);
  }
};
template <class Streams>
struct ExpandableOver {
  using Pool = carve::ExpandablePool<carve::HostMemoryMapper, Streams>;
  static carve::StreamUsesPool<Pool> make(Streams s) {
    // A pool that moves: given whole.
    return carve::StreamUsesPool<Pool>(Pool(carve::HostMemoryMapper({.granularity = 4 * KiB}),
                                            carve::ExpandablePoolOptions{.max_reserved_bytes = 256 * KiB}, s),
                                       s);
  }
};

static_assert(carve::StreamOrderedResource<OrderedOver<SharedStreams>::Pool> &&
              carve::StreamOrderedResource<CachingOver<SharedStreams>::Pool> &&
              carve::StreamOrderedResource<ExpandableOver<SharedStreams>::Pool>);
static_assert(carve::StreamOrderedResource<carve::StreamUsesPool<OrderedOver<SharedStreams>::Pool>>);
static_assert(carve::MemoryResource<carve::StreamUsesPool<OrderedOver<SharedStreams>::Pool>>);

// Blocks the pool hands `stream` while `p` must stay out: every free block of `bytes` taken, so
// that `p` would be among them were it free. All given back before returning.
template <class Pool>
bool handed_out_again(Pool& pool, SimulatedStream stream, void* p, std::size_t bytes) {
  std::vector<void*> taken;
  bool found = false;
  while (auto q = pool.try_allocate(stream, bytes, 256)) {
    found = found || *q == p;
    taken.push_back(*q);
  }
  for (void* q : taken) {
    REQUIRE(pool.try_deallocate(stream, q, bytes, 256));
  }
  return found;
}

// A pool of `Over`'s kind on three simulated streams, and a 16 KiB block it gave `compute`.
template <class Over>
struct OneBlock {
  SimulatedStreams work{3};
  decltype(Over::make(SharedStreams{})) pool = Over::make(SharedStreams{&work});
  void* p = *pool.try_allocate(compute, 16 * KiB, 256);
};

} // namespace

TEST_CASE_TEMPLATE("a block read on a side stream comes back only once the side stream has run its reads", Over,
                   OrderedOver<SharedStreams>, CachingOver<SharedStreams>, ExpandableOver<SharedStreams>) {
  OneBlock<Over> t;
  t.work.enqueue(side); // a copy on the side stream reads p
  REQUIRE(t.pool.record_stream(t.p, side));
  t.work.enqueue(compute);
  t.work.complete(compute);
  REQUIRE(t.pool.try_deallocate(compute, t.p, 16 * KiB, 256));
  CHECK(t.pool.stats().held_frees == 1);
  CHECK(t.pool.stats().held_bytes == 16 * KiB);
  // Not on its own stream (the pool alone would reuse it there at once), nor on another.
  CHECK_FALSE(handed_out_again(t.pool, compute, t.p, 16 * KiB));
  CHECK_FALSE(handed_out_again(t.pool, other, t.p, 16 * KiB));
  CHECK(t.pool.try_deallocate(compute, t.p, 16 * KiB, 256).error() == Errc::not_allocated); // its free waits already
  t.work.complete(side);
  CHECK(t.pool.collect() == 1);
  CHECK(t.pool.stats().held_frees == 0);
  CHECK(handed_out_again(t.pool, compute, t.p, 16 * KiB)); // the pool's rule from here: its own stream at once
  CHECK(t.pool.stats().blocks_with_uses == 0);
  CHECK(t.pool.stats().frees_held == 1);
}

TEST_CASE_TEMPLATE("a block named only on its own stream is freed at once, its name forgotten", Over,
                   OrderedOver<SharedStreams>, CachingOver<SharedStreams>, ExpandableOver<SharedStreams>) {
  OneBlock<Over> t;
  REQUIRE(t.pool.record_stream(t.p, compute));
  REQUIRE(t.pool.record_stream(t.p, compute)); // twice: one name
  CHECK(t.pool.stats().blocks_with_uses == 1);
  CHECK_FALSE(t.pool.used_elsewhere(t.p, compute));
  CHECK(t.pool.used_elsewhere(t.p, side));
  REQUIRE(t.pool.try_deallocate(compute, t.p, 16 * KiB, 256));
  CHECK(t.pool.stats().held_frees == 0);
  CHECK(t.pool.stats().blocks_with_uses == 0);
  CHECK(handed_out_again(t.pool, compute, t.p, 16 * KiB));
}

TEST_CASE_TEMPLATE("a free the pool would refuse is refused before it is held, and its names kept", Over,
                   OrderedOver<SharedStreams>, CachingOver<SharedStreams>, ExpandableOver<SharedStreams>) {
  OneBlock<Over> t;
  REQUIRE(t.pool.record_stream(t.p, side));
  const auto wrong = t.pool.try_deallocate(compute, t.p, 48 * KiB, 256);
  REQUIRE_FALSE(wrong);
  CHECK(wrong.error() == Errc::invalid_size);
  CHECK(t.pool.stats().held_frees == 0);
  CHECK(t.pool.used_elsewhere(t.p, compute)); // still named: the right free waits for `side`
  int stranger = 0;
  CHECK(t.pool.record_stream(&stranger, side).error() == Errc::not_allocated); // not the pool's memory
  CHECK(t.pool.record_stream(nullptr, side).error() == Errc::not_allocated);
  CHECK(t.pool.check_deallocate(t.p, 16 * KiB, 256));
  t.work.enqueue(side);
  REQUIRE(t.pool.try_deallocate(compute, t.p, 16 * KiB, 256));
  CHECK(t.pool.check_deallocate(t.p, 16 * KiB, 256).error() == Errc::not_allocated);
  CHECK(t.pool.stats().held_frees == 1);
  CHECK(t.pool.record_stream(t.p, other).error() == Errc::not_allocated); // its free is held: no block now
  CHECK(t.pool.stats().blocks_with_uses == 0);                            // nothing recorded for it
  t.work.complete(side);
  CHECK(t.pool.collect() == 1);
}

TEST_CASE_TEMPLATE("an address inside a block names no block: refused, nothing recorded, the block's free not held",
                   Over, OrderedOver<SharedStreams>, CachingOver<SharedStreams>, ExpandableOver<SharedStreams>) {
  OneBlock<Over> t;
  void* inside = static_cast<char*>(t.p) + 4 * KiB; // the pool's memory, but no free would ever name it
  REQUIRE(t.pool.owns(inside));
  const auto named = t.pool.record_stream(inside, side);
  REQUIRE_FALSE(named);
  CHECK(named.error() == Errc::not_allocated);
  CHECK(t.pool.stats().blocks_with_uses == 0); // no entry left behind
  void* q = *t.pool.try_allocate(compute, 16 * KiB, 256);
  t.work.enqueue(side);
  REQUIRE(t.pool.record_stream(q, side)); // a block's own address is named as before
  REQUIRE(t.pool.try_deallocate(compute, q, 16 * KiB, 256));
  CHECK(t.pool.stats().held_frees == 1);
  REQUIRE(t.pool.try_deallocate(compute, t.p, 16 * KiB, 256));
  CHECK(t.pool.stats().held_frees == 1); // p was never named: freed at once
  t.work.complete(side);
  CHECK(t.pool.collect() == 1);
  CHECK(t.pool.stats().blocks_with_uses == 0);
}

TEST_CASE_TEMPLATE("a block freed already names no block; the smallest block names itself", Over,
                   OrderedOver<SharedStreams>, CachingOver<SharedStreams>, ExpandableOver<SharedStreams>) {
  OneBlock<Over> t;
  REQUIRE(t.pool.try_deallocate(compute, t.p, 16 * KiB, 256)); // cached by the pool, or given back
  CHECK(t.pool.record_stream(t.p, side).error() == Errc::not_allocated);
  CHECK(t.pool.stats().blocks_with_uses == 0);
  void* tiny = *t.pool.try_allocate(compute, 1, 1); // a size and alignment the pool's check is asked about
  t.work.enqueue(side);
  REQUIRE(t.pool.record_stream(tiny, side));
  REQUIRE(t.pool.try_deallocate(compute, tiny, 1, 1));
  CHECK(t.pool.stats().held_frees == 1);
  t.work.complete(side);
  CHECK(t.pool.collect() == 1);
}

TEST_CASE("a free on another stream that the caching pool holds for that stream's work names no block") {
  OneBlock<CachingOver<SharedStreams>> t;
  t.work.enqueue(other); // work on `other` may still read p
  REQUIRE(t.pool.try_deallocate(other, t.p, 16 * KiB, 256));
  CHECK(t.pool.record_stream(t.p, side).error() == Errc::not_allocated); // freed already, waiting
  CHECK(t.pool.stats().blocks_with_uses == 0);
  t.work.complete(other);
}

TEST_CASE("a free made while held records its events after the hold, so they cover the work queued meanwhile") {
  SimulatedStreams work(3);
  auto pool = OrderedOver<SharedStreams>::make(SharedStreams{&work});
  void* p = *pool.try_allocate(compute, 16 * KiB, 256);
  REQUIRE(pool.record_stream(p, side));
  work.enqueue(side);
  pool.hold(true); // a capture begins: no event calls on the streams it may take in
  REQUIRE(pool.try_deallocate(compute, p, 16 * KiB, 256));
  work.complete(side); // the work before the free has run, but no event says so yet
  CHECK(pool.collect() == 0);
  work.enqueue(side); // queued while held: covered by the event recorded after the hold
  pool.hold(false);
  CHECK(pool.collect() == 0); // recorded now, behind the second piece of work
  CHECK_FALSE(handed_out_again(pool, other, p, 16 * KiB));
  work.complete(side);
  CHECK(pool.collect() == 1);
  CHECK(handed_out_again(pool, other, p, 16 * KiB));
}

TEST_CASE("a stream on which no event can be recorded: synchronised where the Streams can, else waited on") {
  SUBCASE("Streams that can synchronise a stream") {
    SimulatedStreams work(3);
    std::atomic<int> synchronized{0};
    auto pool = OrderedOver<SynchronizingStreams>::make(unrecordable_side(work, synchronized));
    free_while_side_works(pool, work);
    CHECK(pool.collect() == 1); // side synchronised: its work ran
    CHECK(work.pending(side) == 0);
    CHECK(synchronized.load() == 1);
    CHECK(pool.stats().streams_synchronized == 1);
  }
  SUBCASE("Streams that cannot: the free waits") {
    SimulatedStreams work(3);
    SharedStreams streams{&work, side.id};
    auto pool = OrderedOver<SharedStreams>::make(streams);
    void* p = *pool.try_allocate(compute, 16 * KiB, 256);
    REQUIRE(pool.record_stream(p, side));
    REQUIRE(pool.try_deallocate(compute, p, 16 * KiB, 256));
    CHECK(pool.collect(true) == 0);
    CHECK(pool.stats().held_frees == 1);
    CHECK_FALSE(handed_out_again(pool, compute, p, 16 * KiB));
  }
}

TEST_CASE("a held free made with no stream, and held frees the adaptor's end still makes") {
  SUBCASE("the synchronous spelling: held while any stream was named, then freed with no stream") {
    SimulatedStreams work(3);
    auto pool = OrderedOver<SharedStreams>::make(SharedStreams{&work});
    void* p = *pool.try_allocate(16 * KiB, 256);
    REQUIRE(pool.record_stream(p, compute)); // no stream of its own: every named stream counts
    work.enqueue(compute);
    REQUIRE(pool.try_deallocate(p, 16 * KiB, 256));
    CHECK(pool.stats().held_frees == 1);
    CHECK(pool.collect() == 0);
    work.complete(compute);
    CHECK(pool.collect() == 1);
    CHECK(pool.pool().stats().bytes_in_use == 0);
  }
  SUBCASE("at the end: a stream with no event recorded is synchronised before the free is made") {
    SimulatedStreams work(3);
    std::atomic<int> synchronized{0};
    {
      auto pool = OrderedOver<SynchronizingStreams>::make(unrecordable_side(work, synchronized));
      free_while_side_works(pool, work);
      CHECK(work.pending(side) == 1);
    }
    CHECK(work.pending(side) == 0); // its reads ran before the pool took the block back
    CHECK(synchronized.load() == 1);
  }
}

TEST_CASE("trim makes the held frees whose streams have run, then the pool's trim") {
  SimulatedStreams work(3);
  auto pool = OrderedOver<SharedStreams>::make(SharedStreams{&work});
  void* p = *pool.try_allocate(compute, 16 * KiB, 256);
  void* q = *pool.try_allocate(compute, 16 * KiB, 256);
  REQUIRE(pool.record_stream(p, side));
  REQUIRE(pool.record_stream(q, other));
  work.enqueue(side);
  work.enqueue(other);
  REQUIRE(pool.try_deallocate(compute, p, 16 * KiB, 256));
  REQUIRE(pool.try_deallocate(compute, q, 16 * KiB, 256));
  work.complete(side);
  (void)pool.trim();
  CHECK(pool.stats().held_frees == 1); // q's still waits for `other`
  CHECK(pool.pool().upstream().used_bytes() > 0);
  work.complete(other);
  (void)pool.trim();
  CHECK(pool.stats().held_frees == 0);
  CHECK(pool.pool().upstream().used_bytes() == 0);
}

TEST_CASE("the one-argument form, default Streams, and the synchronous spellings, which pass straight through") {
  carve::StreamUsesPool<carve::StreamOrderedPool<SimulatedCard>> pool(
      SimulatedCard(16 * KiB)); // what its constructor takes
  void* p = pool.allocate(carve::SynchronousStream{}, 4 * KiB, 256);
  REQUIRE(pool.record_stream(p, carve::SynchronousStream{}));
  pool.deallocate(carve::SynchronousStream{}, p, 4 * KiB, 256);
  void* q = pool.allocate(8 * KiB, 256); // the synchronous spellings
  pool.deallocate(q, 8 * KiB, 256);
  CHECK(pool.stats().held_frees == 0);
  CHECK(pool.trim() > 0);
}

TEST_CASE("with no stream named, the adaptor serves exactly what its pool alone would") {
  // What lets carve_replay measure libcarve_torch's pools without the adaptor: the replay names no
  // stream (a snapshot's frees are replayed where PyTorch made them). Over address-only cards, as
  // in the replay: their addresses fall alike in their own ranges, where a SimulatedCard's come
  // from the heap, whose history (the tests before this one) orders them differently, and the
  // pools break ties between equal free blocks by address.
  using Caching = carve::StreamCachingPool<carve::AddressOnlyCard, SimulatedStreams>;
  Caching alone(carve::AddressOnlyCard(8 << 20), carve::PoolOptions{}, SimulatedStreams(3));
  carve::StreamUsesPool<Caching> wrapped(
      std::piecewise_construct,
      std::forward_as_tuple(carve::AddressOnlyCard(8 << 20), carve::PoolOptions{}, SimulatedStreams(3)),
      SimulatedStreams(3));
  std::mt19937 random(7);
  struct Live {
    void* a;
    void* b;
    std::size_t bytes;
    SimulatedStream stream;
  };
  std::vector<Live> live;
  for (int step = 0; step < 3000; ++step) {
    if (live.empty() || random() % 3 != 0) {
      const std::size_t bytes = 512 * (1 + random() % 600);
      const SimulatedStream s{static_cast<std::uint32_t>(random() % 3)};
      const auto a = alone.try_allocate(s, bytes, 512);
      const auto b = wrapped.try_allocate(s, bytes, 512);
      REQUIRE(a.has_value() == b.has_value());
      if (a) {
        live.push_back({*a, *b, bytes, s});
      }
    } else {
      const std::size_t i = random() % live.size();
      REQUIRE(alone.try_deallocate(live[i].stream, live[i].a, live[i].bytes, 512));
      REQUIRE(wrapped.try_deallocate(live[i].stream, live[i].b, live[i].bytes, 512));
      live[i] = live.back();
      live.pop_back();
    }
    const carve::StreamCachingPoolStats x = alone.stats();
    const carve::StreamCachingPoolStats y = wrapped.pool().stats();
    REQUIRE(x.bytes_reserved == y.bytes_reserved);
    REQUIRE(x.bytes_in_use == y.bytes_in_use);
  }
  CHECK(wrapped.stats().frees_held == 0);
  for (const Live& l : live) {
    alone.deallocate(l.stream, l.a, l.bytes, 512);
    wrapped.deallocate(l.stream, l.b, l.bytes, 512);
  }
}

TEST_CASE("four threads allocate, name side streams and free at once; no block is handed out while held") {
  constexpr unsigned threads = 4;
  SimulatedStreams work(threads * 2);
  auto pool = CachingOver<SharedStreams>::make(SharedStreams{&work});
  std::atomic<bool> overlap{false};
  std::vector<std::thread> running;
  for (unsigned t = 0; t < threads; ++t) {
    running.emplace_back([&, t] {
      const SimulatedStream own{t};
      const SimulatedStream reader{threads + t};
      std::set<void*> held; // this thread's blocks whose frees wait for `reader`
      for (int i = 0; i < 300; ++i) {
        auto p = pool.try_allocate(own, 1 * KiB, 256);
        if (!p) {
          work.complete(reader); // every held free of this thread may go now
          held.clear();
          continue;
        }
        if (held.count(*p) != 0) {
          overlap = true; // handed out again while its free waited for `reader`
        }
        work.enqueue(reader);
        CHECK(pool.record_stream(*p, reader)); // (CHECK: a REQUIRE would end the run from a thread)
        CHECK(pool.try_deallocate(own, *p, 1 * KiB, 256));
        held.insert(*p);
      }
      work.complete(reader);
    });
  }
  for (std::thread& t : running) {
    t.join();
  }
  CHECK_FALSE(overlap.load());
  (void)pool.trim();
  CHECK(pool.stats().held_frees == 0);
  CHECK(pool.pool().upstream().used_bytes() == 0);
}

} // namespace test_stream_uses_pool
