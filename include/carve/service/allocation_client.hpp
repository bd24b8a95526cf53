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
#include <carve/mr/memory_resource.hpp>
#include <carve/service/client_mappings.hpp>
#include <carve/service/client_transport.hpp>
#include <carve/service/protocol.hpp>
#include <carve/service/segment_mapping.hpp>
#include <carve/service/unix_socket.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
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
/// MemoryResource on its default card (ClientOptions::card). Thread-safe; movable, not copyable.
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
      const detail::LocalRegion* r = state_->mappings.region_at(p);
      if (r == nullptr) {
        return cuda::std::unexpected(Errc::not_allocated);
      }
      if (r->info.size != bytes || !check_request(bytes, alignment)) {
        return cuda::std::unexpected(Errc::invalid_size);
      }
      const auto freed = state_->free(p);
      return freed ? cuda::std::expected<void, Errc>{} : cuda::std::unexpected(freed.error().code);
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
    const detail::LocalRegion* r = state_->mappings.region_holding(p);
    return r != nullptr && !r->orphan;
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
    const detail::LocalRegion* r = state_->mappings.region_holding(p);
    if (r == nullptr || r->orphan) {
      return fail(Errc::not_allocated, "no region of this client holds that address");
    }
    return state_->query(r->info.id);
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
    const detail::LocalRegion* r = state_->mappings.region_at(p);
    if (r == nullptr || r->orphan) {
      return std::nullopt;
    }
    return r->info.id;
  }

  /// Whether the connection is up as far as this side knows (a server that hung up is noticed at
  /// the next call).
  bool connected() const {
    const std::lock_guard lock(state_->mutex);
    return state_->transport.connected();
  }
  /// The server's answer to Hello (its pid, this client's id, the backend, ...).
  HelloReply server() const {
    const std::lock_guard lock(state_->mutex);
    return state_->hello;
  }
  /// Segments mapped into this process now, orphans' included.
  std::size_t mapped_segments() const {
    const std::lock_guard lock(state_->mutex);
    return state_->mappings.segment_count();
  }
  /// Every segment mapped into this process for this client: all the server's memory it can reach.
  std::vector<MappedSegment> mappings() const {
    const std::lock_guard lock(state_->mutex);
    return state_->mappings.mappings();
  }
  /// Regions this process holds, orphans included.
  std::size_t live_regions() const {
    const std::lock_guard lock(state_->mutex);
    return state_->mappings.region_count();
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
    // The reply comes when the wait ends: give it that long on top of the usual reply timeout,
    // and the server's deadline tick (at most a second) besides.
    state_->extra_wait = timeout + std::chrono::seconds(1);
    auto r = state_->call_for<Reclaimed>(request);
    state_->extra_wait = std::chrono::milliseconds{0};
    if (!r) {
      return cuda::std::unexpected(std::move(r.error()));
    }
    return r->reclaimed_regions;
  }

  // The client's state behind its mutex: the connection, and the regions mapped here. The data
  // path of a lease reads top to bottom: lease -> call_for (the transport) -> map the segment ->
  // record the region (the mappings).
  struct State {
    explicit State(ClientOptions o) : options(std::move(o)), transport(options.socket_path, options.timeout) {}
    State(const State&) = delete;
    State& operator=(const State&) = delete;

    [[nodiscard]] Result<void> open() {
      if (auto c = transport.connect(); !c) {
        return c;
      }
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

    // Asks for the region, maps its segment when it is new here, and records the region.
    [[nodiscard]] Result<Region> lease_mapped(std::size_t bytes, int card) {
      std::vector<UniqueFd> fds;
      auto r = call_for<Allocated>(Allocate{bytes, card}, &fds);
      if (!r) {
        return cuda::std::unexpected(std::move(r.error()));
      }
      const Allocated& a = *r;
      auto key = mappings.key_of(a.region.segment);
      if (a.new_mapping == key.has_value()) {
        return give_back(a.region.id, "the server's reply does not match this client's mappings");
      }
      if (a.new_mapping) {
        if (travels_as_descriptor(a.kind) && fds.size() != 1) {
          return give_back(a.region.id,
                           std::string("a new ") + to_string(a.kind) + " segment came without its descriptor");
        }
        auto m = map_segment(a, fds.empty() ? UniqueFd() : std::move(fds.front()));
        if (!m) {
          (void)give_back(a.region.id, m.error().message);
          // The server counts the segment as mapped here: say it is not, so that a later region of
          // it comes as a new mapping again.
          unmapped({a.region.segment});
          return fail(m.error().code, m.error().message);
        }
        key = mappings.add_segment(a.region.segment, *m);
      }
      void* p = mappings.add_region(a.region, *key);
      if (p == nullptr) {
        return give_back(a.region.id, "the server placed a region outside its segment");
      }
      return Region{p, a.region};
    }

    // Frees a region this client cannot use (the reply was inconsistent) and reports why.
    cuda::std::unexpected<Error> give_back(RegionId id, const std::string& why) {
      (void)call_for<Freed>(Free{id});
      return fail(Errc::bad_message, why);
    }

    [[nodiscard]] Result<void> free(void* p) {
      const detail::LocalRegion* r = mappings.region_at(p);
      if (r == nullptr) {
        return fail(Errc::not_allocated, "this client holds no region starting at that address");
      }
      if (!r->orphan) {
        const auto freed = call_for<Freed>(Free{r->info.id});
        if (!freed && freed.error().code != Errc::disconnected) {
          return cuda::std::unexpected(freed.error());
        }
        // disconnected: lose_connection() has made the region an orphan; drop it below
      }
      if (const auto done = mappings.remove_region(p)) {
        unmapped({*done}); // its segment is unmapped here: the server can end the lease
      }
      return {};
    }

    [[nodiscard]] Result<RegionInfo> query(RegionId id) {
      auto r = call_for<QueryReply>(Query{id});
      if (!r) {
        return cuda::std::unexpected(std::move(r.error()));
      }
      return r->region;
    }

    // One request, its reply of type M (or the server's ErrorReply, or a transport failure,
    // after which this session's regions are orphans).
    template <class M>
    [[nodiscard]] Result<M> call_for(const Request& request, std::vector<UniqueFd>* fds = nullptr) {
      auto reply = transport.call(request, fds, extra_wait,
                                  [this](const SegmentsRetired& notice) { unmap_retired(notice.segments); });
      if (!reply) {
        lose_connection();
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

    // Handles the notices that have arrived, without waiting; returns the segments unmapped.
    std::size_t drain_notices() {
      std::size_t unmapped_now = 0;
      transport.drain([&](const SegmentsRetired& notice) { unmapped_now += unmap_retired(notice.segments); });
      if (!transport.connected()) {
        lose_connection();
      }
      return unmapped_now;
    }

    std::size_t unmap_retired(const std::vector<SegmentId>& retired) {
      const std::vector<SegmentId> done = mappings.unmap_retired(retired);
      unmapped(done);
      return done.size();
    }

    // Tells the server these segments are not mapped here (no reply).
    void unmapped(std::vector<SegmentId> ids) {
      if (!ids.empty() && transport.connected() && !transport.notify(Request{Unmapped{std::move(ids)}})) {
        lose_connection();
      }
    }

    // The server is gone (or this side hung up): regions become orphans, idle mappings go.
    void lose_connection() {
      transport.hang_up();
      mappings.orphan_all();
    }

    ClientOptions options;
    std::chrono::milliseconds extra_wait{0}; // on top of options.timeout, for a call answered late
    mutable std::mutex mutex;
    HelloReply hello;
    detail::ClientMappings mappings; // unmapped after the transport below hangs up
    detail::ClientTransport transport;
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
