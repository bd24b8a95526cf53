// PyTorch memory snapshots as request streams: the start state rebuilt from the end state and
// checked against figures computed apart from the reader (the simulation that wrote the test's own
// snapshots; for the real snapshot, the figures in ../shared/traces/README.md), the recorded
// reserve, and every bad input refused with a message naming the file, the event and the fault.
#include <carve/trace.hpp>

#include <doctest/doctest.h>
#include <trace/pickle_writer.hpp>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <string>

// In a namespace of its own: the area's test files compile as one translation unit.
namespace test_memory_snapshot {

using carve::test::PickleWriter;
using carve::trace::AllocationTrace;
using carve::trace::read_memory_snapshot;
using carve::trace::read_trace_file;

namespace {

const std::string data = std::string(CARVE_TEST_DATA_DIR) + "/traces/";

// `name value` lines, as make_snapshots.py writes them.
std::map<std::string, std::uint64_t> expected_figures(const std::string& path) {
  std::ifstream in(path);
  std::map<std::string, std::uint64_t> out;
  std::string key;
  while (in >> key) {
    if (key[0] == '#') {
      std::getline(in, key);
      continue;
    }
    in >> out[key];
  }
  return out;
}

std::string message_of(const std::string& file) {
  const auto t = read_trace_file(data + file);
  REQUIRE_FALSE(t);
  return t.error().message;
}

// A snapshot: the segments `segments` writes, then device 0's events, `events`' (each a list's items).
std::string snapshot(const std::function<void(PickleWriter&)>& segments,
                     const std::function<void(PickleWriter&)>& events) {
  PickleWriter w;
  w.dict().str("segments").list();
  segments(w);
  w.list_end().str("device_traces").list().list();
  events(w);
  return w.list_end().list_end().dict_end().stop();
}

// An event on stream 0.
void event(PickleWriter& w, std::string_view action, std::int64_t addr, std::int64_t size) {
  w.dict().item("action", action).item("addr", addr).item("size", size).item("stream", 0).dict_end();
}

// An allocation at 0x1000 and its free: the events of a snapshot whose segments are the test.
void alloc_and_free(PickleWriter& w) {
  event(w, "alloc", 0x1000, 512);
  event(w, "free_completed", 0x1000, 512);
}

// A segment of device 0 on stream 0, its blocks written by `blocks`.
void segment(
    PickleWriter& w, std::int64_t address, std::int64_t total,
    const std::function<void(PickleWriter&)>& blocks = [](PickleWriter&) {}) {
  w.dict().item("device", 0).item("address", address).item("total_size", total).item("stream", 0);
  w.str("blocks").list();
  blocks(w);
  w.list_end().dict_end();
}

// A segment's block: `state`, `size` bytes, at `address` where given.
void block(PickleWriter& w, std::int64_t size, std::string_view state, std::optional<std::int64_t> address = {}) {
  w.dict().item("size", size).item("state", state);
  if (address) {
    w.item("address", *address);
  }
  w.dict_end();
}

// The message read_memory_snapshot gives for `bytes` (checking the code); "" when it reads.
std::string snapshot_error(const std::string& bytes) {
  const auto t = read_memory_snapshot(bytes, "s.pickle");
  if (t) {
    return "";
  }
  CHECK(t.error().code == carve::Errc::invalid_argument);
  return t.error().message;
}

constexpr std::int64_t int63 = INT64_MAX;             // the largest int the pickle reader reads
constexpr std::int64_t two62 = std::int64_t{1} << 62; // the largest block

} // namespace

TEST_CASE("the test's own snapshot: the start state and the peak are the simulation's") {
  const auto want = expected_figures(data + "small_snapshot.expected");
  REQUIRE(want.size() == 8);
  const auto t = read_trace_file(data + "small_snapshot.pickle");
  REQUIRE(t);
  CHECK(t->start_blocks == want.at("start_blocks"));
  CHECK(t->start_live_bytes() == want.at("start_live_bytes"));
  CHECK(t->allocations() == want.at("allocations"));
  CHECK(t->peak_live_bytes() == want.at("peak_live_bytes"));
  REQUIRE(t->recorded);
  CHECK(t->recorded->peak_bytes == want.at("recorded_peak_bytes"));
  CHECK(t->recorded->device_calls == want.at("recorded_device_calls"));
  // The segments held before the first event: the final ones less those the events allocated.
  CHECK(t->start_segments.size() == want.at("start_segments"));
  std::uint64_t held = 0;
  for (const auto& s : t->start_segments) {
    held += s.bytes;
    CHECK((s.small == (s.bytes == (std::uint64_t{2} << 20))));
  }
  CHECK(held == want.at("start_segment_bytes"));
  CHECK(held == t->recorded->start_bytes);
  // The loop frees every activation it allocates; the weights, live at the start, stay.
  std::size_t frees = 0;
  for (const auto& r : t->requests) {
    frees += r.allocate ? 0 : 1;
  }
  CHECK(frees == t->allocations());
  std::map<std::uint64_t, int> streams;
  for (const auto& b : t->blocks) {
    ++streams[b.stream];
  }
  CHECK(streams.size() == 2);
  CHECK(t->blocks[t->start_blocks].allocated_us >= 0); // events carry time_us
}

TEST_CASE("expandable segments: maps and unmaps are the recorded reserve") {
  const auto small = read_trace_file(data + "small_snapshot.pickle");
  const auto t = read_trace_file(data + "expandable_snapshot.pickle");
  REQUIRE((small && t && t->recorded));
  CHECK(t->recorded->start_bytes == small->recorded->start_bytes);
  CHECK(t->recorded->peak_bytes == small->recorded->peak_bytes);
  CHECK(t->recorded->device_calls == small->recorded->device_calls + 1);
  CHECK(t->start_segments.empty()); // an expandable segment's state is pages: no segments to start from
  CHECK(t->recorded->steps.back().second == small->recorded->peak_bytes - (std::uint64_t{2} << 20));
}

TEST_CASE("a snapshot with neither events nor segments for the device asked for is refused") {
  const auto bytes = carve::trace::read_whole_file(data + "small_snapshot.pickle");
  REQUIRE(bytes);
  const auto t = carve::trace::read_memory_snapshot(*bytes, "small.pickle", 1);
  REQUIRE_FALSE(t);
  CHECK(t.error().message == "small.pickle: start state: device 1 has no recorded events and no segments: nothing "
                             "to read (record events with torch.cuda.memory._record_memory_history())");
  CHECK_FALSE(carve::trace::read_memory_snapshot(*bytes, "small.pickle", 2));
}

TEST_CASE("bad snapshots: one message naming the file, the event and what is wrong") {
  CHECK(message_of("bad/truncated.pickle").find("bad/truncated.pickle: byte") != std::string::npos);
  CHECK(message_of("bad/truncated.pickle").find("truncated") != std::string::npos);
  CHECK(message_of("bad/global_call.pickle").find("opcode GLOBAL (0x63) refused") != std::string::npos);
  CHECK(message_of("bad/call.pickle").find("opcode REDUCE (0x52) refused") != std::string::npos);
  CHECK(message_of("bad/wrong_type.pickle").find(": event 0: the event's 'size' is not a whole number") !=
        std::string::npos);
  CHECK(message_of("bad/zero_size.pickle").find(": event 3: a block of 0 bytes") != std::string::npos);
  CHECK(message_of("bad/huge_size.pickle").find(": event 3: a block of 4611686018427387905 bytes, beyond 2^62") !=
        std::string::npos);
  CHECK(message_of("bad/double_free.pickle").find("which is freed again later without being allocated") !=
        std::string::npos);
  CHECK(message_of("bad/unknown_free.rmm.csv").find(": event 1: free of address 0x7f8a40000400, which is not live") !=
        std::string::npos);
  CHECK(message_of("no/such/file.pickle").find("cannot open") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists("carve_replay_was_tricked")); // the file's "call" never ran
}

TEST_CASE("the shared real snapshot: the figures computed apart from this reader") {
  const std::string real = CARVE_REAL_SNAPSHOT;
  if (!std::filesystem::exists(real)) {
    MESSAGE("skipped: " << real << " is absent");
    return;
  }
  const auto t = read_trace_file(real);
  REQUIRE(t);
  CHECK(t->allocations() == 3505);
  CHECK(t->start_blocks == 622);
  CHECK(t->start_live_bytes() == 1095725248); // 1.02 GiB
  CHECK(t->peak_live_bytes() == 5876132840);  // 5.47 GiB
  REQUIRE(t->recorded);
  CHECK(t->recorded->start_bytes == 1400897536); // 1.30 GiB: the final segments less the 152 recorded
  CHECK(t->recorded->peak_bytes == 6471811072);  // 6.03 GiB, 1.10x the peak live
  CHECK(t->recorded->device_calls == 152);
  CHECK(t->start_segments.size() == 63); // 215 at the end, 152 allocated in the trace
}

TEST_CASE("a hostile snapshot: huge dicts shared by every event and block are walked once each") {
  // One event dict and one block dict, each with 100000 keys the reader does not know after those
  // it does, each referred to 100000 times (DUP pushes the same dict again). Looking each field up
  // by walking the dict compares some 10^10 keys, minutes of work; walking each dict once, 2 * 10^5.
  constexpr std::int64_t n = 100'000;
  const auto junk = [](PickleWriter& w) {
    for (std::int64_t k = 0; k < n; ++k) {
      w.str("k" + std::to_string(k)).none();
    }
  };
  const std::string bytes = snapshot(
      [&](PickleWriter& w) {
        segment(w, 1 << 20, n * 512, [&](PickleWriter& b) {
          b.dict().item("size", 512).item("state", "inactive");
          junk(b);
          b.dict_end().dup(n - 1);
        });
      },
      [&](PickleWriter& w) {
        w.dict().item("action", "free_requested").item("addr", 4096).item("size", 512).item("stream", 0);
        w.item("time_us", 7);
        junk(w);
        w.dict_end().dup(n - 1);
      });
  const auto t = read_memory_snapshot(bytes, "hostile.pickle");
  REQUIRE_MESSAGE(t, (t ? "" : t.error().message));
  CHECK(t->requests.empty());
  CHECK(t->start_blocks == 0);
  REQUIRE(t->recorded);
  CHECK(t->recorded->start_bytes == n * 512);
  CHECK(t->start_segments.size() == 1);
}

TEST_CASE("sums and ends of sizes that overflow 64 bits are refused, never wrapped") {
  // The smallest good snapshot reads: the cases below differ from it in one thing each.
  CHECK(snapshot_error(snapshot([](PickleWriter& w) { segment(w, 0x10000, 4096); }, alloc_and_free)) == "");
  // Three segments of 2^63 - 1 bytes: their total, the recorded reserve at the end, passes 2^64.
  CHECK(snapshot_error(snapshot(
            [](PickleWriter& w) {
              segment(w, 0, int63);
              segment(w, two62, int63);
              segment(w, std::int64_t{1} << 61, int63);
            },
            alloc_and_free)) == "s.pickle: start state: the final segments hold more than 2^64 - 1 bytes");
  // Blocks without an address follow each other: the third would start past 2^64 - 1.
  CHECK(snapshot_error(snapshot(
            [](PickleWriter& w) {
              segment(w, int63, 4096, [](PickleWriter& b) {
                block(b, int63, "inactive");
                block(b, int63, "inactive");
                block(b, 4096, "active_allocated");
              });
            },
            alloc_and_free)) == "s.pickle: start state: a block of 9223372036854775807 bytes at "
                                "0xfffffffffffffffe: its end does not fit in 64 bits");
  // Four live blocks of 2^62 bytes (overlapping: the reader does not check that) hold 2^64.
  CHECK(snapshot_error(snapshot(
            [](PickleWriter& w) {
              segment(w, 0x10000, two62, [](PickleWriter& b) {
                for (std::int64_t k = 1; k <= 4; ++k) {
                  block(b, two62, "active_allocated", k * 0x10000);
                }
              });
            },
            alloc_and_free)) == "s.pickle: start state: a block of 4611686018427387904 bytes at 0x20000: the "
                                "blocks live would hold more than 2^62 bytes");
  // Four segment frees of 2^62 bytes: the reserve before them would be 2^64.
  CHECK(snapshot_error(snapshot([](PickleWriter&) {},
                                [](PickleWriter& w) {
                                  alloc_and_free(w);
                                  for (std::int64_t k = 1; k <= 4; ++k) {
                                    event(w, "segment_free", k * (two62 / 4), two62);
                                  }
                                })) == "s.pickle: start state: the segment events free more than 2^64 - 1 bytes");
  CHECK(snapshot_error(snapshot([](PickleWriter&) {},
                                [](PickleWriter& w) {
                                  alloc_and_free(w);
                                  for (std::int64_t k = 1; k <= 4; ++k) {
                                    event(w, "segment_alloc", k * (two62 / 4), two62);
                                  }
                                })) == "s.pickle: start state: the segment events allocate more than 2^64 - 1 bytes");
  // (An address and a size are ints of at most 2^63 - 1 here, so one of each cannot pass 2^64:
  // TraceBuilder's own check of that is tested with carve's CSV, whose addresses reach 2^64 - 1.)
}

TEST_CASE("an event's C++ and Python frames are read past, 2^64 - 1 as a line among them") {
  // As PyTorch records with C++ stacks: each frame a dict of filename, line and name, where a
  // C++ frame with no line has line 2**64 - 1, beyond 64-bit signed.
  const auto frames = [](PickleWriter& w) {
    w.str("frames").list();
    w.dict()
        .item("filename", "??")
        .str("line")
        .unknown_line()
        .item("name", "c10::cuda::CUDACachingAllocator")
        .dict_end();
    w.dict().item("filename", "train.py").item("line", 42).item("name", "step").dict_end();
    w.list_end();
  };
  const std::string bytes = snapshot([](PickleWriter&) {},
                                     [&](PickleWriter& w) {
                                       for (const char* action : {"alloc", "free_completed"}) {
                                         w.dict().item("action", action).item("addr", 0x1000).item("size", 512);
                                         w.item("stream", 0);
                                         frames(w);
                                         w.dict_end();
                                       }
                                     });
  CHECK(snapshot_error(bytes).empty());
}

TEST_CASE("a file above the size limit is refused before it is read") {
  CHECK(carve::trace::max_trace_file_bytes == std::uint64_t{4} << 30);
  const std::string path = data + "small_snapshot.pickle";
  const auto size = static_cast<std::uint64_t>(std::filesystem::file_size(path));
  CHECK(carve::trace::read_whole_file(path, size)); // at the limit: read
  const std::string over = path + ": " + std::to_string(size) + " bytes, above the limit of " +
                           std::to_string(size - 1) + " bytes for a trace file";
  const auto bytes = carve::trace::read_whole_file(path, size - 1);
  REQUIRE_FALSE(bytes);
  CHECK(bytes.error().code == carve::Errc::invalid_argument);
  CHECK(bytes.error().message == over);
  const auto t = read_trace_file(path, std::nullopt, size - 1);
  REQUIRE_FALSE(t);
  CHECK(t.error().message == over);
  // A file whose size is not known in advance is read up to the limit, then refused.
  if (std::filesystem::exists("/dev/zero")) {
    const auto endless = carve::trace::read_whole_file("/dev/zero", std::uint64_t{1} << 20);
    REQUIRE_FALSE(endless);
    CHECK(endless.error().message == "/dev/zero: more than 1048576 bytes, above the limit for a trace file");
  }
}

} // namespace test_memory_snapshot
