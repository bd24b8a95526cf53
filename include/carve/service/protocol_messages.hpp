/// @file carve/service/protocol_messages.hpp
/// The messages carve-served and AllocationClient exchange (protocol version 2): their types,
/// fields and limits, and who answers what. Their wire layouts are in protocol_layout.hpp, the
/// header and the codec in protocol.hpp.
///
/// The first request on a connection must be Hello. Every request but Unmapped gets exactly one
/// reply: the matching reply type or ErrorReply. Two messages come unasked, with sequence 0:
/// SegmentsRetired (segments the client maps were freed; it unmaps those it holds no region in
/// and answers with Unmapped, which gets no reply), and the ErrorReply the server sends before it
/// closes a connection on its own (a refused peer, a missed deadline, shutdown). A reply may come
/// long after its request: WaitReclaimed waits for other clients to go.
///
/// Every region is a segment of its own that only its client maps. A shared-memory segment's
/// descriptor travels as SCM_RIGHTS with the Allocated reply that first uses the segment
/// (Allocated::new_mapping, set in every Allocated carve-served sends); the client unmaps the
/// segment when it no longer holds a region in it (at the region's Free) and says so with
/// Unmapped, which ends the segment's lease.
///
/// GPUs cross the socket by UUID (Allocated::device_uuid and requester_uuid, CardInfo::uuid), never
/// by the server's ordinal alone: with CUDA_VISIBLE_DEVICES a client numbers the GPUs its own way.
/// Version 2 added those fields; a peer of version 1 gets unsupported_version.
#pragma once

#include <carve/core/error.hpp>
#include <carve/mr/device_uuid.hpp>
#include <carve/mr/segment_export.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

namespace carve::service {

/// A region's id: never 0, never reused while its server runs.
using RegionId = std::uint64_t;
/// An exported segment's id: never 0, unique within the server process and never reused, so a
/// client can key its mappings by it even when a new segment reuses an old address.
using SegmentId = std::uint64_t;
/// A connection's id in the service (HelloReply::client_id): from 1, in order of arrival.
using ClientId = std::uint32_t;

/// The header's first field: "CRVE" in byte order.
inline constexpr std::uint32_t protocol_magic = 0x45565243;
/// The header's version field; a message with any other is refused (unsupported_version).
inline constexpr std::uint16_t protocol_version = 2;
/// Bytes of the header before every payload.
inline constexpr std::size_t header_size = 16;
/// The largest request, header included; the server refuses a larger one and closes the
/// connection.
inline constexpr std::size_t max_request_size = 4096;
/// The largest reply, header included.
inline constexpr std::size_t max_message_size = 65536;
/// The most cards a server serves, and a CardsReply or StatsReply lists.
inline constexpr int max_cards = 64;
/// The longest client or card name on the wire, in bytes.
inline constexpr std::size_t max_name_length = 64;
/// The longest ErrorReply message on the wire, in bytes; a longer one is cut.
inline constexpr std::size_t max_error_length = 1024;
/// The most segment ids one Unmapped or SegmentsRetired carries.
inline constexpr std::size_t max_segment_list = 256;
/// The most BorrowCount entries a StatsReply carries.
inline constexpr std::size_t max_borrow_entries = 512;
/// The most BorrowEvent entries (the newest) a StatsReply carries.
inline constexpr std::size_t max_recent_borrows = 64;
/// The most ClientSummary entries a StatsReply carries.
inline constexpr std::size_t max_client_entries = 64;

/// The header's type field: requests below 0x8000, replies and notices from 0x8000 on.
enum class MessageType : std::uint16_t {
  // requests
  hello = 0x0001,    ///< Hello
  allocate = 0x0002, ///< Allocate
  free = 0x0003,     ///< Free
  query = 0x0004,    ///< Query
  stats = 0x0005,    ///< StatsRequest
  cards = 0x0006,    ///< CardsRequest
  unmapped = 0x0007, ///< Unmapped (no reply)
  // replies
  hello_reply = 0x8001,      ///< HelloReply
  allocated = 0x8002,        ///< Allocated
  freed = 0x8003,            ///< Freed
  query_reply = 0x8004,      ///< QueryReply
  stats_reply = 0x8005,      ///< StatsReply
  cards_reply = 0x8006,      ///< CardsReply
  segments_retired = 0x8007, ///< SegmentsRetired: unsolicited, sequence 0
  error = 0x80ff,            ///< ErrorReply
  // Added after version 1 was first released; the values need not follow on.
  wait_reclaimed = 0x0020, ///< WaitReclaimed (a request)
  reclaimed = 0x8020,      ///< Reclaimed (its reply)
};

// ---- requests ----

/// The first request on a connection. Answered by HelloReply; sent again, it closes the
/// connection (bad_message).
struct Hello {
  static constexpr MessageType type = MessageType::hello; ///< its header type
  std::string client_name;                                ///< shown in stats; at most max_name_length bytes
  /// Field by field.
  friend bool operator==(const Hello&, const Hello&) = default;
};
/// A region of `bytes` for card `card`, on that card or borrowed from a peer. Answered by
/// Allocated, or ErrorReply: no_space (naming every card's largest free block, or the system's
/// refusal), out_of_range (no such card), invalid_size (0 bytes).
struct Allocate {
  static constexpr MessageType type = MessageType::allocate; ///< its header type
  std::uint64_t bytes = 0;                                   ///< the region's size
  std::int32_t card = 0;                                     ///< the requesting card
  /// Field by field.
  friend bool operator==(const Allocate&, const Allocate&) = default;
};
/// Gives back one of this client's regions. Answered by Freed, or ErrorReply: not_allocated (no
/// such region), permission_denied (another client's).
struct Free {
  static constexpr MessageType type = MessageType::free; ///< its header type
  RegionId region = 0;                                   ///< the region to free
  /// Field by field.
  friend bool operator==(const Free&, const Free&) = default;
};
/// The server's record of one of this client's regions. Answered by QueryReply, or ErrorReply as
/// for Free.
struct Query {
  static constexpr MessageType type = MessageType::query; ///< its header type
  RegionId region = 0;                                    ///< the region asked about
  /// Field by field.
  friend bool operator==(const Query&, const Query&) = default;
};
/// The server's counters, cards, borrows and clients. Answered by StatsReply.
struct StatsRequest {
  static constexpr MessageType type = MessageType::stats; ///< its header type
  /// Field by field.
  friend bool operator==(const StatsRequest&, const StatsRequest&) = default;
};
/// Every card's size, free memory and bandwidths. Answered by CardsReply.
struct CardsRequest {
  static constexpr MessageType type = MessageType::cards; ///< its header type
  /// Field by field.
  friend bool operator==(const CardsRequest&, const CardsRequest&) = default;
};
/// The client has unmapped these segments, so their leases end. No reply; segments it still
/// holds regions in, or never mapped, are ignored.
struct Unmapped {
  static constexpr MessageType type = MessageType::unmapped; ///< its header type
  std::vector<SegmentId> segments;                           ///< at most max_segment_list
  /// Field by field.
  friend bool operator==(const Unmapped&, const Unmapped&) = default;
};

/// Waits until the server has reclaimed everything of one client (client_id, as HelloReply names
/// it) or of every client of one process (pid): it replies Reclaimed once none of them is
/// connected any more (at once when none is), or ErrorReply timed_out after timeout_ms. For a
/// client that died: its connection closes when the kernel notices, and its regions are freed
/// then. Other errors: invalid_argument (both or neither named, a timeout above max_wait_ms, the
/// asking client itself), no_space (the asker already waits 64 times).
struct WaitReclaimed {
  static constexpr MessageType type = MessageType::wait_reclaimed; ///< its header type
  std::uint32_t client_id = 0;                                     ///< the client to wait for, or 0
  std::uint32_t pid = 0;                                           ///< the process whose clients to wait for, or 0
  std::uint32_t timeout_ms = 0;                                    ///< at most max_wait_ms
  /// Field by field.
  friend bool operator==(const WaitReclaimed&, const WaitReclaimed&) = default;
};
/// The longest WaitReclaimed: one hour.
inline constexpr std::uint32_t max_wait_ms = 3600 * 1000;

/// Every message a client sends.
using Request = std::variant<Hello, Allocate, Free, Query, StatsRequest, CardsRequest, Unmapped, WaitReclaimed>;

// ---- replies ----

/// The answer to Hello: who is on each side, and how segments will come.
struct HelloReply {
  static constexpr MessageType type = MessageType::hello_reply; ///< its header type
  std::uint32_t server_pid = 0;                                 ///< the server process
  std::uint32_t client_id = 0;                                  ///< this connection, as stats name it
  std::uint32_t peer_pid = 0;                                   ///< the client as the server's SO_PEERCRED saw it
  std::uint32_t peer_uid = 0;                                   ///< the client's user, likewise
  std::int32_t cards = 0;                                       ///< how many cards the server serves
  ExportKind backend = ExportKind::shared_memory;               ///< how its segments are exported
  /// Field by field.
  friend bool operator==(const HelloReply&, const HelloReply&) = default;
};

/// A region as the server keeps it.
struct RegionInfo {
  RegionId id = 0;             ///< the region's id
  std::int32_t card = -1;      ///< whose memory it is
  std::int32_t requester = -1; ///< the card that asked; card != requester: borrowed
  SegmentId segment = 0;       ///< the exported segment holding it
  std::uint64_t offset = 0;    ///< from the segment's start
  std::uint64_t size = 0;      ///< bytes asked for
  /// Field by field.
  friend bool operator==(const RegionInfo&, const RegionInfo&) = default;
};

/// The answer to Allocate: the region, and how to map the segment that holds it.
struct Allocated {
  static constexpr MessageType type = MessageType::allocated; ///< its header type
  RegionInfo region;                                          ///< where the region is
  ExportKind kind = ExportKind::shared_memory;                ///< how its segment is exported
  std::uint64_t segment_size = 0;                             ///< bytes of the whole segment to map
  std::int32_t device = -1;                                   ///< the device holding it, as the server numbers it
  DeviceUuid device_uuid{};    ///< that device's UUID; no_device_uuid for host-twin memory (`device` holds then)
  DeviceUuid requester_uuid{}; ///< the UUID of the card that asked (region.requester); likewise
  std::array<std::uint8_t, SegmentExport::handle_bytes> handle{}; ///< cuda_ipc: the cudaIpcMemHandle_t
  /// The segment is new to this client: map it (shared_memory, cuda_vmm, host_vmm: with the
  /// SCM_RIGHTS descriptor that comes with this reply; cuda_ipc: from `handle`). Otherwise the
  /// client has it mapped already.
  bool new_mapping = false;
  /// Field by field.
  friend bool operator==(const Allocated&, const Allocated&) = default;
};
/// The answer to Free: the region is back with the server.
struct Freed {
  static constexpr MessageType type = MessageType::freed; ///< its header type
  RegionId region = 0;                                    ///< the freed region
  /// Field by field.
  friend bool operator==(const Freed&, const Freed&) = default;
};
/// The answer to Query.
struct QueryReply {
  static constexpr MessageType type = MessageType::query_reply; ///< its header type
  RegionInfo region;                                            ///< the server's record of it
  /// Field by field.
  friend bool operator==(const QueryReply&, const QueryReply&) = default;
};

/// One card's figures in a StatsReply. carve-served keeps no cache (clients pool inside their
/// own leases), so bytes_cached and cache_hits are 0 there and every region is one segment.
struct CardStats {
  std::uint64_t capacity = 0;             ///< the card's size
  std::uint64_t free_bytes = 0;           ///< what the card has free now
  std::uint64_t largest_free_block = 0;   ///< the largest region it could give now
  std::uint64_t bytes_in_use = 0;         ///< the sizes of the live regions on it
  std::uint64_t bytes_cached = 0;         ///< held for reuse by a server-side cache
  std::uint64_t bytes_reserved = 0;       ///< taken from the card (freed CUDA IPC segments too, until unmapped)
  std::uint64_t live_blocks = 0;          ///< live regions on it
  std::uint64_t segments = 0;             ///< segments held from the card
  std::uint64_t cache_hits = 0;           ///< requests a server-side cache served
  std::uint64_t upstream_allocations = 0; ///< segments taken from the card, since the server started
  std::uint64_t upstream_frees = 0;       ///< regions given back (freed or reclaimed), since then
  /// Field by field.
  friend bool operator==(const CardStats&, const CardStats&) = default;
};

/// The borrows of one requesting card from one lender in the server's history window.
struct BorrowCount {
  std::int32_t requester = -1; ///< the card that asked
  std::int32_t lender = -1;    ///< the card that lent
  std::uint32_t count = 0;     ///< how many borrows
  std::uint64_t bytes = 0;     ///< their total size
  /// Field by field.
  friend bool operator==(const BorrowCount&, const BorrowCount&) = default;
};

/// One record of the borrowing history; StatsReply lists the newest first.
struct BorrowEvent {
  std::uint64_t age_us = 0;    ///< how long ago, in microseconds
  std::int32_t requester = -1; ///< the card that asked
  std::int32_t lender = -1;    ///< the card that lent
  std::uint64_t bytes = 0;     ///< the borrow's size
  /// Field by field.
  friend bool operator==(const BorrowEvent&, const BorrowEvent&) = default;
};

/// One connected client in a StatsReply.
struct ClientSummary {
  std::uint32_t client_id = 0; ///< as its HelloReply names it
  std::uint32_t pid = 0;       ///< its process, from SO_PEERCRED
  std::uint32_t uid = 0;       ///< its user, from SO_PEERCRED
  std::uint64_t regions = 0;   ///< its live regions
  std::uint64_t bytes = 0;     ///< their total size
  std::string name;            ///< from its Hello
  /// Field by field.
  friend bool operator==(const ClientSummary&, const ClientSummary&) = default;
};

/// The answer to StatsRequest: the server's counters (since it started), every card, the
/// borrowing history and the clients.
struct StatsReply {
  static constexpr MessageType type = MessageType::stats_reply; ///< its header type
  std::uint64_t clients = 0;                                    ///< connections now
  std::uint64_t live_regions = 0;                               ///< regions held now
  std::uint64_t allocations = 0;                                ///< successful
  std::uint64_t frees = 0;                                      ///< by clients
  std::uint64_t failed_allocations = 0;                         ///< Allocate requests refused
  std::uint64_t reclaimed_regions = 0;                          ///< freed because their client went away
  std::uint64_t rejected_messages = 0;     ///< bad or out-of-order messages, refused or timed-out connections
  std::uint64_t leased_segments = 0;       ///< mapped by at least one client
  std::uint64_t retired_segments = 0;      ///< freed while their client mapped them, not yet reported unmapped
  std::uint64_t open_descriptors = 0;      ///< the server process's, from /proc/self/fd
  std::uint64_t my_regions = 0;            ///< the asking client's live regions
  std::uint64_t my_bytes = 0;              ///< their total size
  bool consistent = false;                 ///< the region table agrees with the cards and the leases
  std::vector<CardStats> cards;            ///< one per card
  std::vector<BorrowCount> borrows;        ///< per requester and lender; at most max_borrow_entries
  std::vector<BorrowEvent> recent_borrows; ///< newest first; at most max_recent_borrows
  std::vector<ClientSummary> client_list;  ///< by client id; at most max_client_entries
  /// Field by field.
  friend bool operator==(const StatsReply&, const StatsReply&) = default;
};

/// One card in a CardsReply.
struct CardInfo {
  std::int32_t card = -1;               ///< its index
  std::string name;                     ///< as the topology names it ("GPU3")
  DeviceUuid uuid{};                    ///< its CUDA device's UUID; no_device_uuid for a host twin's card
  std::uint64_t capacity = 0;           ///< its size
  std::uint64_t free_bytes = 0;         ///< what it has free now
  std::uint64_t largest_free_block = 0; ///< the largest region it could give now
  std::vector<double> bandwidth_gbps;   ///< to every card; +infinity to itself, 0 without a path
  /// Field by field.
  friend bool operator==(const CardInfo&, const CardInfo&) = default;
};

/// The answer to CardsRequest.
struct CardsReply {
  static constexpr MessageType type = MessageType::cards_reply; ///< its header type
  std::vector<CardInfo> cards;                                  ///< one per card, in card order
  /// Field by field.
  friend bool operator==(const CardsReply&, const CardsReply&) = default;
};
/// A notice (sequence 0): segments this client maps were freed. It unmaps those it holds no
/// region in and answers with Unmapped.
struct SegmentsRetired {
  static constexpr MessageType type = MessageType::segments_retired; ///< its header type
  std::vector<SegmentId> segments;                                   ///< at most max_segment_list
  /// Field by field.
  friend bool operator==(const SegmentsRetired&, const SegmentsRetired&) = default;
};
/// The answer to a request that failed; with sequence 0, why the server closes the connection.
struct ErrorReply {
  static constexpr MessageType type = MessageType::error; ///< its header type
  Errc code = Errc::bad_message;                          ///< what failed; a reader refuses a value that is no Errc
  std::string message;                                    ///< why, for people; at most max_error_length bytes
  /// Field by field.
  friend bool operator==(const ErrorReply&, const ErrorReply&) = default;
};

/// The answer to WaitReclaimed: none of the clients waited for is connected any more.
struct Reclaimed {
  static constexpr MessageType type = MessageType::reclaimed; ///< its header type
  std::uint64_t reclaimed_regions = 0;                        ///< StatsReply::reclaimed_regions when the wait ended
  /// Field by field.
  friend bool operator==(const Reclaimed&, const Reclaimed&) = default;
};

/// Every message the server sends.
using Reply = std::variant<HelloReply, Allocated, Freed, QueryReply, StatsReply, CardsReply, SegmentsRetired,
                           ErrorReply, Reclaimed>;

} // namespace carve::service
