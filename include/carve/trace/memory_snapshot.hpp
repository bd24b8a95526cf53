/// @file carve/trace/memory_snapshot.hpp
/// A PyTorch memory snapshot as an AllocationTrace: what `torch.cuda.memory._dump_snapshot()` writes
/// after `_record_memory_history()`, read without executing anything.
///
/// @code
/// std::string bytes = read_whole_file("snapshot.pickle");
/// auto trace = carve::trace::read_memory_snapshot(bytes, "snapshot.pickle");   // device: see below
/// if (!trace) { std::cerr << trace.error().message << '\n'; }   // "snapshot.pickle: event 12: ..."
/// @endcode
///
/// The file is a pickle of a dict: `segments`, each the allocator's segment at the time of the
/// dump with its `blocks` (`address`, `size`, `requested_size`, `state`), and `device_traces`, one
/// list of events per device, each a dict with `action`, `addr`, `size`, `stream` and, in newer
/// versions, `time_us`. The pickle is decoded by read_pickle, which refuses globals and calls.
///
/// Every layout PyTorch 2.x writes, by Python's pickle (`_dump_snapshot`, protocol 4 or 5) or by
/// its C++ pickler (protocol 2), is read: the fields above are in all of them, and what versions
/// added is read past (carve/trace/snapshot_fields.hpp): `frames` of Python and C++ stacks (a line
/// of 2^64 - 1 among them), `time_us`, `compile_context` and `user_metadata` on events; `frames`,
/// `segment_pool_id`, `is_expandable` and the allocated, active and requested sizes on segments;
/// `allocator_settings` and `external_annotations` at the root. Blocks without `address` (the
/// oldest layout) follow each other from their segment's start. Actions other than those below
/// (`oom`, whose `device_free` takes the place of `addr`; `snapshot`; `user_defined` annotations;
/// any a later version adds) are not requests and are passed over unread.
///
/// The request stream is `alloc` and `free_completed` (the memory is free for reuse then; `free`,
/// written by early versions, counts as the same); `free_requested` gives a free its time, when the
/// caller let go of it. Recording usually starts while the program runs, and the event buffer may
/// have dropped its oldest entries, so blocks freed in the trace may have been allocated before it:
/// the blocks live before the first event are rebuilt from the end state, as PyTorch's memory
/// viewer does, by walking the events backwards from the blocks live in the final `segments`
/// (state `active_allocated`, or `active_pending_free`: freed, its streams' work not yet done;
/// `inactive` blocks are free): an `alloc` takes its block out, a `free_completed` puts it back.
/// The allocator's own segment events (`segment_alloc`/`segment_free`, and
/// `segment_map`/`segment_unmap` of expandable segments) are the RecordedReserve: what PyTorch
/// really reserved on this request stream, starting from the final segments' total less what the
/// events added. Walking back also gives the segments that existed before the first event
/// (`start_segments`; not for expandable segments, whose state is pages), from which a model of
/// PyTorch's allocator can start as the recording did.
///
/// The device: the one asked for; else the first whose list holds an event of the request stream
/// or a segment event; else the lowest that holds a segment. A device with no events (recording
/// off, its history cleared, `device_traces` empty or absent) still has its end state, and that is
/// its trace: the live blocks as start blocks, no requests, the final segments as start segments
/// and their total as the recorded reserve, unchanged. Nothing is replayed from it; carve_replay
/// says so (examples/carve_replay/main.cpp).
///
/// Errors (Errc::invalid_argument, or bad_message from the pickle reader), each naming the source,
/// the event index and what is wrong: a root that is not such a dict, a field of the wrong type or
/// missing, a negative size or address, one of 2^63 or more (an int the pickle holds only as a
/// big_integer), a device with neither events nor segments, an alloc whose block is neither live
/// at the end nor freed later, a block freed twice, a segment event of more than 2^62 bytes, a
/// recorded reserve that would start below zero, a sum of sizes that does not fit in 64 bits (the
/// final segments' total, the segment events' totals, a block's end where blocks follow each other
/// without addresses), and everything a TraceBuilder refuses (a size of 0 or above 2^62, a free of
/// an address not live, more than 2^62 bytes live at once).
///
/// Cost: linear in the snapshot's size. Each dict is walked once for all the fields read from it
/// (SnapshotFields), however many events refer to it; the events are decoded once into a vector
/// and walked back and forth.
#pragma once

#include <carve/core/checked_math.hpp>
#include <carve/trace/allocation_trace.hpp>
#include <carve/trace/pickle_reader.hpp>
#include <carve/trace/snapshot_fields.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace carve::trace {

namespace detail {

/// One device trace entry, decoded.
struct SnapshotEvent {
  enum class Kind : std::uint8_t { alloc, free_requested, free_completed, reserve, release, map, unmap, other };
  Kind kind = Kind::other;
  std::uint64_t address = 0;
  std::uint64_t bytes = 0;
  std::uint64_t stream = 0;
  std::int64_t time_us = no_time;
};

inline SnapshotEvent::Kind snapshot_action(std::string_view a) noexcept {
  using K = SnapshotEvent::Kind;
  if (a == "alloc") {
    return K::alloc;
  }
  if (a == "free_requested") {
    return K::free_requested;
  }
  if (a == "free_completed" || a == "free") {
    return K::free_completed;
  }
  if (a == "segment_alloc") {
    return K::reserve;
  }
  if (a == "segment_free") {
    return K::release;
  }
  if (a == "segment_map") {
    return K::map;
  }
  if (a == "segment_unmap") {
    return K::unmap;
  }
  return K::other; // snapshot, oom, user_defined, and whatever later versions add: not requests
}

/// The device read when none is asked for: the first whose events include one carve reads (a
/// request or a segment event), else the lowest that holds a segment; nullopt when there is
/// neither. Events and segments that are not what they should be are passed over here: the
/// device chosen is read in full, and refused with a message, later.
inline std::optional<std::uint64_t> snapshot_device(const PickleDocument& doc, SnapshotFields& fields,
                                                    std::span<const PickleDocument::Id> traces,
                                                    std::span<const PickleDocument::Id> segments) {
  for (std::size_t d = 0; d < traces.size(); ++d) {
    for (const auto entry : doc.items(traces[d])) { // no items for other than a list or tuple
      const auto action = fields.find(entry, SnapshotKey::action);
      if (action && snapshot_action(doc.text(*action)) != SnapshotEvent::Kind::other) {
        return d;
      }
    }
  }
  std::optional<std::uint64_t> lowest;
  for (const auto segment : segments) {
    const auto on = fields.find(segment, SnapshotKey::device);
    if (on && doc.kind(*on) == PickleDocument::Kind::integer && doc.integer(*on) >= 0) {
      const auto d = static_cast<std::uint64_t>(doc.integer(*on));
      lowest = lowest && *lowest < d ? *lowest : d;
    }
  }
  return lowest;
}

} // namespace detail

/// The trace of `device` (nullopt: chosen as the file's description says) in the snapshot `bytes`;
/// `source` starts every message. See the file's description.
[[nodiscard]] inline Result<AllocationTrace> read_memory_snapshot(std::string_view bytes, std::string source,
                                                                  std::optional<std::uint64_t> device = std::nullopt) {
  auto doc = read_pickle(bytes, source);
  if (!doc) {
    return cuda::std::unexpected(doc.error());
  }
  TraceBuilder builder(source);
  detail::SnapshotFields fields(*doc, builder);
  using detail::SnapshotEvent;
  using Id = PickleDocument::Id;
  using Key = detail::SnapshotKey;
  const auto root = doc->root();

  // The device, and its events decoded and type-checked once. Without `device_traces` (a snapshot
  // taken without its history) no device has events.
  auto segments = fields.list(root, Key::segments, std::nullopt, "the snapshot");
  if (!segments) {
    return cuda::std::unexpected(segments.error());
  }
  std::span<const Id> traces;
  if (fields.find(root, Key::device_traces)) {
    auto listed = fields.list(root, Key::device_traces, std::nullopt, "the snapshot");
    if (!listed) {
      return cuda::std::unexpected(listed.error());
    }
    traces = *listed;
  }
  if (!device) {
    device = detail::snapshot_device(*doc, fields, traces, *segments);
  }
  const std::string nothing = " (record events with torch.cuda.memory._record_memory_history())";
  if (!device) {
    return builder.failure("no device has recorded events or segments: nothing to read" + nothing, std::nullopt);
  }
  std::span<const Id> entries; // none where the list of devices ends before this one
  if (*device < traces.size()) {
    const auto k = doc->kind(traces[*device]);
    if (k != PickleDocument::Kind::list && k != PickleDocument::Kind::tuple) {
      return builder.failure("the trace of device " + std::to_string(*device) + " is not a list", std::nullopt);
    }
    entries = doc->items(traces[*device]);
  }
  std::vector<SnapshotEvent> events(entries.size());
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const auto at = static_cast<std::uint64_t>(i);
    auto action = fields.text(entries[i], Key::action, at, "the event");
    if (!action) {
      return cuda::std::unexpected(action.error());
    }
    SnapshotEvent& e = events[i];
    e.kind = detail::snapshot_action(*action);
    if (e.kind == SnapshotEvent::Kind::other) {
      continue;
    }
    auto addr = fields.count(entries[i], Key::addr, at, "the event");
    auto size = addr ? fields.count(entries[i], Key::size, at, "the event") : addr;
    auto stream = size ? fields.count(entries[i], Key::stream, at, "the event") : size;
    if (!stream) {
      return cuda::std::unexpected(stream.error());
    }
    e.address = *addr;
    e.bytes = *size;
    e.stream = *stream;
    if (e.kind == SnapshotEvent::Kind::alloc || e.kind == SnapshotEvent::Kind::free_completed) {
      if (auto ok = builder.check_size(e.bytes, at); !ok) {
        return cuda::std::unexpected(ok.error());
      }
    } else if (e.kind != SnapshotEvent::Kind::free_requested && e.bytes > max_block_bytes) {
      return builder.failure("a segment of " + std::to_string(e.bytes) + " bytes, beyond 2^62", at);
    }
    if (const auto t = fields.find(entries[i], Key::time_us)) {
      auto us = fields.whole(*t, Key::time_us, at, "the event");
      if (!us) {
        return cuda::std::unexpected(us.error());
      }
      e.time_us = static_cast<std::int64_t>(*us);
    }
  }

  // The end state: live blocks, and the bytes the allocator's segments held.
  std::map<std::uint64_t, std::pair<std::uint64_t, std::uint64_t>> live; // address -> (bytes, stream)
  std::map<std::uint64_t, TraceSegment> held;                            // the segments, by address
  bool expandable = false;  // expandable segments' state is pages, not segments: no start segments
  bool any_segment = false; // of this device
  std::uint64_t final_reserved = 0;
  for (const auto segment : *segments) {
    auto on = fields.count(segment, Key::device, std::nullopt, "a segment");
    auto base = on ? fields.count(segment, Key::address, std::nullopt, "a segment") : on;
    auto total = base ? fields.count(segment, Key::total_size, std::nullopt, "a segment") : base;
    auto stream = total ? fields.count(segment, Key::stream, std::nullopt, "a segment") : total;
    auto blocks = stream ? fields.list(segment, Key::blocks, std::nullopt, "a segment")
                         : Result<std::span<const PickleDocument::Id>>(cuda::std::unexpected(stream.error()));
    if (!blocks) {
      return cuda::std::unexpected(blocks.error());
    }
    if (*on != *device) {
      continue;
    }
    any_segment = true;
    const auto reserved = checked_add(final_reserved, *total);
    if (!reserved) {
      return builder.failure("the final segments hold more than 2^64 - 1 bytes", std::nullopt);
    }
    final_reserved = *reserved;
    const auto type = fields.find(segment, Key::segment_type);
    const bool small = type && doc->kind(*type) == PickleDocument::Kind::string ? doc->text(*type) == "small"
                                                                                : *total == (std::uint64_t{2} << 20);
    if (const auto e = fields.find(segment, Key::is_expandable); e && doc->kind(*e) == PickleDocument::Kind::boolean) {
      expandable = expandable || doc->boolean(*e);
    }
    held[*base] = TraceSegment{*base, *total, *stream, small};
    std::uint64_t next = *base; // blocks without an address follow each other from the segment's start
    for (const auto block : *blocks) {
      auto size = fields.count(block, Key::size, std::nullopt, "a segment's block");
      auto state = size ? fields.text(block, Key::state, std::nullopt, "a segment's block")
                        : Result<std::string_view>(cuda::std::unexpected(size.error()));
      if (!state) {
        return cuda::std::unexpected(state.error());
      }
      std::uint64_t address = next;
      if (fields.find(block, Key::address)) {
        auto a = fields.count(block, Key::address, std::nullopt, "a segment's block");
        if (!a) {
          return cuda::std::unexpected(a.error());
        }
        address = *a;
      }
      const auto end = checked_add(address, *size);
      if (!end) {
        return builder.failure("a block of " + std::to_string(*size) + " bytes at " + TraceBuilder::hex(address) +
                                   ": its end does not fit in 64 bits",
                               std::nullopt);
      }
      next = *end;
      if (*state != "active_allocated" && *state != "active_pending_free") {
        continue;
      }
      std::uint64_t requested = *size;
      if (fields.find(block, Key::requested_size)) {
        auto r = fields.count(block, Key::requested_size, std::nullopt, "a segment's block");
        if (!r) {
          return cuda::std::unexpected(r.error());
        }
        requested = *r;
      }
      live[address] = {requested, *stream};
    }
  }

  if (entries.empty() && !any_segment) {
    return builder.failure("device " + std::to_string(*device) +
                               " has no recorded events and no segments: " + "nothing to read" + nothing,
                           std::nullopt);
  }

  // Walk back to the start: blocks allocated in the trace were not live before it, blocks freed in
  // it were; and the recorded reserve loses what its segment events added.
  std::uint64_t added = 0;
  std::uint64_t removed = 0;
  for (std::size_t i = events.size(); i-- > 0;) {
    const SnapshotEvent& e = events[i];
    const auto at = static_cast<std::uint64_t>(i);
    if (e.kind == SnapshotEvent::Kind::alloc) {
      if (live.erase(e.address) == 0) {
        return builder.failure("an allocation at " + TraceBuilder::hex(e.address) +
                                   " that is neither live at the end nor freed later",
                               at);
      }
    } else if (e.kind == SnapshotEvent::Kind::free_completed) {
      if (!live.emplace(e.address, std::pair{e.bytes, e.stream}).second) {
        return builder.failure("a free of " + TraceBuilder::hex(e.address) +
                                   ", which is freed again later without being allocated in between",
                               at);
      }
    } else if (e.kind == SnapshotEvent::Kind::reserve || e.kind == SnapshotEvent::Kind::map) {
      const auto sum = checked_add(added, e.bytes);
      if (!sum) {
        return builder.failure("the segment events allocate more than 2^64 - 1 bytes", std::nullopt);
      }
      added = *sum;
      held.erase(e.address); // not there before it was allocated
      expandable = expandable || e.kind == SnapshotEvent::Kind::map;
    } else if (e.kind == SnapshotEvent::Kind::release || e.kind == SnapshotEvent::Kind::unmap) {
      const auto sum = checked_add(removed, e.bytes);
      if (!sum) {
        return builder.failure("the segment events free more than 2^64 - 1 bytes", std::nullopt);
      }
      removed = *sum;
      held[e.address] = TraceSegment{e.address, e.bytes, e.stream, e.bytes == (std::uint64_t{2} << 20)};
      expandable = expandable || e.kind == SnapshotEvent::Kind::unmap;
    }
  }
  if (!expandable) {
    for (const auto& [address, segment] : held) {
      builder.start_segment(segment);
    }
  }
  for (const auto& [address, block] : live) {
    if (auto ok = builder.start_block(address, block.first, block.second); !ok) {
      return cuda::std::unexpected(ok.error());
    }
  }
  const bool recorded = added != 0 || removed != 0 || final_reserved != 0;
  if (recorded) {
    const auto before = checked_add(final_reserved, removed);
    if (!before) {
      return builder.failure("the final segments and the segment events' frees hold more than 2^64 - 1 bytes",
                             std::nullopt);
    }
    if (added > *before) {
      return builder.failure("the segment events add more than the final segments hold", std::nullopt);
    }
    builder.reserve_start(*before - added);
  }

  // And forward again: the request stream, checked by the builder.
  std::map<std::uint64_t, std::int64_t> requested_at; // address -> when its free was requested
  for (std::size_t i = 0; i < events.size(); ++i) {
    const SnapshotEvent& e = events[i];
    const auto at = static_cast<std::uint64_t>(i);
    Result<void> ok;
    switch (e.kind) {
    case SnapshotEvent::Kind::alloc:
      ok = builder.allocate(at, e.address, e.bytes, e.stream, e.time_us);
      break;
    case SnapshotEvent::Kind::free_requested:
      requested_at[e.address] = e.time_us;
      break;
    case SnapshotEvent::Kind::free_completed: {
      const auto asked = requested_at.find(e.address);
      const std::int64_t t = asked != requested_at.end() && asked->second != no_time ? asked->second : e.time_us;
      if (asked != requested_at.end()) {
        requested_at.erase(asked);
      }
      ok = builder.free(at, e.address, e.bytes, t);
      break;
    }
    case SnapshotEvent::Kind::reserve:
    case SnapshotEvent::Kind::release:
    case SnapshotEvent::Kind::map:
    case SnapshotEvent::Kind::unmap: {
      const bool grows = e.kind == SnapshotEvent::Kind::reserve || e.kind == SnapshotEvent::Kind::map;
      ok = builder.reserve_change(at, grows ? static_cast<std::int64_t>(e.bytes) : -static_cast<std::int64_t>(e.bytes));
      break;
    }
    case SnapshotEvent::Kind::other:
      break;
    }
    if (!ok) {
      return cuda::std::unexpected(ok.error());
    }
  }
  return std::move(builder).finish();
}

} // namespace carve::trace
