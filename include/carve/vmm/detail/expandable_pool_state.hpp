// carve/vmm/detail/expandable_pool_state.hpp — what an ExpandablePool remembers: one reservation
// per stream (made on first use) with its free ranges and fence, the live blocks, the frees waiting on other streams'
// work, the idle chunks, the devices granted and the counters, with the figures and invariants
// stats() and consistent() report. The pool's rules are in carve/vmm/expandable_pool.hpp.
#pragma once

#include <carve/core/errc.hpp>
#include <carve/mr/best_fit_ranges.hpp>
#include <carve/mr/detail/address_table.hpp>
#include <carve/mr/detail/cross_stream_frees.hpp>
#include <carve/mr/detail/stream_fence.hpp>
#include <carve/mr/memory_resource.hpp>
#include <carve/vmm/detail/hole_lending.hpp>
#include <carve/vmm/detail/idle_chunks.hpp>
#include <carve/vmm/detail/recent_frees.hpp>
#include <carve/vmm/expandable_pool_options.hpp>
#include <carve/vmm/on_demand_reservation.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace carve::detail {

// An ExpandablePool's tables (behind one pointer, so the pool moves as a pointer does).
template <class Mapper, class Streams>
struct ExpandablePoolState {
  using stream_type = typename Streams::stream_type;

  // A reservation: a stream's, or (nullopt) the synchronous spellings'.
  struct Space {
    std::optional<stream_type> stream;
    OnDemandReservation<Mapper> memory;
    BestFitRanges free;
    StreamFence<Streams> fence; // which frees the stream's work has passed
    LentHoles lent;             // holes mapped a second time, kept out of best fit's way
    WatchedChunks watched;      // lent holes' chunks and second mappings, with their blocks
    RecentFrees recent;         // what the stream freed since its work last caught up
  };
  struct Live {
    std::size_t size = 0;             // rounded to the granularity
    BestFitRanges::Handle handle = 0; // its range in the reservation
    std::uint32_t space = 0;          // index into spaces
  };
  struct Freed { // a block freed on another stream than its reservation's
    BestFitRanges::Handle handle = 0;
    std::uint32_t space = 0;
  };

  // A mapper that says it cannot map part of an allocation never gets a hole to lend.
  ExpandablePoolState(Mapper m, Streams s, ExpandablePoolOptions o)
      : mapper(std::move(m)), streams(std::move(s)), options(o),
        lending_refused(o.lend_min_bytes != SIZE_MAX && !may_map_partial_allocations(mapper, o.device)) {}

  Mapper mapper;
  Streams streams;
  ExpandablePoolOptions options;
  std::size_t granule = 0;
  mutable std::mutex mutex;
  std::vector<std::unique_ptr<Space>> spaces;
  AddressTable<Live> live;
  CrossStreamFrees<Streams, Freed> pending;
  IdleChunks idle;    // kept only with a finite release_threshold
  struct Homecoming { // a chunk whose holes may come home once its stream's work passes free `since`
    std::uint32_t space = 0;
    std::uintptr_t home = 0;
    std::uint64_t since = 0;
  };
  std::vector<Homecoming> deferred;                             // ready at a free whose stream's work had not run
  std::vector<std::uintptr_t> homes;                            // find_ready_homes's answer, reused
  std::vector<std::pair<std::uintptr_t, std::size_t>> homeward; // find_homeward's answer, reused
  std::uint64_t frees = 0; // successful frees so far: the clock that chunks and fences are timed by
  std::size_t reserved = 0;
  bool held = false;            // hold(): nothing is unmapped
  bool lending_refused = false; // the mapper cannot map part of an allocation: no hole is lent
  std::uint64_t peers = 0;      // bit d: device d is granted every chunk (grant_access)
  ExpandablePoolStats stats;    // the counters kept here; the rest is filled in by stats()

  static constexpr std::uint32_t no_space = UINT32_MAX; // space_for: the mapper refused the addresses

  // The reservation of `stream`, made on first use (and opened to the granted devices); no_space
  // when the mapper refuses it. Under the lock.
  std::uint32_t space_for(const std::optional<stream_type>& stream) {
    for (std::uint32_t i = 0; i < spaces.size(); ++i) {
      const auto& own = spaces[i]->stream;
      if (own.has_value() == stream.has_value() && (!own || *own == *stream)) {
        return i;
      }
    }
    return add_space(stream);
  }
  // space_for's first use of `stream`: kept out of line, so the search above inlines into every
  // allocation.
  [[gnu::noinline]] std::uint32_t add_space(const std::optional<stream_type>& stream) {
    auto memory = OnDemandReservation<Mapper>::reserve(mapper, options.device, options.address_space_bytes);
    if (!memory) {
      return no_space;
    }
    for (int peer = 0; peer < OnDemandReservation<Mapper>::max_peers; ++peer) {
      if ((peers >> peer & 1u) != 0) {
        (void)memory->grant(peer); // no chunk yet: nothing to refuse
      }
    }
    const std::uintptr_t base = memory->base();
    const std::size_t size = memory->bytes();
    spaces.push_back(std::make_unique<Space>(Space{stream,
                                                   std::move(*memory),
                                                   BestFitRanges(base, size),
                                                   {},
                                                   {},
                                                   WatchedChunks(base, granule, options.bring_holes_home),
                                                   {}}));
    return static_cast<std::uint32_t>(spaces.size() - 1);
  }

  // Whether memory of `space` freed by free number `since` may be unmapped: its stream's work
  // before that free has run (StreamFence). `wait`: block until then, where the Streams can. The
  // synchronous reservation's frees all came after the caller synchronised.
  bool settled(Space& space, std::uint64_t since, bool wait) noexcept {
    return !space.stream || space.fence.settled(streams, *space.stream, since, frees, wait);
  }
  // The idle chunks of every reservation, highest addresses first (best fit reaches them last);
  // without `all`, only those of reservations whose stream's work has run (asked without waiting).
  std::vector<IdleChunks::Chunk> idle_chunks(bool all) noexcept {
    std::vector<IdleChunks::Chunk> chunks;
    for (std::uint32_t i = 0; i < spaces.size(); ++i) {
      Space& space = *spaces[i];
      const std::size_t found = chunks.size();
      find_idle_chunks(space.free, space.memory, i, chunks);
      if (!all && chunks.size() != found && !settled(space, frees, false)) { // asked only where it matters
        chunks.resize(found);
      }
    }
    std::sort(chunks.begin(), chunks.end(), [](const auto& a, const auto& b) { return a.start > b.start; });
    return chunks;
  }
  // Whether the idle chunk [start, start + bytes) of `space` may be unmapped, waiting where the
  // Streams can for the work queued before the last free that touched it, not for what the stream
  // queued after (the device keeps that work while the host unmaps and maps).
  bool chunk_settled(Space& space, std::uintptr_t start, std::size_t bytes) noexcept {
    if (!space.stream) {
      return true;
    }
    space.recent.forget_through(space.fence.settled_through());
    return settled(space, space.recent.started() ? space.recent.last_touching(start, bytes) : frees, true);
  }
  // The block [start, start + bytes) of `space` is free again as free number `frees`: remembered
  // until the stream's work passes it, with an event after it every few frees (not while held),
  // once the pool has had to wait for the stream: a pool that never waits pays for no event (a
  // driver call each), and its first wait is for everything queued.
  void note_release(Space& space, std::uintptr_t start, std::size_t bytes) noexcept {
    if (!space.stream || space.fence.waits() == 0) {
      return;
    }
    space.recent.note(start, bytes, frees);
    if (!held) {
      space.fence.mark(streams, *space.stream, frees, mark_every);
      space.recent.forget_through(space.fence.settled_through());
    }
  }
  // Frees between the events note_release records: a wait for a chunk waits for work queued up to
  // this many frees after its last one (one event per 16 frees: ~70 per GPT-2 training step).
  static constexpr std::uint64_t mark_every = 16;

  // Whether the options lend and the mapper has not refused it.
  bool lends() const noexcept {
    return options.lend_min_bytes != std::numeric_limits<std::size_t>::max() && !lending_refused;
  }
  // Whether spaces[space] has holes to lend (false where the list cannot grow).
  bool has_holes(std::uint32_t space) const noexcept {
    try {
      const Space& s = *spaces[space];
      return !find_holes(s.free, s.memory).empty();
    } catch (const std::bad_alloc&) {
      return false;
    }
  }

  // A block of [addr, addr + size) in `space` is gone: whether chunks whose holes are lent may
  // bring them home now, those chunks in `homes`. Where the list cannot grow, none (their holes
  // stay lent until trim() or the headroom line).
  bool find_ready_homes(Space& space, std::uintptr_t addr, std::size_t size) noexcept {
    homes.clear();
    try {
      if (space.watched.remove(addr, size)) {
        space.watched.for_each_ready_in(addr, size, [&](std::uintptr_t home) {
          if (std::find(homes.begin(), homes.end(), home) == homes.end()) {
            homes.push_back(home);
          }
        });
      }
    } catch (const std::bad_alloc&) {
      homes.clear();
      for (Homecoming& d : deferred) { // one may be a chunk just left unused: not before this free's work
        if (spaces[d.space].get() == &space) {
          d.since = frees;
        }
      }
    }
    return !homes.empty();
  }
  // Maps holes of spaces[space] under the unmapped granules of the block [addr, addr + size)
  // (detail::lend_holes) where they are due: past the headroom line for a block of lend_min_bytes
  // or more that needs `need` bytes mapped, and for any block the device has refused memory
  // (`refused`): on a full card, what live blocks leave unused still holds it. Returns whether it
  // tried.
  bool lend_holes(std::uint32_t space, std::uintptr_t addr, std::size_t size, std::size_t need, bool refused) noexcept {
    const bool large = size >= options.lend_min_bytes && reserved + need > headroom_line(size);
    if (!(large || refused) || !lends()) {
      return false;
    }
    Space& s = *spaces[space];
    detail::lend_holes(s.free, s.memory, s.lent, s.watched, idle, space, addr, size, lending_refused);
    return true;
  }
  // The second mappings (start, bytes) to unmap so that the holes of the chunk at `home` come
  // home (find_homecomings): none where it is no longer ready or the list cannot grow.
  const std::vector<std::pair<std::uintptr_t, std::size_t>>& find_homeward(Space& space, std::uintptr_t home) noexcept {
    homeward.clear();
    try {
      find_homecomings(space.memory, space.lent, space.watched, home, homeward);
    } catch (const std::bad_alloc&) {
      homeward.clear();
    }
    return homeward;
  }
  // The chunk at `home` of spaces[space] is ready to bring its holes home at free number `frees`
  // (now), but the stream's work may still use them: later. Where the list cannot grow, its holes
  // stay lent until trim() or the headroom line.
  void defer_home(std::uint32_t space, std::uintptr_t home) noexcept {
    for (Homecoming& d : deferred) {
      if (d.space == space && d.home == home) {
        d.since = frees;
        return;
      }
    }
    try {
      deferred.push_back(Homecoming{space, home, frees});
    } catch (const std::bad_alloc&) {
    }
  }

  // Why `found` (the live block at an address, null for none) may not be freed as `bytes` at
  // `alignment`: not_allocated, invalid_size, or Errc{} (no reason) when it may.
  Errc refusal(const Live* found, std::size_t bytes, std::size_t alignment) const noexcept {
    return found == nullptr                                                   ? Errc::not_allocated
           : valid_request(bytes, alignment) && rounded(bytes) == found->size ? Errc{}
                                                                              : Errc::invalid_size;
  }

  // `bytes` rounded up to the granularity (a power of two); 0 when that overflows.
  std::size_t rounded(std::size_t bytes) const noexcept {
    const std::size_t g = options.granularity;
    return bytes > std::numeric_limits<std::size_t>::max() - (g - 1) ? 0 : (bytes + g - 1) & ~(g - 1);
  }

  // The most the pool maps before it unmaps idle chunks to map more, for a block of `size`.
  std::size_t headroom_line(std::size_t size) const noexcept {
    return detail::headroom_line(std::max(stats.peak_in_use, stats.bytes_in_use + size), options.headroom_permille);
  }

  // ExpandablePool::last_failure, under the lock: the last reservation's whose mapper refused.
  std::string last_failure() const {
    std::string why;
    for (const auto& space : spaces) {
      why = space->memory.last_failure().empty() ? why : space->memory.last_failure();
    }
    return why;
  }

  // ExpandablePool::grant_access for a device in [0, 64), under the lock.
  Result<void> grant(int device) {
    for (std::size_t i = 0; i < spaces.size(); ++i) {
      if (auto ok = spaces[i]->memory.grant(device); !ok) {
        while (i-- > 0) {
          spaces[i]->memory.revoke(device);
        }
        return ok;
      }
    }
    peers |= device == options.device ? 0 : std::uint64_t{1} << device; // for reservations made later
    return {};
  }

  // ExpandablePool::stats, under the lock.
  ExpandablePoolStats figures() const {
    ExpandablePoolStats out = stats;
    out.bytes_reserved = reserved;
    out.live_blocks = live.size();
    out.pending_frees = pending.size();
    out.address_spaces = spaces.size();
    out.lending_refused = lending_refused;
    for (const auto& space : spaces) {
      out.chunks += space->memory.chunk_count();
      out.address_space_bytes += space->memory.bytes();
      out.free_ranges += space->free.count();
      for (const auto& [start, hole] : space->lent) {
        out.lent_bytes += hole.bytes;
      }
      out.add_calls(space->memory.counts());
      out.stream_waits += space->fence.waits();
    }
    return out;
  }

  // ExpandablePool::consistent, under the lock.
  bool consistent() const {
    std::size_t in_use = 0;
    std::size_t taken = pending.size();
    bool ok = true;
    live.for_each([&](std::uintptr_t addr, const Live& block) {
      const Space& space = *spaces[block.space];
      ok = ok && space.free.start(block.handle) == addr && space.free.size(block.handle) == block.size &&
           space.memory.backed(addr, block.size);
      in_use += block.size;
      ++taken;
    });
    std::size_t mapped = 0;
    std::size_t taken_ranges = 0;
    for (std::uint32_t i = 0; i < spaces.size(); ++i) { // each watched chunk counts the blocks on it
      const bool busy_right =
          spaces[i]->watched.for_each([&](std::uintptr_t start, std::size_t bytes, std::size_t users) {
            const auto on = [&](std::uintptr_t a, std::size_t n) { return a < start + bytes && a + n > start; };
            std::size_t blocks = 0;
            live.for_each([&](std::uintptr_t a, const Live& b) { blocks += b.space == i && on(a, b.size) ? 1u : 0u; });
            (void)pending.any_of([&](const Freed& f) {
              const BestFitRanges& r = spaces[f.space]->free;
              blocks += f.space == i && on(r.start(f.handle), r.size(f.handle)) ? 1u : 0u;
              return false;
            });
            ok = ok && blocks == users;
          });
      ok = ok && busy_right;
    }
    for (const auto& space : spaces) {
      ok = ok && space->free.consistent() && space->memory.consistent();
      mapped += space->memory.mapped_bytes();
      taken_ranges += space->free.taken();
      taken += space->lent.size();
      for (const auto& hole : space->lent) { // its chunk stays mapped while its memory is lent
        const std::uintptr_t end = hole.first + hole.second.bytes;
        bool home = false;
        space->memory.for_each_chunk_in(
            hole.first, 1, [&](std::uintptr_t c, std::size_t n) { home = !space->memory.lent_at(c) && end <= c + n; });
        ok = ok && home;
      }
    }
    return ok && taken == taken_ranges && in_use == stats.bytes_in_use && mapped == reserved;
  }
};

} // namespace carve::detail
