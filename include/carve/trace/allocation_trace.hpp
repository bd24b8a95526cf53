/// @file carve/trace/allocation_trace.hpp
/// A program's allocations as a request stream to replay through any allocator: the live blocks
/// before the first request, every allocate and free in order, and, where the file has them, the
/// bytes the recording allocator itself reserved.
///
/// @code
/// carve::trace::TraceBuilder b("run.csv");
/// b.allocate(0, 0x7f0000000000, 4096, 0);       // event 0: 4 KiB at that address, stream 0
/// b.free(1, 0x7f0000000000, 0);                  // event 1: freed
/// carve::Result<carve::trace::AllocationTrace> t = std::move(b).finish();
/// @endcode
///
/// Every reader (PyTorch memory snapshots, RMM's logging adaptor, carve's own CSV) feeds a
/// TraceBuilder, so the rules for a sound stream are stated once, here, and every format gets the
/// same messages: `<source>: event <i>: <what is wrong>`. A block is an address and a size; a
/// replay gives each block whatever address its allocator picks and frees it by its index, so a
/// replay never looks anything up by the recorded address.
///
/// What a builder refuses (Errc::invalid_argument, nothing of the trace kept): a size of zero or
/// above 2^62 bytes, a block whose end (address + size) does not fit in 64 bits, a block that
/// takes the bytes live at once past 2^62, an allocation at an address that is live already, a
/// free of an address that is not live (never allocated and not live at the start, or freed
/// twice), a free whose size differs from its allocation's, a segment event that takes the
/// recorded reserve below zero or past 2^64 - 1. So every sum a trace's accessors make fits.
#pragma once

#include <carve/core/checked_math.hpp>
#include <carve/core/error.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace carve::trace {

/// The largest block size a trace may hold: 2^62 bytes, beyond any memory.
inline constexpr std::uint64_t max_block_bytes = std::uint64_t{1} << 62;
/// The most bytes a trace may hold live at once: 2^62, beyond any memory. A TraceBuilder refuses
/// a block that would take the live bytes past it, so start_live_bytes() and peak_live_bytes()
/// fit in 64 bits with room to spare (four times over); a replay that adds up more than that, an
/// allocator's rounding and caching on top of the live bytes, say, still checks its own sums.
inline constexpr std::uint64_t max_live_bytes = std::uint64_t{1} << 62;

/// "Not recorded", for times.
inline constexpr std::int64_t no_time = -1;

/// One block of memory a program held: where and how large it was as recorded, and the stream it
/// was allocated on.
struct TraceBlock {
  std::uint64_t address = 0;           ///< as recorded (a replay gives it an address of its own)
  std::uint64_t bytes = 0;             ///< as requested, 1 .. max_block_bytes
  std::uint64_t stream = 0;            ///< the recorded stream handle (0: the default stream)
  std::int64_t allocated_us = no_time; ///< when it was allocated, where recorded
  std::int64_t freed_us = no_time;     ///< when it was freed (the free was requested), where recorded
};

/// A segment the recording allocator held before the first event (PyTorch snapshots): where it
/// was, how large, for which stream, and whether it served small requests. A model of that
/// allocator can start from these, as the recording did.
struct TraceSegment {
  std::uint64_t address = 0; ///< as recorded
  std::uint64_t bytes = 0;   ///< its size
  std::uint64_t stream = 0;  ///< the recorded stream handle
  bool small = false;        ///< PyTorch's small pool (segment_type "small")
};

/// One call of the request stream.
struct TraceRequest {
  bool allocate = true;    ///< allocate, or free
  std::uint32_t block = 0; ///< index into AllocationTrace::blocks
  std::uint64_t event = 0; ///< the event's index in the file, for messages
};

/// What the recording allocator reserved over the trace (a PyTorch snapshot's segment events):
/// bytes reserved before the first request, and after every request that changed it.
struct RecordedReserve {
  std::uint64_t start_bytes = 0; ///< reserved before the first request
  /// (number of requests replayed, bytes reserved then), in order; one entry per change.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> steps;
  std::uint64_t peak_bytes = 0;   ///< the most it reserved
  std::uint64_t device_calls = 0; ///< its segment allocations and frees (maps and unmaps)
};

/// A request stream: the start state, then the requests in order.
struct AllocationTrace {
  std::string source;                      ///< the file (or name) it came from, for messages
  std::vector<TraceBlock> blocks;          ///< every block; the first `start_blocks` were live before the first request
  std::uint32_t start_blocks = 0;          ///< how many blocks were live at the start
  std::vector<TraceRequest> requests;      ///< allocations and frees, in order
  std::optional<RecordedReserve> recorded; ///< the recording allocator's own reserve, where the file has it
  std::vector<TraceSegment> start_segments; ///< its segments before the first event, where the file has them

  /// Bytes live before the first request. For a trace a TraceBuilder built, at most
  /// max_live_bytes (a trace assembled by hand must keep to that too, or the sum may wrap).
  std::uint64_t start_live_bytes() const noexcept {
    std::uint64_t sum = 0;
    for (std::uint32_t i = 0; i < start_blocks; ++i) {
      sum += blocks[i].bytes;
    }
    return sum;
  }
  /// The most bytes live at once, the start state included: the floor any allocator needs. At
  /// most max_live_bytes, as start_live_bytes().
  std::uint64_t peak_live_bytes() const noexcept {
    std::uint64_t live = start_live_bytes();
    std::uint64_t peak = live;
    for (const TraceRequest& r : requests) {
      if (r.allocate) {
        live += blocks[r.block].bytes;
        peak = live > peak ? live : peak;
      } else {
        live -= blocks[r.block].bytes;
      }
    }
    return peak;
  }
  /// Allocations in the request stream (the start blocks not counted).
  std::uint64_t allocations() const noexcept { return blocks.size() - start_blocks; }
};

/// Builds an AllocationTrace from events in file order, checking each (see the file's
/// description). Start blocks first (start_block), then events; finish() hands the trace over.
class TraceBuilder {
public:
  /// A builder for the trace of `source` (a file name; it starts every message).
  explicit TraceBuilder(std::string source) { trace_.source = std::move(source); }

  /// A block live before the first event. Errors: a bad size; an end past 2^64 - 1; the live
  /// bytes past max_live_bytes; an address live already.
  [[nodiscard]] Result<void> start_block(std::uint64_t address, std::uint64_t bytes, std::uint64_t stream) {
    if (!trace_.requests.empty()) {
      return failure("start blocks come before the first event", std::nullopt);
    }
    if (auto ok = take_block(address, bytes, std::nullopt); !ok) {
      return ok;
    }
    trace_.blocks.push_back(TraceBlock{address, bytes, stream, no_time, no_time});
    ++trace_.start_blocks;
    return {};
  }

  /// Event `event`: `bytes` allocated at `address` on `stream`. Errors: a bad size; an end past
  /// 2^64 - 1; the live bytes past max_live_bytes; the address is live.
  [[nodiscard]] Result<void> allocate(std::uint64_t event, std::uint64_t address, std::uint64_t bytes,
                                      std::uint64_t stream, std::int64_t time_us = no_time) {
    if (auto ok = take_block(address, bytes, event); !ok) {
      return ok;
    }
    trace_.blocks.push_back(TraceBlock{address, bytes, stream, time_us, no_time});
    trace_.requests.push_back(TraceRequest{true, static_cast<std::uint32_t>(trace_.blocks.size() - 1), event});
    return {};
  }

  /// Event `event`: the block at `address` freed (`bytes`: its size where the file records it, to
  /// be checked). Errors: nothing is live there; the size differs.
  [[nodiscard]] Result<void> free(std::uint64_t event, std::uint64_t address,
                                  std::optional<std::uint64_t> bytes = std::nullopt, std::int64_t time_us = no_time) {
    const auto it = live_.find(address);
    if (it == live_.end()) {
      return failure("free of address " + hex(address) + ", which is not live (never allocated, or freed already)",
                     event);
    }
    TraceBlock& block = trace_.blocks[it->second];
    if (bytes && *bytes != block.bytes) {
      return failure("free of " + std::to_string(*bytes) + " bytes at " + hex(address) + ", allocated with " +
                         std::to_string(block.bytes),
                     event);
    }
    block.freed_us = time_us;
    trace_.requests.push_back(TraceRequest{false, it->second, event});
    live_bytes_ -= block.bytes;
    live_.erase(it);
    return {};
  }

  /// The recording allocator's own reserve changed by `delta` bytes at event `event` (after the
  /// requests so far): a segment allocated (positive) or freed (negative). `start_bytes` is what it
  /// held before the first event; call reserve_start once, before the first change.
  void reserve_start(std::uint64_t start_bytes) { trace_.recorded = RecordedReserve{start_bytes, {}, start_bytes, 0}; }
  /// See reserve_start. Errors: a change that takes the reserve below zero or past 2^64 bytes.
  [[nodiscard]] Result<void> reserve_change(std::uint64_t event, std::int64_t delta) {
    if (!trace_.recorded) {
      reserve_start(0);
    }
    RecordedReserve& r = *trace_.recorded;
    const std::uint64_t now = r.steps.empty() ? r.start_bytes : r.steps.back().second;
    const std::uint64_t magnitude =
        delta < 0 ? 0 - static_cast<std::uint64_t>(delta) : static_cast<std::uint64_t>(delta);
    if (delta < 0 && magnitude > now) {
      return failure("a segment event frees " + std::to_string(magnitude) + " bytes of a recorded reserve of " +
                         std::to_string(now),
                     event);
    }
    if (delta > 0 && magnitude > UINT64_MAX - now) {
      return failure("the recorded reserve passes 2^64 bytes", event);
    }
    const std::uint64_t after = delta < 0 ? now - magnitude : now + magnitude;
    const std::uint64_t at = trace_.requests.size();
    if (!r.steps.empty() && r.steps.back().first == at) {
      r.steps.back().second = after;
    } else {
      r.steps.emplace_back(at, after);
    }
    r.peak_bytes = after > r.peak_bytes ? after : r.peak_bytes;
    ++r.device_calls;
    return {};
  }

  /// A segment the recording allocator held before the first event.
  void start_segment(const TraceSegment& segment) { trace_.start_segments.push_back(segment); }

  /// Whether `address` is live now.
  bool live(std::uint64_t address) const { return live_.count(address) != 0; }

  /// The trace. Errors: none so far (the events were checked as they came); kept a Result so that
  /// whole-trace checks have a place.
  [[nodiscard]] Result<AllocationTrace> finish() && {
    if (trace_.blocks.size() > UINT32_MAX) {
      return failure("more than 2^32 blocks", std::nullopt);
    }
    return std::move(trace_);
  }

  /// The failed Result for a problem at `event` (or in the start state): "<source>: event <i>: <what>".
  cuda::std::unexpected<Error> failure(const std::string& what, std::optional<std::uint64_t> event) const {
    return fail(Errc::invalid_argument, trace_.source + ": " +
                                            (event ? "event " + std::to_string(*event) : std::string("start state")) +
                                            ": " + what);
  }

  /// `a` as 0x-prefixed hexadecimal, as addresses are written in messages.
  static std::string hex(std::uint64_t a) {
    static constexpr char digits[] = "0123456789abcdef";
    std::string out;
    do {
      out.insert(out.begin(), digits[a % 16]);
      a /= 16;
    } while (a != 0);
    return "0x" + out;
  }

  /// Errors for a block size of 0 or above max_block_bytes, with the message every reader uses.
  [[nodiscard]] Result<void> check_size(std::uint64_t bytes, std::optional<std::uint64_t> event) const {
    if (bytes == 0) {
      return failure("a block of 0 bytes", event);
    }
    if (bytes > max_block_bytes) {
      return failure("a block of " + std::to_string(bytes) + " bytes, beyond 2^62", event);
    }
    return {};
  }

private:
  /// The checks of a new live block, and its address and bytes taken as live.
  [[nodiscard]] Result<void> take_block(std::uint64_t address, std::uint64_t bytes,
                                        std::optional<std::uint64_t> event) {
    if (auto ok = check_size(bytes, event); !ok) {
      return ok;
    }
    if (!checked_add(address, bytes)) {
      return failure("a block of " + std::to_string(bytes) + " bytes at " + hex(address) +
                         ": its end does not fit in 64 bits",
                     event);
    }
    if (trace_.blocks.size() >= UINT32_MAX) {
      return failure("more than 2^32 blocks", event);
    }
    const auto [it, inserted] = live_.emplace(address, static_cast<std::uint32_t>(trace_.blocks.size()));
    if (!inserted) {
      return failure("allocation at " + hex(address) + ", which is live already", event);
    }
    if (bytes > max_live_bytes - live_bytes_) { // live_bytes_ <= max_live_bytes: no wrap
      live_.erase(it);
      return failure("a block of " + std::to_string(bytes) + " bytes at " + hex(address) +
                         ": the blocks live would hold more than 2^62 bytes",
                     event);
    }
    live_bytes_ += bytes;
    return {};
  }

  AllocationTrace trace_;
  std::unordered_map<std::uint64_t, std::uint32_t> live_; ///< recorded address -> block index
  std::uint64_t live_bytes_ = 0;                          ///< the bytes of live_'s blocks, <= max_live_bytes
};

} // namespace carve::trace
