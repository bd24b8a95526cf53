// libcarve_torch and CUDA graphs, on its host backend: while a capture is under way the blocks its
// streams allocate belong to the graph's private pool (reused only by that pool, given back when
// it is released), nothing goes back to the device, frees of other blocks wait for the end of the
// capture, and a stream that captures with no pool open is refused with a message saying why;
// for each stack, then through the C hooks PyTorch calls (CARVE_TORCH_BACKEND=host, set by ctest).
#include "host_stacks.hpp"
#include <carve_torch.h>
#include <pool_stacks.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

using carve::PrivatePoolId;
using carve::torch::DeviceStack;
using carve::torch::PoolKind;

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

using namespace host_stacks;

// One stack of a kind and two streams no other test used: `graph`, which a graph captures on, and
// `other`.
struct Capture {
  explicit Capture(PoolKind kind) : s(make(kind)) {}

  // What torch.cuda.graph does around a capture on `graph`: open the pool (before the driver's
  // capture begins), capture, end.
  void begin(PrivatePoolId id) {
    s->begin_capture(id, [g = graph](cudaStream_t x) { return x == g; });
    set_capturing(graph, true);
  }
  void end(PrivatePoolId id) {
    set_capturing(graph, false);
    s->end_capture(id);
  }

  std::uintptr_t base = fresh_streams(2);
  cudaStream_t graph = stream(base);
  cudaStream_t other = stream(base + 1);
  std::unique_ptr<DeviceStack> s;
};

} // namespace

TEST_CASE("each stack: a graph's blocks are its own until it is released") {
  for (const PoolKind kind : kinds) {
    CAPTURE(name(kind));
    Capture c(kind);
    const cudaStream_t graph = c.graph;
    const cudaStream_t eager = c.other;
    auto& s = c.s;
    const PrivatePoolId id{1, 0};
    c.begin(id);
    void* weights = s->allocate(graph, 4 * MiB); // lives past the capture (a static output)
    void* temp = s->allocate(graph, 2 * MiB);
    REQUIRE(weights != nullptr);
    REQUIRE(temp != nullptr);
    std::memset(temp, 1, 2 * MiB);
    REQUIRE(s->deallocate(graph, temp, 2 * MiB)); // a temporary dies inside the capture
    void* other = s->allocate(eager, 2 * MiB);    // another stream, during the capture
    CHECK(other != temp);
    void* again = s->allocate(graph, 2 * MiB); // the graph's own later request: its block
    CHECK(again == temp);
    REQUIRE(s->deallocate(graph, again, 2 * MiB));
    c.end(id);

    // The capture is over; the graph may replay: its freed block still serves no one else.
    void* after = s->allocate(graph, 2 * MiB);
    CHECK(after != temp);
    void* elsewhere = s->allocate(eager, 2 * MiB);
    CHECK(elsewhere != temp);
    const auto before_release = s->books().reserved.now();
    s->release_pool(id);                                // the graph is destroyed: its free block goes back
    CHECK(s->books().reserved.now() == before_release); // back to the stack's cache, not the device
    REQUIRE(s->deallocate(graph, weights, 4 * MiB));    // its last block, freed later, follows
    for (void* p : {other, after, elsewhere}) {
      REQUIRE(s->deallocate(p == other || p == elsewhere ? eager : graph, p, 2 * MiB));
    }
    s->empty_cache();
    CHECK(s->books().live.now() == 0);
    CHECK(s->books().reserved.now() == 0); // every block came home
  }
}

TEST_CASE("each stack: a graph's block freed twice, or with another size, is refused and changes nothing") {
  for (const PoolKind kind : kinds) {
    CAPTURE(name(kind));
    Capture c(kind);
    auto& s = c.s;
    const PrivatePoolId id{1, 0};
    c.begin(id);
    void* temp = s->allocate(c.graph, 2 * MiB);
    REQUIRE(temp != nullptr);
    CHECK(s->deallocate(c.graph, temp, MiB).error() == carve::Errc::invalid_size);
    REQUIRE(s->deallocate(c.graph, temp, 2 * MiB));
    CHECK(s->deallocate(c.graph, temp, 2 * MiB).error() == carve::Errc::not_allocated);
    c.end(id);
    CHECK(s->books().live.now() == 0);
    void* eager = s->allocate(c.other, 2 * MiB); // the graph's pool keeps its block: never handed out here
    CHECK(eager != temp);
    c.begin(id);
    void* again = s->allocate(c.graph, 2 * MiB);
    CHECK(again == temp); // kept once, so handed out once
    REQUIRE(s->deallocate(c.graph, again, 2 * MiB));
    c.end(id);
    s->release_pool(id); // both graphs captured into the pool are destroyed
    s->release_pool(id);
    REQUIRE(s->deallocate(c.other, eager, 2 * MiB));
    s->empty_cache();
    CHECK(s->books().live.now() == 0);
    CHECK(s->books().reserved.now() == 0);
  }
}

TEST_CASE("each stack: during a capture nothing goes back to the device and other frees wait") {
  for (const PoolKind kind : kinds) {
    CAPTURE(name(kind));
    Capture c(kind);
    const cudaStream_t eager = c.other;
    auto& s = c.s;
    void* before = s->allocate(eager, 3 * MiB); // from before the capture
    void* cached = s->allocate(eager, 8 * MiB);
    REQUIRE(s->deallocate(eager, cached, 8 * MiB));
    const auto reserved = s->books().reserved.now();
    const PrivatePoolId id{2, 0};
    c.begin(id);
    s->empty_cache(); // during a capture: nothing
    CHECK(s->books().reserved.now() == reserved);
    REQUIRE(s->deallocate(eager, before, 3 * MiB)); // waits for the end of the capture
    void* during = s->allocate(eager, 3 * MiB);
    CHECK(during != before);
    c.end(id);
    void* reuse = s->allocate(eager, 3 * MiB);                // the free went through: its stream reuses it
    CHECK((reuse == before || kind == PoolKind::expandable)); // (best fit may choose another hole)
    for (void* p : {during, reuse}) {
      REQUIRE(s->deallocate(eager, p, 3 * MiB));
    }
    s->release_pool(id);
    s->empty_cache();
    CHECK(s->books().reserved.now() == 0);
  }
}

TEST_CASE("each stack: a graph's block another stream reads (record_stream) is not reused within the capture") {
  for (const PoolKind kind : kinds) {
    CAPTURE(name(kind));
    Capture c(kind);
    const cudaStream_t side = stream(fresh_streams(1));
    const PrivatePoolId id{4, 0};
    c.begin(id);
    void* read_elsewhere = c.s->allocate(c.graph, 2 * MiB);
    REQUIRE(read_elsewhere != nullptr);
    REQUIRE(c.s->record_stream(read_elsewhere, side)); // a side stream's node reads it
    REQUIRE(c.s->deallocate(c.graph, read_elsewhere, 2 * MiB));
    void* next = c.s->allocate(c.graph, 2 * MiB); // the graph's own later request
    CHECK(next != read_elsewhere);
    REQUIRE(c.s->deallocate(c.graph, next, 2 * MiB));
    c.end(id);
    void* after = c.s->allocate(c.graph, 2 * MiB); // still the graph's: its pool keeps both
    CHECK(after != read_elsewhere);
    CHECK(after != next);
    REQUIRE(c.s->deallocate(c.graph, after, 2 * MiB));
    c.s->release_pool(id);
    c.s->empty_cache();
    CHECK(c.s->books().live.now() == 0);
    CHECK(c.s->books().reserved.now() == 0); // every block came home
  }
}

// PyTorch replays a graph on the current stream, not the one it captured on: a block of the
// graph's pool freed after the graph is destroyed may still be read by a replay that stream does
// not order, so it goes back only once the device has run everything queued.
TEST_CASE("each stack: a graph's block freed after the graph is destroyed goes back after a device synchronisation") {
  for (const PoolKind kind : kinds) {
    CAPTURE(name(kind));
    Capture c(kind);
    const PrivatePoolId id{5, 0};
    c.begin(id);
    void* out = c.s->allocate(c.graph, 2 * MiB); // the graph's static output, kept past it
    REQUIRE(out != nullptr);
    c.end(id);
    c.s->release_pool(id); // the graph is destroyed while `out` lives
    const auto before = streams().synchronizations();
    REQUIRE(c.s->deallocate(c.graph, out, 2 * MiB));
    CHECK(streams().synchronizations() == before + 1);
    c.s->empty_cache();
    CHECK(c.s->books().live.now() == 0);
    CHECK(c.s->books().reserved.now() == 0);
  }
}

TEST_CASE("each stack: a stream that captures with no pool open is refused, never served") {
  for (const PoolKind kind : kinds) {
    CAPTURE(name(kind));
    Capture c(kind);
    const cudaStream_t stray = c.other;
    auto& s = c.s;
    const PrivatePoolId id{3, 0};
    c.begin(id);
    set_capturing(stray, true); // a second capture PyTorch opened no pool for
    bool refused = false;
    CHECK(s->allocate(stray, MiB, nullptr, &refused) == nullptr);
    CHECK(refused);
    c.end(id);
    // With no capture under way, only the guard (no hooks installed) asks the driver.
    void* served = s->allocate(stray, MiB);
    CHECK(served != nullptr);
    s->guard_captures(true);
    refused = false;
    CHECK(s->allocate(stray, MiB, nullptr, &refused) == nullptr);
    CHECK(refused);
    set_capturing(stray, false);
    void* plain = s->allocate(stray, MiB);
    CHECK(plain != nullptr);
    for (void* p : {served, plain}) {
      REQUIRE(s->deallocate(stray, p, MiB));
    }
    s->release_pool(id);
  }
}

// A capture that failed (PyTorch raised before it announced the end): carve ends it and releases
// its pool itself (carve_gpu.torch's wrapper decides when), and everything comes home.
TEST_CASE(
    "each stack: a failed capture ended and released late: the frees that waited go through, its pool comes home") {
  for (const PoolKind kind : kinds) {
    CAPTURE(name(kind));
    Capture c(kind);
    auto& s = c.s;
    void* eager = s->allocate(c.other, 3 * MiB); // from before the capture
    REQUIRE(eager != nullptr);
    const PrivatePoolId id{9, 0};
    c.begin(id);
    void* out = s->allocate(c.graph, 4 * MiB); // a tensor the failed capture made and the program keeps
    void* temp = s->allocate(c.graph, 2 * MiB);
    REQUIRE(out != nullptr);
    REQUIRE(temp != nullptr);
    REQUIRE(s->deallocate(c.graph, temp, 2 * MiB));
    REQUIRE(s->deallocate(c.other, eager, 3 * MiB)); // waits for the end of the capture
    set_capturing(c.graph, false);                   // the driver's capture failed; no end_capture came
    s->empty_cache();                                // still under way for carve: nothing goes back
    const auto held = s->books().reserved.now();
    CHECK(held >= 9 * MiB);

    CHECK(s->end_capture(id));
    CHECK_FALSE(s->end_capture(id)); // once
    s->release_pool(id);
    s->empty_cache(); // the waited free went through and the pool was released: all but `out` goes back
    CHECK(s->books().reserved.now() < held);
    // (`out` is a mid-size request: the caching stack's pool gave it a shared 20 MiB segment)
    CHECK(s->books().reserved.now() <= (kind == PoolKind::caching ? 20 * MiB : 4 * MiB + 2 * MiB));
    REQUIRE(s->deallocate(c.graph, out, 4 * MiB)); // the pool's last block follows when freed
    s->empty_cache();
    CHECK(s->books().live.now() == 0);
    CHECK(s->books().reserved.now() == 0);
  }
}

TEST_CASE("the C functions for failed captures: what this thread began, captures not yet ended, ends and releases") {
  const auto base = fresh_streams(2);
  const cudaStream_t graph = stream(base);
  const cudaStream_t old_graph = stream(base + 1);
  const unsigned long long before = carve_torch_captures_begun(nullptr, nullptr, nullptr, nullptr);
  const carve_torch_pool_id pool{11, 0};
  // Two captures into one pool (a shared pool): a failed one is ended by its number, not the pool's.
  carve_torch_begin_allocate_to_pool(0, pool, [graph](cudaStream_t x) { return x == graph; });
  unsigned long long outer = 0;
  CHECK(carve_torch_captures_begun(nullptr, nullptr, nullptr, &outer) == before + 1);
  carve_torch_begin_allocate_to_pool(0, pool, [](cudaStream_t) { return false; });
  int device = -1;
  unsigned long long first = 0;
  unsigned long long second = 1;
  unsigned long long inner = 0;
  CHECK(carve_torch_captures_begun(&device, &first, &second, &inner) == before + 2);
  CHECK(device == 0);
  CHECK(first == 11);
  CHECK(second == 0);
  CHECK(inner != outer);
  std::thread([] { CHECK(carve_torch_captures_begun(nullptr, nullptr, nullptr, nullptr) == 0); }).join();
  CHECK(carve_torch_end_failed_capture(0, inner) == 1);
  CHECK(carve_torch_end_failed_capture(0, inner) == 0); // ended
  carve_torch_release_failed_capture(0, 11, 0);

  // The driver's states of a stream: in a capture while it runs and after an error invalidated
  // it, until cudaStreamEndCapture.
  CHECK(carve_torch_stream_in_capture(graph) == 0);
  carve_torch_host_stream_capturing(graph, 1);
  CHECK(carve_torch_stream_in_capture(graph) == 1);
  void* out = carve_torch_malloc(static_cast<ssize_t>(MiB), 0, graph); // the outer capture still serves it
  REQUIRE(out != nullptr);
  carve_torch_host_stream_capturing(graph, 2);
  CHECK(carve_torch_stream_in_capture(graph) == 1);
  CHECK(carve_torch_stream_in_capture(nullptr) == 0);
  carve_torch_host_stream_capturing(graph, 0);

  CHECK(carve_torch_end_failed_capture(0, outer) == 1);
  CHECK(carve_torch_end_failed_capture(-1, outer) == 0);
  CHECK(carve_torch_end_failed_capture(64, outer) == 0);
  carve_torch_watch_release(0, 11, 0);
  carve_torch_release_failed_capture(0, 12, 0); // another pool: not the one watched
  CHECK(carve_torch_watched_release() == 0);
  carve_torch_watch_release(0, 11, 0);
  carve_torch_release_pool(0, pool);                                     // what a reset of PyTorch's calls
  std::thread([] { CHECK(carve_torch_watched_release() == 0); }).join(); // this thread's own
  CHECK(carve_torch_watched_release() == 1);
  CHECK(carve_torch_watched_release() == 0);                  // the watch ended
  carve_torch_free(out, static_cast<ssize_t>(MiB), 0, graph); // comes home: its pool was released

  // PyTorch 2.1's stream form: a capture begun on a stream that captures already (refused by the
  // driver) is ended by its number; the outer one is still ended by its stream.
  carve_torch_begin_allocate_stream_to_pool(0, old_graph, carve_torch_pool_id{13, 0});
  carve_torch_host_stream_capturing(old_graph, 1);
  carve_torch_begin_allocate_stream_to_pool(0, old_graph, carve_torch_pool_id{14, 0});
  CHECK(carve_torch_captures_begun(nullptr, &first, nullptr, &inner) == before + 4);
  CHECK(first == 14);
  CHECK(carve_torch_end_failed_capture(0, inner) == 1);
  carve_torch_release_failed_capture(0, 14, 0);
  void* p = carve_torch_malloc(static_cast<ssize_t>(MiB), 0, old_graph); // the outer capture's pool
  REQUIRE(p != nullptr);
  carve_torch_free(p, static_cast<ssize_t>(MiB), 0, old_graph);
  carve_torch_host_stream_capturing(old_graph, 0);
  carve_torch_end_allocate_stream_to_pool(0, old_graph); // ends the outer capture
  carve_torch_end_allocate_stream_to_pool(0, old_graph); // nothing more to end
  carve_torch_release_pool(0, carve_torch_pool_id{13, 0});
  carve_torch_empty_cache();
  const std::string stats = carve_torch_stats_json(0);
  CHECK(stats.find("\"live_bytes\":0,") != std::string::npos);
  CHECK(stats.find("\"reserved_bytes\":0,") != std::string::npos); // every capture ended, every pool home
}

TEST_CASE("the C hooks PyTorch calls: pools by MempoolId_t, PyTorch 2.1's stream forms, the refusal's text") {
  const auto base = fresh_streams(3);
  const cudaStream_t graph = stream(base);
  const cudaStream_t old_graph = stream(base + 1);
  const cudaStream_t stray = stream(base + 2);
  const carve_torch_pool_id pool{7, 0};
  carve_torch_begin_allocate_to_pool(0, pool, [graph](cudaStream_t x) { return x == graph; });
  carve_torch_host_stream_capturing(graph, 1);
  void* temp = carve_torch_malloc(static_cast<ssize_t>(MiB), 0, graph);
  REQUIRE(temp != nullptr);
  carve_torch_free(temp, static_cast<ssize_t>(MiB), 0, graph);
  CHECK(carve_torch_malloc(static_cast<ssize_t>(MiB), 0, graph) == temp); // the graph's own block
  carve_torch_host_stream_capturing(stray, 1);
  CHECK(carve_torch_malloc(static_cast<ssize_t>(MiB), 0, stray) == nullptr);
  const std::string why = carve_torch_last_refusal();
  CHECK(why.find("a CUDA graph capture on GPU 0 asked for 1.00 MiB") != std::string::npos);
  CHECK(why.find("no private pool is open") != std::string::npos);
  CHECK(why.rfind("CUDA out of memory", 0) != 0); // not an out-of-memory error
  carve_torch_host_stream_capturing(stray, 0);
  carve_torch_host_stream_capturing(graph, 0);
  carve_torch_end_allocate_to_pool(0, pool);
  carve_torch_free(temp, static_cast<ssize_t>(MiB), 0, graph);
  carve_torch_release_pool(0, pool);

  // PyTorch 2.1: the pool named with its stream, and ended by it.
  const carve_torch_pool_id older{8, 0};
  carve_torch_begin_allocate_stream_to_pool(0, old_graph, older);
  carve_torch_host_stream_capturing(old_graph, 1);
  void* p = carve_torch_malloc(static_cast<ssize_t>(MiB), 0, old_graph);
  REQUIRE(p != nullptr);
  carve_torch_free(p, static_cast<ssize_t>(MiB), 0, old_graph);
  carve_torch_host_stream_capturing(old_graph, 0);
  carve_torch_end_allocate_stream_to_pool(0, old_graph);
  void* q = carve_torch_malloc(static_cast<ssize_t>(MiB), 0, old_graph);
  CHECK(q != p); // still the graph's
  carve_torch_free(q, static_cast<ssize_t>(MiB), 0, old_graph);
  carve_torch_release_pool(0, older);
  carve_torch_empty_cache();
}
