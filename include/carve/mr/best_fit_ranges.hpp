/// @file carve/mr/best_fit_ranges.hpp
/// The free and taken parts of one or more address regions, free parts handed out best fit: the
/// bookkeeping under CachingPool, AddressOnlyCard and ExpandablePool, usable on its own for any
/// addresses.
///
/// @code
/// carve::BestFitRanges space(0x10000, 1 << 20);   // one region, [0x10000, 0x10000 + 1 MiB), free
/// auto a = space.take(4096, 256);                 // a->start == 0x10000
/// auto b = space.take(8192, 4096);                // b->start == 0x11000
/// space.give(a->handle);                          // free again, merged with free neighbours
/// @endcode
///
/// take(bytes, alignment) cuts the request from the smallest free range that holds it at an
/// `alignment`-aligned address, the lowest such range among equals, so runs are reproducible; what
/// is left before the aligned start and after the request stays free. give(handle) returns a taken
/// range and merges it with the free ranges beside it in its region, so free ranges are always
/// maximal. Best fit is what keeps a long-lived range compact: small requests fill small holes and
/// the largest free range, often the untouched end, is used last. Ranges of different regions
/// never merge, even where the regions touch: a region is one segment of memory, given back whole
/// (remove_region) once nothing in it is taken.
///
/// How it is fast: every range, free or taken, is a node in its region's address-ordered list, so
/// a give finds its neighbours without a search. Free ranges are filed in size classes, as in TLSF
/// (a class per 1/32 of each power of two, two levels of bitmaps saying which classes hold any), so
/// finding the class to look in is a few bit operations. Each class keeps its ranges ordered by
/// (size, start) in a tree whose links live in the nodes (detail::IntrusiveTreap), so best fit is
/// exact and found by descent: in the request's own class, the first range of at least its size;
/// else the first range of the first class above that holds any. Filing or unfiling a range is a
/// descent too, so a take or give costs O(log n) in the n free ranges of the classes it touches
/// (expected: the tree's shape is random), however fragmented the ranges are: bench_pool_fragmentation
/// times it with 1k, 10k and 100k equal holes. One case still walks a class: a request aligned
/// more than the ranges' starts are, where the next ranges in order may each be too short once
/// their start is aligned up (the walk stops at the first that holds it; CachingPool takes with
/// alignment 1 and never walks). It allocates only when the node table grows, and then may throw
/// std::bad_alloc, changing nothing. Not thread-safe: its users hold their own lock.
#pragma once

#include <carve/mr/detail/intrusive_treap.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace carve {

/// Free and taken ranges of address regions, taken best fit (see the file's description).
class BestFitRanges {
public:
  /// Names a taken range (valid until it is given back).
  using Handle = std::uint32_t;
  /// Names a region.
  using Region = std::uint32_t;
  /// A range taken: where it starts, and the handle that gives it back.
  struct Taken {
    std::uintptr_t start = 0; ///< the aligned start
    Handle handle = 0;        ///< for give()
    std::size_t rest = 0;     ///< bytes of the range it was cut from that stay free (0: an exact fit)
  };
  /// A free range, as give() leaves it after merging.
  struct Span {
    std::uintptr_t start = 0; ///< its first address
    std::size_t bytes = 0;    ///< its length
    unsigned joined = 0;      ///< free neighbours it was merged with (0, 1 or 2)
  };

  /// Nothing free.
  BestFitRanges() { roots_.fill(none); }
  /// One region, [start, start + bytes), free. Throws std::bad_alloc.
  BestFitRanges(std::uintptr_t start, std::size_t bytes) : BestFitRanges() { (void)add_region(start, bytes); }

  /// A new region [start, start + bytes) (bytes > 0), all free; it overlaps no other. Throws
  /// std::bad_alloc (nothing changes).
  Region add_region(std::uintptr_t start, std::size_t bytes) {
    if (spare_regions_.empty()) {
      make_room(regions_, 1);
    }
    make_room(nodes_, 1);
    Region region = 0;
    if (spare_regions_.empty()) {
      region = static_cast<Region>(regions_.size());
      regions_.push_back(RegionInfo{});
    } else {
      region = spare_regions_.back();
      spare_regions_.pop_back();
    }
    const std::uint32_t n = new_node(Node{start, bytes, none, none, {}, region, true});
    file(n);
    regions_[region] = RegionInfo{start, bytes, n, true};
    free_bytes_ += bytes;
    return region;
  }

  /// Whether no byte of `region` is taken.
  bool region_free(Region region) const noexcept {
    const Node& first = nodes_[regions_[region].first];
    return first.free && first.bytes == regions_[region].bytes;
  }
  /// Forgets a region no byte of which is taken (region_free); a later add_region may reuse its id.
  void remove_region(Region region) noexcept {
    RegionInfo& info = regions_[region];
    const std::uint32_t n = info.first;
    unfile(n);
    free_bytes_ -= nodes_[n].bytes;
    drop_node(n);
    info.alive = false;
    try {
      spare_regions_.push_back(region);
    } catch (...) {
      // the id is not reused
    }
  }
  /// One more than the highest region id in use or spare: ids are below it.
  std::size_t region_ids() const noexcept { return regions_.size(); }

  /// `bytes` (> 0) aligned to `alignment` (a power of two), cut from the smallest free range that
  /// holds them (the lowest among equals); nullopt when none does (nothing changes). Throws
  /// std::bad_alloc (nothing changes) when the node table must grow and cannot.
  std::optional<Taken> take(std::size_t bytes, std::size_t alignment = 1) {
    const std::uint32_t n = best_fit(bytes, alignment);
    if (n == none) {
      return std::nullopt;
    }
    return cut(n, align_up(nodes_[n].start, alignment) - nodes_[n].start, bytes);
  }

  /// Takes exactly [start, start + bytes) (bytes > 0), which must lie inside one free range;
  /// nullopt when it does not (nothing changes). It walks the free ranges from the request's size
  /// class up, so it is for rare use (an owner keeping a range out of best fit's way). Throws
  /// std::bad_alloc (nothing changes) when the node table must grow and cannot.
  std::optional<Taken> take_at(std::uintptr_t start, std::size_t bytes) {
    std::uint32_t n = none;
    const FreeOrder<const Node> at{nodes_.data()};
    const std::uint32_t own = class_of(std::max<std::size_t>(bytes, 1));
    for (std::uint32_t c = roots_[own] != none ? own : next_class(own); c != none && n == none; c = next_class(c)) {
      for (std::uint32_t m = ConstTree::first(roots_[c], at); m != none; m = ConstTree::next(m, at)) {
        if (nodes_[m].start <= start && start - nodes_[m].start <= nodes_[m].bytes &&
            bytes <= nodes_[m].bytes - (start - nodes_[m].start)) {
          n = m;
          break;
        }
      }
    }
    if (n == none || bytes == 0) {
      return std::nullopt;
    }
    return cut(n, start - nodes_[n].start, bytes);
  }

  /// Frees a taken range, merging it with free neighbours of its region; returns the free range
  /// it is now part of.
  Span give(Handle h) noexcept {
    std::uint32_t n = h;
    free_bytes_ += nodes_[n].bytes;
    --taken_;
    unsigned joined = 0;
    if (free_at(nodes_[n].next)) {
      const std::uint32_t next = nodes_[n].next;
      unfile(next);
      absorb(n, next);
      ++joined;
    }
    if (free_at(nodes_[n].prev)) {
      const std::uint32_t prev = nodes_[n].prev;
      unfile(prev);
      absorb(prev, n);
      n = prev;
      ++joined;
    }
    nodes_[n].free = true;
    file(n);
    return Span{nodes_[n].start, nodes_[n].bytes, joined};
  }

  /// The region a taken range lies in.
  Region region(Handle h) const noexcept { return nodes_[h].region; }
  /// Where a taken range starts.
  std::uintptr_t start(Handle h) const noexcept { return nodes_[h].start; }
  /// How long a taken range is.
  std::size_t size(Handle h) const noexcept { return nodes_[h].bytes; }

  /// Calls `visit(start, bytes, free)` for every range, free or taken, of taken range `h`'s region
  /// (that region only) that overlaps [lo, hi), walking the address order out from `h`, which need
  /// not lie in [lo, hi) (for an owner that counts what lies around a range it keeps). `visit`
  /// must not change the ranges.
  template <class Visit>
  void for_each_range_near(Handle h, std::uintptr_t lo, std::uintptr_t hi, Visit&& visit) const {
    std::uint32_t n = h;
    while (nodes_[n].prev != none && nodes_[n].start > lo) {
      n = nodes_[n].prev;
    }
    for (; n != none && nodes_[n].start < hi; n = nodes_[n].next) {
      if (nodes_[n].start + nodes_[n].bytes > lo) {
        visit(nodes_[n].start, nodes_[n].bytes, nodes_[n].free);
      }
    }
  }

  /// The free range take(bytes, alignment) would cut from, left as it is; nullopt when none fits.
  std::optional<Span> best_range(std::size_t bytes, std::size_t alignment = 1) const noexcept {
    const std::uint32_t n = best_fit(bytes, alignment);
    return n == none ? std::nullopt : std::optional<Span>(Span{nodes_[n].start, nodes_[n].bytes});
  }

  /// Calls `visit(start, bytes)` for every free range of at least `at_least` bytes, smallest first
  /// (the lowest among equals); the classes below it and the empty ones are skipped, not walked.
  /// `visit` must not change the ranges.
  template <class Visit>
  void for_each_free(Visit&& visit, std::size_t at_least = 1) const {
    const FreeOrder<const Node> at{nodes_.data()};
    const std::uint32_t own = class_of(std::max<std::size_t>(at_least, 1));
    for (std::uint32_t c = roots_[own] != none ? own : next_class(own); c != none; c = next_class(c)) {
      for (std::uint32_t n = ConstTree::first(roots_[c], at); n != none; n = ConstTree::next(n, at)) {
        if (nodes_[n].bytes >= at_least) {
          visit(nodes_[n].start, nodes_[n].bytes);
        }
      }
    }
  }

  /// Bytes free in all.
  std::size_t free_bytes() const noexcept { return free_bytes_; }
  /// The largest free range (0 when nothing is free).
  std::size_t largest() const noexcept {
    if (top_ == 0) {
      return 0;
    }
    const unsigned first = 63 - static_cast<unsigned>(std::countl_zero(top_));
    const unsigned second = 31 - static_cast<unsigned>(std::countl_zero(classes_[first]));
    return nodes_[ConstTree::last(roots_[first * 32 + second], FreeOrder<const Node>{nodes_.data()})].bytes;
  }
  /// How many free ranges there are.
  std::size_t count() const noexcept { return free_count_; }
  /// How many ranges are taken.
  std::size_t taken() const noexcept { return taken_; }

  /// Whether every region's ranges tile it in address order, no two free neighbours are left
  /// unmerged, and the size classes hold exactly the free ranges, each in its own class, in
  /// well-formed trees ordered by (size, start). For tests.
  bool consistent() const {
    std::size_t free_ranges = 0;
    std::size_t free_sum = 0;
    for (const RegionInfo& r : regions_) {
      if (!r.alive) {
        continue;
      }
      std::uintptr_t at = r.start;
      bool previous_free = false;
      for (std::uint32_t n = r.first; n != none; n = nodes_[n].next) {
        const Node& node = nodes_[n];
        if (node.start != at || node.bytes == 0 || (previous_free && node.free) ||
            (node.next != none && nodes_[node.next].prev != n)) {
          return false;
        }
        free_ranges += node.free ? 1u : 0u;
        free_sum += node.free ? node.bytes : 0u;
        previous_free = node.free;
        at += node.bytes;
      }
      if (at != r.start + r.bytes) {
        return false;
      }
    }
    std::size_t filed = 0;
    const FreeOrder<const Node> at{nodes_.data()};
    for (std::uint32_t c = 0; c < class_count; ++c) {
      const bool marked = ((top_ >> (c / 32)) & 1u) != 0 && ((classes_[c / 32] >> (c % 32)) & 1u) != 0;
      std::size_t in_class = 0;
      if (marked != (roots_[c] != none) || !ConstTree::valid(roots_[c], at, in_class)) {
        return false;
      }
      for (std::uint32_t n = ConstTree::first(roots_[c], at); n != none; n = ConstTree::next(n, at)) {
        if (!nodes_[n].free || class_of(nodes_[n].bytes) != c) {
          return false;
        }
      }
      filed += in_class;
    }
    return filed == free_ranges && free_ranges == free_count_ && free_sum == free_bytes_;
  }

private:
  static constexpr std::uint32_t none = detail::treap_none;
  static constexpr std::uint32_t class_count = 64 * 32;
  struct Node {
    std::uintptr_t start = 0;
    std::size_t bytes = 0;
    std::uint32_t prev = none;     ///< the range before it in its region
    std::uint32_t next = none;     ///< the range after it
    detail::TreapLinks free_links; ///< in its size class's tree, while free
    Region region = 0;
    bool free = false;
  };
  // Free ranges in a class's tree: by size, then by start (starts are unique, so the order is
  // total). `N` is Node, or const Node where the tree is only read.
  template <class N>
  struct FreeOrder {
    N* nodes;
    auto& links(std::uint32_t n) const noexcept { return nodes[n].free_links; }
    bool before(std::uint32_t a, std::uint32_t b) const noexcept {
      return nodes[a].bytes != nodes[b].bytes ? nodes[a].bytes < nodes[b].bytes : nodes[a].start < nodes[b].start;
    }
  };
  using Tree = detail::IntrusiveTreap<FreeOrder<Node>>;
  using ConstTree = detail::IntrusiveTreap<FreeOrder<const Node>>;
  struct RegionInfo {
    std::uintptr_t start = 0;
    std::size_t bytes = 0;
    std::uint32_t first = none; ///< its first range
    bool alive = true;
  };

  static std::uintptr_t align_up(std::uintptr_t a, std::size_t alignment) noexcept {
    return (a + (alignment - 1)) & ~std::uintptr_t{alignment - 1};
  }

  // The size class of `bytes` (> 0): sizes below 32 one class each, then 32 classes per power of
  // two, so a class's sizes are within 1/32 of each other. Classes grow with the sizes they hold.
  static std::uint32_t class_of(std::size_t bytes) noexcept {
    if (bytes < 32) {
      return static_cast<std::uint32_t>(bytes);
    }
    const auto log = static_cast<unsigned>(std::bit_width(bytes)) - 1; // >= 5
    return (log - 4) * 32 + static_cast<std::uint32_t>((bytes >> (log - 5)) & 31);
  }

  // The first class above `c` that holds a free range, or none.
  std::uint32_t next_class(std::uint32_t c) const noexcept {
    const std::uint32_t first = c / 32;
    const std::uint32_t second = c % 32;
    const std::uint32_t above = second == 31 ? 0u : classes_[first] & (~std::uint32_t{0} << (second + 1));
    if (above != 0) {
      return first * 32 + static_cast<std::uint32_t>(std::countr_zero(above));
    }
    const std::uint64_t higher = first == 63 ? 0u : top_ & (~std::uint64_t{0} << (first + 1));
    if (higher == 0) {
      return none;
    }
    const auto f = static_cast<std::uint32_t>(std::countr_zero(higher));
    return f * 32 + static_cast<std::uint32_t>(std::countr_zero(classes_[f]));
  }

  // The free range best fit takes for the request, or none: the smallest that holds it aligned,
  // the lowest among equals. Classes and, within one, the tree run in (size, start) order, so the
  // answer is the first range from the first one of at least the request's size that holds it
  // aligned: the request's own class may hold ranges too small (skipped by the descent) and
  // ranges that cannot be aligned (walked past), every class above only ranges large enough.
  std::uint32_t best_fit(std::size_t bytes, std::size_t alignment) const noexcept {
    const FreeOrder<const Node> at{nodes_.data()};
    const std::uint32_t own = class_of(bytes);
    for (std::uint32_t c = roots_[own] != none ? own : next_class(own); c != none; c = next_class(c)) {
      for (std::uint32_t n =
               ConstTree::lower_bound(roots_[c], at, [&](std::uint32_t m) { return nodes_[m].bytes < bytes; });
           n != none; n = ConstTree::next(n, at)) {
        const Node& node = nodes_[n];
        const std::uintptr_t aligned = align_up(node.start, alignment);
        if (aligned >= node.start && aligned - node.start <= node.bytes - bytes) {
          return n; // it holds the request at an aligned address
        }
      }
    }
    return none;
  }

  bool free_at(std::uint32_t n) const noexcept { return n != none && nodes_[n].free; }

  // Files free node `n` in its size class.
  void file(std::uint32_t n) noexcept {
    const std::uint32_t c = class_of(nodes_[n].bytes);
    Tree::insert(roots_[c], n, FreeOrder<Node>{nodes_.data()});
    classes_[c / 32] |= std::uint32_t{1} << (c % 32);
    top_ |= std::uint64_t{1} << (c / 32);
    ++free_count_;
  }
  // Takes node `n` out of its size class.
  void unfile(std::uint32_t n) noexcept {
    const std::uint32_t c = class_of(nodes_[n].bytes);
    Tree::erase(roots_[c], n, FreeOrder<Node>{nodes_.data()});
    if (roots_[c] == none) {
      classes_[c / 32] &= ~(std::uint32_t{1} << (c % 32));
      if (classes_[c / 32] == 0) {
        top_ &= ~(std::uint64_t{1} << (c / 32));
      }
    }
    --free_count_;
  }

  // Room for `extra` more elements without a reallocation (growing geometrically, so that making
  // room before every change costs nothing on the whole).
  template <class Vector>
  static void make_room(Vector& v, std::size_t extra) {
    if (v.capacity() - v.size() < extra) {
      v.reserve(std::max(2 * v.capacity(), v.size() + extra));
    }
  }

  // A node from the spares, or a new one (make room in nodes_ first where nothing may throw).
  std::uint32_t new_node(const Node& value) {
    if (!spare_.empty()) {
      const std::uint32_t n = spare_.back();
      spare_.pop_back();
      nodes_[n] = value;
      return n;
    }
    nodes_.push_back(value);
    return static_cast<std::uint32_t>(nodes_.size() - 1);
  }
  void drop_node(std::uint32_t n) noexcept {
    try {
      spare_.push_back(n);
    } catch (...) {
      // the slot is not reused; nothing else depends on it
    }
  }

  // Takes `bytes` of free node `n`, `pad` bytes after its start; the pad and the tail stay free.
  Taken cut(std::uint32_t n, std::size_t pad, std::size_t bytes) {
    make_room(nodes_, 2); // the pieces that stay free, before anything changes
    const std::uintptr_t start = nodes_[n].start + pad;
    const std::size_t tail = nodes_[n].bytes - pad - bytes;
    unfile(n);
    std::uint32_t got = n;
    if (pad != 0) { // the taken part becomes a node of its own after the pad, which stays free
      got = split_after(n, pad);
      file(n);
    }
    if (tail != 0) {
      file(split_after(got, bytes));
    }
    nodes_[got].free = false;
    free_bytes_ -= bytes;
    ++taken_;
    return Taken{start, got, pad + tail};
  }

  // Cuts node `n` after its first `keep` bytes; the rest becomes a new free node after it
  // (returned, not yet filed).
  std::uint32_t split_after(std::uint32_t n, std::size_t keep) {
    const Node& node = nodes_[n];
    const std::uint32_t m = new_node(Node{node.start + keep, node.bytes - keep, n, node.next, {}, node.region, true});
    Node& first = nodes_[n];
    if (first.next != none) {
      nodes_[first.next].prev = m;
    }
    first.next = m;
    first.bytes = keep;
    return m;
  }

  // Joins node `b` (the one after `a`) into `a`.
  void absorb(std::uint32_t a, std::uint32_t b) noexcept {
    nodes_[a].bytes += nodes_[b].bytes;
    nodes_[a].next = nodes_[b].next;
    if (nodes_[b].next != none) {
      nodes_[nodes_[b].next].prev = a;
    }
    drop_node(b);
  }

  std::vector<Node> nodes_;
  std::vector<std::uint32_t> spare_; ///< nodes_ slots free for reuse
  std::vector<RegionInfo> regions_;
  std::vector<Region> spare_regions_;              ///< ids of removed regions, for reuse
  std::array<std::uint32_t, class_count> roots_{}; ///< per size class, its tree's root
  std::array<std::uint32_t, 64> classes_{};        ///< per power of two, which of its 32 classes hold any
  std::uint64_t top_ = 0;                          ///< which powers of two hold any
  std::size_t free_count_ = 0;
  std::size_t free_bytes_ = 0;
  std::size_t taken_ = 0;
};

} // namespace carve
