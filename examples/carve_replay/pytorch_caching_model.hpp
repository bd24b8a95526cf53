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

#include "pytorch_books.hpp"

#include <carve/trace/allocation_trace.hpp>

#include <carve/core/errc.hpp>
#include <carve/core/misuse.hpp>
#include <carve/mr/memory_resource.hpp>
#include <carve/mr/stream_events.hpp>

#include <cuda/std/expected>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

namespace carve::replay {

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

  /// Starts from the state a recording began in, as no sequence of requests could rebuild it:
  /// each of `segments` (the recorder's, before its first event) taken from the upstream at its
  /// size, with the live `blocks` placed at their recorded offsets and everything else cached,
  /// merged as PyTorch keeps it. A live block is its request rounded to 512 bytes; in a large
  /// segment it also holds the gap after it when that is 1 MiB or less, the rest PyTorch does not
  /// split off (and no free block of the large pool is that small). `stream_of(recorded handle)`
  /// numbers the streams as the requests do; `at[i]` receives block i's address here. False, with
  /// nothing changed, when a block lies in no segment or overlaps another, or the upstream refuses.
  template <class StreamOf>
  bool seed(const std::vector<trace::TraceSegment>& segments, const std::vector<trace::TraceBlock>& blocks,
            std::uint32_t count, StreamOf stream_of, std::vector<void*>& at) {
    const std::lock_guard lock(mutex_);
    std::vector<std::uint32_t> order(count);
    for (std::uint32_t i = 0; i < count; ++i) {
      order[i] = i;
    }
    std::sort(order.begin(), order.end(), [&](auto a, auto b) { return blocks[a].address < blocks[b].address; });
    std::vector<trace::TraceSegment> by_address = segments;
    std::sort(by_address.begin(), by_address.end(), [](const auto& a, const auto& b) { return a.address < b.address; });
    std::vector<std::pair<void*, std::size_t>> taken; // segments from the upstream, to undo
    const auto undo = [&] {
      for (auto [p, bytes] : taken) {
        upstream_.deallocate(p, bytes, segment_alignment);
      }
      return false;
    };
    std::size_t next_block = 0;
    std::vector<std::vector<Block*>> built;
    for (const trace::TraceSegment& seg : by_address) {
      const auto got = upstream_.try_allocate(seg.bytes, segment_alignment);
      if (!got) {
        return undo();
      }
      taken.emplace_back(*got, seg.bytes);
      const auto base = reinterpret_cast<std::uintptr_t>(*got);
      std::vector<Block*> chain;
      std::uint64_t cursor = seg.address;
      const std::uint64_t end = seg.address + seg.bytes;
      const auto piece = [&](std::uint64_t from, std::uint64_t bytes, bool live) {
        auto* b = new Block;
        b->ptr = base + (from - seg.address);
        b->size = bytes;
        b->stream = stream_of(seg.stream);
        b->small = seg.small;
        b->allocated = live;
        b->prev = chain.empty() ? nullptr : chain.back();
        if (b->prev != nullptr) {
          b->prev->next = b;
        }
        chain.push_back(b);
      };
      for (; next_block < order.size() && blocks[order[next_block]].address < end; ++next_block) {
        const trace::TraceBlock& live = blocks[order[next_block]];
        const std::uint64_t size = pytorch_rules::block_size(live.bytes);
        if (live.address < cursor || size > end - live.address) {
          for (auto& c : built) {
            for (Block* b : c) {
              delete b;
            }
          }
          for (Block* b : chain) {
            delete b;
          }
          return undo();
        }
        if (live.address > cursor) {
          piece(cursor, live.address - cursor, false);
        }
        const std::uint64_t following = next_block + 1 < order.size() ? blocks[order[next_block + 1]].address : end;
        const std::uint64_t gap = std::min(following, end) - (live.address + size);
        const bool keeps_gap =
            !seg.small && gap <= pytorch_rules::small_request_limit && following >= live.address + size;
        piece(live.address, keeps_gap ? size + gap : size, true);
        at[order[next_block]] = reinterpret_cast<void*>(chain.back()->ptr);
        cursor = live.address + chain.back()->size;
      }
      if (cursor < end) {
        piece(cursor, end - cursor, false);
      }
      built.push_back(std::move(chain));
    }
    if (next_block != order.size()) { // a block outside every segment
      for (auto& c : built) {
        for (Block* b : c) {
          delete b;
        }
      }
      return undo();
    }
    for (const auto& chain : built) {
      for (Block* b : chain) {
        if (b->allocated) {
          books_.hand_out(b);
        } else {
          books_.pool(b->small).blocks.insert(b);
        }
      }
      std::size_t bytes = 0;
      for (Block* b : chain) {
        bytes += b->size;
      }
      books_.reserve_bytes(bytes);
      ++books_.stats.device_allocations;
    }
    return true;
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
