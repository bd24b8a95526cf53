/// @file carve/service/protocol_layout.hpp
/// The wire layout of every message of carve's service protocol: one fields() function per
/// message, listing its fields in order. WireWriter encodes with it, WireReader decodes with it
/// and WireSizer counts the fewest bytes each message takes with it (min_wire_size), so the three
/// cannot drift apart.
#pragma once

#include <carve/core/error.hpp>
#include <carve/mr/segment_export.hpp>
#include <carve/service/protocol_messages.hpp>
#include <carve/service/wire.hpp>

#include <concepts>
#include <cstddef>
#include <type_traits>

namespace carve::service {

/// M is T, const or not: one fields() overload serves the writer (a const message) and the reader.
template <class M, class T>
concept Is = std::same_as<std::remove_const_t<M>, T>;

/// An ExportKind field; the reader fails on a value that is no ExportKind (cuda_vmm and host_vmm
/// came after version 1 was first released: a reader from before refuses them, so an old client
/// gets a clear bad_message from a VMM server rather than a mapping it cannot make).
template <class A, class K>
void export_kind(A& a, K& kind) {
  a.enumeration(kind);
  if constexpr (std::same_as<A, WireReader>) {
    if (kind != ExportKind::shared_memory && kind != ExportKind::cuda_ipc && kind != ExportKind::cuda_vmm &&
        kind != ExportKind::host_vmm && kind != ExportKind::cuda_fabric) {
      a.fail("unknown export kind");
    }
  }
}

/// Hello on the wire: the client name (text).
template <class A>
void fields(A& a, Is<Hello> auto& m) {
  a.text(m.client_name, max_name_length);
}
/// Allocate on the wire: bytes (u64), then the requesting card (i32).
template <class A>
void fields(A& a, Is<Allocate> auto& m) {
  a(m.bytes, m.card);
}
/// Free on the wire: the region id (u64).
template <class A>
void fields(A& a, Is<Free> auto& m) {
  a(m.region);
}
/// Query on the wire: the region id (u64).
template <class A>
void fields(A& a, Is<Query> auto& m) {
  a(m.region);
}
/// StatsRequest on the wire: no fields.
template <class A>
void fields(A&, Is<StatsRequest> auto&) {}
/// CardsRequest on the wire: no fields.
template <class A>
void fields(A&, Is<CardsRequest> auto&) {}
/// Unmapped on the wire: a list of segment ids.
template <class A>
void fields(A& a, Is<Unmapped> auto& m) {
  a.list(m.segments, max_segment_list);
}
/// WaitReclaimed on the wire: client id, pid, timeout in ms (u32 each).
template <class A>
void fields(A& a, Is<WaitReclaimed> auto& m) {
  a(m.client_id, m.pid, m.timeout_ms);
}
/// Reclaimed on the wire: the reclaimed-region count (u64).
template <class A>
void fields(A& a, Is<Reclaimed> auto& m) {
  a(m.reclaimed_regions);
}
/// HelloReply on the wire: server pid, client id, peer pid, peer uid (u32), cards (i32), backend (u8).
template <class A>
void fields(A& a, Is<HelloReply> auto& m) {
  a(m.server_pid, m.client_id, m.peer_pid, m.peer_uid, m.cards);
  export_kind(a, m.backend);
}
/// RegionInfo on the wire: id (u64), card, requester (i32), segment, offset, size (u64).
template <class A>
void fields(A& a, Is<RegionInfo> auto& m) {
  a(m.id, m.card, m.requester, m.segment, m.offset, m.size);
}
/// Allocated on the wire: the region, the export kind, segment size, device, the device's and the
/// requester's UUIDs (16 bytes each), the handle's bytes, new_mapping.
template <class A>
void fields(A& a, Is<Allocated> auto& m) {
  fields(a, m.region);
  export_kind(a, m.kind);
  a(m.segment_size, m.device, m.device_uuid, m.requester_uuid, m.handle, m.new_mapping);
}
/// Freed on the wire: the region id (u64).
template <class A>
void fields(A& a, Is<Freed> auto& m) {
  a(m.region);
}
/// QueryReply on the wire: the region's RegionInfo.
template <class A>
void fields(A& a, Is<QueryReply> auto& m) {
  fields(a, m.region);
}
/// CardStats on the wire: its eleven counters (u64), in declaration order.
template <class A>
void fields(A& a, Is<CardStats> auto& m) {
  a(m.capacity, m.free_bytes, m.largest_free_block, m.bytes_in_use, m.bytes_cached, m.bytes_reserved, m.live_blocks,
    m.segments, m.cache_hits, m.upstream_allocations, m.upstream_frees);
}
/// BorrowCount on the wire: requester, lender (i32), count (u32), bytes (u64).
template <class A>
void fields(A& a, Is<BorrowCount> auto& m) {
  a(m.requester, m.lender, m.count, m.bytes);
}
/// BorrowEvent on the wire: age (u64), requester, lender (i32), bytes (u64).
template <class A>
void fields(A& a, Is<BorrowEvent> auto& m) {
  a(m.age_us, m.requester, m.lender, m.bytes);
}
/// ClientSummary on the wire: client id, pid, uid (u32), regions, bytes (u64), then the name (text).
template <class A>
void fields(A& a, Is<ClientSummary> auto& m) {
  a(m.client_id, m.pid, m.uid, m.regions, m.bytes);
  a.text(m.name, max_name_length);
}
/// StatsReply on the wire: its twelve counters (u64) and the flag, then the four lists.
template <class A>
void fields(A& a, Is<StatsReply> auto& m) {
  a(m.clients, m.live_regions, m.allocations, m.frees, m.failed_allocations, m.reclaimed_regions, m.rejected_messages,
    m.leased_segments, m.retired_segments, m.open_descriptors, m.my_regions, m.my_bytes, m.consistent);
  a.list(m.cards, static_cast<std::size_t>(max_cards));
  a.list(m.borrows, max_borrow_entries);
  a.list(m.recent_borrows, max_recent_borrows);
  a.list(m.client_list, max_client_entries);
}
/// CardInfo on the wire: card (i32), name (text), UUID (16 bytes), capacity, free bytes, largest
/// free block (u64), bandwidths.
template <class A>
void fields(A& a, Is<CardInfo> auto& m) {
  a(m.card);
  a.text(m.name, max_name_length);
  a(m.uuid, m.capacity, m.free_bytes, m.largest_free_block);
  a.list(m.bandwidth_gbps, static_cast<std::size_t>(max_cards));
}
/// CardsReply on the wire: a list of CardInfo.
template <class A>
void fields(A& a, Is<CardsReply> auto& m) {
  a.list(m.cards, static_cast<std::size_t>(max_cards));
}
/// SegmentsRetired on the wire: a list of segment ids.
template <class A>
void fields(A& a, Is<SegmentsRetired> auto& m) {
  a.list(m.segments, max_segment_list);
}
/// ErrorReply on the wire: the code (its Errc value, checked), then the message (text).
template <class A>
void fields(A& a, Is<ErrorReply> auto& m) {
  a.enumeration(m.code);
  if constexpr (std::same_as<A, WireReader>) {
    const auto v = static_cast<int>(m.code);
    if (v < static_cast<int>(Errc::no_space) || v > static_cast<int>(last_errc)) {
      a.fail("unknown error code");
    }
  }
  a.text(m.message, max_error_length);
}

} // namespace carve::service
