/// @file pytorch_caching_model.hpp
/// PyTorch's CUDA caching allocator with its default settings, modelled from its rules over a
/// carve::UpstreamResource that plays cudaMalloc and cudaFree, so that carve_replay can run a
/// recorded PyTorch trace through it and through carve's pools and compare reserved bytes, device
/// calls and host time per call.
///
/// @code
/// carve::replay::PytorchCachingModel model(carve::SimulatedCard(1ull << 30));
/// void* p = *model.try_allocate({.id = 0}, 3 << 20);   // stream 0: a 20 MiB segment, split
/// model.deallocate(p);                                  // cached, merged with its free neighbour
/// model.empty_cache();                                  // torch.cuda.empty_cache()
/// @endcode
///
/// The rules, each with the function of c10/cuda/CUDACachingAllocator.cpp that states it:
/// - a request is rounded up to a multiple of 512 bytes, and is at least 512 (round_size);
/// - requests of at most 1 MiB are served from the small pool, larger ones from the large pool
///   (get_pool); the pools never lend each other blocks;
/// - a cached block is taken by best fit: the first free block at or after (stream, size, address
///   0) in the pool's set ordered by (stream, size, address), and only if it belongs to the
///   request's stream (get_free_block, BlockComparatorSize). A block stays with the stream its
///   segment was allocated for, so streams never share cached memory;
/// - with no fitting block, a new segment (one cudaMalloc) of 2 MiB for a small request, 20 MiB
///   for a request above 1 MiB and below 10 MiB, else the request rounded up to 2 MiB
///   (get_allocation_size, alloc_block);
/// - the block found is split when the rest is at least 512 bytes in the small pool, or more than
///   1 MiB in the large pool; the request takes the front and the rest stays cached
///   (should_split, alloc_found_block). An unsplit large block is handed out whole, and its whole
///   size counts as allocated;
/// - a freed block merges with free neighbours of its segment (free_block, try_merge_blocks);
/// - when cudaMalloc refuses, every cached whole segment (a free block with no neighbour), of
///   both pools and every stream, is freed and cudaMalloc is asked once more; if it refuses
///   again, the request fails with PyTorch's out-of-memory error (malloc,
///   release_cached_blocks, release_blocks). The cache stays released after such a failure, as in
///   PyTorch: here try_allocate departs from carve's "a failure changes nothing";
/// - empty_cache frees every cached whole segment the same way (emptyCache).
/// Settings modelled: the defaults. max_split_size is unlimited (so release_available_cached_blocks
/// frees nothing and no block is too big to split), there is no garbage-collection threshold or
/// memory fraction, no roundup_power2_divisions, no CUDA graph pools, and no cross-stream uses
/// (recordStream), so no block waits on an event.
///
/// Cost: the structures are PyTorch's, so host time per call compares fairly: a block is a node
/// of a doubly linked list within its segment, the free blocks of each pool sit in an ordered set
/// keyed (stream, size, address), live blocks in a hash map by address, and one mutex guards it
/// all. The model never touches the memory it hands out, so the upstream may be an address-only
/// card. Host memory failing for the model's own tables ends the program: try_allocate and
/// deallocate are noexcept, and a half-updated model would give wrong numbers silently.
#pragma once

#include <carve/core/errc.hpp>
#include <carve/core/misuse.hpp>
#include <carve/mr/detail/address_table.hpp>
#include <carve/mr/memory_resource.hpp>
#include <carve/mr/stream_events.hpp>

#include <cuda/std/expected>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

namespace carve::replay {

/// PyTorch's sizes (the constants of c10/cuda/CUDACachingAllocator.cpp) and the rules on them.
namespace pytorch_rules {
inline constexpr std::size_t min_block_size = 512;                        ///< kMinBlockSize
inline constexpr std::size_t small_request_limit = std::size_t{1} << 20;  ///< kSmallSize: the small pool's largest
inline constexpr std::size_t small_segment_size = std::size_t{2} << 20;   ///< kSmallBuffer
inline constexpr std::size_t large_segment_size = std::size_t{20} << 20;  ///< kLargeBuffer
inline constexpr std::size_t large_segment_limit = std::size_t{10} << 20; ///< kMinLargeAlloc
inline constexpr std::size_t large_rounding = std::size_t{2} << 20;       ///< kRoundLarge

/// The block size of a request (round_size): at least 512 bytes, a multiple of 512; 0 on overflow.
constexpr std::size_t block_size(std::size_t bytes) noexcept {
  return bytes < min_block_size ? min_block_size : round_up(bytes, min_block_size);
}
/// Whether a block of `size` belongs to the small pool (get_pool).
constexpr bool in_small_pool(std::size_t size) noexcept { return size <= small_request_limit; }
/// The size of a new cudaMalloc segment for a block of `size` (get_allocation_size); 0 on overflow.
constexpr std::size_t segment_size(std::size_t size) noexcept {
  if (size <= small_request_limit) {
    return small_segment_size;
  }
  return size < large_segment_limit ? large_segment_size : round_up(size, large_rounding);
}
/// Whether a block is split when `rest` bytes of it would be left over (should_split, default
/// settings): at least 512 in the small pool, more than 1 MiB in the large pool.
constexpr bool splits(bool small_pool, std::size_t rest) noexcept {
  return small_pool ? rest >= min_block_size : rest > small_request_limit;
}
} // namespace pytorch_rules

/// What a model of PyTorch's allocator did, in PyTorch's terms. Bytes are block sizes (rounded),
/// as PyTorch's allocated_bytes and reserved_bytes statistics count them.
struct TorchModelStats {
  std::uint64_t allocated_bytes = 0;           ///< in blocks handed out now
  std::uint64_t peak_allocated_bytes = 0;      ///< the most allocated_bytes has been
  std::uint64_t reserved_bytes = 0;            ///< in segments (default) or mapped pages (expandable) now
  std::uint64_t peak_reserved_bytes = 0;       ///< the most reserved_bytes has been
  std::uint64_t device_allocations = 0;        ///< cudaMalloc, or cuMemCreate, calls that succeeded
  std::uint64_t device_frees = 0;              ///< cudaFree calls, or cuMemRelease calls
  std::uint64_t maps = 0;                      ///< cuMemMap calls (one per page)
  std::uint64_t unmaps = 0;                    ///< cuMemUnmap calls (one per page)
  std::uint64_t set_accesses = 0;              ///< cuMemSetAccess calls (one per newly mapped run)
  std::uint64_t reservations = 0;              ///< cuMemAddressReserve calls (one per expandable segment)
  std::uint64_t reservation_frees = 0;         ///< cuMemAddressFree calls
  std::uint64_t failed_device_allocations = 0; ///< cudaMalloc refused; a growth or reservation refused
  std::uint64_t ooms = 0;                      ///< requests that failed with PyTorch's out-of-memory error
};

namespace detail {

struct TorchExpandableSegment; // defined by pytorch_expandable_model.hpp

/// PyTorch's Block, less what a single-process replay never uses (events, history, IPC).
struct TorchBlock {
  std::uintptr_t ptr = 0;
  std::size_t size = 0;
  TorchBlock* prev = nullptr;                ///< the block before it in its segment
  TorchBlock* next = nullptr;                ///< the block after it in its segment
  TorchExpandableSegment* segment = nullptr; ///< its expandable segment; null for a cudaMalloc segment
  std::uint32_t stream = 0;                  ///< the stream its segment was allocated for
  bool small = false;                        ///< which pool it belongs to
  bool allocated = false;
  bool mapped = true; ///< false only for addresses of an expandable segment with no pages behind them
};

/// BlockComparatorSize: by stream, then size, then address.
struct BySizeOrder {
  bool operator()(const TorchBlock* a, const TorchBlock* b) const noexcept {
    if (a->stream != b->stream) {
      return a->stream < b->stream;
    }
    return a->size != b->size ? a->size < b->size : a->ptr < b->ptr;
  }
};
/// BlockComparatorAddress: by stream, then address.
struct ByAddressOrder {
  bool operator()(const TorchBlock* a, const TorchBlock* b) const noexcept {
    return a->stream != b->stream ? a->stream < b->stream : a->ptr < b->ptr;
  }
};

/// PyTorch's BlockPool: the free mapped blocks by (stream, size, address) and, for expandable
/// segments, the unmapped ranges by (stream, address).
struct TorchPool {
  explicit TorchPool(bool small_pool) : small(small_pool) {}
  std::set<TorchBlock*, BySizeOrder> blocks;
  std::set<TorchBlock*, ByAddressOrder> unmapped;
  bool small;
};

/// The books both models keep, and the steps they take alike: the two pools, the live blocks by
/// address, splitting, handing out, freeing and merging. Not thread-safe: the models lock.
class TorchBooks {
public:
  TorchBooks() = default;
  TorchBooks(const TorchBooks&) = delete;
  TorchBooks& operator=(const TorchBooks&) = delete;
  /// Deletes every block (the models give the memory back first).
  ~TorchBooks() {
    for (TorchBlock* b : all_blocks()) {
      delete b;
    }
  }

  TorchPool& pool(bool small_pool) noexcept { return small_pool ? small_ : large_; }

  /// Cuts `b` to its first `front` bytes; the rest becomes a new block after it, in the same
  /// state and filed nowhere, which is returned.
  TorchBlock* split_off(TorchBlock* b, std::size_t front) {
    auto* tail = new TorchBlock(*b);
    tail->ptr = b->ptr + front;
    tail->size = b->size - front;
    tail->prev = b;
    if (b->next != nullptr) {
      b->next->prev = tail;
    }
    b->next = tail;
    b->size = front;
    return tail;
  }

  /// Cuts `b` (taken out of its pool) to `size`; the rest becomes a free block after it, cached.
  void split_front(TorchBlock* b, std::size_t size) { pool(b->small).blocks.insert(split_off(b, size)); }

  /// Marks `b` live and files it by address.
  void hand_out(TorchBlock* b) {
    b->allocated = true;
    active_.insert(b->ptr, b);
    stats.allocated_bytes += b->size;
    stats.peak_allocated_bytes = std::max(stats.peak_allocated_bytes, stats.allocated_bytes);
  }

  /// The live block at `p`, taken off the live list; null when `p` is not one.
  TorchBlock* take_back(const void* p) noexcept {
    const auto address = reinterpret_cast<std::uintptr_t>(p);
    TorchBlock* const* found = active_.find(address);
    if (found == nullptr) {
      return nullptr;
    }
    TorchBlock* b = *found;
    active_.erase(address);
    return b;
  }

  /// free_block: `b` (taken back) merges with its free neighbours and is cached.
  void free_block(TorchBlock* b) {
    b->allocated = false;
    stats.allocated_bytes -= b->size;
    merge(b, b->prev);
    merge(b, b->next);
    pool(b->small).blocks.insert(b);
  }

  /// try_merge_blocks: `src`, a free neighbour of `dst` in the same state (mapped or not), is
  /// folded into `dst`, which must be in no set.
  void merge(TorchBlock* dst, TorchBlock* src) noexcept {
    if (src == nullptr || src->allocated || src->mapped != dst->mapped) {
      return;
    }
    TorchPool& p = pool(src->small);
    if (src->mapped) {
      p.blocks.erase(src);
    } else {
      p.unmapped.erase(src);
    }
    if (dst->prev == src) {
      dst->ptr = src->ptr;
      dst->prev = src->prev;
      if (dst->prev != nullptr) {
        dst->prev->next = dst;
      }
    } else {
      dst->next = src->next;
      if (dst->next != nullptr) {
        dst->next->prev = dst;
      }
    }
    dst->size += src->size;
    delete src;
  }

  /// Adds to reserved_bytes and its peak.
  void reserve_bytes(std::size_t bytes) noexcept {
    stats.reserved_bytes += bytes;
    stats.peak_reserved_bytes = std::max(stats.peak_reserved_bytes, stats.reserved_bytes);
  }

  /// Every block: cached, unmapped and live.
  std::vector<TorchBlock*> all_blocks() const {
    std::vector<TorchBlock*> out;
    for (const TorchPool* p : {&small_, &large_}) {
      out.insert(out.end(), p->blocks.begin(), p->blocks.end());
      out.insert(out.end(), p->unmapped.begin(), p->unmapped.end());
    }
    active_.for_each([&](std::uintptr_t, TorchBlock* b) { out.push_back(b); });
    return out;
  }

  /// Checks that the blocks tile their segments in linked order, that no two free neighbours
  /// in the same state are left unmerged, that every block is filed where its state says, and
  /// that the byte counts add up (`reserved`: the mapped bytes of every segment). For tests.
  bool consistent(std::size_t reserved) const {
    const std::vector<TorchBlock*> blocks = all_blocks();
    std::size_t mapped = 0;
    std::size_t allocated = 0;
    std::size_t reached = 0;
    for (TorchBlock* head : blocks) {
      for (TorchBlock* b = head->prev == nullptr ? head : nullptr; b != nullptr; b = b->next) {
        ++reached;
        const TorchBlock* n = b->next;
        if (b->size == 0 || (n != nullptr && (n->prev != b || n->ptr != b->ptr + b->size))) {
          return false;
        }
        if (n != nullptr && (n->stream != b->stream || n->small != b->small || n->segment != b->segment ||
                             (!b->allocated && !n->allocated && b->mapped == n->mapped))) {
          return false;
        }
        const TorchPool& p = b->small ? small_ : large_;
        const std::size_t filed = b->allocated ? (active_.find(b->ptr) != nullptr ? 1u : 0u)
                                               : (b->mapped ? p.blocks.count(b) : p.unmapped.count(b));
        if (filed != 1) {
          return false;
        }
        mapped += b->mapped ? b->size : 0;
        allocated += b->allocated ? b->size : 0;
      }
    }
    return reached == blocks.size() && mapped == reserved && allocated == stats.allocated_bytes;
  }

  TorchModelStats stats; ///< the counters; the models update the device ones

private:
  TorchPool small_{true};
  TorchPool large_{false};
  /// Live blocks by address: an open-addressing table, as PyTorch's ska::flat_hash_set is.
  carve::detail::AddressTable<TorchBlock*> active_;
};

} // namespace detail

/// PyTorch's CUDA caching allocator with default settings (see the file's description), over
/// `Upstream` playing cudaMalloc/cudaFree: each upstream allocation is one segment. Thread-safe
/// (one mutex).
template <UpstreamResource Upstream>
requires std::move_constructible<Upstream>
class PytorchCachingModel {
public:
  /// Which stream a request is for.
  using stream_type = SimulatedStream;
  /// The resource segments come from.
  using upstream_type = Upstream;
  /// The alignment segments are asked for: what cudaMalloc promises.
  static constexpr std::size_t segment_alignment = default_alignment;

  /// A model with nothing reserved.
  explicit PytorchCachingModel(Upstream upstream) : upstream_(std::move(upstream)) {}
  PytorchCachingModel(const PytorchCachingModel&) = delete;
  PytorchCachingModel& operator=(const PytorchCachingModel&) = delete;

  /// Gives every segment back to the upstream; blocks still handed out become invalid with it.
  ~PytorchCachingModel() {
    for (const detail::TorchBlock* head : books_.all_blocks()) {
      if (head->prev == nullptr) {
        std::size_t bytes = 0;
        for (const detail::TorchBlock* b = head; b != nullptr; b = b->next) {
          bytes += b->size;
        }
        upstream_.deallocate(reinterpret_cast<void*>(head->ptr), bytes, segment_alignment);
      }
    }
  }

  /// A block of at least `bytes` for `stream` (PyTorch's malloc). Errors: invalid_size for 0
  /// bytes (PyTorch hands out no block for those); no_space when a size overflows when rounded,
  /// or for PyTorch's out-of-memory error: the upstream refused the segment twice, the second
  /// time after every cached whole segment was freed (which stays done).
  cuda::std::expected<void*, Errc> try_allocate(stream_type stream, std::size_t bytes) noexcept {
    if (bytes == 0) {
      return cuda::std::unexpected(Errc::invalid_size);
    }
    const std::size_t size = pytorch_rules::block_size(bytes);
    const std::size_t segment = pytorch_rules::segment_size(size);
    if (size == 0 || segment == 0) {
      return cuda::std::unexpected(Errc::no_space);
    }
    const bool small = pytorch_rules::in_small_pool(size);
    const std::lock_guard lock(mutex_);
    detail::TorchBlock* block = take_best_fit(books_.pool(small), stream.id, size);
    if (block == nullptr) {
      block = new_segment(stream.id, small, segment);
      if (block == nullptr) {
        release_cached_segments();
        block = new_segment(stream.id, small, segment);
      }
      if (block == nullptr) {
        ++books_.stats.ooms;
        return cuda::std::unexpected(Errc::no_space);
      }
    }
    if (pytorch_rules::splits(small, block->size - size)) {
      books_.split_front(block, size);
    }
    books_.hand_out(block);
    return reinterpret_cast<void*>(block->ptr);
  }

  /// Takes back the block at `p` (PyTorch frees by pointer alone). A pointer this model never
  /// handed out, or handed out and took back already, ends the program with a message, as
  /// PyTorch's "invalid device pointer" check stops it.
  void deallocate(void* p) noexcept {
    const std::lock_guard lock(mutex_);
    detail::TorchBlock* block = books_.take_back(p);
    if (block == nullptr) {
      report_misuse("carve::replay::PytorchCachingModel::deallocate", p, 0, Errc::not_allocated);
    }
    books_.free_block(block);
  }

  /// torch.cuda.empty_cache(): frees every cached whole segment; returns the bytes freed.
  std::size_t empty_cache() {
    const std::lock_guard lock(mutex_);
    return release_cached_segments();
  }

  /// The counters now, taken under the lock.
  TorchModelStats stats() const {
    const std::lock_guard lock(mutex_);
    return books_.stats;
  }

  /// Checks every invariant of the block lists and the byte counts. For tests.
  bool consistent() const {
    const std::lock_guard lock(mutex_);
    return books_.consistent(books_.stats.reserved_bytes);
  }

  /// The upstream resource.
  const Upstream& upstream() const noexcept { return upstream_; }

private:
  using Block = detail::TorchBlock;

  /// get_free_block with default settings: the first free block at or after (stream, size, 0),
  /// if it is the stream's; taken out of the pool. Null when there is none.
  static Block* take_best_fit(detail::TorchPool& pool, std::uint32_t stream, std::size_t size) {
    Block key;
    key.stream = stream;
    key.size = size;
    const auto it = pool.blocks.lower_bound(&key);
    if (it == pool.blocks.end() || (*it)->stream != stream) {
      return nullptr;
    }
    Block* found = *it;
    pool.blocks.erase(it);
    return found;
  }

  /// alloc_block: one segment of `bytes` from the upstream as one free block, not filed in a
  /// pool (it is about to be handed out). Null when the upstream refuses.
  Block* new_segment(std::uint32_t stream, bool small, std::size_t bytes) {
    const auto got = upstream_.try_allocate(bytes, segment_alignment);
    if (!got) {
      ++books_.stats.failed_device_allocations;
      return nullptr;
    }
    auto* b = new Block;
    b->ptr = reinterpret_cast<std::uintptr_t>(*got);
    b->size = bytes;
    b->stream = stream;
    b->small = small;
    ++books_.stats.device_allocations;
    books_.reserve_bytes(bytes);
    return b;
  }

  /// release_cached_blocks (release_blocks on the large pool, then the small one): frees every
  /// free block that is a whole segment, of every stream. Returns the bytes freed.
  std::size_t release_cached_segments() noexcept {
    std::size_t released = 0;
    for (const bool small : {false, true}) {
      auto& blocks = books_.pool(small).blocks;
      for (auto it = blocks.begin(); it != blocks.end();) {
        Block* b = *it;
        if (b->prev != nullptr || b->next != nullptr) {
          ++it;
          continue;
        }
        it = blocks.erase(it);
        upstream_.deallocate(reinterpret_cast<void*>(b->ptr), b->size, segment_alignment);
        ++books_.stats.device_frees;
        books_.stats.reserved_bytes -= b->size;
        released += b->size;
        delete b;
      }
    }
    return released;
  }

  Upstream upstream_;
  mutable std::mutex mutex_;
  detail::TorchBooks books_;
};

} // namespace carve::replay
