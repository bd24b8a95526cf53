/// @file carve/vmm/expandable_pool.hpp
/// A pool whose physical memory follows its live blocks: best fit over one address reservation
/// per stream, memory mapped where requests land and unmapped where whole chunks fall idle.
///
/// @code
/// carve::ExpandablePool<carve::CudaMemoryMapper> pool(carve::CudaMemoryMapper{}, {.device = 0});
/// carve::ExpandablePool<carve::HostMemoryMapper> twin(carve::HostMemoryMapper{});  // the host twin
/// void* p = *twin.try_allocate(3 << 20, 256);   // maps the granules it lands on
/// twin.deallocate(p, 3 << 20, 256);             // free; the memory stays mapped for reuse
/// twin.trim();                                  // unmaps every idle chunk
/// @endcode
/// A caching pool over cudaMalloc holds segments it cannot give back while any block in them
/// lives, nor join with their neighbours. Here the addresses are one reservation per stream
/// (OnDemandReservation): every free range joins its neighbours, and a request is placed best fit
/// (smallest hole first, lowest address among equals; the untouched end is used last). Memory is
/// separate: a block's granules are mapped where it lands, in chunks (growth_divisor says how
/// large), and a chunk is unmapped only once no block touches it: on trim(), beyond
/// release_threshold, when the device refuses memory, or to stay under the headroom line (the
/// running peak of live bytes plus headroom_permille of it). A chunk stops at the line; a request
/// that must map past it first unmaps idle chunks, highest addresses first, and a large one
/// (lend_min_bytes) then maps holes, unused granules of chunks live blocks pin, a second time
/// (detail/hole_lending.hpp); a request the device refuses is retried after idle chunks are
/// unmapped, mapping holes first whatever its size. With bring_holes_home, once no block touches a
/// hole's chunk nor the second mappings of its holes, those are unmapped and the chunk is whole again.
/// What is mapped: the live blocks, the holes, idle chunks and the headroom.
///
/// Streams: a block allocated on stream S comes from S's reservation; freed on S, S may reuse it
/// at once; freed on another stream T, it waits for an event recorded on T at the free; freed
/// synchronously, it is free at once. Memory moves between streams by unmapping idle chunks in one
/// reservation and mapping new ones in another. Nothing is unmapped before its stream's work
/// queued before the frees that left it unused has run: trim(), the retry under pressure, the
/// headroom line and destruction wait for that where the Streams can (StreamEventsThatWait:
/// CudaStreams), the line after its first wait for the work before a chunk's last free only (on
/// events recorded every few frees: the device keeps what was queued after; checked over
/// simulated streams, not yet on a card); the release threshold and holes coming home never wait
/// (they unmap at a later free or allocation). The synchronous spellings have a reservation of
/// their own; the default SynchronousStreams has one stream whose events are always complete.
///
/// Errors (no block is made and nothing is lost; the idle chunks unmapped in trying stay
/// unmapped): invalid_size (check_request, or a size that overflows when rounded); no_space for
/// an alignment above the device's granularity, a full address space, or physical memory refused
/// by the device or by max_reserved_bytes after idle chunks were unmapped (the mapper's last
/// refusal is in last_failure()). try_deallocate (nothing changes): not_allocated for a pointer
/// that is no live block, invalid_size for bytes that do not round to its size. Thread-safe (one
/// lock; driver calls are made under it). Movable, not copyable; a moved-from pool may only be
/// destroyed or assigned to. Destruction waits for the streams' work on freed blocks (where the
/// Streams can) and unmaps everything: blocks still out are invalid with it.
#pragma once

#include <carve/core/error.hpp>
#include <carve/core/misuse.hpp>
#include <carve/mr/best_fit_ranges.hpp>
#include <carve/mr/cuda_mr.hpp>
#include <carve/mr/detail/address_table.hpp>
#include <carve/mr/memory_resource.hpp>
#include <carve/mr/stream_events.hpp>
#include <carve/vmm/detail/expandable_pool_state.hpp>
#include <carve/vmm/expandable_pool_options.hpp>
#include <carve/vmm/on_demand_reservation.hpp>
#include <carve/vmm/physical_memory_mapper.hpp>

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

namespace carve {

/// A MemoryResource whose physical memory follows its live blocks (see the file's description).
template <PhysicalMemoryMapper Mapper, StreamEvents Streams = SynchronousStreams>
class ExpandablePool : public StreamOrderedSpellings<ExpandablePool<Mapper, Streams>, typename Streams::stream_type> {
public:
  /// The name misuse reports give.
  static constexpr const char* resource_name = "carve::ExpandablePool::deallocate";
  using stream_type = typename Streams::stream_type; ///< the stream type the stream-ordered spellings name

  /// Nothing reserved yet (the first allocation on each stream reserves its addresses); where the options
  /// lend, the mapper is asked whether it maps part of an allocation. Throws carve::Exception: the mapper's
  /// error when it has no such device; invalid_argument for a granularity that is not a power of two or
  /// exceeds the device's, or an address space smaller than one granule.
  explicit ExpandablePool(Mapper mapper, ExpandablePoolOptions options = {}, Streams streams = Streams())
      : s_(std::make_unique<State>(std::move(mapper), std::move(streams), options)) {
    const auto g = s_->mapper.granularity(options.device);
    if (!g) {
      throw Exception(g.error().code, "carve::ExpandablePool: " + g.error().message);
    }
    s_->granule = *g;
    s_->options = resolved(options, *g);
  }

  ExpandablePool(ExpandablePool&&) noexcept = default; ///< the other may only be destroyed or assigned to
  /// Closes this pool (as its destructor does), then takes over the other's.
  ExpandablePool& operator=(ExpandablePool&& other) noexcept {
    if (this != &other) {
      close();
      s_ = std::move(other.s_);
    }
    return *this;
  }
  /// Waits for the streams' work on freed blocks where the Streams can, then unmaps everything.
  ~ExpandablePool() { close(); }

  /// A block on `stream`. Errors: see the top of this header.
  [[nodiscard]] cuda::std::expected<void*, Errc> try_allocate(stream_type stream, std::size_t bytes,
                                                              std::size_t alignment) noexcept {
    Errc why{};
    return detail::allocation_answer(take(stream, bytes, alignment, why), why);
  }
  /// Frees `p` for work queued on `stream` after the work that used it. Errors: see try_deallocate.
  [[nodiscard]] cuda::std::expected<void, Errc> try_deallocate(stream_type stream, void* p, std::size_t bytes,
                                                               std::size_t alignment) noexcept {
    return give(stream, p, bytes, alignment);
  }
  /// What try_deallocate(stream, p, bytes, alignment) would say now, without freeing anything:
  /// success, not_allocated or invalid_size. For a caller that holds a free to make it later.
  [[nodiscard]] cuda::std::expected<void, Errc> check_deallocate(void* p, std::size_t bytes,
                                                                 std::size_t alignment) const noexcept {
    const std::lock_guard lock(s_->mutex);
    return detail::answered(s_->refusal(s_->live.find(reinterpret_cast<std::uintptr_t>(p)), bytes, alignment));
  }
  /// The synchronous form: a block from the synchronous reservation.
  [[nodiscard]] cuda::std::expected<void*, Errc> try_allocate(std::size_t bytes, std::size_t alignment) noexcept {
    Errc why{};
    return detail::allocation_answer(take(std::nullopt, bytes, alignment, why), why);
  }
  /// The synchronous free: the caller has synchronised, so the block is free at once.
  [[nodiscard]] cuda::std::expected<void, Errc> try_deallocate(void* p, std::size_t bytes,
                                                               std::size_t alignment) noexcept {
    return give(std::nullopt, p, bytes, alignment);
  }

  /// Unmaps every chunk no block touches (frees whose stream work has completed count as free),
  /// first waiting for the streams' work on freed blocks where the Streams can wait (without
  /// that, a reservation whose stream is still busy keeps its chunks); returns the bytes unmapped.
  std::size_t trim() noexcept {
    const std::lock_guard lock(s_->mutex);
    try {
      collect_pending();
    } catch (const std::bad_alloc&) { // frees whose event could not be recorded stay pending
    }
    return release_idle(true);
  }

  /// Lets `device` (a peer GPU, whose kernels and copies fault on memory not granted to it;
  /// cudaDeviceEnablePeerAccess opens cudaMalloc memory only) read and write every chunk mapped
  /// now or later, as the pool's own device does. Granting the own device or one already granted
  /// does nothing; a later chunk the driver refuses to open to `device` stays, closed to it
  /// (ExpandablePoolStats::peer_refusals). Errors: invalid_argument for a device outside [0, 64);
  /// the mapper's, after the chunks opened so far are closed again (where the mapper lets them).
  [[nodiscard]] Result<void> grant_access(int device) {
    if (device < 0 || device >= OnDemandReservation<Mapper>::max_peers) {
      return fail(Errc::invalid_argument, "grant_access: device " + std::to_string(device) + " is outside [0, 64)");
    }
    const std::lock_guard lock(s_->mutex);
    return s_->grant(device);
  }

  /// While `held`, the pool unmaps nothing (not for the headroom line, the release threshold,
  /// trim() or the retry under pressure, which then refuses) and records no event (a block freed
  /// on another stream waits for the end of the hold to record its event). For a CUDA stream
  /// capture: the unmapping and the events must not land in the graph. Mapping goes on.
  void hold(bool held) noexcept {
    const std::lock_guard lock(s_->mutex);
    s_->held = held;
  }

  /// The figures now, taken under the lock.
  ExpandablePoolStats stats() const {
    const std::lock_guard lock(s_->mutex);
    return s_->figures();
  }

  /// Calls `visit(start, bytes)` for every chunk mapped now (holes mapped again among them), by
  /// reservation and address: where the pool's memory is (a test's or a debugger's view).
  template <class Visit>
  void for_each_chunk(Visit&& visit) const {
    const std::lock_guard lock(s_->mutex);
    for (const auto& space : s_->spaces) {
      space->memory.for_each_chunk(visit);
    }
  }

  /// Whether `p` lies in physical memory this pool has mapped (a block, a hole or an idle chunk).
  bool owns(const void* p) const noexcept {
    const std::lock_guard lock(s_->mutex);
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    return std::any_of(s_->spaces.begin(), s_->spaces.end(),
                       [a](const auto& space) { return space->memory.backed(a, 1); });
  }
  /// What it may still hand out: max_reserved_bytes less the bytes in live blocks (a hint).
  std::size_t free_bytes() const {
    const std::lock_guard lock(s_->mutex);
    return s_->options.max_reserved_bytes - s_->stats.bytes_in_use;
  }
  /// max_reserved_bytes: what it could ever hold.
  std::size_t capacity() const noexcept { return s_->options.max_reserved_bytes; }
  /// The device's granularity: the unit of mapping.
  std::size_t granule() const noexcept { return s_->granule; }
  /// The options, with address_space_bytes resolved.
  const ExpandablePoolOptions& options() const noexcept { return s_->options; }
  /// The streams and events (a test's SimulatedStreams, to queue and complete work).
  Streams& streams() noexcept { return s_->streams; }
  /// Why the mapper last refused (empty when it never did).
  std::string last_failure() const {
    const std::lock_guard lock(s_->mutex);
    return s_->last_failure();
  }

  /// Checks every invariant: each reservation's ranges tile it (BestFitRanges::consistent), every
  /// live block is a taken range of its reservation at its address and its granules are mapped,
  /// and the counts add up. For tests.
  bool consistent() const {
    const std::lock_guard lock(s_->mutex);
    return s_->consistent();
  }

  /// Equal only to itself.
  friend bool operator==(const ExpandablePool& a, const ExpandablePool& b) noexcept { return a.s_ == b.s_; }

private:
  using State = detail::ExpandablePoolState<Mapper, Streams>;
  using Space = typename State::Space;
  using Live = typename State::Live;
  using Freed = typename State::Freed;

  // A block, or null with `why` set. The answer leaves in a register: an expected built here
  // would be stored in pieces and read back whole, a stall per call.
  [[nodiscard]] void* take(const std::optional<stream_type>& stream, std::size_t bytes, std::size_t alignment,
                           Errc& why) noexcept {
    const std::size_t size = valid_request(bytes, alignment) ? s_->rounded(bytes) : 0;
    why = size == 0 ? Errc::invalid_size : Errc::no_space; // the answer to every null from here on
    if (size == 0 || alignment > s_->granule) { // invalid, or overflows when rounded: no resource could serve it
      return nullptr;
    }
    try {
      const std::lock_guard lock(s_->mutex);
      collect_pending();
      bring_deferred_homes();
      const std::uint32_t index = s_->space_for(stream);
      if (index == State::no_space) {
        return nullptr;
      }
      s_->live.make_room(); // once memory is mapped for the block, recording it cannot fail
      Space& space = *s_->spaces[index];
      bool lending_tried = false;
      for (int attempt = 0; attempt < 2; ++attempt) {
        const auto found = space.free.take(size, std::max(alignment, s_->options.granularity));
        if (!found) {
          break; // the address space is full: unmapping changes nothing
        }
        const std::uintptr_t start = found->start;          // field by field: a whole copy of the
        const BestFitRanges::Handle handle = found->handle; // optional, written in pieces, stalls
        std::optional<Result<std::size_t>> added;           // empty: the tables could not grow, nothing was mapped
        std::optional<std::size_t> mapped;                  // the reservation's memory before back()
        try {
          const std::size_t need = space.memory.unbacked_bytes(start, size); // idle chunks are not under it
          if (need == 0) { // as for most blocks: the memory is mapped already
            added.emplace(std::size_t{0});
          } else {
            make_headroom(need, size);
            lending_tried = s_->lend_holes(index, start, size, need, attempt > 0) || lending_tried;
            mapped = space.memory.mapped_bytes();
            added.emplace(space.memory.back(start, size, [this, size] { return chunk_rule(size); }));
          }
        } catch (const std::bad_alloc&) {
        }
        // What back() mapped, less what it unmapped of mappings the mapper had refused to undo (a
        // failed back() may leave such chunks mapped itself: idle, counted).
        s_->reserved = mapped ? s_->reserved - *mapped + space.memory.mapped_bytes() : s_->reserved;
        if (added && *added) {
          s_->live.insert(start, Live{size, handle, index});
          space.watched.add(start, size);
          note_allocation(index, start, size);
          s_->stats.refusals_served += attempt > 0 ? 1 : 0;
          return reinterpret_cast<void*>(start);
        }
        s_->stats.peak_reserved = std::max(s_->stats.peak_reserved, s_->reserved);
        space.free.give(handle);
        // Refused: idle chunks are unmapped (the holes lent to the block with them), and the block
        // tries again, mapping holes first whatever its size.
        if (release_idle(true) == 0 && (lending_tried || !s_->lends() || !s_->has_holes(index))) {
          break; // another attempt would fail the same way
        }
      }
      return nullptr;
    } catch (const std::bad_alloc&) { // the pool's own tables could not grow
      return nullptr;
    }
  }

  [[nodiscard]] cuda::std::expected<void, Errc> give(const std::optional<stream_type>& stream, void* p,
                                                     std::size_t bytes, std::size_t alignment) noexcept {
    const std::lock_guard lock(s_->mutex);
    const auto addr = reinterpret_cast<std::uintptr_t>(p);
    const Live* found = s_->live.find(addr);
    if (const Errc why = s_->refusal(found, bytes, alignment); why != Errc{}) {
      return cuda::std::unexpected(why);
    }
    const Live block = *found;
    Space& space = *s_->spaces[block.space];
    const bool now = !stream || (space.stream && *space.stream == *stream);
    if (!now) {
      try {
        s_->pending.add(s_->streams, Freed{block.handle, block.space}, *stream, !s_->held);
      } catch (const std::bad_alloc&) { // the pool's tables could not grow: the block stays live
        return cuda::std::unexpected(Errc::no_space);
      }
    }
    s_->live.erase(addr);
    ++s_->frees;
    ++s_->stats.deallocations;
    s_->stats.bytes_in_use -= block.size;
    if (now) {
      release(block.space, block.handle);
    }
    return succeeded;
  }

  // How much a chunk for a block of `size` maps: growth_divisor's share of what is held, but not
  // past the headroom line; never past the cap.
  ChunkRule chunk_rule(std::size_t size) const noexcept {
    const ExpandablePoolOptions& o = s_->options;
    const std::size_t grown = o.growth_divisor == 0 ? 0 : s_->reserved / o.growth_divisor;
    const std::size_t line = s_->headroom_line(size);
    const std::size_t room = line > s_->reserved ? line - s_->reserved : 0;
    const std::size_t limit = o.max_reserved_bytes > s_->reserved ? o.max_reserved_bytes - s_->reserved : 0;
    return ChunkRule{std::min(std::max(o.min_chunk_bytes, grown), room), limit, o.max_chunk_bytes};
  }

  // Before `need` (> 0) more bytes are mapped for a block of `size` past the headroom line: unmaps idle
  // chunks, highest addresses first (best fit reaches them last), those whose stream's work has run,
  // then the others, each once the work before its last free has run (waiting where the Streams can).
  void make_headroom(std::size_t need, std::size_t size) noexcept {
    const std::size_t line = s_->headroom_line(size);
    const auto fits = [&] { return s_->reserved <= line && need <= line - s_->reserved; };
    for (const bool wait : {false, true}) {
      if (fits() || s_->held) {
        return;
      }
      const auto idle = s_->idle_chunks(wait);
      for (auto chunk = idle.begin(); chunk != idle.end() && !fits(); ++chunk) {
        if (!wait || s_->chunk_settled(*s_->spaces[chunk->space], chunk->start, chunk->bytes)) {
          unmap_within(chunk->space, chunk->start, chunk->bytes);
        }
      }
    }
  }

  // Unmaps the chunks of `space` wholly in [start, start + bytes), a range no block touches, and
  // frees the holes whose second mappings go with them (their chunks may then go too, past
  // release_threshold); what goes comes off s_->reserved.
  void unmap_within(std::uint32_t space, std::uintptr_t start, std::size_t bytes) noexcept {
    Space& s = *s_->spaces[space];
    const std::size_t chunks = s.memory.chunk_count();
    s_->reserved -= s.memory.release_within(start, bytes);
    if (s.memory.chunk_count() != chunks) { // second mappings too, though they free no memory
      s_->idle.unmapped(space, start, bytes);
    }
    while (const auto hole = s.memory.next_returned()) {
      if (const auto kept = detail::hole_returned(s.memory, s.lent, s.watched, hole->first)) {
        note_free(space, s.free.give(*kept));
      }
    }
  }

  // A block's range free again. Lent holes whose chunk and second mappings no block touches now
  // come home (bring_holes_home) once the stream's work on the freed blocks has run (an unmap
  // under a running kernel faults): at this free where it has, else at a later allocation
  // (bring_deferred_homes). A free never waits for it.
  void release(std::uint32_t index, BestFitRanges::Handle handle) noexcept {
    Space& space = *s_->spaces[index];
    const bool ready = s_->find_ready_homes(space, space.free.start(handle), space.free.size(handle));
    s_->note_release(space, space.free.start(handle), space.free.size(handle));
    note_free(index, space.free.give(handle));
    const bool now = ready && !s_->held && s_->settled(space, s_->frees, false);
    for (const std::uintptr_t home : s_->homes) { // empty unless ready
      now ? bring_home(index, home) : s_->defer_home(index, home);
    }
  }

  // Unmaps the second mappings of the holes of the chunk at `home` in `space`, if it is still ready.
  void bring_home(std::uint32_t space, std::uintptr_t home) noexcept {
    Space& s = *s_->spaces[space];
    const std::size_t lent = s.lent.size();
    for (const auto& [at, bytes] : s_->find_homeward(s, home)) {
      unmap_within(space, at, bytes);
    }
    s_->stats.holes_home += lent - s.lent.size(); // those the mapper unmapped
  }

  // The homecomings deferred at frees whose streams' work has run since (never waits).
  void bring_deferred_homes() noexcept {
    std::size_t kept = 0;
    for (std::size_t i = 0; i < s_->deferred.size(); ++i) {
      const auto d = s_->deferred[i];
      if (s_->held || !s_->settled(*s_->spaces[d.space], d.since, false)) {
        s_->deferred[kept++] = d;
      } else {
        bring_home(d.space, d.home);
      }
    }
    s_->deferred.resize(kept);
  }

  void note_allocation(std::uint32_t space, std::uintptr_t addr, std::size_t size) {
    ExpandablePoolStats& st = s_->stats;
    ++st.allocations;
    st.bytes_in_use += size;
    st.peak_in_use = std::max(st.peak_in_use, st.bytes_in_use);
    st.peak_reserved = std::max(st.peak_reserved, s_->reserved);
    if (tracks_idle()) { // chunks under the new block are in use again
      s_->spaces[space]->memory.for_each_chunk_in(
          addr, size, [&](std::uintptr_t start, std::size_t) { s_->idle.in_use(space, start); });
    }
  }

  // With a finite release_threshold: chunks wholly in the free `span` join the idle list, and the
  // least recently idle go while it holds too much and their streams' work has run (never waits).
  void note_free(std::uint32_t space, const BestFitRanges::Span& span) noexcept {
    if (!tracks_idle()) {
      return;
    }
    s_->spaces[space]->memory.for_each_chunk_in(span.start, span.bytes, [&](std::uintptr_t start, std::size_t bytes) {
      if (start >= span.start && start + bytes <= span.start + span.bytes) {
        s_->idle.fell_idle(space, start, bytes, s_->frees, !s_->spaces[space]->memory.lent_at(start));
      }
    });
    while (!s_->held && s_->idle.bytes() > s_->options.release_threshold) {
      const auto oldest = s_->idle.oldest();
      if (!oldest || !s_->settled(*s_->spaces[oldest->space], oldest->since, false)) {
        break;
      }
      s_->idle.drop_oldest(); // even when the mapper refuses to unmap it: the loop must end
      unmap_within(oldest->space, oldest->start, oldest->bytes);
    }
  }

  bool tracks_idle() const noexcept { return s_->options.release_threshold != std::numeric_limits<std::size_t>::max(); }

  // Unmaps every idle chunk (one that lies wholly in a free range) in every reservation whose
  // stream's work on freed blocks has run (`wait`: waiting for it where the Streams can); returns
  // the bytes unmapped. Holes given back can leave their chunks idle: then it goes round again.
  std::size_t release_idle(bool wait) noexcept {
    const std::size_t before = s_->reserved;
    for (std::uint32_t i = 0; !s_->held && i < s_->spaces.size(); ++i) {
      Space& space = *s_->spaces[i];
      for (std::size_t lent = SIZE_MAX; s_->settled(space, s_->frees, wait) && lent != space.lent.size();) {
        lent = space.lent.size();
        std::vector<detail::IdleChunks::Chunk> idle;
        detail::find_idle_chunks(space.free, space.memory, i, idle); // unmapping changes the ranges
        for (const auto& chunk : idle) {
          unmap_within(i, chunk.start, chunk.bytes);
        }
      }
    }
    return before - s_->reserved;
  }

  // Frees whose streams' work has completed become free memory (may throw: CrossStreamFrees::collect).
  void collect_pending() {
    const auto home = [&](const Freed& f) {
      release(f.space, f.handle);
      return true;
    };
    s_->pending.collect(s_->streams, home, false, !s_->held); // no event recorded while held
  }

  // Gives back its events, first waiting (where it can) for work that may still use freed memory.
  void close() noexcept {
    if (!s_) {
      return;
    }
    for (auto& space : s_->spaces) {
      (void)s_->settled(*space, s_->frees, true);
      space->fence.close(s_->streams);
    }
    s_->pending.close(s_->streams);
    s_.reset();
  }

  std::unique_ptr<State> s_;
};

} // namespace carve
