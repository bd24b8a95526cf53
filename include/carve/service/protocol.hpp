// carve/service/protocol.hpp — the messages carve-served and AllocationClient exchange, and
// their encoding (version 1).
//
// Transport: a Unix-domain SOCK_SEQPACKET connection, so one send is one message. A message is
// a 16-byte header and a payload, every integer little-endian:
//
//   offset 0  u32 magic     0x45565243 ("CRVE" in byte order)
//          4  u16 version   protocol_version; anything else is refused
//          6  u16 type      MessageType
//          8  u32 length    payload bytes; must equal the message size - 16
//         12  u32 sequence  chosen by the client (never 0); a reply repeats its request's
//
// Requests are at most max_request_size bytes, replies at most max_message_size. The first
// request on a connection must be Hello. Every request but Unmapped gets exactly one reply: the
// matching reply type or ErrorReply. The server may also send SegmentsRetired (sequence 0) at
// any time; a client unmaps those segments and answers with Unmapped (no reply). A reply may
// come long after its request: WaitReclaimed waits for other clients to go.
//
// A shared-memory segment's descriptor travels as SCM_RIGHTS with the Allocated reply that
// first uses the segment (Allocated::new_mapping); the client keeps its mapping until
// the server retires the segment, so a segment is opened once per client and cached.
//
// Decoding is strict: a wrong magic, version or length, a truncated or oversized message, an
// unknown enum value, a flag other than 0 or 1, a list or text beyond its limit, or trailing
// bytes are errors (DecodeError), never undefined behaviour. decode(encode(m)) == m, and a
// message that decodes re-encodes to the same bytes (the fuzz target checks both).
#pragma once

#include <carve/core/error.hpp>
#include <carve/mr/segment_export.hpp>
#include <carve/service/wire.hpp>

#include <cuda/std/expected>

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <variant>
#include <vector>

namespace carve::service {

using RegionId = std::uint64_t;
using SegmentId = std::uint64_t;

inline constexpr std::uint32_t protocol_magic = 0x45565243;
inline constexpr std::uint16_t protocol_version = 1;
inline constexpr std::size_t header_size = 16;
inline constexpr std::size_t max_request_size = 4096;
inline constexpr std::size_t max_message_size = 65536;
inline constexpr int max_cards = 64;
inline constexpr std::size_t max_name_length = 64;
inline constexpr std::size_t max_error_length = 1024;
inline constexpr std::size_t max_segment_list = 256;
inline constexpr std::size_t max_borrow_entries = 512;
inline constexpr std::size_t max_recent_borrows = 64;
inline constexpr std::size_t max_client_entries = 64;

enum class MessageType : std::uint16_t {
  // requests
  hello = 0x0001,
  allocate = 0x0002,
  free = 0x0003,
  query = 0x0004,
  stats = 0x0005,
  cards = 0x0006,
  unmapped = 0x0007, // no reply
  // replies
  hello_reply = 0x8001,
  allocated = 0x8002,
  freed = 0x8003,
  query_reply = 0x8004,
  stats_reply = 0x8005,
  cards_reply = 0x8006,
  segments_retired = 0x8007, // unsolicited, sequence 0
  error = 0x80ff,
  // Added after version 1 was first released; the values need not follow on.
  wait_reclaimed = 0x0020, // request
  reclaimed = 0x8020,      // its reply
};

// ---- requests ----

struct Hello {
  static constexpr MessageType type = MessageType::hello;
  std::string client_name; // shown in stats; at most max_name_length bytes
  friend bool operator==(const Hello&, const Hello&) = default;
};
struct Allocate {
  static constexpr MessageType type = MessageType::allocate;
  std::uint64_t bytes = 0;
  std::int32_t card = 0; // the requesting card
  friend bool operator==(const Allocate&, const Allocate&) = default;
};
struct Free {
  static constexpr MessageType type = MessageType::free;
  RegionId region = 0;
  friend bool operator==(const Free&, const Free&) = default;
};
struct Query {
  static constexpr MessageType type = MessageType::query;
  RegionId region = 0;
  friend bool operator==(const Query&, const Query&) = default;
};
struct StatsRequest {
  static constexpr MessageType type = MessageType::stats;
  friend bool operator==(const StatsRequest&, const StatsRequest&) = default;
};
struct CardsRequest {
  static constexpr MessageType type = MessageType::cards;
  friend bool operator==(const CardsRequest&, const CardsRequest&) = default;
};
struct Unmapped {
  static constexpr MessageType type = MessageType::unmapped;
  std::vector<SegmentId> segments; // the client has unmapped these
  friend bool operator==(const Unmapped&, const Unmapped&) = default;
};

// Waits until the server has reclaimed everything of one client (client_id, as HelloReply names
// it) or of every client of one process (pid): it replies Reclaimed once none of them is
// connected any more (at once when none is), or ErrorReply timed_out after timeout_ms. For a
// client that died: its connection closes when the kernel notices, and its regions are freed
// then. Exactly one of client_id and pid is non-zero; timeout_ms is at most max_wait_ms.
struct WaitReclaimed {
  static constexpr MessageType type = MessageType::wait_reclaimed;
  std::uint32_t client_id = 0;
  std::uint32_t pid = 0;
  std::uint32_t timeout_ms = 0;
  friend bool operator==(const WaitReclaimed&, const WaitReclaimed&) = default;
};
inline constexpr std::uint32_t max_wait_ms = 3600 * 1000;

using Request = std::variant<Hello, Allocate, Free, Query, StatsRequest, CardsRequest, Unmapped, WaitReclaimed>;

// ---- replies ----

struct HelloReply {
  static constexpr MessageType type = MessageType::hello_reply;
  std::uint32_t server_pid = 0;
  std::uint32_t client_id = 0; // this connection, as stats name it
  std::uint32_t peer_pid = 0;  // the client as the server's SO_PEERCRED saw it
  std::uint32_t peer_uid = 0;
  std::int32_t cards = 0;
  ExportKind backend = ExportKind::shared_memory;
  friend bool operator==(const HelloReply&, const HelloReply&) = default;
};

struct RegionInfo {
  RegionId id = 0;
  std::int32_t card = -1;      // whose memory it is
  std::int32_t requester = -1; // the card that asked; card != requester: borrowed
  SegmentId segment = 0;       // the exported segment holding it
  std::uint64_t offset = 0;    // from the segment's start
  std::uint64_t size = 0;      // bytes asked for
  friend bool operator==(const RegionInfo&, const RegionInfo&) = default;
};
template <>
inline constexpr std::size_t min_wire_size<RegionInfo> = 40;

struct Allocated {
  static constexpr MessageType type = MessageType::allocated;
  RegionInfo region;
  ExportKind kind = ExportKind::shared_memory;
  std::uint64_t segment_size = 0;
  std::int32_t device = -1;                                       // cuda_ipc
  std::array<std::uint8_t, SegmentExport::handle_bytes> handle{}; // cuda_ipc
  // The segment is new to this client: map it (shared_memory: with the SCM_RIGHTS descriptor that
  // comes with this reply; cuda_ipc: from `handle`). Otherwise the client has it mapped already.
  bool new_mapping = false;
  friend bool operator==(const Allocated&, const Allocated&) = default;
};
struct Freed {
  static constexpr MessageType type = MessageType::freed;
  RegionId region = 0;
  friend bool operator==(const Freed&, const Freed&) = default;
};
struct QueryReply {
  static constexpr MessageType type = MessageType::query_reply;
  RegionInfo region;
  friend bool operator==(const QueryReply&, const QueryReply&) = default;
};

struct CardStats {
  std::uint64_t capacity = 0;
  std::uint64_t free_bytes = 0; // cached plus what the card has free
  std::uint64_t largest_free_block = 0;
  std::uint64_t bytes_in_use = 0;
  std::uint64_t bytes_cached = 0;
  std::uint64_t bytes_reserved = 0;
  std::uint64_t live_blocks = 0;
  std::uint64_t segments = 0;
  std::uint64_t cache_hits = 0;
  std::uint64_t upstream_allocations = 0;
  std::uint64_t upstream_frees = 0;
  friend bool operator==(const CardStats&, const CardStats&) = default;
};
template <>
inline constexpr std::size_t min_wire_size<CardStats> = 88;

struct BorrowCount { // borrows in the server's history window
  std::int32_t requester = -1;
  std::int32_t lender = -1;
  std::uint32_t count = 0;
  std::uint64_t bytes = 0;
  friend bool operator==(const BorrowCount&, const BorrowCount&) = default;
};
template <>
inline constexpr std::size_t min_wire_size<BorrowCount> = 20;

struct BorrowEvent { // one record of the history, newest first in StatsReply
  std::uint64_t age_us = 0;
  std::int32_t requester = -1;
  std::int32_t lender = -1;
  std::uint64_t bytes = 0;
  friend bool operator==(const BorrowEvent&, const BorrowEvent&) = default;
};
template <>
inline constexpr std::size_t min_wire_size<BorrowEvent> = 24;

struct ClientSummary {
  std::uint32_t client_id = 0;
  std::uint32_t pid = 0;
  std::uint32_t uid = 0;
  std::uint64_t regions = 0;
  std::uint64_t bytes = 0;
  std::string name;
  friend bool operator==(const ClientSummary&, const ClientSummary&) = default;
};
template <>
inline constexpr std::size_t min_wire_size<ClientSummary> = 30;

struct StatsReply {
  static constexpr MessageType type = MessageType::stats_reply;
  std::uint64_t clients = 0;
  std::uint64_t live_regions = 0;
  std::uint64_t allocations = 0; // successful, since the server started
  std::uint64_t frees = 0;       // by clients
  std::uint64_t failed_allocations = 0;
  std::uint64_t reclaimed_regions = 0; // freed because their client went away
  std::uint64_t rejected_messages = 0; // that did not decode, or came before Hello
  std::uint64_t leased_segments = 0;   // mapped by at least one client
  std::uint64_t retired_segments = 0;  // released by a pool, waiting for clients to unmap
  std::uint64_t open_descriptors = 0;  // the server process's, from /proc/self/fd
  std::uint64_t my_regions = 0;        // the asking client's
  std::uint64_t my_bytes = 0;
  bool consistent = false; // every pool's invariants hold and agree with the region table
  std::vector<CardStats> cards;
  std::vector<BorrowCount> borrows;
  std::vector<BorrowEvent> recent_borrows;
  std::vector<ClientSummary> client_list; // at most max_client_entries
  friend bool operator==(const StatsReply&, const StatsReply&) = default;
};

struct CardInfo {
  std::int32_t card = -1;
  std::string name; // as the topology names it ("GPU3")
  std::uint64_t capacity = 0;
  std::uint64_t free_bytes = 0;
  std::uint64_t largest_free_block = 0;
  std::vector<double> bandwidth_gbps; // to every card; +infinity to itself, 0 without a path
  friend bool operator==(const CardInfo&, const CardInfo&) = default;
};
template <>
inline constexpr std::size_t min_wire_size<CardInfo> = 34;

struct CardsReply {
  static constexpr MessageType type = MessageType::cards_reply;
  std::vector<CardInfo> cards;
  friend bool operator==(const CardsReply&, const CardsReply&) = default;
};
struct SegmentsRetired {
  static constexpr MessageType type = MessageType::segments_retired;
  std::vector<SegmentId> segments;
  friend bool operator==(const SegmentsRetired&, const SegmentsRetired&) = default;
};
struct ErrorReply {
  static constexpr MessageType type = MessageType::error;
  Errc code = Errc::bad_message;
  std::string message; // at most max_error_length bytes
  friend bool operator==(const ErrorReply&, const ErrorReply&) = default;
};

struct Reclaimed {
  static constexpr MessageType type = MessageType::reclaimed;
  std::uint64_t reclaimed_regions = 0; // StatsReply::reclaimed_regions when the wait ended
  friend bool operator==(const Reclaimed&, const Reclaimed&) = default;
};

using Reply = std::variant<HelloReply, Allocated, Freed, QueryReply, StatsReply, CardsReply, SegmentsRetired,
                           ErrorReply, Reclaimed>;

// ---- fields: the wire layout of each message, in order ----

template <class M, class T>
concept Is = std::same_as<std::remove_const_t<M>, T>;

template <class A, class K>
void export_kind(A& a, K& kind) {
  a.enumeration(kind);
  if constexpr (std::same_as<A, WireReader>) {
    if (kind != ExportKind::shared_memory && kind != ExportKind::cuda_ipc) {
      a.fail("unknown export kind");
    }
  }
}

template <class A>
void fields(A& a, Is<Hello> auto& m) {
  a.text(m.client_name, max_name_length);
}
template <class A>
void fields(A& a, Is<Allocate> auto& m) {
  a(m.bytes, m.card);
}
template <class A>
void fields(A& a, Is<Free> auto& m) {
  a(m.region);
}
template <class A>
void fields(A& a, Is<Query> auto& m) {
  a(m.region);
}
template <class A>
void fields(A&, Is<StatsRequest> auto&) {}
template <class A>
void fields(A&, Is<CardsRequest> auto&) {}
template <class A>
void fields(A& a, Is<Unmapped> auto& m) {
  a.list(m.segments, max_segment_list);
}
template <class A>
void fields(A& a, Is<WaitReclaimed> auto& m) {
  a(m.client_id, m.pid, m.timeout_ms);
}
template <class A>
void fields(A& a, Is<Reclaimed> auto& m) {
  a(m.reclaimed_regions);
}
template <class A>
void fields(A& a, Is<HelloReply> auto& m) {
  a(m.server_pid, m.client_id, m.peer_pid, m.peer_uid, m.cards);
  export_kind(a, m.backend);
}
template <class A>
void fields(A& a, Is<RegionInfo> auto& m) {
  a(m.id, m.card, m.requester, m.segment, m.offset, m.size);
}
template <class A>
void fields(A& a, Is<Allocated> auto& m) {
  fields(a, m.region);
  export_kind(a, m.kind);
  a(m.segment_size, m.device, m.handle, m.new_mapping);
}
template <class A>
void fields(A& a, Is<Freed> auto& m) {
  a(m.region);
}
template <class A>
void fields(A& a, Is<QueryReply> auto& m) {
  fields(a, m.region);
}
template <class A>
void fields(A& a, Is<CardStats> auto& m) {
  a(m.capacity, m.free_bytes, m.largest_free_block, m.bytes_in_use, m.bytes_cached, m.bytes_reserved, m.live_blocks,
    m.segments, m.cache_hits, m.upstream_allocations, m.upstream_frees);
}
template <class A>
void fields(A& a, Is<BorrowCount> auto& m) {
  a(m.requester, m.lender, m.count, m.bytes);
}
template <class A>
void fields(A& a, Is<BorrowEvent> auto& m) {
  a(m.age_us, m.requester, m.lender, m.bytes);
}
template <class A>
void fields(A& a, Is<ClientSummary> auto& m) {
  a(m.client_id, m.pid, m.uid, m.regions, m.bytes);
  a.text(m.name, max_name_length);
}
template <class A>
void fields(A& a, Is<StatsReply> auto& m) {
  a(m.clients, m.live_regions, m.allocations, m.frees, m.failed_allocations, m.reclaimed_regions, m.rejected_messages,
    m.leased_segments, m.retired_segments, m.open_descriptors, m.my_regions, m.my_bytes, m.consistent);
  a.list(m.cards, static_cast<std::size_t>(max_cards));
  a.list(m.borrows, max_borrow_entries);
  a.list(m.recent_borrows, max_recent_borrows);
  a.list(m.client_list, max_client_entries);
}
template <class A>
void fields(A& a, Is<CardInfo> auto& m) {
  a(m.card);
  a.text(m.name, max_name_length);
  a(m.capacity, m.free_bytes, m.largest_free_block);
  a.list(m.bandwidth_gbps, static_cast<std::size_t>(max_cards));
}
template <class A>
void fields(A& a, Is<CardsReply> auto& m) {
  a.list(m.cards, static_cast<std::size_t>(max_cards));
}
template <class A>
void fields(A& a, Is<SegmentsRetired> auto& m) {
  a.list(m.segments, max_segment_list);
}
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

// ---- messages ----

template <class M>
constexpr MessageType message_type() noexcept {
  return std::remove_cvref_t<M>::type;
}

// What decoding found wrong. `fatal`: the byte stream cannot be trusted any more (bad header,
// malformed payload), so the receiver answers once and closes the connection; an unknown but
// well-framed message type is not fatal.
// Why a message does not decode (an Error: code and message), and what the reply to it needs.
struct DecodeError : Error {
  bool fatal = true;
  std::uint32_t sequence = 0; // the header's, when the header was readable (for the error reply)
};

template <class Body>
struct Decoded {
  std::uint32_t sequence = 0;
  Body body;
};

namespace detail {

template <class M>
void encode_into(std::vector<std::uint8_t>& out, const M& message, std::uint32_t sequence) {
  out.clear();
  WireWriter w(out);
  w(protocol_magic, protocol_version, static_cast<std::uint16_t>(message_type<M>()), std::uint32_t{0}, sequence);
  fields(w, message);
  const auto length = static_cast<std::uint32_t>(out.size() - header_size);
  for (std::size_t i = 0; i < 4; ++i) {
    out[8 + i] = static_cast<std::uint8_t>(length >> (8 * i));
  }
}

// Tries every alternative of the variant whose message type is `type`.
template <class Variant, std::size_t I = 0>
bool decode_body(std::uint16_t type, WireReader& r, Variant& out) {
  if constexpr (I == std::variant_size_v<Variant>) {
    return false;
  } else {
    using M = std::variant_alternative_t<I, Variant>;
    if (type == static_cast<std::uint16_t>(message_type<M>())) {
      M m;
      fields(r, m);
      out = std::move(m);
      return true;
    }
    return decode_body<Variant, I + 1>(type, r, out);
  }
}

template <class Variant>
cuda::std::expected<Decoded<Variant>, DecodeError> decode(std::span<const std::uint8_t> bytes, std::size_t max_size) {
  using Result = cuda::std::expected<Decoded<Variant>, DecodeError>;
  std::uint32_t sequence = 0;
  const auto fail = [&sequence](Errc code, std::string reason, bool fatal = true) {
    return Result(cuda::std::unexpect, DecodeError{{code, std::move(reason)}, fatal, sequence});
  };
  if (bytes.size() > max_size) {
    return fail(Errc::bad_message, "message of " + std::to_string(bytes.size()) + " bytes exceeds the limit of " +
                                       std::to_string(max_size));
  }
  if (bytes.size() < header_size) {
    return fail(Errc::bad_message, "truncated header (" + std::to_string(bytes.size()) + " bytes)");
  }
  WireReader r(bytes);
  std::uint32_t magic = 0;
  std::uint16_t version = 0;
  std::uint16_t type = 0;
  std::uint32_t length = 0;
  r(magic, version, type, length, sequence);
  if (magic != protocol_magic) {
    sequence = 0;
    return fail(Errc::bad_message, "not a carve message (bad magic)");
  }
  if (version != protocol_version) {
    return fail(Errc::unsupported_version, "protocol version " + std::to_string(version) +
                                               " is not supported (this side speaks " +
                                               std::to_string(protocol_version) + ")");
  }
  if (length != bytes.size() - header_size) {
    return fail(Errc::bad_message, "header announces " + std::to_string(length) + " payload bytes but " +
                                       std::to_string(bytes.size() - header_size) + " arrived");
  }
  Decoded<Variant> d;
  d.sequence = sequence;
  if (!decode_body(type, r, d.body)) {
    return fail(Errc::bad_message, "unknown message type " + std::to_string(type), false);
  }
  if (!r.finished()) {
    return fail(Errc::bad_message, std::string("malformed payload: ") + (r.ok() ? "trailing bytes" : r.error()));
  }
  return d;
}

} // namespace detail

inline std::vector<std::uint8_t> encode(const Request& request, std::uint32_t sequence) {
  std::vector<std::uint8_t> out;
  std::visit([&](const auto& m) { detail::encode_into(out, m, sequence); }, request);
  return out;
}
inline std::vector<std::uint8_t> encode(const Reply& reply, std::uint32_t sequence) {
  std::vector<std::uint8_t> out;
  std::visit([&](const auto& m) { detail::encode_into(out, m, sequence); }, reply);
  return out;
}

inline cuda::std::expected<Decoded<Request>, DecodeError> decode_request(std::span<const std::uint8_t> bytes) {
  return detail::decode<Request>(bytes, max_request_size);
}
inline cuda::std::expected<Decoded<Reply>, DecodeError> decode_reply(std::span<const std::uint8_t> bytes) {
  return detail::decode<Reply>(bytes, max_message_size);
}

} // namespace carve::service
