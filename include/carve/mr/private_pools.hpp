/// @file carve/mr/private_pools.hpp
/// Blocks that belong to one named private pool until that pool is released: what a CUDA graph
/// needs of the allocator it is captured with.
///
/// @code
/// carve::PrivatePools<cudaStream_t> graphs;
/// graphs.open(id);                                      // capture begins allocating to pool `id`
/// void* p = graphs.reuse(id, stream, bytes);            // a block the pool holds free, or null
/// if (p == nullptr) { p = take(stream, bytes); graphs.adopt(id, p, bytes); }   // from the owner's pool
/// auto [freed, block] = graphs.free(p, stream, bytes);  // kept: it stays the graph's
/// for (auto b : graphs.release(id)) { give(b.stream, b.p, b.bytes); }   // the graph is gone
/// @endcode
///
/// A captured graph replays with the addresses it was captured with, so the blocks its capture
/// allocated must stay out of everyone else's reach for as long as it may replay. Freed during the
/// capture (a temporary), such a block may serve only later requests of the same pool: the graph,
/// or graphs that share its pool, replay in the order they were captured. It goes back to the
/// allocator only once its pool is released (the graph destroyed) and nothing of it is in use.
/// PrivatePools keeps that bookkeeping beside any pool and hands out no memory of its own: its
/// owner allocates from its pool and adopts the block, and gives back to its pool what free() and
/// release() return, with the size it was made with.
///
/// Reuse inside a pool follows stream order, as a stream-ordered pool's does: a block freed on
/// stream S serves a later request of the same pool on S (queued behind its last use, in the
/// capture as in every replay) of at least half its size, the smallest first; a block freed on
/// another stream waits for the release. Pools are counted: each open() needs a release(), and a
/// pool released with blocks still in use hands each back as it is freed.
///
/// Errors: adopt() refuses (false, nothing changes) a pool not open or a block some pool already
/// holds; free() refuses (nothing changes) a block its pool holds free already (freed twice) and a
/// size other than the one its user asked for. Thread-safe (one lock); the tables' own allocations
/// may throw std::bad_alloc, with nothing changed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

namespace carve {

/// A private pool's name: two numbers, the shape of PyTorch's MempoolId_t.
using PrivatePoolId = std::pair<std::uint64_t, std::uint64_t>;

/// Private pools of blocks over an owner's pool (see the file's description). `Stream` is the
/// owner's stream type: compared with ==.
template <class Stream>
class PrivatePools {
public:
  /// A block as its owner's pool made it.
  struct Block {
    void* p = nullptr;     ///< its address
    std::size_t bytes = 0; ///< as the owner's pool made it (give it back with this size)
    Stream stream{};       ///< where it was last freed (where it was made, while in use)
  };
  /// What a free means for the owner.
  enum class Freed {
    not_private, ///< no pool holds it: the owner frees it as usual
    kept,        ///< its pool keeps it for later requests of the pool
    give_back,   ///< its pool was released: the owner gives `block` back to its pool now
    twice,       ///< its pool holds it free already: a second free, refused (nothing changes)
    wrong_size,  ///< not the size its user asked for: refused (nothing changes)
  };

  /// Capture begins allocating to pool `id` (made on first use): one more user of it.
  void open(PrivatePoolId id) {
    const std::lock_guard lock(mutex_);
    ++pools_[id].users;
  }

  /// A free block of pool `id` for `bytes` on `stream`, now in use again; null when none fits:
  /// one freed on `stream`, of `bytes` to twice that, the smallest (then the oldest) first.
  [[nodiscard]] void* reuse(PrivatePoolId id, Stream stream, std::size_t bytes) {
    const std::lock_guard lock(mutex_);
    const auto pool = pools_.find(id);
    if (pool == pools_.end() || pool->second.users == 0) {
      return nullptr;
    }
    auto& free = pool->second.free;
    for (auto it = free.lower_bound(bytes); it != free.end() && it->first / 2 <= bytes; ++it) {
      if (it->second.stream == stream) {
        void* p = it->second.p;
        Owned& owned = live_.at(p);
        owned.free = false;
        owned.stream = stream;
        owned.requested = bytes;
        ++pool->second.live;
        free.erase(it);
        return p;
      }
    }
    return nullptr;
  }

  /// Block `p` (`bytes` as the owner's pool made it, for work on `stream`) now belongs to pool `id`.
  /// false (nothing changes) when pool `id` is not open or `p` belongs to a pool already.
  bool adopt(PrivatePoolId id, void* p, std::size_t bytes, Stream stream) {
    const std::lock_guard lock(mutex_);
    const auto pool = pools_.find(id);
    if (pool == pools_.end() || pool->second.users == 0 || live_.count(p) != 0) {
      return false;
    }
    live_.emplace(p, Owned{id, bytes, bytes, stream});
    ++pool->second.live;
    bytes_ += bytes;
    return true;
  }

  /// A free of `p` (`bytes` as its user asked for it) on `stream`: kept by its pool, handed back
  /// (its pool was released), not private at all, or refused (twice, wrong_size). `block` is the
  /// block as its owner's pool made it (empty unless kept or give_back).
  std::pair<Freed, Block> free(void* p, Stream stream, std::size_t bytes) {
    const std::lock_guard lock(mutex_);
    const auto owned = live_.find(p);
    if (owned == live_.end()) {
      return {Freed::not_private, Block{}};
    }
    if (owned->second.free || owned->second.requested != bytes) {
      return {owned->second.free ? Freed::twice : Freed::wrong_size, Block{}};
    }
    const auto pool = pools_.find(owned->second.id);
    const Block block{p, owned->second.bytes, stream};
    if (pool->second.users == 0) { // released: the last of its blocks go home as they are freed
      --pool->second.live;
      forget(owned, pool);
      return {Freed::give_back, block};
    }
    pool->second.free.emplace(block.bytes, block); // first: it may throw
    --pool->second.live;
    owned->second.free = true;
    owned->second.stream = stream;
    return {Freed::kept, block};
  }

  /// One less user of pool `id`. When none is left, returns its free blocks for the owner to give
  /// back (each with the stream it was freed on); blocks still in use follow as they are freed.
  /// Empty while the pool has users, or when there is no such pool.
  std::vector<Block> release(PrivatePoolId id) {
    const std::lock_guard lock(mutex_);
    const auto pool = pools_.find(id);
    if (pool == pools_.end() || pool->second.users == 0 || --pool->second.users != 0) {
      return {};
    }
    std::vector<Block> out;
    out.reserve(pool->second.free.size());
    for (const auto& [bytes, block] : pool->second.free) {
      out.push_back(block);
    }
    for (const Block& b : out) {
      bytes_ -= b.bytes;
      live_.erase(b.p);
    }
    pool->second.free.clear();
    if (pool->second.live == 0) {
      pools_.erase(pool);
    }
    return out;
  }

  /// Whether `p` belongs to a pool (in use or kept free).
  bool holds(const void* p) const {
    const std::lock_guard lock(mutex_);
    return live_.count(const_cast<void*>(p)) != 0;
  }
  /// Bytes the pools hold, in use and free, as their owner's pool made them.
  std::size_t bytes() const {
    const std::lock_guard lock(mutex_);
    return bytes_;
  }
  /// Pools that exist: open, or released with blocks still in use.
  std::size_t pools() const {
    const std::lock_guard lock(mutex_);
    return pools_.size();
  }

private:
  struct Pool {
    std::size_t users = 0; ///< open() less release()
    std::size_t live = 0;  ///< blocks in use
    std::multimap<std::size_t, Block> free;
  };
  struct Owned {
    PrivatePoolId id;
    std::size_t bytes = 0;     ///< as the owner's pool made it
    std::size_t requested = 0; ///< as its present user asked for it (reuse() hands out larger blocks)
    Stream stream{};
    bool free = false;
  };
  using OwnedIt = typename std::unordered_map<void*, Owned>::iterator;
  using PoolIt = typename std::map<PrivatePoolId, Pool>::iterator;

  void forget(OwnedIt owned, PoolIt pool) {
    bytes_ -= owned->second.bytes;
    live_.erase(owned);
    if (pool->second.live == 0 && pool->second.free.empty()) {
      pools_.erase(pool);
    }
  }

  mutable std::mutex mutex_;
  std::map<PrivatePoolId, Pool> pools_;
  std::unordered_map<void*, Owned> live_; ///< every block a pool holds, by address
  std::size_t bytes_ = 0;
};

} // namespace carve
