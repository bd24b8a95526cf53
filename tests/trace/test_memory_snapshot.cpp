// PyTorch memory snapshots as request streams: the start state rebuilt from the end state and
// checked against figures computed apart from the reader (the simulation that wrote the test's own
// snapshots; for the real snapshot, the figures in ../shared/traces/README.md), the recorded
// reserve, and every bad input refused with a message naming the file, the event and the fault.
#include <carve/trace.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

using carve::trace::AllocationTrace;
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

TEST_CASE("a snapshot without events for the device asked for is refused") {
  const auto bytes = carve::trace::read_whole_file(data + "small_snapshot.pickle");
  REQUIRE(bytes);
  const auto t = carve::trace::read_memory_snapshot(*bytes, "small.pickle", 1);
  REQUIRE_FALSE(t);
  CHECK(t.error().message == "small.pickle: start state: device 1 has no recorded events (record them with "
                             "torch.cuda.memory._record_memory_history())");
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
