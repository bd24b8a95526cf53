/// @file carve/service/allocation_service.hpp
/// The decisions of carve's allocation server, apart from any socket: clients, their regions and
/// leases, the picker and the borrowing history.
///
/// @code
/// carve::service::AllocationService<carve::SharedMemoryCard> service(topology, cards, options);
/// auto id = service.connect(peer);                 // a client arrived
/// service.receive(id, message_bytes, outgoing);    // its request; replies (and notices) queued
/// service.disconnect(id, outgoing);                // it left or died: its regions are reclaimed
/// @endcode
///
/// A BorrowingAllocator with the BandwidthWeightedPicker over the cards wrapped in LeasedUpstream
/// (so segments can be lent out), with no pool in between, lending only between cards whose GPUs
/// can map each other (`Peers`; LendingPeers asks the driver for CUDA cards). The allocator's
/// BorrowHistory is the service's borrowing history: the weighted strategy reads it on every pick.
///
/// Every region is a segment of its own, exported to its client alone: clients never share a
/// segment, so a client can reach only memory the server gave it, and a pointer it keeps after a
/// free reaches only pages no one else is given (shared memory: the released memfd lives on in
/// that one mapping; CUDA IPC: the segment stays allocated until the client closes its handle).
/// Small requests therefore belong in a pool on the client's side, over the client's leases
/// (CachingPool over carve::ref(client)): the server is asked only for new leases, returns and
/// trims, and still knows every byte a client holds, so a client that dies gives it all back.
///
/// Rules it enforces: the first message is Hello; a request's sequence is not 0 (Unmapped aside);
/// a client frees and queries only the regions it allocated (permission_denied otherwise;
/// not_allocated for an id nobody holds); a message that does not decode gets an ErrorReply and,
/// unless it was merely of an unknown type after Hello (not numbered 0), the connection is closed after it;
/// nothing a client sends can corrupt the cards' accounting or another client's regions. A
/// client that disconnects has all its regions freed and all its leases dropped.
///
/// Not thread-safe: one thread drives it (AllocationServer's event loop does).
#pragma once

#include <carve/borrow/any_strategy.hpp>
#include <carve/borrow/borrowing_allocator.hpp>
#include <carve/borrow/lending_peers.hpp>
#include <carve/core/error.hpp>
#include <carve/mr/device_uuid.hpp>
#include <carve/mr/segment_export.hpp>
#include <carve/service/leased_upstream.hpp>
#include <carve/service/protocol.hpp>
#include <carve/service/reclaim_waits.hpp>
#include <carve/service/service_report.hpp>
#include <carve/service/unix_socket.hpp>
#include <carve/topology/topology.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <variant>
#include <vector>

namespace carve::service {

/// How an AllocationService picks cards.
struct ServiceOptions {
  AnyStrategy strategy{};            ///< how the picker ranks cards that could lend; LargestBandwidth by default
  std::size_t history_window = 1024; ///< borrows the weighted strategy remembers
};

/// A message for one client's connection.
struct Outgoing {
  ClientId to = 0;                 ///< the connection
  std::vector<std::uint8_t> bytes; ///< the encoded message
  UniqueFd fd;                     ///< a segment's descriptor to attach, closed once sent (or dropped)
  bool close_after = false;        ///< close the connection once this is sent
};

/// The allocation server's state and rules over `Upstream` cards (see the file's description).
/// Not copyable; not thread-safe.
template <ExportableResource Upstream, PeerAccess Peers = LendingPeers<Upstream>>
class AllocationService {
  static_assert(KnowsItsDevice<Upstream> || !is_cuda_memory(Upstream::export_kind),
                "a card lending CUDA memory names its GPU (device_uuid()), so that clients find it in their numbering");

public:
  using card_type = LeasedUpstream<Upstream>;                               ///< a card, as lent out
  using allocator_type = BorrowingAllocator<card_type, AnyStrategy, Peers>; ///< picks and takes the memory

  /// One card per GPU of `topology`, in GPU order; `peers` says which may lend to which
  /// (lending_peers(cards) when not given). Throws carve::Exception (invalid_argument) when the
  /// cards do not match the topology's GPUs, or there are more than max_cards; a card that
  /// KnowsItsDevice but cannot say its UUID, that error; lending_peers', the driver's.
  AllocationService(const Topology& topology, std::vector<Upstream> cards, ServiceOptions options = {},
                    std::optional<Peers> peers = std::nullopt)
      : options_(options), allocator_(make_allocator(topology, std::move(cards), options, std::move(peers))) {
    for (int c = 0; c < topology.gpu_count(); ++c) {
      names_.push_back(topology.node(topology.gpu(c)).name);
    }
    counters_.taken.assign(cards_.size(), 0);
    counters_.returned.assign(cards_.size(), 0);
  }

  AllocationService(const AllocationService&) = delete;
  AllocationService& operator=(const AllocationService&) = delete;

  /// A new client with `peer`'s credentials, which must say Hello first. Returns its id.
  ClientId connect(const PeerCredentials& peer) {
    const ClientId id = next_client_++;
    clients_[id].peer = peer;
    return id;
  }

  /// Handles one message from `client` (an unknown id is ignored); replies and notices go to
  /// `out`, whose entries with close_after end the connection once sent.
  void receive(ClientId client, std::span<const std::uint8_t> message, std::vector<Outgoing>& out) {
    const auto it = clients_.find(client);
    if (it == clients_.end()) {
      return;
    }
    Client& c = it->second;
    auto decoded = decode_request(message);
    if (!decoded) {
      ++counters_.rejected;
      // Sequence 0 is reserved for notices, and an error in reply to it says the connection ends.
      send(out, client, ErrorReply{decoded.error().code, decoded.error().message}, decoded.error().sequence,
           decoded.error().fatal || !c.greeted || decoded.error().sequence == 0);
      return;
    }
    const std::uint32_t seq = decoded->sequence;
    const Request& request = decoded->body;
    if (!c.greeted && !std::holds_alternative<Hello>(request)) {
      return reject(client, Errc::bad_message, "the first message must be Hello", out, seq);
    }
    if (seq == 0 && !std::holds_alternative<Unmapped>(request)) {
      return reject(client, Errc::bad_message, "sequence 0 is reserved for notices", out, seq);
    }
    std::visit([&](const auto& m) { handle(client, c, seq, m, out); }, request);
    collect_retired(out);
  }

  /// Refuses `client`: an error reply, then the connection closes. For protocol violations, and
  /// for what the transport finds wrong (an oversized message, descriptors sent to the server, a
  /// peer of another user, one client too many, a missed deadline).
  void reject(ClientId client, Errc code, std::string reason, std::vector<Outgoing>& out, std::uint32_t seq = 0) {
    ++counters_.rejected;
    send(out, client, ErrorReply{code, std::move(reason)}, seq, true);
  }

  /// The client is gone: frees its regions, drops its leases and its own waits, and answers the
  /// WaitReclaimed requests that now wait for no one.
  void disconnect(ClientId client, std::vector<Outgoing>& out) {
    const auto it = clients_.find(client);
    if (it == clients_.end()) {
      return;
    }
    Client& c = it->second;
    for (const RegionId r : c.regions) {
      const auto region = regions_.find(r);
      (void)allocator_.give_back(region->second.handle);
      ++counters_.returned[static_cast<std::size_t>(region->second.handle.card)];
      regions_.erase(region);
      ++counters_.reclaimed;
    }
    for (const auto& [segment, mapping] : c.mappings) {
      drop_mapping(client, segment, mapping.card);
    }
    clients_.erase(it);
    collect_retired(out);
    settle_waits(client, out);
  }

  /// Ends the WaitReclaimed requests whose time is up (timed_out). The server calls it on a tick
  /// while waits_pending().
  void expire_waits(std::chrono::steady_clock::time_point now, std::vector<Outgoing>& out) {
    waits_.expire(now, [&](const detail::ReclaimWaits::Wait& w) {
      const std::string who = w.what.client_id != 0 ? "client " + std::to_string(w.what.client_id)
                                                    : "a client of pid " + std::to_string(w.what.pid);
      send(out, w.waiter,
           error(Errc::timed_out, who + " is still connected after " + std::to_string(w.what.timeout_ms) + " ms"),
           w.seq);
    });
  }
  /// Whether some WaitReclaimed is not answered yet.
  bool waits_pending() const noexcept { return waits_.pending(); }

  /// What StatsRequest answers; `asking` is the client whose my_ fields are filled (0: none).
  StatsReply stats(ClientId asking = 0) const { return detail::ServiceReport::stats(*this, asking); }

  /// What CardsRequest answers: every card's size, free memory and bandwidths.
  std::vector<CardInfo> cards() const { return detail::ServiceReport::cards(*this); }

  /// The region table agrees with the cards and the leases: every region is a live segment of
  /// its card, mapped by its owner alone, and every leased segment has its mapper on record.
  bool consistent() const { return detail::ServiceReport::consistent(*this); }

  /// Whether `client` has said Hello (for the server's handshake deadline).
  bool greeted(ClientId client) const {
    const auto it = clients_.find(client);
    return it != clients_.end() && it->second.greeted;
  }
  /// Whether `client` holds memory: regions, or segments it maps (for the server's idle policy).
  bool holds_memory(ClientId client) const {
    const auto it = clients_.find(client);
    return it != clients_.end() && (!it->second.regions.empty() || !it->second.mappings.empty());
  }
  /// Whether `client` waits for a WaitReclaimed answer (it is not idle then).
  bool waiting(ClientId client) const { return waits_.waiting(client); }

  /// The cards served.
  int card_count() const noexcept { return allocator_.card_count(); }
  /// Clients connected now, greeted or not.
  std::size_t client_count() const noexcept { return clients_.size(); }
  /// Live regions, over all clients.
  std::size_t region_count() const noexcept { return regions_.size(); }
  /// The allocator, for its picker, history and card states.
  const allocator_type& allocator() const noexcept { return allocator_; }
  /// Card `c`'s leases and segments. Throws carve::Exception (out_of_range) for no such card.
  const card_type& card(int c) const {
    if (c < 0 || c >= card_count()) {
      throw Exception(Errc::out_of_range,
                      "card " + std::to_string(c) + " of a service with " + std::to_string(card_count()) + " cards");
    }
    return cards_[static_cast<std::size_t>(c)];
  }

private:
  friend struct detail::ServiceReport; // reads the tables below, changes nothing

  struct Mapping {
    int card = -1;
    std::uint32_t live = 0; // the client's regions in this segment
    bool retired = false;   // the client was told to unmap it
  };
  struct Client {
    PeerCredentials peer;
    std::string name;
    bool greeted = false;
    std::unordered_set<RegionId> regions;
    std::uint64_t bytes = 0;
    std::unordered_map<SegmentId, Mapping> mappings; // segments the client has mapped
  };
  struct Region {
    ClientId owner = 0;
    BorrowHandle handle;
    SegmentId segment = 0;
    std::uint64_t offset = 0;
  };
  struct Counters {
    std::uint64_t allocations = 0;
    std::uint64_t frees = 0;
    std::uint64_t failed = 0;
    std::uint64_t reclaimed = 0;
    std::uint64_t rejected = 0;
    std::vector<std::uint64_t> taken;    // per card: segments taken for regions
    std::vector<std::uint64_t> returned; // per card: regions given back (freed or reclaimed)
  };
  allocator_type make_allocator(const Topology& topology, std::vector<Upstream> cards, const ServiceOptions& options,
                                std::optional<Peers> peers) {
    if (topology.gpu_count() < 1 || topology.gpu_count() > max_cards) {
      throw Exception(Errc::invalid_argument, "the topology has " + std::to_string(topology.gpu_count()) +
                                                  " GPUs; a server serves 1 to " + std::to_string(max_cards));
    }
    if (cards.size() != static_cast<std::size_t>(topology.gpu_count())) {
      throw Exception(Errc::invalid_argument, std::to_string(cards.size()) + " cards for a topology with " +
                                                  std::to_string(topology.gpu_count()) + " GPUs");
    }
    Peers lending = lending_peers<Peers>(cards, std::move(peers));
    for (Upstream& u : cards) {
      uuids_.push_back(value_or_throw(device_identity(u)));
      cards_.emplace_back(std::move(u));
    }
    // Copies of a LeasedUpstream share its state: the allocator's cards are the service's.
    return allocator_type(
        topology, [&](int c) { return cards_[static_cast<std::size_t>(c)]; }, options.strategy, options.history_window,
        std::move(lending));
  }

  template <class M>
  void send(std::vector<Outgoing>& out, ClientId to, M message, std::uint32_t seq, bool close_after = false) {
    out.push_back(Outgoing{to, encode(Reply{std::move(message)}, seq), UniqueFd(), close_after});
  }

  static ErrorReply error(Errc code, std::string message) { return ErrorReply{code, std::move(message)}; }

  void handle(ClientId id, Client& c, std::uint32_t seq, const Hello& m, std::vector<Outgoing>& out) {
    if (c.greeted) {
      return reject(id, Errc::bad_message, "Hello sent twice", out, seq);
    }
    c.greeted = true;
    c.name = m.client_name;
    send(out, id,
         HelloReply{static_cast<std::uint32_t>(::getpid()), id, c.peer.pid, c.peer.uid, card_count(),
                    Upstream::export_kind},
         seq);
  }

  void handle(ClientId id, Client& c, std::uint32_t seq, const Allocate& m, std::vector<Outgoing>& out) {
    static_assert(sizeof(std::size_t) == sizeof(m.bytes), "sizes travel as 64-bit values");
    auto h = allocator_.borrow_explained(m.card, static_cast<std::size_t>(m.bytes), carve::default_alignment);
    if (!h) {
      ++counters_.failed;
      return send(out, id, error(h.error().code, std::move(h.error().message)), seq);
    }
    // The block is a segment of its own (no pool sits between the allocator and the card), so it
    // is new and is leased to this client alone.
    card_type& card = cards_[static_cast<std::size_t>(h->card)];
    const auto where = card.locate(h->address);
    const auto e = where ? card.lease(where->segment) : std::nullopt;
    // The segment is never exported again: the reply carries its descriptor away, and the server
    // keeps none for it.
    UniqueFd fd(e && travels_as_descriptor(e->kind) ? card.take_descriptor(where->segment, *e) : -1);
    if (!e || (travels_as_descriptor(e->kind) && !fd)) {
      if (e) {
        card.unlease(where->segment);
      }
      (void)allocator_.give_back(*h);
      ++counters_.failed;
      return send(out, id, error(Errc::no_space, "card " + std::to_string(h->card) + " cannot export its memory"), seq);
    }
    c.mappings.emplace(where->segment, Mapping{h->card, 1, false});
    mappers_[where->segment] = {id};
    const RegionId rid = next_region_++;
    const auto region = regions_.emplace(rid, Region{id, *h, where->segment, where->offset}).first;
    ++counters_.taken[static_cast<std::size_t>(h->card)];
    c.regions.insert(rid);
    c.bytes += h->size;
    ++counters_.allocations;
    Allocated a;
    a.kind = Upstream::export_kind;
    a.new_mapping = true;
    a.device = e->device;
    a.device_uuid = uuids_[static_cast<std::size_t>(h->card)];
    a.requester_uuid = uuids_[static_cast<std::size_t>(h->requester)];
    a.handle = e->handle;
    a.region = info(rid, region->second);
    a.segment_size = where->segment_size;
    out.push_back(Outgoing{id, encode(Reply{a}, seq), std::move(fd), false});
  }

  void handle(ClientId id, Client& c, std::uint32_t seq, const Free& m, std::vector<Outgoing>& out) {
    const auto r = owned(id, m.region, seq, out);
    if (r == regions_.end()) {
      return;
    }
    if (const auto e = allocator_.give_back(r->second.handle); !e) { // the table and the cards disagree
      return send(out, id, error(e.error(), "region " + std::to_string(m.region) + " could not be freed"), seq);
    }
    ++counters_.returned[static_cast<std::size_t>(r->second.handle.card)];
    // A live region's segment is mapped by its owner: the mapping goes only once it holds no region.
    --c.mappings.find(r->second.segment)->second.live;
    c.regions.erase(m.region);
    c.bytes -= r->second.handle.size;
    regions_.erase(r);
    ++counters_.frees;
    send(out, id, Freed{m.region}, seq);
  }

  void handle(ClientId id, Client&, std::uint32_t seq, const Query& m, std::vector<Outgoing>& out) {
    const auto r = owned(id, m.region, seq, out);
    if (r != regions_.end()) {
      send(out, id, QueryReply{info(r->first, r->second)}, seq);
    }
  }

  void handle(ClientId id, Client&, std::uint32_t seq, const StatsRequest&, std::vector<Outgoing>& out) {
    send(out, id, stats(id), seq);
  }

  void handle(ClientId id, Client&, std::uint32_t seq, const CardsRequest&, std::vector<Outgoing>& out) {
    send(out, id, CardsReply{cards()}, seq);
  }

  void handle(ClientId id, Client& c, std::uint32_t seq, const WaitReclaimed& m, std::vector<Outgoing>& out) {
    if ((m.client_id == 0) == (m.pid == 0)) {
      return send(out, id, error(Errc::invalid_argument, "name a client id or a pid, not both or neither"), seq);
    }
    if (m.timeout_ms > max_wait_ms) {
      return send(out, id,
                  error(Errc::invalid_argument, "a wait of " + std::to_string(m.timeout_ms) +
                                                    " ms is longer than the limit of " + std::to_string(max_wait_ms)),
                  seq);
    }
    if (m.client_id == id || (m.pid != 0 && m.pid == c.peer.pid)) {
      return send(out, id, error(Errc::invalid_argument, "a client cannot wait for its own reclaim"), seq);
    }
    if (!still_connected(m)) {
      return send(out, id, Reclaimed{counters_.reclaimed}, seq);
    }
    if (!waits_.room_for(id)) {
      return send(out, id,
                  error(Errc::no_space, "a client may wait for at most " +
                                            std::to_string(detail::ReclaimWaits::max_waits_per_client) +
                                            " reclaims at once"),
                  seq);
    }
    waits_.add(id, seq, m);
  }

  bool still_connected(const WaitReclaimed& m) const {
    if (m.client_id != 0) {
      return clients_.count(m.client_id) != 0;
    }
    return std::any_of(clients_.begin(), clients_.end(), [&](const auto& c) { return c.second.peer.pid == m.pid; });
  }

  // `gone` has been reclaimed: its own waits end, and those it satisfied are answered.
  void settle_waits(ClientId gone, std::vector<Outgoing>& out) {
    waits_.settle(
        gone, [this](const WaitReclaimed& what) { return still_connected(what); },
        [&](const detail::ReclaimWaits::Wait& w) { send(out, w.waiter, Reclaimed{counters_.reclaimed}, w.seq); });
  }

  // No reply. Segments the client still holds regions in, or never mapped, are ignored.
  void handle(ClientId id, Client& c, std::uint32_t, const Unmapped& m, std::vector<Outgoing>&) {
    for (const SegmentId s : m.segments) {
      const auto it = c.mappings.find(s);
      if (it != c.mappings.end() && it->second.live == 0) {
        const int card = it->second.card;
        c.mappings.erase(it);
        drop_mapping(id, s, card);
      }
    }
  }

  // The region if `client` holds it; otherwise an error reply and end().
  typename std::unordered_map<RegionId, Region>::iterator owned(ClientId client, RegionId region, std::uint32_t seq,
                                                                std::vector<Outgoing>& out) {
    const auto r = regions_.find(region);
    if (r == regions_.end()) {
      send(out, client, error(Errc::not_allocated, "region " + std::to_string(region) + " is not allocated"), seq);
    } else if (r->second.owner != client) {
      send(out, client,
           error(Errc::permission_denied, "region " + std::to_string(region) + " belongs to another client"), seq);
      return regions_.end();
    }
    return r;
  }

  static RegionInfo info(RegionId id, const Region& r) {
    return RegionInfo{id, r.handle.card, r.handle.requester, r.segment, r.offset, r.handle.size};
  }

  void drop_mapping(ClientId client, SegmentId segment, int card) {
    const auto m = mappers_.find(segment);
    if (m != mappers_.end()) {
      std::erase(m->second, client);
      if (m->second.empty()) {
        mappers_.erase(m);
      }
    }
    cards_[static_cast<std::size_t>(card)].unlease(segment);
  }

  // Segments freed while clients had them mapped: tell those clients to unmap.
  void collect_retired(std::vector<Outgoing>& out) {
    std::map<ClientId, std::vector<SegmentId>> notices;
    for (card_type& card : cards_) {
      for (const SegmentId s : card.take_retired()) {
        const auto m = mappers_.find(s);
        if (m == mappers_.end()) {
          continue;
        }
        for (const ClientId client : m->second) {
          // A mapper on record is connected and maps `s`: disconnect and Unmapped drop both together.
          auto& mapping = clients_.find(client)->second.mappings.find(s)->second;
          if (!mapping.retired) {
            mapping.retired = true;
            notices[client].push_back(s);
          }
        }
      }
    }
    for (auto& [client, segments] : notices) {
      for (std::size_t i = 0; i < segments.size(); i += max_segment_list) {
        const auto end = std::min(segments.size(), i + max_segment_list);
        SegmentsRetired notice{
            {segments.begin() + static_cast<std::ptrdiff_t>(i), segments.begin() + static_cast<std::ptrdiff_t>(end)}};
        send(out, client, std::move(notice), 0);
      }
    }
  }

  ServiceOptions options_;
  std::vector<card_type> cards_;  // filled by make_allocator, before allocator_ is built
  std::vector<DeviceUuid> uuids_; // each card's device (make_allocator): GPUs cross the socket by UUID
  allocator_type allocator_;
  std::vector<std::string> names_;
  std::unordered_map<ClientId, Client> clients_;
  std::unordered_map<RegionId, Region> regions_;
  std::unordered_map<SegmentId, std::vector<ClientId>> mappers_; // who maps each leased segment
  detail::ReclaimWaits waits_;
  ClientId next_client_ = 1;
  RegionId next_region_ = 1;
  Counters counters_;
};

} // namespace carve::service
