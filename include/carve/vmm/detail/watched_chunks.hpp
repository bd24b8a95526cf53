// carve/vmm/detail/watched_chunks.hpp — the chunks of a reservation whose holes are lent and the
// second mappings of those holes, each with the number of blocks that touch it: what tells an
// ExpandablePool when a chunk's holes may come home (hole_lending.hpp: find_homecomings), which is
// once no block touches the chunk nor any of its second mappings. Every allocation and free asks
// which of them its block touches, so that is a few word tests (a bitmap marks the granules they
// lie on, a table by granule names the chunk on each marked one), and whether a chunk's holes may
// come home is kept current as blocks come and go, not searched for.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace carve::detail {

// Watched chunks, with their blocks. Not thread-safe: the pool holds its lock.
class WatchedChunks {
public:
  // `on` false: its owner watches nothing (see on()), so a pool that keeps lent holes pays nothing.
  WatchedChunks(std::uintptr_t base, std::size_t granule, bool on) noexcept
      : base_(base), shift_(static_cast<unsigned>(std::countr_zero(granule))), on_(on) {}

  // Whether its owner should watch at all (hole_lending.hpp's watch_lent asks).
  bool on() const noexcept { return on_; }

  // Watches the chunk [start, start + bytes) whose holes are lent (whole granules, overlapping no
  // other watched chunk), which `users` blocks touch now. Throws std::bad_alloc (then it is not
  // watched).
  void watch_home(std::uintptr_t start, std::size_t bytes, std::size_t users) {
    (void)add_chunk(start, bytes, users, none);
  }
  // Watches the second mapping [at, at + bytes) of a hole of the watched chunk at `home`; no block
  // touches it yet. Throws std::bad_alloc (then it is not watched).
  void watch_second(std::uintptr_t at, std::size_t bytes, std::uintptr_t home) {
    const Watched* h = find(home);
    if (h != nullptr && h->home == none) {
      (void)add_chunk(at, bytes, 0, static_cast<std::uint32_t>(h - chunks_.data()));
    }
  }
  // Whether the chunk (or second mapping) that starts at `start` is watched.
  bool watched(std::uintptr_t start) const noexcept { return find(start) != nullptr; }
  // Stops watching the chunk or second mapping that starts at `start` (nothing for one not watched).
  // A chunk goes after its second mappings.
  void forget(std::uintptr_t start) noexcept {
    Watched* w = find(start);
    if (w == nullptr) {
      return;
    }
    if (w->home != none && w->users != 0) {
      --chunks_[w->home].busy;
    }
    const auto slot = static_cast<std::uint32_t>(w - chunks_.data());
    const std::size_t first = granule_of(w->start), last = granule_of(w->start + w->bytes - 1);
    std::fill(owner_.begin() + static_cast<std::ptrdiff_t>(first),
              owner_.begin() + static_cast<std::ptrdiff_t>(last + 1), none);
    mark(first, last, false);
    *w = Watched{};
    w->users = free_slot_; // a free slot: bytes 0, users the next free slot
    free_slot_ = slot;
    covered_ = --count_ == 0 ? 0 : covered_;
  }

  // A block of [addr, addr + bytes) now touches the watched chunks it lies on.
  void add(std::uintptr_t addr, std::size_t bytes) noexcept {
    for_each_in(addr, bytes, [&](Watched& w) {
      if (w.users++ == 0 && w.home != none) {
        ++chunks_[w.home].busy;
      }
    });
  }
  // A block added before is gone; whether a chunk it touched (or whose second mapping it touched)
  // may now bring its holes home (ready()).
  bool remove(std::uintptr_t addr, std::size_t bytes) noexcept {
    bool freed = false;
    for_each_in(addr, bytes, [&](Watched& w) {
      if (--w.users != 0) {
        return;
      }
      if (w.home == none) {
        freed |= w.busy == 0;
      } else {
        Watched& home = chunks_[w.home];
        freed |= --home.busy == 0 && home.users == 0;
      }
    });
    return freed;
  }
  // Calls `visit(home)` for each chunk that may bring its holes home, among those [addr, addr +
  // bytes) touches and those whose second mappings it touches (a chunk may be visited twice).
  template <class Visit>
  void for_each_ready_in(std::uintptr_t addr, std::size_t bytes, Visit&& visit) {
    for_each_in(addr, bytes, [&](const Watched& w) {
      const Watched& home = w.home == none ? w : chunks_[w.home];
      if (home.users == 0 && home.busy == 0) {
        visit(home.start);
      }
    });
  }
  // Whether no block touches the watched chunk at `home`, nor any of its watched second mappings;
  // false for a chunk not watched.
  bool ready(std::uintptr_t home) const noexcept {
    const Watched* w = find(home);
    return w != nullptr && w->home == none && w->users == 0 && w->busy == 0;
  }
  // Whether the watched chunk or second mapping at `start` has no block; false for one not watched.
  bool unused(std::uintptr_t start) const noexcept {
    const Watched* w = find(start);
    return w != nullptr && w->users == 0;
  }
  // Calls `visit(start, bytes, users)` for every watched chunk and second mapping, in no order, and
  // returns whether each chunk's count of second mappings with blocks is right (for a check).
  template <class Visit>
  bool for_each(Visit&& visit) const {
    std::vector<std::uint32_t> busy(chunks_.size());
    for (const Watched& w : chunks_) {
      if (w.bytes != 0) {
        visit(w.start, w.bytes, w.users);
        busy[w.home == none ? 0 : w.home] += w.home != none && w.users != 0 ? 1u : 0u;
      }
    }
    for (std::size_t i = 0; i < chunks_.size(); ++i) {
      if (chunks_[i].bytes != 0 && chunks_[i].home == none && chunks_[i].busy != busy[i]) {
        return false;
      }
    }
    return true;
  }

private:
  static constexpr std::uint32_t none = UINT32_MAX;
  struct Watched {
    std::uintptr_t start = 0;
    std::size_t bytes = 0;     // 0: a free slot
    std::size_t users = 0;     // blocks on it; in a free slot, the next free slot
    std::uint32_t home = none; // a second mapping's chunk; none for a chunk
    std::uint32_t busy = 0;    // a chunk's second mappings that blocks touch
  };

  std::size_t granule_of(std::uintptr_t addr) const noexcept { return (addr - base_) >> shift_; }

  std::uint32_t add_chunk(std::uintptr_t start, std::size_t bytes, std::size_t users, std::uint32_t home) {
    const std::size_t last = granule_of(start + bytes - 1);
    if (last >= owner_.size()) {
      bits_.resize(last / 64 + 1);
      owner_.resize(bits_.size() * 64, none);
    }
    std::uint32_t slot = free_slot_;
    if (slot == none) {
      chunks_.push_back(Watched{});
      slot = static_cast<std::uint32_t>(chunks_.size() - 1);
    } else {
      free_slot_ = static_cast<std::uint32_t>(chunks_[slot].users);
    }
    chunks_[slot] = Watched{start, bytes, users, home, 0};
    std::fill(owner_.begin() + static_cast<std::ptrdiff_t>(granule_of(start)),
              owner_.begin() + static_cast<std::ptrdiff_t>(last + 1), slot);
    mark(granule_of(start), last, true);
    ++count_;
    covered_ = owner_.size() << shift_;
    return slot;
  }

  const Watched* find(std::uintptr_t start) const noexcept {
    if (start - base_ >= covered_) {
      return nullptr;
    }
    const std::uint32_t slot = owner_[granule_of(start)];
    return slot != none && chunks_[slot].start == start ? &chunks_[slot] : nullptr;
  }
  Watched* find(std::uintptr_t start) noexcept {
    return const_cast<Watched*>(static_cast<const WatchedChunks&>(*this).find(start));
  }

  // Visits each watched chunk [addr, addr + bytes) touches, once: the bitmap a word at a time,
  // past each chunk found.
  template <class Visit>
  void for_each_in(std::uintptr_t addr, std::size_t bytes, Visit&& visit) {
    const std::uintptr_t offset = addr - base_; // below base_, it wraps past the table
    if (offset >= covered_) {
      return;
    }
    const std::size_t last = std::min((offset + bytes - 1) >> shift_, owner_.size() - 1);
    if (last == offset >> shift_) { // inside one granule, as most blocks are: the table alone
      if (const std::uint32_t slot = owner_[last]; slot != none) {
        visit(chunks_[slot]);
      }
      return;
    }
    for (std::size_t g = offset >> shift_; g <= last;) {
      std::size_t word = g / 64;
      std::uint64_t bits = bits_[word] & (~std::uint64_t{0} << (g % 64));
      while (bits == 0) {
        if (++word > last / 64) {
          return;
        }
        bits = bits_[word];
      }
      g = word * 64 + static_cast<std::size_t>(std::countr_zero(bits));
      if (g > last) {
        return;
      }
      Watched& w = chunks_[owner_[g]];
      visit(w);
      g = granule_of(w.start + w.bytes - 1) + 1;
    }
  }
  // Sets (or clears) the bits of granules [first, last].
  void mark(std::size_t first, std::size_t last, bool on) noexcept {
    for (std::size_t word = first / 64; word <= last / 64; ++word) {
      const std::size_t lo = word == first / 64 ? first % 64 : 0;
      const std::size_t hi = word == last / 64 ? last % 64 : 63;
      const std::uint64_t mask = (~std::uint64_t{0} >> (63 - hi)) & (~std::uint64_t{0} << lo);
      bits_[word] = on ? bits_[word] | mask : bits_[word] & ~mask;
    }
  }

  std::uintptr_t base_;
  unsigned shift_;                   // log2 of the granule
  std::vector<Watched> chunks_;      // by slot; freed slots are reused
  std::vector<std::uint64_t> bits_;  // by granule from base_: 1 where a watched chunk lies
  std::vector<std::uint32_t> owner_; // by granule from base_: the slot of the chunk on it, or none
  std::uint32_t free_slot_ = none;   // the first free slot of chunks_
  std::size_t count_ = 0;            // chunks and second mappings watched now
  std::size_t covered_ = 0;          // bytes from base_ the table covers; 0 while nothing is watched
  bool on_;
};

} // namespace carve::detail
