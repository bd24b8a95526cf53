/// @file carve/service/allocation_client.hpp
/// An application's side of carve's allocation service.
///
/// @code
/// auto client = carve::AllocationClient::connect({.name = "trainer"});
/// if (!client) { std::puts(client.error().message.c_str()); return 1; }
/// auto r = client->lease(64 << 20, /*requesting card*/ 0, /*alignment*/ 256); // carve::Result<Region>
/// if (r) { std::memset(r->ptr, 0, r->info.size); client->free(r->ptr); }
/// @endcode
///
/// lease() asks the server for a region for a card, which is a segment of its own that only this
/// client maps (shared memory: mmap of the descriptor passed with the reply; CUDA: the IPC
/// handle), and free() unmaps it and gives it back. The client remembers pointer -> region id, so
/// free() and query() take the pointer.
///
/// The client is also a carve::MemoryResource whose bytes come from one card, the default card
/// chosen at connect() (ClientOptions::card): try_allocate(bytes, alignment) and
/// deallocate(p, bytes, alignment), and CCCL's allocate / allocate_sync / deallocate_sync, mean
/// what they mean on every carve resource (a lease for ClientOptions::card with the message
/// dropped, and its free), so remote memory stacks under pools and fallbacks like any other.
/// That is how small allocations should go: a CachingPool over the client leases segments from
/// the server and serves blocks from them without a round trip,
///
/// @code
/// carve::CachingPool pool(carve::ref(*client));        // a client-side pool over leases
/// void* p = pool.allocate(256, 256);                   // a round trip only for a new lease
/// pool.trim();                                         // idle leases go back to the server
/// @endcode
///
/// and the server still counts every leased byte against this client.
///
/// Errors are values (carve::Error: an Errc and a message): the server's (no_space naming every
/// card's largest free block, out_of_range for an unknown card, permission_denied, ...), and
/// disconnected when the server is gone: it stopped, restarted or did not answer within the
/// timeout. A server that closes the connection says why, and the next call returns that code
/// (timed_out for an idle client, disconnected at shutdown). Regions from a lost connection are
/// orphans: their memory stays mapped (so pointers stay valid here) until free() drops them
/// locally; reconnect() starts a new session. The destructor hangs up, which makes the server
/// reclaim every region of this client, and unmaps everything: pointers from a destroyed client
/// are invalid.
///
/// Thread-safe: calls are serialised on the one connection (give each thread its own client
/// for parallel round trips). Host-only, Linux.
#pragma once

#include <carve/core/error.hpp>
#include <carve/core/misuse.hpp>
#include <carve/mr/cuda_mr.hpp>
#include <carve/mr/detail/block_lookup.hpp>
#include <carve/mr/memory_resource.hpp>
#include <carve/service/protocol.hpp>
#include <carve/service/segment_mapping.hpp>
#include <carve/service/unix_socket.hpp>

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

namespace carve::service {

/// How an AllocationClient connects.
struct ClientOptions {
  std::filesystem::path socket_path = default_socket_path(); ///< where the server listens
  std::string name;                         ///< shown in the server's stats; cut to max_name_length bytes
  std::chrono::milliseconds timeout{30000}; ///< for each reply; then the connection counts as lost
  int card = 0; ///< the default card: the requesting card of the resource form (try_allocate, allocate, ...)
};

/// A region as this process sees it.
struct Region {
  void* ptr = nullptr; ///< in this process
  RegionInfo info;     ///< as the server keeps it: id, card, requester, segment, offset, size
  /// Whether the memory is another card's than the one that asked.
  bool borrowed() const noexcept { return info.card != info.requester; }
};

/// An application's connection to carve-served (see the file's description), and a
/// MemoryResource for ClientOptions::card. Thread-safe; movable, not copyable.
class AllocationClient : public CcclSpellings<AllocationClient> {
public:
  /// Connects and says Hello. Errors: disconnected (no server, no answer in time, or a server
  /// speaking another protocol version: the message says which), permission_denied (a server of
  /// another user, or one that refuses this user), no_space (the server has no room for another
  /// client), invalid_size (a socket path too long for a socket address).
  [[nodiscard]] static Result<AllocationClient> connect(ClientOptions options = {}) {
    AllocationClient client(std::move(options));
    if (auto r = client.state_->open(); !r) {
      return cuda::std::unexpected(std::move(r.error()));
    }
    return client;
  }

  /// Takes over the connection; the moved-from client may only be destroyed or assigned to.
  AllocationClient(AllocationClient&&) noexcept = default;
  /// Hangs up this client's connection (as the destructor does), then takes over `other`'s.
  AllocationClient& operator=(AllocationClient&&) noexcept = default;
  /// Hangs up (the server reclaims every region of this client) and unmaps everything.
  ~AllocationClient() = default;

  /// A lease of `bytes` for `card` (the requesting card), on that card or borrowed from another,
  /// mapped here at an address aligned to `alignment`. Errors: invalid_size (0 bytes, an
  /// alignment that is not a power of two; nothing is sent); the server's (no_space,
  /// out_of_range for no such card); no_space for a region that does not start at `alignment`
  /// (it is given back: a mapping starts on a page, and is not moved to meet a coarser
  /// alignment); disconnected; bad_message for a reply that does not hold together, and
  /// map_segment's errors (the region is given back in both cases).
  [[nodiscard]] Result<Region> lease(std::size_t bytes, int card, std::size_t alignment) {
    const std::lock_guard lock(state_->mutex);
    return state_->lease(bytes, card, alignment);
  }

  /// The resource form (carve::MemoryResource): `bytes` aligned to `alignment`, leased for the
  /// default card (ClientOptions::card). Errors: lease()'s codes, and no_space when this client's
  /// bookkeeping cannot grow. allocate(bytes, alignment) and allocate_sync are this, throwing.
  [[nodiscard]] cuda::std::expected<void*, Errc> try_allocate(std::size_t bytes, std::size_t alignment) noexcept {
    try {
      const std::lock_guard lock(state_->mutex);
      const auto r = state_->lease(bytes, state_->options.card, alignment);
      if (!r) {
        return cuda::std::unexpected(r.error().code);
      }
      return r->ptr;
    } catch (const std::exception&) { // the client's own bookkeeping could not grow
      return cuda::std::unexpected(Errc::no_space);
    }
  }
  /// try_deallocate, and any error it finds ends the program with a message (core/misuse.hpp):
  /// a pointer or size this client does not know, or a free the server refuses.
  void deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept {
    if (const auto r = try_deallocate(p, bytes, alignment); !r) {
      report_misuse("carve::AllocationClient::deallocate", p, bytes, r.error());
    }
  }
  /// Errors (nothing changes): not_allocated when `p` does not start a region of this client;
  /// invalid_size when `bytes` is not its size; the server's errors. After a lost connection the
  /// region is dropped here and the call succeeds.
  [[nodiscard]] cuda::std::expected<void, Errc> try_deallocate(void* p, std::size_t bytes,
                                                               std::size_t alignment) noexcept {
    try {
      const std::lock_guard lock(state_->mutex);
      const auto it = state_->regions.find(address(p));
      if (it == state_->regions.end()) {
        return cuda::std::unexpected(Errc::not_allocated);
      }
      if (it->second.info.size != bytes || !check_request(bytes, alignment)) {
        return cuda::std::unexpected(Errc::invalid_size);
      }
      const auto r = state_->free(p);
      return r ? cuda::std::expected<void, Errc>{} : cuda::std::unexpected(r.error().code);
    } catch (const std::exception&) {
      return cuda::std::unexpected(Errc::no_space);
    }
  }
  /// ClientOptions::card's free bytes as the server sees them now (one round trip; 0 when the
  /// server cannot be reached): so that a CachingPool stacks on the client.
  std::size_t free_bytes() const { return card_figure(&CardInfo::free_bytes); }
  /// ClientOptions::card's size, likewise (one round trip; 0 when the server cannot be reached).
  std::size_t capacity() const { return card_figure(&CardInfo::capacity); }

  /// Whether `p` lies in a live region of this client (an orphan's does not count).
  bool owns(const void* p) const noexcept {
    const std::lock_guard lock(state_->mutex);
    const auto it = state_->find(p);
    return it != state_->regions.end() && !it->second.orphan;
  }
  /// Equal only to itself: regions go back to the client that allocated them.
  friend bool operator==(const AllocationClient& a, const AllocationClient& b) noexcept { return a.state_ == b.state_; }

  /// Frees the region that starts at `p` and unmaps it. Errors: not_allocated when `p` is not the
  /// start of a region of this client (nothing is sent); the server's errors. A region orphaned
  /// by a lost connection is dropped locally (its server reclaimed it already).
  [[nodiscard]] Result<void> free(void* p) {
    const std::lock_guard lock(state_->mutex);
    return state_->free(p);
  }

  /// The server's record of the region that holds `p` (any byte of it). Errors: not_allocated
  /// when no live region of this client holds it (nothing is sent); the server's; disconnected.
  [[nodiscard]] Result<RegionInfo> query(const void* p) {
    const std::lock_guard lock(state_->mutex);
    const auto r = state_->find(p);
    if (r == state_->regions.end() || r->second.orphan) {
      return fail(Errc::not_allocated, "no region of this client holds that address");
    }
    return state_->query(r->second.info.id);
  }

  /// The server's counters, cards, borrows and clients (one round trip); the my_ fields are this
  /// client's.
  [[nodiscard]] Result<StatsReply> stats() {
    const std::lock_guard lock(state_->mutex);
    return state_->call_for<StatsReply>(StatsRequest{});
  }
  /// Every card's size, free memory and bandwidths (one round trip).
  [[nodiscard]] Result<std::vector<CardInfo>> cards() {
    const std::lock_guard lock(state_->mutex);
    auto r = state_->call_for<CardsReply>(CardsRequest{});
    if (!r) {
      return cuda::std::unexpected(std::move(r.error()));
    }
    return std::move(r->cards);
  }

  /// Waits until the server has reclaimed every region of process `pid` (all its connections
  /// closed, e.g. after it died): the moment a test or a supervisor can count on the memory being
  /// back. Answers at once when none is connected. Returns the server's count of reclaimed
  /// regions then. Errors: timed_out when one is still connected after `timeout`;
  /// invalid_argument for 0 or a timeout outside 0 ms .. 1 h (nothing is sent), and for this
  /// client's own pid; no_space when this client already waits 64 times; disconnected.
  [[nodiscard]] Result<std::uint64_t> wait_reclaimed_pid(std::uint32_t pid, std::chrono::milliseconds timeout) {
    return wait_reclaimed(WaitReclaimed{0, pid, 0}, timeout);
  }
  /// As wait_reclaimed_pid, for one client (its HelloReply::client_id); invalid_argument for this
  /// client's own id.
  [[nodiscard]] Result<std::uint64_t> wait_reclaimed_client(std::uint32_t client_id,
                                                            std::chrono::milliseconds timeout) {
    return wait_reclaimed(WaitReclaimed{client_id, 0, 0}, timeout);
  }

  /// Hangs up (if still connected) and connects again: a new session, which owns none of the
  /// old regions (they become orphans). Errors: as connect().
  [[nodiscard]] Result<void> reconnect() {
    const std::lock_guard lock(state_->mutex);
    state_->lose_connection();
    return state_->open();
  }

  /// Handles notices that have arrived (segments to unmap) without waiting. Returns how many
  /// segments were unmapped: usually 0, as this client unmaps a segment when it frees the region
  /// in it. Anything but a notice waiting there means the connection is lost.
  std::size_t process_notices() {
    const std::lock_guard lock(state_->mutex);
    return state_->drain_notices();
  }

  /// The region id of the region starting at `p`, from this process's table (no round trip);
  /// nullopt for anything else, orphans included.
  std::optional<RegionId> region_of(const void* p) const {
    const std::lock_guard lock(state_->mutex);
    const auto it = state_->regions.find(address(p));
    if (it == state_->regions.end() || it->second.orphan) {
      return std::nullopt;
    }
    return it->second.info.id;
  }

  /// Whether the connection is up as far as this side knows (a server that hung up is noticed at
  /// the next call).
  bool connected() const {
    const std::lock_guard lock(state_->mutex);
    return static_cast<bool>(state_->socket);
  }
  /// The server's answer to Hello (its pid, this client's id, the backend, ...).
  HelloReply server() const {
    const std::lock_guard lock(state_->mutex);
    return state_->hello;
  }
  /// Segments mapped into this process now, orphans' included.
  std::size_t mapped_segments() const {
    const std::lock_guard lock(state_->mutex);
    return state_->segments.size();
  }
  /// Every segment mapped into this process for this client: all the server's memory it can reach.
  std::vector<MappedSegment> mappings() const {
    const std::lock_guard lock(state_->mutex);
    std::vector<MappedSegment> out;
    for (const auto& [key, s] : state_->segments) {
      out.push_back(s.mapping);
    }
    return out;
  }
  /// Regions this process holds, orphans included.
  std::size_t live_regions() const {
    const std::lock_guard lock(state_->mutex);
    return state_->regions.size();
  }
  /// As given to connect().
  const ClientOptions& options() const noexcept { return state_->options; }

private:
  static std::uintptr_t address(const void* p) noexcept { return reinterpret_cast<std::uintptr_t>(p); }

  std::size_t card_figure(std::uint64_t CardInfo::*figure) const {
    const std::lock_guard lock(state_->mutex);
    const auto r = state_->call_for<CardsReply>(CardsRequest{});
    const auto card = static_cast<std::size_t>(state_->options.card);
    return r && card < r->cards.size() ? static_cast<std::size_t>(r->cards[card].*figure) : 0;
  }

  [[nodiscard]] Result<std::uint64_t> wait_reclaimed(WaitReclaimed request, std::chrono::milliseconds timeout) {
    if (timeout.count() < 0 || timeout.count() > max_wait_ms) {
      return fail(Errc::invalid_argument, "a wait of " + std::to_string(timeout.count()) + " ms is outside 0 ms .. " +
                                              std::to_string(max_wait_ms) + " ms");
    }
    if (request.pid == 0 && request.client_id == 0) {
      return fail(Errc::invalid_argument, "wait_reclaimed needs a pid or a client id other than 0");
    }
    request.timeout_ms = static_cast<std::uint32_t>(timeout.count());
    const std::lock_guard lock(state_->mutex);
    // The reply comes when the wait ends: give it that long on top of the usual reply timeout.
    state_->extra_wait = timeout;
    auto r = state_->call_for<Reclaimed>(request);
    state_->extra_wait = std::chrono::milliseconds{0};
    if (!r) {
      return cuda::std::unexpected(std::move(r.error()));
    }
    return r->reclaimed_regions;
  }

  struct LocalSegment {
    MappedSegment mapping;
    std::size_t live = 0; // this process's regions in it
    bool orphan = false;  // from a lost connection
  };
  struct LocalRegion {
    RegionInfo info;
    std::uint64_t segment_key = 0; // into State::segments
    bool orphan = false;
  };

  struct State {
    explicit State(ClientOptions o) : options(std::move(o)) {}
    State(const State&) = delete;
    State& operator=(const State&) = delete;
    ~State() {
      socket.reset();
      for (const auto& [key, s] : segments) {
        unmap_segment(s.mapping);
      }
    }

    [[nodiscard]] Result<void> open() {
      auto fd = connect_to(options.socket_path);
      if (!fd) {
        return cuda::std::unexpected(std::move(fd.error()));
      }
      const auto peer = peer_credentials(fd->get());
      if (!peer || (peer->uid != ::geteuid() && peer->uid != 0)) {
        return fail(Errc::permission_denied,
                    options.socket_path.string() + " is served by another user; refusing to use it");
      }
      socket = std::move(*fd);
      auto r = call_for<HelloReply>(Hello{options.name});
      if (!r) {
        lose_connection();
        return cuda::std::unexpected(std::move(r.error()));
      }
      hello = *r;
      return {};
    }

    [[nodiscard]] Result<Region> lease(std::size_t bytes, int card, std::size_t alignment) {
      if (!valid_request(bytes, alignment)) {
        return fail(Errc::invalid_size, "cannot lease " + std::to_string(bytes) + " bytes aligned to " +
                                            std::to_string(alignment) + ": 0 bytes, or not a power of two");
      }
      auto r = lease_mapped(bytes, card);
      if (r && address(r->ptr) % alignment != 0) {
        (void)free(r->ptr);
        return fail(Errc::no_space, "the region is mapped at an address not aligned to " + std::to_string(alignment));
      }
      return r;
    }

    [[nodiscard]] Result<Region> lease_mapped(std::size_t bytes, int card) {
      std::vector<UniqueFd> fds;
      auto r = call_for<Allocated>(Allocate{bytes, card}, &fds);
      if (!r) {
        return cuda::std::unexpected(std::move(r.error()));
      }
      const Allocated& a = *r;
      const auto known = by_segment.find(a.region.segment);
      std::uint64_t key = 0;
      if (a.new_mapping == (known != by_segment.end())) {
        return give_back(a.region.id, "the server's reply does not match this client's mappings");
      }
      if (a.new_mapping) {
        if (travels_as_descriptor(a.kind) && fds.size() != 1) {
          return give_back(a.region.id,
                           std::string("a new ") + to_string(a.kind) + " segment came without its descriptor");
        }
        auto m = map_segment(a.kind, static_cast<std::size_t>(a.segment_size), a.device, a.handle,
                             fds.empty() ? UniqueFd() : std::move(fds.front()));
        if (!m) {
          (void)give_back(a.region.id, m.error().message);
          // The server counts the segment as mapped here: say it is not, so that a later region of
          // it comes as a new mapping again.
          unmapped({a.region.segment});
          return fail(m.error().code, m.error().message);
        }
        key = next_key++;
        segments.emplace(key, LocalSegment{*m, 0, false});
        by_segment.emplace(a.region.segment, key);
      } else {
        key = known->second;
      }
      LocalSegment& s = segments.find(key)->second; // just added, or by_segment's: both are in `segments`
      if (a.region.offset > s.mapping.size || a.region.size > s.mapping.size - a.region.offset) {
        return give_back(a.region.id, "the server placed a region outside its segment");
      }
      void* p = static_cast<std::uint8_t*>(s.mapping.base) + a.region.offset;
      ++s.live;
      regions[address(p)] = LocalRegion{a.region, key, false};
      return Region{p, a.region};
    }

    // Frees a region this client cannot use (the reply was inconsistent) and reports why.
    cuda::std::unexpected<Error> give_back(RegionId id, const std::string& why) {
      (void)call_for<Freed>(Free{id});
      return fail(Errc::bad_message, why);
    }

    [[nodiscard]] Result<void> free(void* p) {
      const auto it = regions.find(address(p));
      if (it == regions.end()) {
        return fail(Errc::not_allocated, "this client holds no region starting at that address");
      }
      if (!it->second.orphan) {
        const auto r = call_for<Freed>(Free{it->second.info.id});
        if (!r && r.error().code != Errc::disconnected) {
          return cuda::std::unexpected(r.error());
        }
        // disconnected: lose_connection() has made the region an orphan; drop it below
      }
      const auto again = regions.find(address(p));
      const LocalRegion gone = again->second;
      regions.erase(again);
      release_segment_use(gone.segment_key, gone.info.segment);
      return {};
    }

    [[nodiscard]] Result<RegionInfo> query(RegionId id) {
      auto r = call_for<QueryReply>(Query{id});
      if (!r) {
        return cuda::std::unexpected(std::move(r.error()));
      }
      return r->region;
    }

    std::map<std::uintptr_t, LocalRegion>::iterator find(const void* p) {
      return carve::detail::block_containing(regions, p, [](const LocalRegion& r) { return r.info.size; });
    }

    // One request, its reply of type M (or the server's ErrorReply, or a transport failure).
    template <class M>
    [[nodiscard]] Result<M> call_for(const Request& request, std::vector<UniqueFd>* fds = nullptr) {
      auto reply = call(request, fds);
      if (!reply) {
        return cuda::std::unexpected(std::move(reply.error()));
      }
      if (auto* e = std::get_if<ErrorReply>(&*reply)) {
        return fail(e->code, std::move(e->message));
      }
      if (auto* m = std::get_if<M>(&*reply)) {
        return std::move(*m);
      }
      lose_connection();
      return fail(Errc::bad_message, "carve-served answered with the wrong message type");
    }

    [[nodiscard]] Result<Reply> call(const Request& request, std::vector<UniqueFd>* fds) {
      if (!socket) {
        return not_connected();
      }
      sequence = sequence == std::numeric_limits<std::uint32_t>::max() ? 1 : sequence + 1;
      const std::uint32_t seq = sequence;
      if (const int e = send_message(socket.get(), encode(request, seq)); e != 0) {
        return e == EPIPE || e == ECONNRESET ? server_hung_up()
                                             : lost("cannot send to carve-served: " + detail::errno_text(e));
      }
      const auto deadline = std::chrono::steady_clock::now() + options.timeout + extra_wait;
      for (;;) {
        std::vector<UniqueFd> received;
        auto message = next_message(deadline, received);
        if (!message) {
          return cuda::std::unexpected(std::move(message.error()));
        }
        if (auto* notice = std::get_if<SegmentsRetired>(&message->body); notice != nullptr && message->sequence == 0) {
          unmap_retired(notice->segments);
          continue;
        }
        if (auto* why = std::get_if<ErrorReply>(&message->body); why != nullptr && message->sequence == 0) {
          return hung_up(*why); // refused, or the server is shutting down
        }
        if (message->sequence != seq) {
          return lost("carve-served answered request " + std::to_string(message->sequence) + " while " +
                      std::to_string(seq) + " was pending");
        }
        if (fds != nullptr) {
          *fds = std::move(received);
        }
        return std::move(message->body);
      }
    }

    [[nodiscard]] Result<Decoded<Reply>> next_message(std::chrono::steady_clock::time_point deadline,
                                                      std::vector<UniqueFd>& fds) {
      for (;;) {
        const auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
        pollfd p{socket.get(), POLLIN, 0};
        const int ready = ::poll(&p, 1, static_cast<int>(std::max<std::int64_t>(left.count(), 0)));
        if (ready < 0 && errno == EINTR) {
          continue;
        }
        if (ready == 0) {
          return lost("no reply from carve-served within " + std::to_string(options.timeout.count()) + " ms");
        }
        const ReceivedMessage r = receive_message(socket.get(), buffer, fds);
        if (r.closed || r.error == ECONNRESET) {
          return server_hung_up();
        }
        if (r.error != 0 || r.truncated) {
          return lost(r.error != 0 ? "cannot read from carve-served: " + detail::errno_text(r.error)
                                   : "carve-served sent an oversized message");
        }
        auto decoded = decode_reply(std::span<const std::uint8_t>(buffer.data(), r.size));
        if (!decoded) {
          return lost("carve-served sent a message that does not decode: " + decoded.error().message);
        }
        return std::move(*decoded);
      }
    }

    // The connection is gone. A server that hangs up says why first (an ErrorReply with
    // sequence 0) when it can; a reset is reported before the data that is still queued.
    cuda::std::unexpected<Error> server_hung_up() {
      if (const auto why = goodbye()) {
        return hung_up(*why);
      }
      return lost("carve-served closed the connection (it stopped or restarted)");
    }
    std::optional<ErrorReply> goodbye() {
      for (int resets = 0;;) {
        std::vector<UniqueFd> fds;
        const ReceivedMessage r = receive_message(socket.get(), buffer, fds, true);
        if (r.error == ECONNRESET && ++resets < 2) {
          continue;
        }
        if (r.error != 0 || r.closed || r.truncated) {
          return std::nullopt;
        }
        auto decoded = decode_reply(std::span<const std::uint8_t>(buffer.data(), r.size));
        if (!decoded) {
          return std::nullopt;
        }
        if (auto* why = std::get_if<ErrorReply>(&decoded->body); why != nullptr && decoded->sequence == 0) {
          return *why;
        }
      }
    }

    // Reads notices that are already there, without waiting.
    std::size_t drain_notices() {
      std::size_t unmapped = 0;
      while (socket) {
        std::vector<UniqueFd> fds;
        const ReceivedMessage r = receive_message(socket.get(), buffer, fds, true);
        if (r.error == EAGAIN || r.error == EWOULDBLOCK) {
          break;
        }
        if (r.closed || r.error != 0 || r.truncated) {
          lose_connection();
          break;
        }
        auto decoded = decode_reply(std::span<const std::uint8_t>(buffer.data(), r.size));
        auto* notice = decoded ? std::get_if<SegmentsRetired>(&decoded->body) : nullptr;
        if (notice == nullptr || decoded->sequence != 0) {
          lose_connection(); // nothing but notices can be waiting between calls
          break;
        }
        unmapped += unmap_retired(notice->segments);
      }
      return unmapped;
    }

    std::size_t unmap_retired(const std::vector<SegmentId>& retired) {
      std::vector<SegmentId> done;
      for (const SegmentId id : retired) {
        const auto it = by_segment.find(id);
        if (it == by_segment.end()) {
          continue;
        }
        const auto s = segments.find(it->second); // every by_segment entry names a mapped segment
        if (s->second.live != 0) {
          continue; // a retired segment holds no regions; ignore a notice that says otherwise
        }
        unmap_segment(s->second.mapping);
        segments.erase(s);
        by_segment.erase(it);
        done.push_back(id);
      }
      unmapped(done);
      return done.size();
    }

    // Tells the server these segments are not mapped here (no reply).
    void unmapped(std::vector<SegmentId> ids) {
      if (ids.empty() || !socket) {
        return;
      }
      sequence = sequence == std::numeric_limits<std::uint32_t>::max() ? 1 : sequence + 1;
      if (send_message(socket.get(), encode(Request{Unmapped{std::move(ids)}}, sequence)) != 0) {
        lose_connection();
      }
    }

    // A segment this process holds no region in is unmapped at once (the server gives each
    // region a segment of its own, so the segment of a freed region is done with), and the server
    // is told, so that it can end the lease.
    void release_segment_use(std::uint64_t key, SegmentId id) {
      LocalSegment& s = segments.find(key)->second; // a region's segment stays mapped while it lives
      if (--s.live != 0) {
        return;
      }
      const bool orphan = s.orphan;
      unmap_segment(s.mapping);
      segments.erase(key);
      if (!orphan) {
        by_segment.erase(id);
        unmapped({id});
      }
    }

    // The server is gone (or this side hung up): regions become orphans, idle mappings go.
    void lose_connection() {
      socket.reset();
      for (auto& [p, r] : regions) {
        r.orphan = true;
      }
      by_segment.clear();
      for (auto it = segments.begin(); it != segments.end();) {
        if (it->second.live == 0) {
          unmap_segment(it->second.mapping);
          it = segments.erase(it);
        } else {
          it->second.orphan = true;
          ++it;
        }
      }
    }

    // The server said why it closes the connection (an ErrorReply with sequence 0).
    cuda::std::unexpected<Error> hung_up(const ErrorReply& why) {
      lose_connection();
      return fail(why.code, "carve-served closed the connection: " + why.message);
    }
    cuda::std::unexpected<Error> lost(std::string why) {
      lose_connection();
      return fail(Errc::disconnected, std::move(why));
    }
    cuda::std::unexpected<Error> not_connected() const {
      return fail(Errc::disconnected,
                  "not connected to carve-served at " + options.socket_path.string() + "; call reconnect()");
    }

    ClientOptions options;
    std::chrono::milliseconds extra_wait{0}; // on top of options.timeout, for a call answered late
    mutable std::mutex mutex;
    UniqueFd socket;
    HelloReply hello;
    std::uint32_t sequence = 0;
    std::vector<std::uint8_t> buffer = std::vector<std::uint8_t>(max_message_size);
    std::map<std::uintptr_t, LocalRegion> regions;            // by pointer in this process
    std::unordered_map<std::uint64_t, LocalSegment> segments; // by local key
    std::unordered_map<SegmentId, std::uint64_t> by_segment;  // this session's segment ids -> key
    std::uint64_t next_key = 1;
  };

  explicit AllocationClient(ClientOptions options) : state_(std::make_unique<State>(std::move(options))) {}

  std::unique_ptr<State> state_;
};

static_assert(UpstreamResource<AllocationClient> && OwnsMemory<AllocationClient> &&
              ChecksDeallocation<AllocationClient>);

} // namespace carve::service

namespace carve {
/// The client beside the other building blocks; its options stay in carve::service.
using service::AllocationClient;
} // namespace carve
