// PyTorch memory snapshots in each layout PyTorch 2.x writes, written here key by key as that
// version's snapshot code writes them (the keys, the actions, the ints' forms, the picklers'
// protocols; for Python's pickle, byte for byte what it writes, frames and memo included), all
// holding the same allocations: every layout must read to the same trace. Then snapshots without
// events (recording off, history cleared), integers beyond 64 bits where carve
// reads past them and where it needs their value, and the events carve does not model.
#include <carve/trace.hpp>

#include <doctest/doctest.h>
#include <trace/pickle_writer.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

// In a namespace of its own: the area's test files compile as one translation unit.
namespace test_snapshot_layouts {

using carve::test::PickleWriter;
using carve::trace::AllocationTrace;
using carve::trace::no_time;
using carve::trace::read_memory_snapshot;

namespace {

constexpr std::int64_t MiB = 1 << 20;
constexpr std::int64_t base = 0x7f0000000000;    // segment A: 2 MiB, small, device 0
constexpr std::int64_t large = base + 64 * MiB;  // segment B: 20 MiB, allocated in the trace
constexpr std::int64_t other = base + 256 * MiB; // segment C: 2 MiB on device 1

// What each version added to what the snapshot holds; each layout below holds what those before
// it added, unless it says otherwise.
struct Layout {
  const char* name;
  int protocol = 4;                 // Python's pickle.dump (4); PyTorch's C++ pickler (2); text ints (1)
  bool block_address = true;        // 2.1: blocks carry `address` and `frames` (2.0: `history`)
  bool segment_extras = true;       // 2.1: `segment_pool_id`, `is_expandable`, `frames` on segments
  bool time_us = true;              // 2.2: events carry `time_us`
  bool allocator_settings = true;   // 2.3: the root's `allocator_settings`
  bool user_defined = false;        // mid-2024 nightlies: record_function annotations as events
  bool external_annotations = true; // 2.5: the annotations at the root instead
  bool compile_context = true;      // 2.8: events carry `compile_context`
  bool user_metadata = true;        // 2.10: events carry `user_metadata`
  bool cpp_frames = false;          // stacks="all": C++ frames, a line of 2^64 - 1 where unknown
  PickleWriter::Form form = PickleWriter::Form::python; // protocols 4 and 5: as Python's pickle writes them
  std::size_t frame_bytes = std::size_t{64} << 10;      // Python's frames; smaller ones cut values apart
  bool expandable = false; // expandable_segments:True: segments mapped and unmapped, not allocated
};

// clang-format off
const Layout layouts[] = {
    {"2.0", 4, false, false, false, false, false, false, false, false, false},
    {"2.1", 4, true, true, false, false, false, false, false, false, false},
    {"2.2", 4, true, true, true, false, false, false, false, false, false},
    {"2.3", 4, true, true, true, true, false, false, false, false, false},
    {"mid-2024 nightlies", 4, true, true, true, true, true, false, false, false, false},
    {"2.5", 4, true, true, true, true, false, true, false, false, false},
    {"2.8", 4, true, true, true, true, false, true, true, false, false},
    {"2.10", 4, true, true, true, true, false, true, true, true, false},
    {"2.10, C++ stacks", 4, true, true, true, true, false, true, true, true, true},
    {"2.10, PyTorch's C++ pickler", 2, true, true, true, true, false, true, true, true, true},
    {"2.10, protocol 1 (ints above 2^31 - 1 as LONG text)", 1, true, true, true, true, false, true, true, true, true},
    {"2.10, protocol 5 (Python 3.14's pickle)", 5, true, true, true, true, false, true, true, true, true},
    {"2.10, a frame every 64 bytes", 4, true, true, true, true, false, true, true, true, true,
     PickleWriter::Form::python, 64},
    {"2.10, every int as an 8-byte LONG1, no frames or memo", 4, true, true, true, true, false, true, true, true, true,
     PickleWriter::Form::plain},
    {"2.10, expandable segments", 4, true, true, true, true, false, true, true, true, true,
     PickleWriter::Form::python, std::size_t{64} << 10, true},
};
// clang-format on

// A frames list: a Python frame and, with C++ stacks, a C++ frame without a line (2^64 - 1 where
// Python's pickle writes it; -1 where PyTorch's C++ pickler does, its lines being int64).
void frames(PickleWriter& w, const Layout& l) {
  w.list();
  w.dict().item("filename", "train.py").item("line", 42).item("name", "step").dict_end();
  if (l.cpp_frames) {
    w.dict().item("filename", "??").str("line");
    if (l.protocol == 2) {
      w.integer(-1);
    } else {
      w.unknown_line();
    }
    w.item("name", "c10::cuda::CUDACachingAllocator::malloc").dict_end();
  }
  w.list_end();
}

// One event: its action, `addr` (or, for oom, `device_free`), size, stream, and what the layout adds.
void event(PickleWriter& w, const Layout& l, std::string_view action, std::int64_t addr, std::int64_t size,
           std::int64_t time) {
  w.dict().item("action", action).item(action == "oom" ? "device_free" : "addr", addr).item("size", size);
  w.item("stream", 0);
  if (l.time_us) {
    w.item("time_us", time);
  }
  if (l.compile_context) {
    w.item("compile_context", "N/A");
  }
  if (l.user_metadata) {
    w.item("user_metadata", "");
  }
  w.str("frames");
  if (time == 1) { // the first event's frames shared by the others, as the picklers' memo does
    frames(w, l);
    w.put(1);
  } else {
    w.get(1);
  }
  w.dict_end();
}

// A block: 2.1 on with its address and frames, 2.0 with its history (each allocation with frames).
void block(PickleWriter& w, const Layout& l, std::int64_t address, std::int64_t size, std::int64_t requested,
           std::string_view state) {
  w.dict();
  if (l.block_address) {
    w.item("address", address);
  }
  w.item("size", size).item("requested_size", requested).item("state", state);
  if (l.block_address) {
    w.str("frames").list().list_end();
  } else {
    w.str("history").list();
    if (state != "inactive") {
      w.dict().item("addr", address).item("real_size", requested).str("frames").list().list_end().dict_end();
    }
    w.list_end();
  }
  w.dict_end();
}

// A segment's keys before its blocks.
void segment(PickleWriter& w, const Layout& l, std::int64_t device, std::int64_t address, std::int64_t total,
             bool small) {
  w.dict().item("device", device).item("address", address).item("total_size", total);
  w.item("allocated_size", 0).item("active_size", 0).item("requested_size", 0);
  w.item("stream", 0).item("segment_type", small ? "small" : "large");
  if (l.segment_extras) {
    w.str("segment_pool_id").pair(0, 0).str("is_expandable").boolean(l.expandable);
    w.str("frames").list().list_end();
  }
  w.str("blocks").list();
}

// The snapshot, in layout `l`. Device 0: segment A held before the trace began, with a block live
// throughout; segment B allocated in it (with expandable segments: mapped, and unmapped at the end). Events: 1024 bytes
// in A allocated and freed, 4 MiB in B allocated and freed, 512 bytes in A allocated and live at the end, between them
// the actions carve does not model (oom, snapshot, and mid-2024's annotations). Device 1: segment C, no events.
std::string snapshot(const Layout& l) {
  PickleWriter w(l.protocol, l.form, l.frame_bytes);
  w.dict().str("segments").list();
  segment(w, l, 0, base, 2 * MiB, true);
  block(w, l, base, 512, 500, "active_allocated");
  block(w, l, base + 512, 1024, 1024, "inactive");
  block(w, l, base + 1536, 512, 512, "active_allocated");
  block(w, l, base + 2048, 2 * MiB - 2048, 0, "inactive");
  w.list_end().dict_end();
  if (!l.expandable) { // an expandable B was unmapped by the end: no pages of it left to list
    segment(w, l, 0, large, 20 * MiB, false);
    block(w, l, large, 20 * MiB, 0, "inactive");
    w.list_end().dict_end();
  }
  segment(w, l, 1, other, 2 * MiB, true);
  block(w, l, other, 2048, 2000, "active_pending_free");
  block(w, l, other + 2048, 2 * MiB - 2048, 0, "inactive");
  w.list_end().dict_end();
  w.list_end();

  w.str("device_traces").list().list();
  event(w, l, "alloc", base + 512, 1024, 1);
  event(w, l, l.expandable ? "segment_map" : "segment_alloc", large, 20 * MiB, 2);
  event(w, l, "alloc", large, 4 * MiB, 3);
  if (l.user_defined) {
    w.dict().item("action", "user_defined").item("addr", 0).item("size", 0).item("stream", 0);
    w.item("time_us", 3).item("name", "ProfilerStep#0").dict_end();
  }
  event(w, l, "free_requested", base + 512, 1024, 4);
  event(w, l, "free_completed", base + 512, 1024, 5);
  event(w, l, "oom", 1024, std::int64_t{80} << 30, 6);
  event(w, l, "alloc", base + 1536, 512, 7);
  event(w, l, "free_requested", large, 4 * MiB, 8);
  event(w, l, "free_completed", large, 4 * MiB, 9);
  event(w, l, "snapshot", 0, 0, 10);
  if (l.expandable) { // B's pages given back
    event(w, l, "segment_unmap", large, 20 * MiB, 11);
  }
  w.list_end().list().list_end().list_end(); // device 1: no events

  if (l.allocator_settings) {
    w.str("allocator_settings").dict().item("PYTORCH_CUDA_ALLOC_CONF", "").item("max_split_size", -1);
    w.str("garbage_collection_threshold").floating(0.0).str("expandable_segments").boolean(false);
    w.str("roundup_power2_divisions").dict().item("1", 0).item("2", 0).dict_end().dict_end();
  }
  if (l.external_annotations) {
    w.str("external_annotations").list();
    w.dict().item("stage", "START").item("name", "ProfilerStep#0").item("device", 0).item("time_us", 3).dict_end();
    w.list_end();
  }
  return w.dict_end().stop();
}

AllocationTrace read(const std::string& bytes, std::optional<std::uint64_t> device = std::nullopt) {
  auto t = read_memory_snapshot(bytes, "s.pickle", device);
  REQUIRE_MESSAGE(t, (t ? "" : t.error().message));
  return std::move(*t);
}

std::string message(const std::string& bytes, std::optional<std::uint64_t> device = std::nullopt) {
  const auto t = read_memory_snapshot(bytes, "s.pickle", device);
  REQUIRE_FALSE(t);
  CHECK(t.error().code == carve::Errc::invalid_argument);
  return t.error().message;
}

// A snapshot of one segment of 2 MiB holding a live block of 512 bytes, and `traces` as its
// device_traces (written by the function; nothing: no such key).
std::string no_events(const std::function<void(PickleWriter&)>& traces, bool expandable = false) {
  PickleWriter w;
  w.dict().str("segments").list();
  w.dict().item("device", 0).item("address", base).item("total_size", 2 * MiB).item("stream", 0);
  w.str("is_expandable").boolean(expandable).str("blocks").list();
  w.dict().item("address", base).item("size", 512).item("requested_size", 512).item("state", "active_allocated");
  w.dict_end().list_end().dict_end().list_end();
  if (traces) {
    w.str("device_traces");
    traces(w);
  }
  return w.dict_end().stop();
}

} // namespace

TEST_CASE("every PyTorch 2.x layout reads to the same trace") {
  for (const Layout& l : layouts) {
    CAPTURE(l.name);
    const AllocationTrace t = read(snapshot(l));
    CHECK(t.start_blocks == 1);
    CHECK(t.start_live_bytes() == 500); // requested_size, not the block's 512
    CHECK(t.allocations() == 3);
    REQUIRE(t.requests.size() == 5); // oom, snapshot and annotations are not requests
    CHECK(t.requests[0].event == 0);
    CHECK(t.requests.back().event == (l.user_defined ? 9U : 8U));
    CHECK(t.peak_live_bytes() == 500 + 1024 + 4 * MiB);
    REQUIRE(t.recorded);
    CHECK(t.recorded->start_bytes == 2 * MiB); // A; B was allocated in the trace
    CHECK(t.recorded->peak_bytes == 22 * MiB);
    CHECK(t.recorded->device_calls == (l.expandable ? 2U : 1U)); // a map, and its unmap
    if (l.expandable) {                                          // pages, not segments: nothing to start from
      CHECK(t.start_segments.empty());
      REQUIRE_FALSE(t.recorded->steps.empty());
      CHECK(t.recorded->steps.back().second == 2 * MiB);
    } else {
      REQUIRE(t.start_segments.size() == 1);
      CHECK(t.start_segments[0].address == base);
      CHECK(t.start_segments[0].small);
    }
    // Times where the layout has them; a free's time is when it was requested.
    CHECK(t.blocks[1].allocated_us == (l.time_us ? 1 : no_time));
    CHECK(t.blocks[1].freed_us == (l.time_us ? 4 : no_time));
  }
}

TEST_CASE("Python's memo past index 255: a frames list shared through LONG_BINGET") {
  // Every str, list and dict Python writes takes a memo index, so in a real snapshot the frames
  // list an event shares with later ones sits far past 255 and comes back as LONG_BINGET.
  PickleWriter w(4, PickleWriter::Form::python);
  w.dict().str("segments").list().list_end().str("device_traces").list().list();
  for (std::int64_t i = 0; i < 400; ++i) {
    const bool alloc = i % 2 == 0;
    w.dict().item("action", alloc ? "alloc" : "free_completed").item("addr", base + (i / 2) * 512);
    w.item("size", 512).item("stream", 0).item("time_us", i).str("frames");
    if (i == 200) { // memo index past 1800 by now
      w.list().dict().item("filename", "train.py").item("line", 7).item("name", "step").dict_end().list_end().put(0);
    } else if (i > 200) {
      w.get(0);
    } else {
      w.list().list_end();
    }
    w.dict_end();
  }
  const AllocationTrace t = read(w.list_end().list_end().dict_end().stop());
  CHECK(t.requests.size() == 400);
  CHECK(t.allocations() == 200);
  CHECK(t.peak_live_bytes() == 512);
}

TEST_CASE("a device without events reads as its end state: live blocks, segments, no requests") {
  const std::string bytes = snapshot(layouts[7]);
  const AllocationTrace t = read(bytes, 1);
  CHECK(t.requests.empty());
  CHECK(t.start_blocks == 1);
  CHECK(t.start_live_bytes() == 2000); // active_pending_free: freed, its streams' work not done
  REQUIRE(t.recorded);
  CHECK(t.recorded->start_bytes == 2 * MiB);
  CHECK(t.recorded->peak_bytes == 2 * MiB);
  CHECK(t.recorded->device_calls == 0);
  CHECK(t.recorded->steps.empty());
  REQUIRE(t.start_segments.size() == 1);
  CHECK(t.start_segments[0].address == other);
  // Without a device asked for, the one with events is read.
  CHECK(read(bytes).requests.size() == 5);
}

TEST_CASE("device_traces empty, all its lists empty, or absent: the end state, no error") {
  const auto check = [](const std::string& bytes) {
    const AllocationTrace t = read(bytes);
    CHECK(t.requests.empty());
    CHECK(t.start_blocks == 1);
    CHECK(t.start_live_bytes() == 512);
    REQUIRE(t.recorded);
    CHECK(t.recorded->start_bytes == 2 * MiB);
    CHECK(t.start_segments.size() == 1);
  };
  check(no_events([](PickleWriter& w) { w.list().list_end(); }));                                     // []
  check(no_events([](PickleWriter& w) { w.list().list().list_end().list().list_end().list_end(); })); // [[], []]
  check(no_events(nullptr));                                                                          // no key
  // Only events carve does not model: the same.
  check(no_events([](PickleWriter& w) {
    w.list().list();
    w.dict().item("action", "snapshot").item("addr", 0).item("size", 0).item("stream", 0).dict_end();
    w.dict().item("action", "oom").item("device_free", 0).item("size", 1 << 30).item("stream", 0).dict_end();
    w.list_end().list_end();
  }));
  // Expandable segments: their state is pages, so no start segments, as with events.
  const AllocationTrace t = read(no_events([](PickleWriter& w) { w.list().list_end(); }, true));
  CHECK(t.start_segments.empty());
  CHECK(t.start_blocks == 1);
}

TEST_CASE("a device with neither events nor segments is refused: nothing to read") {
  const std::string record = " (record events with torch.cuda.memory._record_memory_history())";
  PickleWriter empty;
  empty.dict().str("segments").list().list_end().str("device_traces").list().list().list_end().list_end();
  CHECK(message(empty.dict_end().stop()) ==
        "s.pickle: start state: no device has recorded events or segments: nothing to read" + record);
  const std::string one = no_events([](PickleWriter& w) { w.list().list().list_end().list_end(); });
  CHECK(message(one, 3) ==
        "s.pickle: start state: device 3 has no recorded events and no segments: nothing to read" + record);
  CHECK(message(no_events([](PickleWriter& w) { w.list().none().list_end(); }), 0) ==
        "s.pickle: start state: the trace of device 0 is not a list");
  CHECK(message(no_events([](PickleWriter& w) { w.none(); })) ==
        "s.pickle: start state: the snapshot's 'device_traces' is not a list");
}

TEST_CASE("integers beyond 64-bit signed: read past where carve needs no value, refused where it does") {
  // The block's event with a C++ frame of line 2^64 - 1, in binary and in text: read.
  for (const int protocol : {4, 1}) {
    PickleWriter w(protocol);
    w.dict().str("segments").list().list_end().str("device_traces").list().list();
    for (const char* action : {"alloc", "free_completed"}) {
      w.dict().item("action", action).item("addr", base).item("size", 512).item("stream", 0);
      w.str("frames").list().dict().str("line").unknown_line().dict_end().list_end();
      w.str("big_text").long_text("-99999999999999999999999999999999999999").dict_end();
    }
    CHECK(read(w.list_end().list_end().dict_end().stop()).requests.size() == 2);
  }
  // Where the reader needs the value: a message naming the event and the field.
  const auto with_event = [](std::string_view key, std::string_view digits) {
    PickleWriter w(1);
    w.dict().str("segments").list().list_end().str("device_traces").list().list();
    w.dict().item("action", "alloc").item("addr", base).item("size", 512).item("stream", 0).item("time_us", 1);
    w.str(key).long_text(digits).dict_end();
    return w.list_end().list_end().dict_end().stop();
  };
  CHECK(message(with_event("addr", "18446744073709551615")) ==
        "s.pickle: event 0: the event's 'addr' is 2^63 or more, beyond the integers carve reads");
  CHECK(message(with_event("size", "9223372036854775808")) ==
        "s.pickle: event 0: the event's 'size' is 2^63 or more, beyond the integers carve reads");
  CHECK(message(with_event("stream", "-9223372036854775809")) ==
        "s.pickle: event 0: the event's 'stream' is not a whole number");
  CHECK(message(with_event("time_us", "18446744073709551615")) ==
        "s.pickle: event 0: the event's 'time_us' is 2^63 or more, beyond the integers carve reads");
  // 2^63 - 1 still reads (and then is no block size: the builder's own message).
  CHECK(message(with_event("size", "9223372036854775807")) ==
        "s.pickle: event 0: a block of 9223372036854775807 bytes, beyond 2^62");
  // A segment's field: the start state named.
  PickleWriter w;
  w.dict().str("segments").list().dict().item("device", 0).str("address").unknown_line();
  w.item("total_size", 2 * MiB).item("stream", 0).str("blocks").list().list_end().dict_end().list_end();
  CHECK(message(w.dict_end().stop()) ==
        "s.pickle: start state: a segment's 'address' is 2^63 or more, beyond the integers carve reads");
}

TEST_CASE("oom and snapshot events are passed over without their fields being read") {
  // An oom event has device_free where others have addr; a snapshot event, and any action a later
  // version adds, may have neither: none of them is read past its action.
  PickleWriter w;
  w.dict().str("segments").list().list_end().str("device_traces").list().list();
  w.dict().item("action", "alloc").item("addr", base).item("size", 512).item("stream", 0).dict_end();
  w.dict().item("action", "oom").item("device_free", 7).item("size", 1 << 30).item("stream", 0).dict_end();
  w.dict().item("action", "snapshot").dict_end();
  w.dict().item("action", "some_later_action").str("addr").str("not a number").dict_end();
  w.dict().item("action", "free_completed").item("addr", base).item("size", 512).item("stream", 0).dict_end();
  const AllocationTrace t = read(w.list_end().list_end().dict_end().stop());
  REQUIRE(t.requests.size() == 2);
  CHECK(t.requests[1].event == 4);
  // A device whose events are only of those is not the one chosen when another has requests.
  PickleWriter two;
  two.dict().str("segments").list().list_end().str("device_traces").list().list();
  two.dict().item("action", "snapshot").dict_end().list_end().list();
  two.dict().item("action", "alloc").item("addr", base).item("size", 512).item("stream", 0).dict_end();
  two.dict().item("action", "free_completed").item("addr", base).item("size", 512).item("stream", 0).dict_end();
  CHECK(read(two.list_end().list_end().dict_end().stop()).requests.size() == 2);
}

} // namespace test_snapshot_layouts
