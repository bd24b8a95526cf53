// carve/vmm/detail/watched_chunks.hpp — the chunks of a reservation whose holes are lent and the
// second mappings of those holes, each with the number of blocks that touch it: what tells an
// ExpandablePool when holes may come home (hole_lending.hpp: find_homecomings). They are few (a
// sorted array), and a bitmap of their granules makes the common case, a block that touches none,
// a few word tests.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <utility>
#include <vector>

namespace carve::detail {

// Watched chunks, with their blocks. Not thread-safe: the pool holds its lock.
class WatchedChunks {
public:
  // `on` false: its owner watches nothing (see on()), so a pool that keeps lent holes pays nothing.
  WatchedChunks(std::uintptr_t base, std::size_t granule, bool on) noexcept
      : base_(base), shift_(static_cast<unsigned>(std::countr_zero(granule))), on_(on) {}

  // Watches the chunk [start, start + bytes) (no other watched chunk overlaps it), which `users`
  // blocks touch now. Throws std::bad_alloc (then it is not watched).
  void watch(std::uintptr_t start, std::size_t bytes, std::size_t users) {
    const std::size_t last = (start + bytes - 1 - base_) >> shift_;
    if (last / 64 >= bits_.size()) {
      bits_.resize(last / 64 + 1);
    }
    chunks_.insert(after(chunks_, start), Watched{start, bytes, users});
    mark(start, bytes, true);
  }
  // Whether its owner should watch at all (hole_lending.hpp's watch_lent asks).
  bool on() const noexcept { return on_; }
  // Whether the chunk that starts at `start` is watched.
  bool watched(std::uintptr_t start) const noexcept { return find(start) != chunks_.end(); }
  // Stops watching the chunk that starts at `start` (nothing for one not watched).
  void forget(std::uintptr_t start) noexcept {
    if (const auto it = find(start); it != chunks_.end()) {
      mark(it->start, it->bytes, false);
      chunks_.erase(it);
    }
  }
  // A block of [addr, addr + bytes) now touches the watched chunks it lies on.
  void add(std::uintptr_t addr, std::size_t bytes) noexcept {
    if (touches(addr, bytes)) {
      for_each_in(*this, addr, bytes, [](Watched& w) { ++w.users; });
    }
  }
  // A block added before is gone; whether a watched chunk it touched has no block left.
  bool remove(std::uintptr_t addr, std::size_t bytes) noexcept {
    bool emptied = false;
    if (touches(addr, bytes)) {
      for_each_in(*this, addr, bytes, [&](Watched& w) { emptied |= --w.users == 0; });
    }
    return emptied;
  }
  // Calls `visit(start)` for each watched chunk that [addr, addr + bytes) touches and no block does.
  template <class Visit>
  void for_each_unused_in(std::uintptr_t addr, std::size_t bytes, Visit&& visit) const {
    for_each_in(*this, addr, bytes, [&](const Watched& w) {
      if (w.users == 0) {
        visit(w.start);
      }
    });
  }
  // Calls `visit(start, bytes, users)` for every watched chunk, by start (for a check of the counts).
  template <class Visit>
  void for_each(Visit&& visit) const {
    for (const Watched& w : chunks_) {
      visit(w.start, w.bytes, w.users);
    }
  }
  // Whether the watched chunk that starts at `start` has no block; false for a chunk not watched.
  bool unused(std::uintptr_t start) const noexcept {
    const auto it = find(start);
    return it != chunks_.end() && it->users == 0;
  }

private:
  struct Watched {
    std::uintptr_t start;
    std::size_t bytes;
    std::size_t users;
  };
  using Chunks = std::vector<Watched>;

  // The first chunk of `chunks` (const or not) that starts after `addr`.
  template <class Of>
  static auto after(Of& chunks, std::uintptr_t addr) noexcept -> decltype(chunks.begin()) {
    return std::upper_bound(chunks.begin(), chunks.end(), addr,
                            [](std::uintptr_t a, const Watched& w) { return a < w.start; });
  }
  Chunks::const_iterator find(std::uintptr_t start) const noexcept {
    const auto it = std::lower_bound(chunks_.begin(), chunks_.end(), start,
                                     [](const Watched& w, std::uintptr_t a) { return w.start < a; });
    return it != chunks_.end() && it->start == start ? it : chunks_.end();
  }
  Chunks::iterator find(std::uintptr_t start) noexcept {
    return chunks_.begin() + (std::as_const(*this).find(start) - chunks_.cbegin());
  }
  // Visits the chunks of `self` (const or not) that [addr, addr + bytes) touches.
  template <class Self, class Visit>
  static void for_each_in(Self& self, std::uintptr_t addr, std::size_t bytes, Visit&& visit) {
    auto& chunks = self.chunks_;
    auto it = after(chunks, addr);
    if (it != chunks.begin() && std::prev(it)->start + std::prev(it)->bytes > addr) {
      --it;
    }
    for (; it != chunks.end() && it->start < addr + bytes; ++it) {
      visit(*it);
    }
  }
  void mark(std::uintptr_t start, std::size_t bytes, bool on) noexcept {
    for (std::size_t g = (start - base_) >> shift_, last = (start + bytes - 1 - base_) >> shift_; g <= last; ++g) {
      const std::uint64_t bit = std::uint64_t{1} << (g % 64);
      bits_[g / 64] = on ? bits_[g / 64] | bit : bits_[g / 64] & ~bit;
    }
  }
  // Whether [addr, addr + bytes) touches a watched granule.
  bool touches(std::uintptr_t addr, std::size_t bytes) const noexcept {
    if (chunks_.empty() || addr < base_) {
      return false;
    }
    const std::size_t first = (addr - base_) >> shift_;
    const std::size_t last = std::min((addr + bytes - 1 - base_) >> shift_, bits_.size() * 64 - 1);
    for (std::size_t g = first; g <= last; g = (g / 64 + 1) * 64) {
      const std::uint64_t word = bits_[g / 64] >> (g % 64);
      const std::size_t span = std::min<std::size_t>(64 - g % 64, last - g + 1);
      if ((span == 64 ? word : word & ((std::uint64_t{1} << span) - 1)) != 0) {
        return true;
      }
    }
    return false;
  }

  std::uintptr_t base_;
  unsigned shift_;                  // log2 of the granule
  Chunks chunks_;                   // by start
  std::vector<std::uint64_t> bits_; // one bit a granule: 1 where a watched chunk lies
  bool on_;
};

} // namespace carve::detail
