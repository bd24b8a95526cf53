// TraceResource: every call through it is one line of carve's trace CSV, numbered in call order,
// with capabilities passed through; from several threads the log still reads back as a sound
// request stream; stream-ordered calls carry their stream's number.
#include "support/errors.hpp"
#include <carve/mr/caching_pool.hpp>
#include <carve/mr/simulated_card.hpp>
#include <carve/mr/stream_ordered_pool.hpp>
#include <carve/mr/trace_resource.hpp>
#include <carve/trace/carve_csv.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <new>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

// In a namespace of its own: the area's test files compile as one translation unit.
namespace test_trace_resource {

using carve::CachingPool;
using carve::Errc;
using carve::SimulatedCard;
using carve::SimulatedStream;
using carve::SimulatedStreams;
using carve::TraceLog;
using carve::TraceResource;
using StreamPool = carve::StreamOrderedPool<SimulatedCard, SimulatedStreams>;

static_assert(carve::MemoryResource<TraceResource<SimulatedCard>> &&
              carve::UpstreamResource<TraceResource<SimulatedCard>>);
static_assert(!carve::ChecksDeallocation<TraceResource<SimulatedCard>> &&
              !carve::OwnsMemory<TraceResource<SimulatedCard>>);
static_assert(carve::SynchronousResource<TraceResource<SimulatedCard>>);
static_assert(carve::detail::cccl_accepts<TraceResource<SimulatedCard>>());
static_assert(carve::ChecksDeallocation<TraceResource<CachingPool<SimulatedCard>>> &&
              carve::OwnsMemory<TraceResource<CachingPool<SimulatedCard>>> &&
              carve::Trimmable<TraceResource<CachingPool<SimulatedCard>>> &&
              carve::ReportsStats<TraceResource<CachingPool<SimulatedCard>>>);
static_assert(carve::MemoryResource<TraceResource<StreamPool>> && carve::ChecksDeallocation<TraceResource<StreamPool>>);
// stream_type exactly where the resource has one.
static_assert(std::same_as<TraceResource<StreamPool>::stream_type, SimulatedStream>);
template <class R>
concept has_stream_type = requires {
  typename R::stream_type;
};
static_assert(!has_stream_type<TraceResource<SimulatedCard>>);
// A traced stack stacks further: a pool over a traced card, traced again.
static_assert(carve::UpstreamResource<TraceResource<TraceResource<SimulatedCard>>>);

namespace {

constexpr std::size_t KiB = 1024;

// The lines after the version line and header, split into fields.
std::vector<std::vector<std::string>> rows(const std::string& text) {
  std::vector<std::vector<std::string>> out;
  std::istringstream in(text);
  std::string line;
  std::getline(in, line);
  CHECK(line == carve::trace::carve_csv_version_line);
  std::getline(in, line);
  CHECK(line == carve::trace::carve_csv_header);
  while (std::getline(in, line)) {
    std::vector<std::string> fields;
    std::size_t start = 0;
    for (std::size_t comma; (comma = line.find(',', start)) != std::string::npos; start = comma + 1) {
      fields.push_back(line.substr(start, comma - start));
    }
    fields.push_back(line.substr(start));
    REQUIRE(fields.size() == 9);
    out.push_back(fields);
  }
  return out;
}

// A line without its thread and time, which the test does not choose: "seq,action,address,...".
std::string call(const std::vector<std::string>& row) {
  std::string out = row[0];
  for (std::size_t i = 3; i < row.size(); ++i) {
    out += "," + row[i];
  }
  return out;
}

std::string hex(const void* p) {
  std::ostringstream s;
  s << "0x" << std::hex << reinterpret_cast<std::uintptr_t>(p);
  return s.str();
}

} // namespace

// A stream handle like cuda::stream_ref: a pointer behind get().
namespace pointer_streams {
struct Handle {
  void* raw = nullptr;
  void* get() const noexcept { return raw; }
  friend bool operator==(Handle, Handle) = default;
};
// Streams of such handles whose events are always complete: enough for StreamOrderedPool.
struct Streams {
  using stream_type = Handle;
  struct event_type {};
  carve::Result<event_type> record(Handle) { return event_type{}; }
  bool completed(event_type) const { return true; }
  void release(event_type) noexcept {}
};
} // namespace pointer_streams

// A stream type that says its own number (the customisation point, found by ADL).
namespace named_streams {
struct Lane {
  int index = 0;
  friend bool operator==(Lane, Lane) = default;
};
constexpr std::uint64_t trace_stream_id(Lane l) noexcept { return 1000 + static_cast<std::uint64_t>(l.index); }
struct Streams {
  using stream_type = Lane;
  struct event_type {};
  carve::Result<event_type> record(Lane) { return event_type{}; }
  bool completed(event_type) const { return true; }
  void release(event_type) noexcept {}
};
} // namespace named_streams

TEST_CASE("every call is one line: successes, failures with their Errc, throwing spellings once") {
  std::ostringstream text;
  auto log = std::make_shared<TraceLog>(text);
  TraceResource<CachingPool<SimulatedCard>> pool(SimulatedCard(16 << 20), log);
  void* a = *pool.try_allocate(100, 64);
  const auto big = pool.try_allocate(32 << 20, 256);
  REQUIRE(!big);
  CHECK(big.error() == Errc::no_space);
  CHECK(pool.try_allocate(0, 256).error() == Errc::invalid_size);
  CHECK_THROWS_ERRC(carve::Errc::no_space, (void)pool.allocate(64 << 20));
  void* b = pool.allocate(KiB);
  REQUIRE(pool.try_deallocate(a, 100, 64));
  CHECK(pool.try_deallocate(a, 100, 64).error() == Errc::not_allocated);
  pool.deallocate_sync(b, KiB);
  CHECK(log->calls() == 8);
  log->flush();
  CHECK(log->good());
  const auto r = rows(text.str());
  REQUIRE(r.size() == 8);
  CHECK(call(r[0]) == "0,allocate," + hex(a) + ",100,64,,ok");
  CHECK(call(r[1]) == "1,allocate,,33554432,256,,no space");
  CHECK(call(r[2]) == "2,allocate,,0,256,,invalid size");
  CHECK(call(r[3]) == "3,allocate,,67108864,256,,no space");
  CHECK(call(r[4]) == "4,allocate," + hex(b) + ",1024,256,,ok");
  CHECK(call(r[5]) == "5,deallocate," + hex(a) + ",100,64,,ok");
  CHECK(call(r[6]) == "6,deallocate," + hex(a) + ",100,64,,not allocated");
  CHECK(call(r[7]) == "7,deallocate," + hex(b) + ",1024,256,,ok");
  std::uint64_t last_time = 0;
  for (const auto& row : r) {
    CHECK(row[1] == std::to_string(carve::thread_number()));
    CHECK(std::stoull(row[2]) >= last_time); // numbered in order, so timed in order
    last_time = std::stoull(row[2]);
  }
  const auto t = carve::trace::read_carve_csv(text.str(), "calls");
  REQUIRE(t);
  CHECK(t->requests.size() == 4);
  CHECK(t->peak_live_bytes() == 100 + KiB);
}

TEST_CASE("capabilities pass through; copies share one log; equal when resources and log are") {
  std::ostringstream text;
  auto log = std::make_shared<TraceLog>(text);
  SimulatedCard card(64 * KiB);
  TraceResource<SimulatedCard> a(card, log);
  TraceResource<SimulatedCard> b = a;
  CHECK(a == b);
  CHECK(a.capacity() == 64 * KiB);
  void* p = a.allocate(KiB);
  CHECK(b.free_bytes() == 63 * KiB);
  b.deallocate(p, KiB, carve::default_alignment);
  CHECK(a.log() == b.log());
  CHECK(log->calls() == 2);
  auto other = std::make_shared<TraceLog>(text);
  CHECK(!(a == TraceResource<SimulatedCard>(card, other)));

  TraceResource<CachingPool<SimulatedCard>> pool(SimulatedCard(16 << 20), log);
  void* q = pool.allocate(KiB);
  CHECK(pool.owns(q));
  CHECK(pool.stats().live_blocks == 1);
  CHECK(pool.upstream().stats().live_blocks == 1);
  CHECK(pool.capacity() == 16 << 20);
  pool.deallocate(q, KiB, carve::default_alignment);
  CHECK(pool.trim() == 2 << 20); // the one segment
  CHECK(log->calls() == 4);      // trim is not a request: not recorded
}

TEST_CASE("the log: a file it opens, closed and flushed on destruction; refusals name the path") {
  const auto path =
      std::filesystem::temp_directory_path() / ("carve_trace_" + std::to_string(std::random_device{}()) + ".csv");
  {
    TraceResource<SimulatedCard> r(SimulatedCard(1 << 20), std::make_shared<TraceLog>(path));
    r.deallocate(r.allocate(KiB), KiB, carve::default_alignment);
  }
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  std::filesystem::remove(path);
  const auto t = carve::trace::read_carve_csv(text.str(), path.string());
  REQUIRE(t);
  CHECK(t->requests.size() == 2);

  const std::filesystem::path nowhere = "/nonexistent-carve-dir/trace.csv";
  CHECK_THROWS_ERRC(Errc::io_error, TraceLog(nowhere));
  CHECK(carve::test::thrown_message([&] { TraceLog l(nowhere); }) ==
        "carve::TraceLog: cannot open \"/nonexistent-carve-dir/trace.csv\" for writing: No such file or directory");
  CHECK_THROWS_ERRC(Errc::invalid_argument, TraceResource<SimulatedCard>(SimulatedCard(1), nullptr));
}

TEST_CASE("a try_deallocate's line waits for its result, and the lines numbered after it wait for it") {
  // One log for a pool and for the card under it: the pool's try_deallocate gives its segment
  // back to the card (idle threshold 0) while it runs, so the card's free is numbered after the
  // pool's try_deallocate and must still be written after it.
  std::ostringstream text;
  auto log = std::make_shared<TraceLog>(text);
  TraceResource<CachingPool<TraceResource<SimulatedCard>>> pool(
      std::piecewise_construct,
      std::forward_as_tuple(TraceResource<SimulatedCard>(SimulatedCard(1 << 20), log),
                            carve::PoolOptions{.granularity = 512, .segment_size = 4 * KiB, .idle_threshold = 0}),
      log);
  void* p = *pool.try_allocate(KiB, 256);
  REQUIRE(pool.try_deallocate(p, KiB, 256));
  log->flush();
  const auto r = rows(text.str());
  REQUIRE(r.size() == 4);
  CHECK(call(r[0]) == "0,allocate," + hex(p) + ",4096,512,,ok"); // the card's segment
  CHECK(call(r[1]) == "1,allocate," + hex(p) + ",1024,256,,ok"); // the pool's block in it
  CHECK(call(r[2]) == "2,deallocate," + hex(p) + ",1024,256,,ok");
  CHECK(call(r[3]) == "3,deallocate," + hex(p) + ",4096,512,,ok");
}

TEST_CASE("four threads through one traced pool: every line whole, seq 0..n-1, the log replays to nothing live") {
  std::ostringstream text;
  auto log = std::make_shared<TraceLog>(text);
  TraceResource<CachingPool<SimulatedCard>> pool(
      std::piecewise_construct,
      std::forward_as_tuple(SimulatedCard(64 << 20), carve::PoolOptions{.granularity = 512, .segment_size = 256 * KiB}),
      log);
  constexpr int threads = 4;
  constexpr int rounds = 3000;
  std::vector<std::thread> workers;
  for (int w = 0; w < threads; ++w) {
    workers.emplace_back([&pool, w] {
      std::mt19937 rng(static_cast<unsigned>(w) + 1);
      std::vector<std::pair<void*, std::size_t>> mine;
      for (int i = 0; i < rounds; ++i) {
        if (mine.empty() || rng() % 2 == 0) {
          const std::size_t bytes = 1 + rng() % (8 * KiB);
          if (const auto p = pool.try_allocate(bytes, 256)) {
            mine.emplace_back(*p, bytes);
          }
        } else {
          const auto [p, bytes] = mine.back();
          mine.pop_back();
          if (rng() % 2 == 0) {
            pool.deallocate(p, bytes, 256);
          } else {
            CHECK(pool.try_deallocate(p, bytes, 256)); // CHECK: a REQUIRE would throw out of the thread
          }
        }
      }
      for (const auto& [p, bytes] : mine) {
        pool.deallocate(p, bytes, 256);
      }
    });
  }
  for (auto& t : workers) {
    t.join();
  }
  log->flush();
  CHECK(log->good());
  const std::string csv = text.str();
  const auto r = rows(csv);
  REQUIRE(r.size() == log->calls());
  for (std::size_t i = 0; i < r.size(); ++i) {
    CHECK(r[i][0] == std::to_string(i)); // written in seq order, no gaps
    CHECK(r[i][8] == "ok");
  }
  const auto t = carve::trace::read_carve_csv(csv, "threads");
  REQUIRE(t);
  REQUIRE(t->requests.size() == r.size());
  std::uint64_t live = 0;
  std::vector<bool> freed(t->blocks.size(), false);
  for (std::size_t i = 0; i < t->requests.size(); ++i) {
    const auto& q = t->requests[i];
    CHECK(q.event == i);
    if (q.allocate) {
      live += t->blocks[q.block].bytes;
    } else {
      CHECK(!freed[q.block]);
      freed[q.block] = true;
      live -= t->blocks[q.block].bytes;
    }
  }
  CHECK(std::count(freed.begin(), freed.end(), true) == static_cast<std::ptrdiff_t>(t->blocks.size()));
  CHECK(live == 0);
  CHECK(pool.stats().live_blocks == 0);
}

TEST_CASE("a stream-ordered pool, traced: its calls carry the stream's number, synchronous ones none") {
  std::ostringstream text;
  auto log = std::make_shared<TraceLog>(text);
  TraceResource<StreamPool> pool(
      std::piecewise_construct,
      std::forward_as_tuple(SimulatedCard(1 << 20), carve::StreamPoolOptions{}, SimulatedStreams(3)), log);
  const SimulatedStream s1{1};
  const SimulatedStream s2{2};
  void* a = *pool.try_allocate(s1, 4 * KiB, 256);
  void* b = pool.allocate(s2, 2 * KiB, 256);
  void* c = *pool.try_allocate(KiB, 256);
  CHECK(pool.owns(a));
  pool.upstream().streams().enqueue(s1);
  REQUIRE(pool.try_deallocate(s1, a, 4 * KiB, 256));
  CHECK(pool.try_deallocate(s1, a, 4 * KiB, 256).error() == Errc::not_allocated);
  pool.deallocate(s2, b, 2 * KiB, 256);
  pool.deallocate(c, KiB, 256);
  CHECK_THROWS_ERRC(carve::Errc::no_space, (void)pool.allocate(s1, 2 << 20, 256));
  log->flush();
  const auto r = rows(text.str());
  REQUIRE(r.size() == 8);
  CHECK(call(r[0]) == "0,allocate," + hex(a) + ",4096,256,1,ok");
  CHECK(call(r[1]) == "1,allocate," + hex(b) + ",2048,256,2,ok");
  CHECK(call(r[2]) == "2,allocate," + hex(c) + ",1024,256,,ok");
  CHECK(call(r[3]) == "3,deallocate," + hex(a) + ",4096,256,1,ok");
  CHECK(call(r[4]) == "4,deallocate," + hex(a) + ",4096,256,1,not allocated");
  CHECK(call(r[5]) == "5,deallocate," + hex(b) + ",2048,256,2,ok");
  CHECK(call(r[6]) == "6,deallocate," + hex(c) + ",1024,256,,ok");
  CHECK(call(r[7]) == "7,allocate,,2097152,256,1,no space");
  const auto t = carve::trace::read_carve_csv(text.str(), "streams");
  REQUIRE(t);
  REQUIRE(t->blocks.size() == 3);
  CHECK(t->blocks[0].stream == 1);
  CHECK(t->blocks[1].stream == 2);
  CHECK(t->blocks[2].stream == 0);
}

TEST_CASE("stream numbers: a pointer-like handle's value, or the type's own trace_stream_id") {
  std::ostringstream text;
  auto log = std::make_shared<TraceLog>(text);
  int anchor = 0;
  const pointer_streams::Handle h{&anchor};
  TraceResource<carve::StreamOrderedPool<SimulatedCard, pointer_streams::Streams>> by_pointer(
      std::piecewise_construct,
      std::forward_as_tuple(SimulatedCard(1 << 20), carve::StreamPoolOptions{}, pointer_streams::Streams{}), log);
  by_pointer.deallocate(h, by_pointer.allocate(h, KiB, 256), KiB, 256);
  TraceResource<carve::StreamOrderedPool<SimulatedCard, named_streams::Streams>> by_name(
      std::piecewise_construct,
      std::forward_as_tuple(SimulatedCard(1 << 20), carve::StreamPoolOptions{}, named_streams::Streams{}), log);
  by_name.deallocate(named_streams::Lane{7}, by_name.allocate(named_streams::Lane{7}, KiB, 256), KiB, 256);
  log->flush();
  const auto r = rows(text.str());
  REQUIRE(r.size() == 4);
  CHECK(r[0][7] == std::to_string(reinterpret_cast<std::uintptr_t>(&anchor)));
  CHECK(r[1][7] == r[0][7]);
  CHECK(r[2][7] == "1007");
  CHECK(r[3][7] == "1007");
  CHECK(carve::trace_stream_id(SimulatedStream{5}) == 5);
  // A stream type without state names one stream: 0.
  struct OnlyStream {};
  CHECK(carve::detail::traced_stream_number(OnlyStream{}) == 0);
  CHECK(carve::detail::traced_stream_number(std::uint32_t{9}) == 9);
}

} // namespace test_trace_resource
