/// @file carve/service/leased_upstream.hpp
/// An upstream adaptor whose segments can be lent to other processes: it numbers every segment,
/// exports it to each process that maps it (a lease), and reports which leased segments were
/// released while mapped, so their mappers can be told to unmap.
///
/// @code
/// carve::service::LeasedUpstream<carve::SharedMemoryCard> card(carve::SharedMemoryCard(1 << 30));
/// void* block = *card.try_allocate(2 << 20, 256);      // a segment of its own
/// auto where = card.locate(block);                     // segment id and offset of a block
/// auto e = card.lease(where->segment);                 // export it to one more process
/// card.deallocate(block, 2 << 20, 256);                // still leased: retired
/// auto retired = card.take_retired();                  // {where->segment}: tell its mapper
/// card.unlease(where->segment);                        // that process has unmapped it
/// @endcode
///
/// Why: a process may still map a segment when the allocator above gives it back (the allocation
/// service frees a region before its client has unmapped it, and a client may die with its
/// mappings). Then deallocate() reports it (take_retired), and what happens to the memory depends
/// on the upstream:
/// - release_while_mapped (shared memory): it goes back to the card at once; the stale mapping
///   holds host pages only until its client unmaps, and no one can reach them through the card.
/// - otherwise (CUDA IPC, where freeing before the importer closes is undefined): the segment
///   stays allocated, and counted as used by free_bytes(), until the last lease ends.
///
/// Segment ids are unique within the process and never reused, so a client can key its mappings
/// by them even when a new segment reuses an old address. Copies share one state. Thread-safe.
#pragma once

#include <carve/mr/detail/block_lookup.hpp>
#include <carve/mr/memory_resource.hpp>
#include <carve/mr/segment_export.hpp>
#include <carve/service/protocol.hpp>
#include <carve/service/shared_memory_card.hpp>

#include <fcntl.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

namespace carve::service {

namespace detail {
inline SegmentId next_segment_id() noexcept {
  static std::atomic<SegmentId> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}
} // namespace detail

/// Where a block lives: its segment and the offset from the segment's start.
struct SegmentLocation {
  SegmentId segment = 0;        ///< the segment's id
  std::size_t offset = 0;       ///< of the block, from the segment's start
  std::size_t segment_size = 0; ///< the whole segment's bytes
};

/// `Upstream` with segments that can be leased to other processes (see the file's description):
/// an UpstreamResource that knows what it owns. Copies share one state.
template <ExportableResource Upstream>
class LeasedUpstream {
public:
  /// Wraps `upstream`.
  explicit LeasedUpstream(Upstream upstream) : state_(std::make_shared<State>(std::move(upstream))) {}

  /// A new segment from the upstream, numbered. Errors: the upstream's; no_space when the
  /// bookkeeping cannot grow (the segment goes back).
  [[nodiscard]] cuda::std::expected<void*, Errc> try_allocate(std::size_t bytes, std::size_t alignment) noexcept {
    const auto got = state_->upstream.try_allocate(bytes, alignment);
    if (!got) {
      return got;
    }
    void* const p = *got;
    const SegmentId id = detail::next_segment_id();
    try {
      const std::lock_guard lock(state_->mutex);
      // Room for every segment that could retire before the next take_retired(), so that
      // deallocate never allocates.
      state_->retired_new.reserve(state_->retired_new.size() + state_->live.size() + 1);
      state_->segments.emplace(id, Segment{address(p), bytes, alignment, 0, false, false});
      try {
        state_->live.emplace(address(p), id);
      } catch (...) {
        state_->segments.erase(id);
        throw;
      }
      return p;
    } catch (const std::bad_alloc&) {
      state_->upstream.deallocate(p, bytes, alignment);
      return cuda::std::unexpected(Errc::no_space);
    }
  }

  /// Gives a segment back. A leased one is retired and reported by take_retired(); its memory
  /// goes to the upstream now if release_while_mapped, else at its last unlease. Never allocates.
  void deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept {
    {
      const std::lock_guard lock(state_->mutex);
      const auto at = state_->live.find(address(p));
      if (at != state_->live.end()) {
        const auto it = state_->segments.find(at->second);
        state_->live.erase(at);
        if (it->second.leases > 0) {
          it->second.retired = true;
          state_->retired_new.push_back(it->first); // capacity reserved in try_allocate
          if constexpr (!Upstream::release_while_mapped) {
            return; // the last unlease releases it
          }
          it->second.released = true;
        } else {
          state_->segments.erase(it);
        }
      }
    }
    state_->upstream.deallocate(p, bytes, alignment);
  }

  /// The upstream's (a segment kept for a lease counts as used).
  std::size_t free_bytes() const { return state_->upstream.free_bytes(); }
  /// Whether `p` lies in a live segment (a retired one no longer counts).
  bool owns(const void* p) const noexcept { return locate(p).has_value(); }
  /// The upstream's.
  std::size_t capacity() const { return state_->upstream.capacity(); }

  /// The live segment holding `p`; nullopt when none does.
  std::optional<SegmentLocation> locate(const void* p) const noexcept {
    const std::lock_guard lock(state_->mutex);
    const auto size_of = [&](SegmentId id) { return state_->segments.find(id)->second.size; };
    const auto at = carve::detail::block_containing(state_->live, p, size_of);
    if (at == state_->live.end()) {
      return std::nullopt;
    }
    return SegmentLocation{at->second, address(p) - at->first, size_of(at->second)};
  }

  /// Exports the segment to one more process; nullopt (and no lease) when the segment is not
  /// live, or the upstream cannot export it.
  std::optional<SegmentExport> lease(SegmentId id) {
    const std::lock_guard lock(state_->mutex);
    const auto it = state_->segments.find(id);
    if (it == state_->segments.end() || it->second.retired) {
      return std::nullopt;
    }
    Segment& s = it->second;
    auto e = state_->upstream.export_segment(reinterpret_cast<void*>(s.base), s.size);
    if (e) {
      ++s.leases;
    }
    return e;
  }

  /// The descriptor that lease() exported, handed over to the caller (who closes it), for a
  /// segment that will not be leased again: the upstream then holds no descriptor for it. Without
  /// an upstream that can hand descriptors over, a duplicate of the exported one. -1 when there is
  /// none (a CUDA IPC export) or the system refuses the duplicate.
  int take_descriptor(SegmentId id, const SegmentExport& exported) {
    if constexpr (HandsOverDescriptors<Upstream>) {
      const std::lock_guard lock(state_->mutex);
      const auto it = state_->segments.find(id);
      if (it != state_->segments.end()) {
        if (const auto fd = state_->upstream.release_descriptor(reinterpret_cast<void*>(it->second.base))) {
          return *fd;
        }
      }
      return -1;
    } else {
      return exported.fd >= 0 ? ::fcntl(exported.fd, F_DUPFD_CLOEXEC, 0) : -1;
    }
  }

  /// One process has unmapped the segment. The last unlease of a retired segment releases it
  /// (unless that happened already). Returns false for a segment that is not leased.
  bool unlease(SegmentId id) {
    Segment done;
    {
      const std::lock_guard lock(state_->mutex);
      const auto it = state_->segments.find(id);
      if (it == state_->segments.end() || it->second.leases == 0) {
        return false;
      }
      if (--it->second.leases > 0 || !it->second.retired) {
        return true;
      }
      done = it->second;
      state_->segments.erase(it);
    }
    if (!done.released) {
      state_->upstream.deallocate(reinterpret_cast<void*>(done.base), done.size, done.alignment);
    }
    return true;
  }

  /// Segments released while they were leased, since the last call (each is reported once).
  std::vector<SegmentId> take_retired() {
    const std::lock_guard lock(state_->mutex);
    std::vector<SegmentId> out(state_->retired_new.begin(), state_->retired_new.end());
    state_->retired_new.clear();
    return out;
  }

  /// Segments whose memory is held from the upstream (live, or retired and kept for a lease).
  std::size_t held_count() const {
    return count([](const Segment& s) { return !s.released; });
  }
  /// Segments the allocator above holds now (not released to this adaptor).
  std::size_t live_count() const {
    const std::lock_guard lock(state_->mutex);
    return state_->live.size();
  }
  /// Segments at least one process maps.
  std::size_t leased_count() const {
    return count([](const Segment& s) { return s.leases > 0; });
  }
  /// Segments released above that some process still maps.
  std::size_t retired_count() const {
    return count([](const Segment& s) { return s.retired; });
  }

  /// The wrapped upstream, shared by all copies.
  const Upstream& upstream() const noexcept { return state_->upstream; }

  /// Equal when both are copies of one adaptor.
  friend bool operator==(const LeasedUpstream& a, const LeasedUpstream& b) noexcept { return a.state_ == b.state_; }

private:
  struct Segment {
    std::uintptr_t base = 0;
    std::size_t size = 0;
    std::size_t alignment = 0;
    std::uint32_t leases = 0; // processes that map it
    bool retired = false;     // the pool released it; some process still maps it
    bool released = false;    // and its memory went back to the upstream already
  };
  struct State {
    explicit State(Upstream u) : upstream(std::move(u)) {}
    State(const State&) = delete;
    State& operator=(const State&) = delete;
    // Memory still held for leases that die with their server goes back to the upstream.
    ~State() {
      for (const auto& [id, s] : segments) {
        if (s.retired && !s.released) {
          upstream.deallocate(reinterpret_cast<void*>(s.base), s.size, s.alignment);
        }
      }
    }
    Upstream upstream;
    std::mutex mutex;
    std::unordered_map<SegmentId, Segment> segments; // live ones, and retired ones still leased
    std::map<std::uintptr_t, SegmentId> live;        // the pool's segments, by base address
    std::vector<SegmentId> retired_new;
  };

  static std::uintptr_t address(const void* p) noexcept { return reinterpret_cast<std::uintptr_t>(p); }
  template <class Pred>
  std::size_t count(Pred pred) const {
    const std::lock_guard lock(state_->mutex);
    std::size_t n = 0;
    for (const auto& [id, s] : state_->segments) {
      n += pred(s) ? 1u : 0u;
    }
    return n;
  }

  std::shared_ptr<State> state_;
};

static_assert(UpstreamResource<LeasedUpstream<SharedMemoryCard>> && OwnsMemory<LeasedUpstream<SharedMemoryCard>>);

} // namespace carve::service
