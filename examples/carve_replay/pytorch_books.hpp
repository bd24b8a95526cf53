/// @file pytorch_books.hpp
/// What the models of PyTorch's caching allocator share (pytorch_caching_model.hpp,
/// pytorch_expandable_model.hpp): PyTorch's size constants and the rules on them, the statistics
/// the models report, and the books both keep: blocks as nodes of a doubly linked list within
/// their segment, each pool's free blocks in an ordered set keyed (stream, size, address), live
/// blocks in a hash table by address, as c10/cuda/CUDACachingAllocator.cpp keeps them.
#pragma once

#include <carve/mr/detail/address_table.hpp>
#include <carve/mr/memory_resource.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <set>
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

} // namespace carve::replay
