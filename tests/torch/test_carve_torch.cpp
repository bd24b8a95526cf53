// libcarve_torch on its host backend: each of the three stacks (expandable, stream-ordered,
// caching) driven as PyTorch drives the C functions — blocks written whole and never overlapping,
// a free on one stream reused on another only after that stream's work has run, out of memory
// under a cap, empty_cache, the counts balancing — first by hand, then from four threads on four
// streams; the gate a capture closes, and a capture beginning while a free records its events; and
// the C functions themselves (CARVE_TORCH_BACKEND=host is set by ctest).
#include "host_stacks.hpp"
#include <capture_gate.hpp>
#include <carve_torch.h>
#include <pool_stacks.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

using carve::torch::DeviceStack;
using carve::torch::PoolKind;

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t KiB = std::size_t{1} << 10;

using namespace host_stacks;

// Live blocks by address: a new one must overlap none (no byte handed out twice).
class LiveBlocks {
public:
  bool add(void* p, std::size_t bytes) {
    const std::lock_guard lock(mutex_);
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    const auto after = blocks_.lower_bound(a);
    if (after != blocks_.end() && after->first < a + bytes) {
      return false;
    }
    if (after != blocks_.begin() && std::prev(after)->first + std::prev(after)->second > a) {
      return false;
    }
    blocks_.emplace(a, bytes);
    return true;
  }
  void remove(void* p) {
    const std::lock_guard lock(mutex_);
    blocks_.erase(reinterpret_cast<std::uintptr_t>(p));
  }

private:
  std::mutex mutex_;
  std::map<std::uintptr_t, std::size_t> blocks_;
};

// Every byte is `tag`: the first is, and each equals the next (memcmp, which the sanitizers run at
// full speed).
bool filled_with(const void* p, std::size_t bytes, unsigned char tag) {
  const auto* b = static_cast<const unsigned char*>(p);
  return bytes == 0 || (b[0] == tag && std::memcmp(b, b + 1, bytes - 1) == 0);
}

// A block of `bytes` allocated on `own` and named as used on `other` too (Tensor.record_stream).
struct UsedOnTwoStreams {
  UsedOnTwoStreams(DeviceStack& s, std::size_t bytes) : p(s.allocate(own, bytes)) {
    if (p != nullptr) {
      REQUIRE(s.record_stream(p, other));
    }
  }
  std::uintptr_t first = fresh_streams(2);
  cudaStream_t own = stream(first);
  cudaStream_t other = stream(first + 1);
  void* p;
};

} // namespace

TEST_CASE("the expandable stack's counting mapper passes on whether the driver maps part of an allocation") {
  // A driver that maps whole allocations only: the pool must know before it lends, through the
  // mapper libcarve_torch puts between them.
  for (const bool parts : {true, false}) {
    carve::torch::Books books;
    carve::torch::CountingMapper<carve::HostMemoryMapper> counting(
        carve::HostMemoryMapper({.maps_partial_allocations = parts}), &books);
    carve::ExpandablePool<carve::torch::CountingMapper<carve::HostMemoryMapper>> pool(counting);
    CHECK(pool.stats().lending_refused == !parts);
    CHECK(books.device_calls.load() == 0); // the question is no driver call
  }
}

TEST_CASE("each stack: a free on one stream is reused on another only after that stream's work has run") {
  for (const PoolKind kind : kinds) {
    CAPTURE(name(kind));
    auto stack = make(kind);
    const std::uintptr_t a = fresh_streams(2);
    const std::uintptr_t b = a + 1;
    void* p = stack->allocate(stream(a), 3 * MiB);
    REQUIRE(p != nullptr);
    CHECK(reinterpret_cast<std::uintptr_t>(p) % 512 == 0);
    std::memset(p, 0x5a, 3 * MiB);

    // A kernel on a still uses p when a frees it: b must not get p.
    enqueue(stream(a));
    REQUIRE(stack->deallocate(stream(a), p, 3 * MiB));
    void* q = stack->allocate(stream(b), 3 * MiB);
    REQUIRE(q != nullptr);
    CHECK(q != p);
    // a itself may take p back at once: its next kernel runs after the last.
    void* r = stack->allocate(stream(a), 3 * MiB);
    CHECK(r == p);
    REQUIRE(stack->deallocate(stream(a), r, 3 * MiB));
    REQUIRE(stack->deallocate(stream(b), q, 3 * MiB));

    // Freed on b while b still runs a kernel on it: a gets it back only once b has run that work.
    void* x = stack->allocate(stream(a), 1 * MiB);
    REQUIRE(x != nullptr);
    enqueue(stream(b));
    REQUIRE(stack->deallocate(stream(b), x, 1 * MiB));
    void* y = stack->allocate(stream(a), 1 * MiB);
    CHECK(y != x);
    complete(stream(b));
    complete(stream(a));
    void* z = stack->allocate(stream(a), 1 * MiB);
    CHECK(z == x);
    REQUIRE(stack->deallocate(stream(a), y, 1 * MiB));
    REQUIRE(stack->deallocate(stream(a), z, 1 * MiB));

    // Every stream's work has run: the device gets everything back.
    stack->empty_cache();
    const carve::torch::Books& books = stack->books();
    CHECK(books.live.now() == 0);
    CHECK((books.mallocs.load() - books.frees.load()) == 0);
    CHECK(books.reserved.now() == 0);
    CHECK(books.mallocs.load() == books.frees.load());
    CHECK(books.live.peak() == 6 * MiB);
    CHECK(books.failures.load() == 0);
  }
}

TEST_CASE("each stack: out of memory under a cap returns null and changes nothing; empty_cache gives all back") {
  for (const PoolKind kind : kinds) {
    CAPTURE(name(kind));
    auto stack = make(kind, 16 * MiB);
    const std::uintptr_t a = fresh_streams(2);
    const std::uintptr_t b = a + 1;
    std::vector<void*> held;
    for (void* p = nullptr; (p = stack->allocate(stream(a), 3 * MiB)) != nullptr;) {
      std::memset(p, 1, 3 * MiB);
      held.push_back(p);
      REQUIRE(held.size() < 16);
    }
    CHECK(held.size() >= 4);
    CHECK(stack->books().failures.load() == 1);
    CHECK(stack->books().reserved.now() <= 16 * MiB);
    CHECK(stack->allocate(stream(a), 17 * MiB) == nullptr);
    CHECK((stack->books().mallocs.load() - stack->books().frees.load()) == held.size());

    // Freed on a with a's work done: b can have the memory (through the device for caching).
    for (void* p : held) {
      REQUIRE(stack->deallocate(stream(a), p, 3 * MiB));
    }
    void* big = stack->allocate(stream(b), 12 * MiB);
    REQUIRE(big != nullptr);
    std::memset(big, 2, 12 * MiB);
    REQUIRE(stack->deallocate(stream(b), big, 12 * MiB));

    // A freed block whose stream still works on it stays with the pool through empty_cache.
    void* busy = stack->allocate(stream(b), 2 * MiB);
    REQUIRE(busy != nullptr);
    enqueue(stream(b));
    REQUIRE(stack->deallocate(stream(b), busy, 2 * MiB));
    stack->empty_cache();
    CHECK(stack->books().reserved.now() > 0);
    complete(stream(b));
    stack->empty_cache();
    CHECK(stack->books().reserved.now() == 0);
    CHECK(stack->books().live.now() == 0);
    CHECK(stack->books().device_calls.load() > 0);

    // Not a block of this stack: refused, nothing changes.
    int local = 0;
    const auto refused = stack->deallocate(stream(a), &local, 512);
    REQUIRE_FALSE(refused);
    CHECK(refused.error() == carve::Errc::not_allocated);
  }
}

namespace {

// Four threads, each on its own stream, allocate and free random sizes, writing each block whole
// and checking it is intact before its free (another block over it would have written it); a
// quarter of the blocks are freed by the next thread on its own stream, whose work is queued and
// completed as it goes. Returns the number of failures seen.
template <class Allocate, class Free, class Finish>
int hammer(Allocate allocate, Free free, Finish finish, std::uintptr_t first_stream) {
  constexpr int threads = 4;
  constexpr int rounds = 300;
  LiveBlocks live;
  std::atomic<int> failures{0};
  struct Handoff {
    std::mutex mutex;
    std::vector<std::pair<void*, std::size_t>> blocks;
  };
  std::vector<Handoff> handoffs(threads);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      const cudaStream_t s = stream(first_stream + static_cast<std::uintptr_t>(t));
      std::mt19937 rng(static_cast<unsigned>(t) + 1);
      std::vector<std::pair<void*, std::size_t>> mine;
      const auto release = [&](void* p, std::size_t bytes) {
        if (!filled_with(p, bytes, static_cast<unsigned char>(reinterpret_cast<std::uintptr_t>(p) >> 9))) {
          ++failures;
        }
        live.remove(p);
        free(s, p, bytes);
      };
      for (int i = 0; i < rounds; ++i) {
        const std::size_t bytes = (std::size_t{1} << (8 + rng() % 13)) + rng() % 512; // 256 bytes to 1 MiB
        void* p = allocate(s, bytes);
        if (p == nullptr || reinterpret_cast<std::uintptr_t>(p) % 512 != 0 || !live.add(p, bytes)) {
          ++failures;
          continue;
        }
        std::memset(p, static_cast<unsigned char>(reinterpret_cast<std::uintptr_t>(p) >> 9), bytes);
        mine.emplace_back(p, bytes);
        if (rng() % 4 == 0) { // the next thread frees it on its stream
          const std::lock_guard lock(handoffs[static_cast<std::size_t>((t + 1) % threads)].mutex);
          handoffs[static_cast<std::size_t>((t + 1) % threads)].blocks.push_back(mine.back());
          mine.pop_back();
        }
        if (mine.size() > 8) {
          const std::size_t k = rng() % mine.size();
          release(mine[k].first, mine[k].second);
          mine.erase(mine.begin() + static_cast<std::ptrdiff_t>(k));
        }
        std::vector<std::pair<void*, std::size_t>> given;
        {
          const std::lock_guard lock(handoffs[static_cast<std::size_t>(t)].mutex);
          given.swap(handoffs[static_cast<std::size_t>(t)].blocks);
        }
        for (const auto& [q, n] : given) {
          release(q, n);
        }
        if (i % 16 == 0) {
          finish(s);
        }
      }
      for (const auto& [q, n] : mine) {
        release(q, n);
      }
      finish(s);
    });
  }
  for (auto& th : pool) {
    th.join();
  }
  for (auto& h : handoffs) { // handed to a thread that had finished
    for (const auto& [q, n] : h.blocks) {
      live.remove(q);
      free(stream(first_stream), q, n);
    }
  }
  return failures.load();
}

} // namespace

TEST_CASE("each stack: before refusing it gives back its cache and tries once more, never memory a stream still uses") {
  for (const PoolKind kind : kinds) {
    CAPTURE(name(kind));
    auto stack = make(kind, 16 * MiB);
    const std::uintptr_t a = fresh_streams(2);
    const std::uintptr_t b = a + 1;

    // 10 MiB cached after its free: 12 MiB more fits under the cap only once it goes back (the
    // pool's own trim under pressure, or the stack's retry).
    void* cached = stack->allocate(stream(a), 10 * MiB);
    REQUIRE(cached != nullptr);
    REQUIRE(stack->deallocate(stream(a), cached, 10 * MiB));
    std::size_t released = 0;
    void* big = stack->allocate(stream(a), 12 * MiB, &released);
    REQUIRE(big != nullptr);
    CHECK(stack->books().failures.load() == 0);
    CHECK(stack->books().reserved.now() <= 16 * MiB);
    std::memset(big, 3, 12 * MiB);
    REQUIRE(stack->deallocate(stream(a), big, 12 * MiB));
    stack->empty_cache();

    // A block freed while its stream's work is queued stays the pool's through the retry: the
    // request is refused, then served once that work has run.
    void* busy = stack->allocate(stream(a), 10 * MiB);
    REQUIRE(busy != nullptr);
    enqueue(stream(a));
    REQUIRE(stack->deallocate(stream(a), busy, 10 * MiB));
    CHECK(stack->allocate(stream(b), 12 * MiB, &released) == nullptr);
    CHECK(stack->books().reserved.now() >= 10 * MiB);
    CHECK(stack->books().failures.load() == 1);
    complete(stream(a));
    void* after = stack->allocate(stream(b), 12 * MiB);
    REQUIRE(after != nullptr);
    REQUIRE(stack->deallocate(stream(b), after, 12 * MiB));
    stack->empty_cache();
    CHECK(stack->books().reserved.now() == 0);
  }
}

TEST_CASE("each stack: a block another stream uses (record_stream) is held at its free, checked first") {
  for (const PoolKind kind : kinds) {
    CAPTURE(name(kind));
    auto stack = make(kind);
    const UsedOnTwoStreams used(*stack, 2 * MiB);
    const cudaStream_t own = used.own;
    const cudaStream_t side = used.other;
    void* p = used.p;
    REQUIRE(p != nullptr);
    enqueue(side); // a kernel on the side stream reads p

    // Misuse is refused at its call and changes nothing.
    const DeviceStack::Freed wrong_size = stack->deallocate(own, p, 4 * MiB);
    REQUIRE_FALSE(wrong_size);
    CHECK(wrong_size.error() == carve::Errc::invalid_size);
    int never_given = 0;
    const DeviceStack::Done named = stack->record_stream(&never_given, side);
    REQUIRE_FALSE(named);
    CHECK(named.error() == carve::Errc::not_allocated); // not the stack's memory: nothing recorded
    const DeviceStack::Freed stranger = stack->deallocate(own, &never_given, 512);
    REQUIRE_FALSE(stranger);
    CHECK(stranger.error() == carve::Errc::not_allocated);
    CHECK(stack->books().live.now() == 2 * MiB);

    // Freed: held while the side stream works, so no stream gets p; freed again: a double free.
    REQUIRE(stack->deallocate(own, p, 2 * MiB));
    void* on_own = stack->allocate(own, 2 * MiB);
    void* on_side = stack->allocate(side, 2 * MiB);
    CHECK(on_own != p);
    CHECK(on_side != p);
    const DeviceStack::Freed twice = stack->deallocate(own, p, 2 * MiB);
    REQUIRE_FALSE(twice);
    CHECK(twice.error() == carve::Errc::not_allocated);
    complete(side);
    void* later = stack->allocate(own, 2 * MiB);         // the free is made: p serves again
    CHECK((later == p || kind == PoolKind::expandable)); // (best fit may choose another hole)
    REQUIRE(stack->deallocate(own, on_own, 2 * MiB));
    REQUIRE(stack->deallocate(side, on_side, 2 * MiB));
    REQUIRE(stack->deallocate(own, later, 2 * MiB));
    stack->empty_cache();
    CHECK(stack->books().live.now() == 0);
    CHECK(stack->books().reserved.now() == 0);
  }
}

TEST_CASE("each stack: four threads on four streams, blocks never overlapping, counts balanced") {
  for (const PoolKind kind : kinds) {
    CAPTURE(name(kind));
    auto stack = make(kind);
    const int failures =
        hammer([&](cudaStream_t s, std::size_t bytes) { return stack->allocate(s, bytes); },
               [&](cudaStream_t s, void* p, std::size_t bytes) { CHECK(stack->deallocate(s, p, bytes)); },
               [](cudaStream_t s) {
                 enqueue(s);
                 complete(s);
               },
               fresh_streams(4));
    CHECK(failures == 0);
    const carve::torch::Books& books = stack->books();
    CHECK((books.mallocs.load() - books.frees.load()) == 0);
    CHECK(books.live.now() == 0);
    CHECK(books.mallocs.load() == books.frees.load());
    CHECK(books.mallocs.load() == 4 * 300);
    stack->empty_cache();
    CHECK(books.reserved.now() == 0);
  }
}

TEST_CASE("each stack: four threads whose blocks are also used on the next thread's stream (record_stream)") {
  for (const PoolKind kind : kinds) {
    CAPTURE(name(kind));
    auto stack = make(kind);
    const std::uintptr_t first = fresh_streams(4);
    const auto next = [first](cudaStream_t s) {
      return stream(first + (reinterpret_cast<std::uintptr_t>(s) - first + 1) % 4);
    };
    const int failures = hammer(
        [&](cudaStream_t s, std::size_t bytes) {
          void* p = stack->allocate(s, bytes);
          if (p != nullptr) {
            CHECK(stack->record_stream(p, next(s))); // the next thread's kernels read it too
            enqueue(next(s));
          }
          return p;
        },
        [&](cudaStream_t s, void* p, std::size_t bytes) { CHECK(stack->deallocate(s, p, bytes)); },
        [](cudaStream_t s) {
          enqueue(s);
          complete(s);
        },
        first);
    CHECK(failures == 0);
    for (std::uintptr_t k = 0; k < 4; ++k) {
      complete(stream(first + k));
    }
    const carve::torch::Books& books = stack->books();
    CHECK(books.live.now() == 0);
    CHECK(books.mallocs.load() == books.frees.load());
    stack->empty_cache(); // the frees held for the other streams go back, then everything
    CHECK(books.reserved.now() == 0);
  }
}

// PyTorch opens a graph's pool before the driver's capture begins. What a stack records on that
// stream from another thread meanwhile must be done first: an event recorded after the capture
// began would become part of the graph, and asking about it later would fail the capture.
// begin_while_recording runs `act` on one thread and, once it records an event on `graph`, begins
// a capture there from another (as torch.cuda.graph does); it answers whether the capture began
// while that recording was under way.
bool begin_while_recording(DeviceStack& stack, cudaStream_t graph, carve::PrivatePoolId id,
                           const std::function<void()>& act) {
  std::atomic<bool> recording{false};
  std::atomic<bool> begun{false};
  bool begun_while_recording = false;
  streams().on_record([&](std::uintptr_t s) {
    if (stream(s) != graph || recording.exchange(true)) {
      return;
    }
    for (int i = 0; i < 100 && !begun; ++i) { // up to 200 ms for a capture to begin meanwhile
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    begun_while_recording = begun;
  });
  std::thread actor(act);
  while (!recording) {
    std::this_thread::yield();
  }
  std::thread capture([&] {
    stack.begin_capture(id, [graph](cudaStream_t x) { return x == graph; });
    set_capturing(graph, true); // the driver's capture begins
    begun = true;
  });
  actor.join();
  capture.join();
  streams().on_record(nullptr);
  set_capturing(graph, false);
  stack.end_capture(id);
  return begun_while_recording;
}

// The gate begin_capture closes: while it is closed no pass is under way, and what the closer
// wrote is what the next passes read (ThreadSanitizer sees a race on `state` if the gate orders
// nothing). Four threads pass it in a loop while a fifth closes it fifty times.
TEST_CASE("the capture gate: closed, no pass is under way; each closing waits for the passes before it") {
  carve::torch::CaptureGate gate;
  int state = 0;               // written only while closed, read only while passing
  std::atomic<int> passing{0}; // passes under way, as the passers count them
  std::atomic<int> odd_reads{0};
  std::atomic<int> busy_closings{0};
  std::atomic<bool> done{false};
  std::atomic<long> passes{0};
  std::vector<std::thread> passers;
  for (int t = 0; t < 4; ++t) {
    passers.emplace_back([&] {
      while (!done.load()) {
        const std::shared_lock pass(gate);
        passing.fetch_add(1);
        odd_reads += state % 2; // the closer leaves it even
        passing.fetch_sub(1);
        passes.fetch_add(1);
      }
    });
  }
  for (int closing = 0; closing < 50; ++closing) {
    {
      const std::lock_guard closed(gate);
      busy_closings += passing.load() != 0 ? 1 : 0;
      state += 1; // odd while closed
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      busy_closings += passing.load() != 0 ? 1 : 0;
      state += 1;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  done = true;
  for (auto& t : passers) {
    t.join();
  }
  CHECK(state == 100);
  CHECK(odd_reads == 0);
  CHECK(busy_closings == 0);
  CHECK(passes > 0);
}

TEST_CASE("each stack: a capture that begins while a free records its events on that stream waits for them") {
  for (const PoolKind kind : kinds) {
    CAPTURE(name(kind));
    auto stack = make(kind);
    const UsedOnTwoStreams used(*stack, MiB); // the other stream is the one a graph captures on
    const cudaStream_t own = used.own;
    const cudaStream_t graph = used.other;
    void* p = used.p;
    REQUIRE(p != nullptr);
    bool freed = false;
    const carve::PrivatePoolId id{9, 0};
    CHECK_FALSE(
        begin_while_recording(*stack, graph, id, [&] { freed = static_cast<bool>(stack->deallocate(own, p, MiB)); }));
    CHECK(freed);
    complete(graph);
    stack->release_pool(id);
    stack->empty_cache(); // the held free goes back, then everything
    CHECK(stack->books().live.now() == 0);
    CHECK(stack->books().reserved.now() == 0);
  }
}

TEST_CASE("stream-ordered stack: a capture that begins while a free records its event on that stream waits for it") {
  auto stack = make(PoolKind::stream_ordered);
  const std::uintptr_t first = fresh_streams(2);
  const cudaStream_t graph = stream(first);
  // A pool that has seen one stream records no event at a free: a second stream turns them on.
  void* other = stack->allocate(stream(first + 1), MiB);
  REQUIRE(other != nullptr);
  REQUIRE(stack->deallocate(stream(first + 1), other, MiB));
  void* p = stack->allocate(graph, MiB); // freed on its own stream: the pool records an event there
  REQUIRE(p != nullptr);
  bool freed = false;
  const carve::PrivatePoolId id{11, 0};
  CHECK_FALSE(
      begin_while_recording(*stack, graph, id, [&] { freed = static_cast<bool>(stack->deallocate(graph, p, MiB)); }));
  CHECK(freed);
  stack->release_pool(id);
  stack->empty_cache();
  CHECK(stack->books().reserved.now() == 0);
}

TEST_CASE("caching stack: a capture that begins while empty_cache asks the streams waits for it") {
  auto stack = make(PoolKind::caching);
  const cudaStream_t graph = stream(fresh_streams(1));
  void* p = stack->allocate(graph, MiB); // the graph's stream caches a segment
  REQUIRE(p != nullptr);
  REQUIRE(stack->deallocate(graph, p, MiB));
  const carve::PrivatePoolId id{10, 0};
  CHECK_FALSE(begin_while_recording(*stack, graph, id, [&] { stack->empty_cache(); }));
  CHECK(stack->books().reserved.now() == 0); // empty_cache had begun: it gave the segment back
  stack->release_pool(id);
}

TEST_CASE("each stack: the segment that holds a block (getBaseAllocation), only while it is held") {
  for (const PoolKind kind : kinds) {
    CAPTURE(name(kind));
    auto stack = make(kind);
    const cudaStream_t s = stream(fresh_streams(1));
    void* a = stack->allocate(s, 256 * KiB);
    void* b = stack->allocate(s, 256 * KiB);
    REQUIRE((a != nullptr && b != nullptr));
    std::size_t bytes = 0;
    void* base = stack->base_allocation(b, &bytes);
    if (kind == PoolKind::expandable) {
      CHECK(base == nullptr); // mapped memory: no cudaMalloc segment to export
    } else {
      const auto at = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p); };
      REQUIRE(base != nullptr);
      CHECK((at(base) <= at(b) && at(b) + 256 * KiB <= at(base) + bytes));
      const auto address = [](std::uintptr_t n) { return reinterpret_cast<const void*>(n); };
      CHECK(stack->base_allocation(address(at(base) + bytes - 1), nullptr) == base); // its last byte
      CHECK(stack->base_allocation(address(at(base) + bytes), nullptr) != base);     // one past its end
      CHECK(stack->base_allocation(address(at(base) - 1), nullptr) != base);         // one before it
      CHECK(stack->base_allocation(&bytes, nullptr) == nullptr);                     // not device memory
    }
    REQUIRE(stack->deallocate(s, a, 256 * KiB));
    REQUIRE(stack->deallocate(s, b, 256 * KiB));
    stack->empty_cache();
    CHECK(stack->base_allocation(b, nullptr) == nullptr); // the segment went back to the device
  }
}

TEST_CASE("the C functions: host backend, expandable by default, threads, stats as JSON") {
  const char* backend = std::getenv("CARVE_TORCH_BACKEND");
  REQUIRE_MESSAGE((backend != nullptr && std::string(backend) == "host"), "run with CARVE_TORCH_BACKEND=host");
  REQUIRE(carve_torch_config_error() == nullptr);
  const int failures =
      hammer([](cudaStream_t s, std::size_t bytes) { return carve_torch_malloc(static_cast<ssize_t>(bytes), 1, s); },
             [](cudaStream_t s, void* p, std::size_t bytes) { carve_torch_free(p, static_cast<ssize_t>(bytes), 1, s); },
             [](cudaStream_t s) {
               carve_torch_host_stream_enqueue(s);
               carve_torch_host_stream_complete(s);
             },
             fresh_streams(4));
  CHECK(failures == 0);
  CHECK(carve_torch_malloc(0, 1, nullptr) == nullptr);
  carve_torch_free(nullptr, 0, 1, nullptr);
  carve_torch_empty_cache();
  const std::string json = carve_torch_stats_json(1);
  CHECK(json.find("\"backend\":\"host\"") != std::string::npos);
  CHECK(json.find("\"pool\":\"expandable\"") != std::string::npos);
  CHECK(json.find("\"reserved_bytes\":0,") != std::string::npos);
  CHECK(json.find("\"live_blocks\":0,") != std::string::npos);
  CHECK(json.find("\"mallocs\":1200,\"frees\":1200,") != std::string::npos);
  CHECK(json.find("\"failures\":0,") != std::string::npos);
  CHECK(json.find("\"lending_refused\":false") != std::string::npos); // the host twin maps parts of allocations
  CHECK(json.find("\"lent_bytes\":0,") != std::string::npos);         // nothing is held, so no hole is lent
  CHECK(json.find("\"stream_waits\":0,") != std::string::npos);       // every stream's work ran before its frees
  CHECK(json.find("\"refusals_served\":0,") != std::string::npos);    // nothing was refused
  carve_torch_reset_peak(1);
  CHECK(std::string(carve_torch_stats_json(1)).find("\"peak_reserved_bytes\":0,") != std::string::npos);
  CHECK(std::string(carve_torch_stats_json(-1)).find("\"error\":\"libcarve_torch: no device -1\"") !=
        std::string::npos);
}

TEST_CASE("the C functions: each device's expandable memory opens to every other device the process allocates on") {
  REQUIRE(carve_torch_config_error() == nullptr);
  const ssize_t bytes = ssize_t{3} << 20;
  void* on2 = carve_torch_malloc(bytes, 2, nullptr);
  REQUIRE(on2 != nullptr);
  CHECK(carve_torch_peer_access(on2, 2, 2) == 2);
  CHECK(carve_torch_peer_access(on2, 2, 3) == 0);    // device 3 has allocated nothing yet
  void* on3 = carve_torch_malloc(bytes, 3, nullptr); // its first allocation opens both ways
  REQUIRE(on3 != nullptr);
  CHECK(carve_torch_peer_access(on2, 2, 3) == 2);
  CHECK(carve_torch_peer_access(on3, 3, 2) == 2);
  void* later = carve_torch_malloc(ssize_t{64} << 20, 2, nullptr); // mapped after: open too
  REQUIRE(later != nullptr);
  CHECK(carve_torch_peer_access(later, 2, 3) == 2);
  CHECK(carve_torch_peer_access(later, 2, 4) == 0);    // a device that never allocated
  CHECK(carve_torch_peer_access(on2, 5, 3) == -1);     // no pool on device 5
  CHECK(carve_torch_peer_access(nullptr, 2, 3) == -1); // nothing mapped there
  CHECK(carve_torch_peer_access(on2, 2, 64) == -1);    // no such device
  carve_torch_free(on2, bytes, 2, nullptr);
  carve_torch_free(later, ssize_t{64} << 20, 2, nullptr);
  carve_torch_free(on3, bytes, 3, nullptr);
  CHECK(std::string(carve_torch_stats_json(2)).find("\"live_blocks\":0,") != std::string::npos);
}
