/// @file pytorch_expandable_model.hpp
/// PyTorch's CUDA caching allocator with `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`,
/// modelled from its rules over a carve::PhysicalMemoryMapper that plays the driver's virtual
/// memory calls, for carve_replay to compare with the default allocator and with carve's pools.
///
/// @code
/// carve::HostMemoryMapper mapper;                                  // 2 MiB granularity
/// carve::replay::PytorchExpandableModel model(mapper, {.capacity_bytes = 24ull << 30});
/// void* p = *model.try_allocate({.id = 0}, 3 << 20);   // reserves 27 GiB, maps one 20 MiB page
/// model.deallocate(p);
/// model.empty_cache();                                  // unmaps the page
/// @endcode
///
/// The rules, each with the part of c10/cuda/CUDACachingAllocator.cpp that states it:
/// - rounding, the small pool (requests up to 1 MiB) and the large pool, and best fit among the
///   free blocks of the request's stream are the default allocator's (pytorch_caching_model.hpp),
///   except that best fit counts the unmapped addresses after a free block as part of its size:
///   from the first fitting block it moves on to the stream's next one while that one's size so
///   counted is smaller (get_free_block), so the block at a segment's growing end goes last;
/// - a block is split whenever the rest is at least 512 bytes, in both pools (should_split: the
///   large pool's "more than 1 MiB" belongs to the default allocator only);
/// - each (stream, pool) grows an expandable segment: a reservation of `address_space_bytes`
///   (PyTorch takes 1 1/8 of the card's memory) with pages of 2 MiB (small pool) or 20 MiB
///   (large pool) mapped on demand (ExpandableSegment's constructor);
/// - with no fitting free block, the segment grows by the pages the rounded request needs (no
///   2 or 20 MiB segment size here), at the lowest unmapped range of the stream's segments that
///   has room counting from the free block just before it through the free and unmapped blocks
///   after it (find_expandable_block); each unmapped range on the way is mapped and merged with
///   the free blocks beside it (try_allocate_expandable_block, map_block). With no such range
///   (the address space is used up), another segment is reserved;
/// - pages are mapped as ExpandableSegment::map does: one cuMemCreate per page, one cuMemMap per
///   page, then one cuMemSetAccess over the run. A refused create (by the mapper, or because
///   `capacity_bytes` of mapped pages would be exceeded) releases the run's new pages and fails
///   the growth; a refused map or set_access, an exception in PyTorch, is undone the same way;
/// - when growth fails, cached memory is released and growth tried once more, else the request
///   fails with PyTorch's out-of-memory error (malloc, alloc_block, release_cached_blocks).
///   Releasing unmaps the pages wholly inside free blocks, of both pools and every stream, one
///   cuMemUnmap and one cuMemRelease per page, and frees the reservation of a segment this leaves
///   with nothing mapped (release_blocks, unmap_block, ExpandableSegment::unmap,
///   release_expandable_segment); a segment never mapped at all keeps its reservation. Pages that
///   a failed growth did map stay until such a release. empty_cache releases the same way.
///
/// One departure, in when rather than how often: PyTorch keeps each page's handle until the page
/// is unmapped and releases it then; this model releases it once the page is mapped (the mapping
/// keeps the memory until the unmap), so that a HostMemoryMapper holds no descriptor per page.
/// device_frees counts those releases; every count of calls is PyTorch's. Costs and the memory
/// handed out are as in pytorch_caching_model.hpp: PyTorch's structures, one mutex, no byte of
/// the mapped memory ever touched.
#pragma once

#include "pytorch_caching_model.hpp"

#include <carve/core/error.hpp>
#include <carve/vmm/physical_memory_mapper.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace carve::replay {

/// How a PytorchExpandableModel is set up.
struct PytorchExpandableOptions {
  int device = 0;                      ///< the device pages are created on and given access to
  std::size_t capacity_bytes = 0;      ///< the card's memory: the most bytes mapped at once (required)
  std::size_t address_space_bytes = 0; ///< reserved per segment; 0: capacity + capacity / 8, as PyTorch
};

namespace detail {
/// PyTorch's ExpandableSegment: a reservation and which of its pages are mapped.
struct TorchExpandableSegment {
  std::uintptr_t base = 0;
  std::size_t page_size = 0;
  std::vector<bool> mapped; ///< by page; the reservation holds mapped.size() pages
  std::size_t bytes() const noexcept { return page_size * mapped.size(); }
  std::uintptr_t page_address(std::size_t page) const noexcept { return base + page * page_size; }
};
} // namespace detail

/// PyTorch's CUDA caching allocator with expandable segments (see the file's description), over
/// `Mapper`. Thread-safe (one mutex).
template <PhysicalMemoryMapper Mapper>
requires std::move_constructible<Mapper>
class PytorchExpandableModel {
public:
  /// Which stream a request is for.
  using stream_type = SimulatedStream;
  /// The mapper that plays the driver.
  using mapper_type = Mapper;

  /// Throws carve::Exception: invalid_argument for a capacity of 0, or when 2 MiB is not a
  /// multiple of the mapper's granularity; the mapper's error when it knows no such device.
  PytorchExpandableModel(Mapper mapper, PytorchExpandableOptions options)
      : mapper_(std::move(mapper)), options_(options) {
    if (options_.capacity_bytes == 0) {
      throw Exception(Errc::invalid_argument, "carve::replay::PytorchExpandableModel: capacity_bytes is 0");
    }
    if (options_.address_space_bytes == 0) {
      const std::size_t most = ~std::size_t{0};
      const std::size_t eighth = options_.capacity_bytes / 8;
      options_.address_space_bytes = options_.capacity_bytes > most - eighth ? most : options_.capacity_bytes + eighth;
    }
    granularity_ = value_or_throw(mapper_.granularity(options_.device));
    if (pytorch_rules::small_segment_size % granularity_ != 0 ||
        pieces(options_.address_space_bytes, pytorch_rules::large_segment_size) >
            ~std::size_t{0} / pytorch_rules::large_segment_size) {
      throw Exception(Errc::invalid_argument,
                      "carve::replay::PytorchExpandableModel: 2 MiB pages need a granularity that divides "
                      "them (the mapper's is " +
                          std::to_string(granularity_) + ") and an address space that fits in a size_t");
    }
  }
  PytorchExpandableModel(const PytorchExpandableModel&) = delete;
  PytorchExpandableModel& operator=(const PytorchExpandableModel&) = delete;

  /// Unmaps every page and frees every reservation; blocks still handed out become invalid.
  ~PytorchExpandableModel() {
    for (const auto& segment : segments_) {
      for (std::size_t i = 0; i < segment->mapped.size(); ++i) {
        if (segment->mapped[i]) {
          (void)mapper_.unmap(address(segment->page_address(i)), segment->page_size);
        }
      }
      (void)mapper_.free_reservation(address(segment->base), segment->bytes());
    }
  }

  /// A block of at least `bytes` for `stream` (PyTorch's malloc). Errors: invalid_size for 0
  /// bytes; no_space when a size overflows when rounded, and for PyTorch's out-of-memory error:
  /// the segment could not grow, twice, the second time after cached pages were unmapped (which
  /// stays done), or the request is larger than a whole segment's address space.
  cuda::std::expected<void*, Errc> try_allocate(stream_type stream, std::size_t bytes) noexcept {
    if (bytes == 0) {
      return cuda::std::unexpected(Errc::invalid_size);
    }
    const std::size_t size = pytorch_rules::block_size(bytes);
    if (size == 0) {
      return cuda::std::unexpected(Errc::no_space);
    }
    const bool small = pytorch_rules::in_small_pool(size);
    const std::lock_guard lock(mutex_);
    detail::TorchPool& pool = books_.pool(small);
    Block* block = take_best_fit(pool, stream.id, size);
    if (block == nullptr && size <= segment_bytes(small)) {
      block = grow(pool, stream.id, size);
      if (block == nullptr) {
        release_cached();
        block = grow(pool, stream.id, size);
      }
    }
    if (block == nullptr) {
      ++books_.stats.ooms;
      return cuda::std::unexpected(Errc::no_space);
    }
    if (block->size - size >= pytorch_rules::min_block_size) {
      books_.split_front(block, size);
    }
    books_.hand_out(block);
    return address(block->ptr);
  }

  /// Takes back the block at `p`. A pointer this model never handed out, or took back already,
  /// ends the program with a message, as PyTorch's "invalid device pointer" check stops it.
  void deallocate(void* p) noexcept {
    const std::lock_guard lock(mutex_);
    Block* block = books_.take_back(p);
    if (block == nullptr) {
      report_misuse("carve::replay::PytorchExpandableModel::deallocate", p, 0, Errc::not_allocated);
    }
    books_.free_block(block);
  }

  /// torch.cuda.empty_cache(): unmaps every page wholly inside a free block and frees the
  /// reservations this leaves with nothing mapped; returns the bytes unmapped.
  std::size_t empty_cache() {
    const std::lock_guard lock(mutex_);
    return release_cached();
  }

  /// The counters now, taken under the lock. reserved_bytes is the bytes mapped.
  TorchModelStats stats() const {
    const std::lock_guard lock(mutex_);
    return books_.stats;
  }

  /// Checks the block lists, the byte counts, and that mapped blocks lie on mapped pages and
  /// unmapped ranges are whole unmapped pages. For tests.
  bool consistent() const {
    const std::lock_guard lock(mutex_);
    std::size_t mapped_pages_bytes = 0;
    for (const auto& segment : segments_) {
      mapped_pages_bytes += static_cast<std::size_t>(std::count(segment->mapped.begin(), segment->mapped.end(), true)) *
                            segment->page_size;
    }
    for (const Block* b : books_.all_blocks()) {
      const detail::TorchExpandableSegment& s = *b->segment;
      const std::size_t first = (b->ptr - s.base) / s.page_size;
      const std::size_t last = pieces(b->ptr - s.base + b->size, s.page_size);
      const bool aligned = (b->ptr - s.base) % s.page_size == 0 && b->size % s.page_size == 0;
      for (std::size_t i = first; i < last; ++i) {
        if (s.mapped[i] != b->mapped || (!b->mapped && !aligned)) {
          return false;
        }
      }
    }
    return mapped_pages_bytes == books_.stats.reserved_bytes && books_.consistent(books_.stats.reserved_bytes);
  }

  /// Expandable segments (reservations) held now.
  std::size_t segment_count() const {
    const std::lock_guard lock(mutex_);
    return segments_.size();
  }

  /// The mapper.
  const Mapper& mapper() const noexcept { return mapper_; }
  /// The options, with address_space_bytes filled in.
  const PytorchExpandableOptions& options() const noexcept { return options_; }

private:
  using Block = detail::TorchBlock;
  using Segment = detail::TorchExpandableSegment;

  static void* address(std::uintptr_t a) noexcept { return reinterpret_cast<void*>(a); }
  static std::size_t page_size(bool small) noexcept {
    return small ? pytorch_rules::small_segment_size : pytorch_rules::large_segment_size;
  }
  std::size_t segment_bytes(bool small) const noexcept {
    return pieces(options_.address_space_bytes, page_size(small)) * page_size(small);
  }

  /// get_free_block with expandable segments: from the first free block of the stream at or
  /// after (stream, size, 0), on to the next while that one's size, counting the unmapped range
  /// after it, is smaller. Taken out of the pool; null when the stream has none that fits.
  static Block* take_best_fit(detail::TorchPool& pool, std::uint32_t stream, std::size_t size) {
    Block key;
    key.stream = stream;
    key.size = size;
    auto it = pool.blocks.lower_bound(&key);
    if (it == pool.blocks.end() || (*it)->stream != stream) {
      return nullptr;
    }
    const auto room = [](const Block* b) {
      return b->size + (b->next != nullptr && !b->next->mapped ? b->next->size : 0);
    };
    for (auto next = std::next(it); next != pool.blocks.end() && (*next)->stream == stream && room(*next) < room(*it);
         ++next) {
      it = next;
    }
    Block* found = *it;
    pool.blocks.erase(it);
    return found;
  }

  /// try_allocate_expandable_block: maps pages until a free block of at least `size` exists
  /// where find_segment_room puts it; that block, out of the pool, or null when mapping failed.
  Block* grow(detail::TorchPool& pool, std::uint32_t stream, std::size_t size) {
    Block* candidate = find_segment_room(pool, stream, size);
    if (candidate == nullptr || (!candidate->mapped && !map_block(pool, candidate, std::min(candidate->size, size)))) {
      return nullptr;
    }
    while (candidate->size < size) { // a free block, then unmapped addresses
      Block* next = candidate->next;
      if (next == nullptr || next->mapped || next->allocated ||
          !map_block(pool, next, std::min(size - candidate->size, next->size))) {
        return nullptr;
      }
      candidate = next; // map_block folded the candidate into it
    }
    pool.blocks.erase(candidate);
    return candidate;
  }

  /// find_expandable_block: the lowest unmapped range of the stream's segments in this pool that,
  /// counted from the free block before it if there is one, starts `size` bytes of free or
  /// unmapped blocks; else the whole of a newly reserved segment. Null when reserving fails.
  Block* find_segment_room(detail::TorchPool& pool, std::uint32_t stream, std::size_t size) {
    const auto free = [](const Block* b) { return b != nullptr && !b->allocated; };
    Block key;
    key.stream = stream;
    for (auto it = pool.unmapped.lower_bound(&key); it != pool.unmapped.end() && (*it)->stream == stream; ++it) {
      Block* start = free((*it)->prev) ? (*it)->prev : *it;
      std::size_t room = 0;
      for (const Block* b = start; room < size && free(b); b = b->next) {
        room += b->size;
      }
      if (room >= size) {
        return start;
      }
    }
    const std::size_t bytes = segment_bytes(pool.small);
    const auto va = mapper_.reserve(bytes, granularity_);
    if (!va) {
      ++books_.stats.failed_device_allocations;
      return nullptr;
    }
    ++books_.stats.reservations;
    auto segment = std::make_unique<Segment>();
    segment->base = reinterpret_cast<std::uintptr_t>(*va);
    segment->page_size = page_size(pool.small);
    segment->mapped.assign(bytes / segment->page_size, false);
    auto* range = new Block;
    range->ptr = segment->base;
    range->size = bytes;
    range->segment = segment.get();
    range->stream = stream;
    range->small = pool.small;
    range->mapped = false;
    segments_.push_back(std::move(segment));
    pool.unmapped.insert(range);
    return range;
  }

  /// map_block: maps the pages under the first `size` bytes of the unmapped range `range`; the
  /// mapped part (whole pages) becomes a free block merged with its free neighbours and filed in
  /// the pool, the rest stays an unmapped range. False, with nothing changed, when mapping fails.
  bool map_block(detail::TorchPool& pool, Block* range, std::size_t size) {
    Segment& segment = *range->segment;
    const std::size_t first = (range->ptr - segment.base) / segment.page_size;
    const std::size_t last = pieces(range->ptr - segment.base + size, segment.page_size);
    if (!map_pages(segment, first, last)) {
      return false;
    }
    const std::size_t mapped = (last - first) * segment.page_size;
    pool.unmapped.erase(range);
    range->mapped = true;
    if (mapped < range->size) {
      Block* rest = books_.split_off(range, mapped);
      rest->mapped = false;
      pool.unmapped.insert(rest);
    }
    books_.merge(range, range->prev);
    books_.merge(range, range->next);
    pool.blocks.insert(range);
    return true;
  }

  /// ExpandableSegment::map on pages [first, last): creates each page, maps each, opens the run
  /// to the device, then releases the handles (the mappings keep the memory). Undoes what it did
  /// and returns false when the capacity or the mapper refuses.
  bool map_pages(Segment& segment, std::size_t first, std::size_t last) {
    const std::size_t page = segment.page_size;
    std::vector<typename Mapper::physical_handle> handles;
    handles.reserve(last - first);
    std::size_t mapped = 0;
    bool ok = true;
    for (std::size_t i = first; ok && i < last; ++i) {
      ok = books_.stats.reserved_bytes + (handles.size() + 1) * page <= options_.capacity_bytes;
      if (ok) {
        auto h = mapper_.create(options_.device, page);
        ok = h.has_value();
        if (ok) {
          ++books_.stats.device_allocations;
          handles.push_back(*h);
        }
      }
    }
    for (; ok && mapped < handles.size(); ++mapped) {
      ok = mapper_.map(address(segment.page_address(first + mapped)), page, handles[mapped]).has_value();
      books_.stats.maps += ok ? 1 : 0;
    }
    if (ok) {
      ok = mapper_
               .set_access(address(segment.page_address(first)), (last - first) * page, options_.device,
                           Access::read_write)
               .has_value();
      ++books_.stats.set_accesses;
    }
    if (!ok) {
      ++books_.stats.failed_device_allocations;
      unmap_pages(segment, first, first + mapped, false);
    }
    for (const auto& h : handles) {
      (void)mapper_.release(h);
      ++books_.stats.device_frees;
    }
    if (ok) {
      std::fill(segment.mapped.begin() + static_cast<std::ptrdiff_t>(first),
                segment.mapped.begin() + static_cast<std::ptrdiff_t>(last), true);
      books_.reserve_bytes((last - first) * page);
    }
    return ok;
  }

  /// Unmaps pages [first, last), one call each; `counted`: they were in reserved_bytes. A mapper
  /// that refuses to unmap a page this model mapped is broken: that ends the program.
  void unmap_pages(Segment& segment, std::size_t first, std::size_t last, bool counted) noexcept {
    for (std::size_t i = first; i < last; ++i) {
      void* va = address(segment.page_address(i));
      if (const auto r = mapper_.unmap(va, segment.page_size); !r) {
        report_misuse("carve::replay::PytorchExpandableModel: unmap", va, segment.page_size, r.error().code);
      }
      ++books_.stats.unmaps;
      segment.mapped[i] = false;
    }
    if (counted) {
      books_.stats.reserved_bytes -= (last - first) * segment.page_size;
    }
  }

  /// release_cached_blocks (release_blocks on the large pool, then the small one): unmaps the
  /// pages wholly inside every free block and frees each reservation this leaves with nothing
  /// mapped. Returns the bytes unmapped.
  std::size_t release_cached() {
    std::size_t released = 0;
    for (const bool small : {false, true}) {
      detail::TorchPool& pool = books_.pool(small);
      const std::vector<Block*> free_blocks(pool.blocks.begin(), pool.blocks.end());
      for (Block* b : free_blocks) {
        Block* range = unmap_block(pool, b, released);
        if (range != nullptr && range->prev == nullptr && range->next == nullptr) {
          release_segment(pool, range);
        }
      }
    }
    return released;
  }

  /// unmap_block: the whole pages inside free block `b` are unmapped and become an unmapped range
  /// (merged with unmapped neighbours), which is returned; the bytes before and after them stay
  /// free blocks. Null when `b` holds no whole page. Adds the bytes unmapped to `released`.
  Block* unmap_block(detail::TorchPool& pool, Block* b, std::size_t& released) {
    Segment& segment = *b->segment;
    const std::size_t first = pieces(b->ptr - segment.base, segment.page_size);
    const std::size_t last = (b->ptr - segment.base + b->size) / segment.page_size;
    if (first >= last) {
      return nullptr;
    }
    pool.blocks.erase(b);
    const std::size_t bytes = (last - first) * segment.page_size;
    if (const std::uintptr_t begin = segment.page_address(first); begin > b->ptr) {
      Block* before = b;
      b = books_.split_off(before, begin - before->ptr);
      pool.blocks.insert(before);
    }
    if (b->size > bytes) {
      pool.blocks.insert(books_.split_off(b, bytes));
    }
    unmap_pages(segment, first, last, true);
    b->mapped = false;
    books_.merge(b, b->prev);
    books_.merge(b, b->next);
    pool.unmapped.insert(b);
    released += bytes;
    return b;
  }

  /// release_expandable_segment: `b` is a whole segment with nothing mapped; its reservation goes.
  void release_segment(detail::TorchPool& pool, Block* b) noexcept {
    pool.unmapped.erase(b);
    const auto it = std::find_if(segments_.begin(), segments_.end(),
                                 [b](const std::unique_ptr<Segment>& s) { return s.get() == b->segment; });
    if (const auto r = mapper_.free_reservation(address((*it)->base), (*it)->bytes()); !r) {
      report_misuse("carve::replay::PytorchExpandableModel: free_reservation", address((*it)->base), (*it)->bytes(),
                    r.error().code);
    }
    ++books_.stats.reservation_frees;
    segments_.erase(it);
    delete b;
  }

  Mapper mapper_;
  PytorchExpandableOptions options_;
  std::size_t granularity_ = 0;
  mutable std::mutex mutex_;
  detail::TorchBooks books_;
  std::vector<std::unique_ptr<Segment>> segments_;
};

} // namespace carve::replay
