// src/torch/device_stack.hpp — what every one of libcarve_torch's stacks does whatever its pool
// (pool_stacks.hpp builds the three kinds over it): the counting into its Books, the retry after
// giving back the cache before an allocation is refused, and the CUDA graphs' private pools with
// what must wait while a capture is under way.

#pragma once

#include "backends.hpp"
#include "books.hpp"
#include "capture_gate.hpp"

#include <carve/core/errc.hpp>
#include <carve/core/misuse.hpp>
#include <carve/mr/private_pools.hpp>
#include <carve/vmm/expandable_pool_options.hpp>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <mutex>
#include <new>
#include <optional>
#include <shared_mutex> // std::shared_lock
#include <string>
#include <vector>

namespace carve::torch {

// The alignment of every block (and the rounding of the live counts): PyTorch's.
inline constexpr std::size_t block_alignment = 512;

// What CARVE_TORCH_POOL and the size variables chose.
enum class PoolKind { caching, stream_ordered, expandable };

// The options a stack is built with.
struct StackOptions {
  PoolKind pool = PoolKind::expandable;
  std::size_t max_reserved = std::numeric_limits<std::size_t>::max(); // per device
  std::size_t idle_threshold = std::numeric_limits<std::size_t>::max();
  std::size_t max_chunk = std::numeric_limits<std::size_t>::max(); // the expandable pool's max_chunk_bytes
  std::size_t lend_min = ExpandablePoolOptions{}.lend_min_bytes;   // the expandable pool's lend_min_bytes
  bool holes_home = false;                                         // the expandable pool's bring_holes_home
};

// One device's pool behind the C functions (its kind: pool_stacks.hpp), and the private pools of
// the CUDA graphs captured over it.
//
// A graph replays with the addresses it was captured with, so while PyTorch captures one it
// opens a private pool (begin_capture, with a filter that says which streams capture into it) and
// the blocks those streams allocate belong to that pool (carve::PrivatePools) until the graph is
// destroyed (release_pool): freed, they serve only that pool's later requests. While any capture
// is under way nothing goes back to the device and no event is recorded on a stream the capture
// could take in: the pools are held (no unmapping, no taking memory from other streams), the
// cache is not emptied, and every other free waits for the end of the capture. A stream that
// captures with no private pool open (a PyTorch that cannot forward its pool hooks, or a capture
// started outside PyTorch) is refused with a message saying so, never served memory that the
// next allocation could take from under the graph.
class DeviceStack {
public:
  // What a call that changes nothing on failure did: its work, or why not.
  using Done = cuda::std::expected<void, Errc>;
  // What a free did.
  using Freed = Done;
  // Which streams capture into a private pool (PyTorch's filter: the capture's own streams).
  using CaptureFilter = std::function<bool(cudaStream_t)>;

  explicit DeviceStack(const StackOptions& options) { books_.cap = options.max_reserved; }
  virtual ~DeviceStack() = default;
  DeviceStack(const DeviceStack&) = delete;
  DeviceStack& operator=(const DeviceStack&) = delete;

  // A block of `bytes` (> 0) for work on `stream`, or null when the device is full. Before it
  // refuses, the stack gives back what it caches (empty_cache: only memory no stream's work may
  // still touch) and tries once more, as PyTorch's own allocator does; `released`, when given,
  // gets the bytes that gave back (0 when the first try served). During a capture it gives back
  // nothing, and a capturing stream is served from its graph's private pool; `capture_refused`,
  // when given, says that a stream captured with no private pool open.
  void* allocate(cudaStream_t stream, std::size_t bytes, std::size_t* released = nullptr,
                 bool* capture_refused = nullptr) noexcept {
    const std::shared_lock gate(capture_gate_);
    std::size_t gave_back = 0;
    bool unrouted = false;
    void* p = nullptr;
    if (capturing()) {
      p = take_during_capture(stream, bytes, unrouted);
    } else if (guard_captures_.load(std::memory_order_relaxed) && stream_capturing(stream)) {
      unrouted = true; // no hooks: PyTorch opened no pool for this capture
    } else {
      p = take_or_retry(stream, bytes, gave_back);
    }
    if (released != nullptr) {
      *released = gave_back;
    }
    if (capture_refused != nullptr) {
      *capture_refused = unrouted;
    }
    if (p == nullptr) {
      count(books_.failures);
      return nullptr;
    }
    books_.live.add(rounded(bytes));
    count(books_.mallocs);
    return p;
  }
  // Frees `p` for work queued on `stream` after the work that used it. not_allocated when the
  // stack never handed `p` out (or it is free), invalid_size when `bytes` is not its size. During
  // a capture a block of no private pool waits for its end (checked then).
  Freed deallocate(cudaStream_t stream, void* p, std::size_t bytes) noexcept {
    const std::shared_lock gate(capture_gate_);
    Freed why =
        graphs_used_.load(std::memory_order_acquire) ? free_with_graphs(stream, p, bytes) : give(stream, p, bytes);
    if (why) {
      books_.live.sub(rounded(bytes));
      count(books_.frees);
    }
    return why;
  }
  // Gives the device every byte no block uses and no stream's work may still touch; nothing
  // while a capture is under way.
  void empty_cache() noexcept {
    const std::shared_lock gate(capture_gate_);
    if (!capturing()) {
      release_cache();
    }
  }

  // Tensor.record_stream: `p`, a block of this stack, is also used by work queued on `stream`, so
  // its free waits for that work (the pool's StreamUsesPool). not_allocated where `p` is no live
  // block's start (not this stack's memory, inside a block, or freed already); no_space out of host
  // memory (nothing recorded either way).
  virtual Done record_stream(void* p, cudaStream_t stream) noexcept = 0;

  // Lets device `peer`'s kernels and copies read and write this device's blocks: empty when done
  // (or nothing needed doing: cudaMalloc memory is opened by the peer access PyTorch enables),
  // else why not. The expandable pool maps for its own device only until told.
  virtual std::string grant_access(int /*peer*/) { return {}; }
  // The right `peer` has on this device's memory at `p`: 0 none, 1 read, 2 read and write; -1 where
  // the stack cannot say (no mapping of its own there: cudaMalloc memory, or not its block).
  virtual int access(const void* /*p*/, int /*peer*/) const noexcept { return -1; }
  // What only the expandable pool has to say (its ExpandablePoolStats); all zero for the others.
  struct MappingFigures {
    // The pool lends no holes because the driver maps whole allocations only (asked when the pool
    // was made, or seen in a refusal): carve_replay predicts such a run with
    // expandable-pool:partial-maps=0.
    bool lending_refused = false;
    std::size_t lent_bytes = 0;        // holes mapped a second time now
    std::uint64_t stream_waits = 0;    // host syncs with a stream before unmapping memory its work used
    std::uint64_t refusals_served = 0; // requests the device or the cap refused that the pool's retry served
  };
  virtual MappingFigures mapping_figures() const noexcept { return {}; }

  // The base of the device allocation (a cudaMalloc segment of a caching stack) that holds `p`, its
  // size in `bytes`; null where this stack took no such allocation (the expandable pool maps).
  void* base_allocation(const void* p, std::size_t* bytes) const noexcept { return books_.segments.holding(p, bytes); }

  // Whether every request asks the driver if its stream captures a graph (when PyTorch cannot
  // forward its pool hooks, a capture would otherwise be served as any other request).
  void guard_captures(bool on) noexcept { guard_captures_.store(on, std::memory_order_relaxed); }

  // A capture begins allocating to private pool `id` from the streams `filter` accepts. Returns
  // the capture's number, by which end_begun_capture ends exactly this one.
  std::uint64_t begin_capture(PrivatePoolId id, CaptureFilter filter) {
    const std::lock_guard gate(capture_gate_); // the operations under way end first; then graphs_
    const std::lock_guard lock(graphs_);
    const std::uint64_t number = ++captures_begun_;
    underway_.push_back(Capture{id, std::move(filter), number});
    try {
      privates_.open(id);
    } catch (...) {
      underway_.pop_back();
      throw;
    }
    graphs_used_.store(true, std::memory_order_release);
    if (captures_.load(std::memory_order_relaxed) == 0) {
      hold(true);
    }
    captures_.fetch_add(1, std::memory_order_acq_rel);
    return number;
  }
  // The capture into `id` ended (the oldest under way, as PyTorch's own allocator ends one): its
  // streams allocate as usual again. When it was the last one, the frees that waited go through,
  // and the pools released meanwhile go back to the device. False when no capture into `id` was
  // under way (nothing changes).
  bool end_capture(PrivatePoolId id) noexcept {
    return end_where([&](const Capture& c) { return c.id == id; });
  }
  // end_capture for the capture begin_capture numbered `number` (a failed one: PyTorch never
  // ended it), whatever other captures share its pool. False when it is not under way.
  bool end_begun_capture(std::uint64_t number) noexcept {
    return end_where([&](const Capture& c) { return c.number == number; });
  }
  // One user less of private pool `id` (a graph destroyed): when it has none, its free blocks go
  // back to the stack once the device has run every replay (its blocks in use follow as freed).
  void release_pool(PrivatePoolId id) noexcept {
    std::vector<PrivateBlock> blocks;
    try {
      blocks = privates_.release(id);
    } catch (const std::bad_alloc&) {
      return; // the pool keeps its blocks
    }
    const std::lock_guard lock(graphs_); // no capture begins while the device synchronises
    if (!capturing()) {
      give_back(blocks);
      return;
    }
    try { // no device synchronisation during a capture: at its end
      released_.insert(released_.end(), blocks.begin(), blocks.end());
    } catch (const std::bad_alloc&) { // out of host memory: they stay the stack's, unused, to the end
    }
  }

  const Books& books() const noexcept { return books_; }
  void reset_peak() noexcept {
    books_.live.reset_peak();
    books_.reserved.reset_peak();
  }

private:
  // Ends the first capture under way that `which` picks (see end_capture).
  template <class Which>
  bool end_where(Which which) noexcept {
    const std::lock_guard lock(graphs_); // no capture begins while these go back
    const auto it = std::find_if(underway_.begin(), underway_.end(), which);
    if (it == underway_.end()) {
      return false;
    }
    underway_.erase(it);
    // The hold goes first: a request that sees no capture must find the pools unheld, or near the
    // cap it would be refused while memory it could reclaim is there (captures_ changes only under
    // graphs_).
    const bool last = captures_.load(std::memory_order_relaxed) == 1;
    if (last) {
      hold(false);
    }
    captures_.fetch_sub(1, std::memory_order_acq_rel);
    if (!last) {
      return true;
    }
    for (const PrivateBlock& b : waited_) {
      if (const Freed r = give(b.stream, b.p, b.bytes); !r) {
        report_misuse("carve_torch_free", b.p, b.bytes, r.error()); // checked now that it could be
      }
    }
    waited_.clear();
    for (const PrivateBlock& b : used_in_capture_) { // no capture now: through the graph pools again
      if (const Freed r = free_with_graphs(b.stream, b.p, b.bytes); !r) {
        report_misuse("carve_torch_free", b.p, b.bytes, r.error());
      }
    }
    used_in_capture_.clear();
    give_back(released_);
    released_.clear();
    return true;
  }

protected:
  static std::size_t rounded(std::size_t bytes) noexcept {
    return bytes > std::numeric_limits<std::size_t>::max() - (block_alignment - 1)
               ? bytes
               : (bytes + block_alignment - 1) & ~(block_alignment - 1);
  }
  bool capturing() const noexcept { return captures_.load(std::memory_order_acquire) != 0; }

  virtual void* take(cudaStream_t stream, std::size_t bytes) noexcept = 0;
  virtual Freed give(cudaStream_t stream, void* p, std::size_t bytes) noexcept = 0;
  // Called with no capture under way, and none can begin (capture_gate_ held).
  virtual void release_cache() noexcept = 0;
  // While `held` (a capture is under way) the pool gives nothing back to the device and records
  // no event on another stream than the one it serves.
  virtual void hold(bool held) noexcept = 0;
  // Waits until the device has run all work queued so far.
  virtual void synchronize() noexcept = 0;
  // Whether a capture is under way on `stream`.
  virtual bool stream_capturing(cudaStream_t stream) noexcept = 0;
  // Whether record_stream named a stream besides `own` for `p`.
  virtual bool used_elsewhere(void* p, cudaStream_t own) noexcept = 0;
  // Forgets the streams record_stream named for `p` (a graph's pool keeps it: replays order them).
  virtual void forget_uses(void* p) noexcept = 0;

  Books books_; // before the pools, which count into it
  // PyTorch opens a graph's pool (begin_capture) before the driver's capture begins, and what a
  // stack does after finding no capture under way (an event recorded at a free, a
  // synchronisation, memory given back) must not fall into one that begins meanwhile. Every
  // allocation, free and empty_cache holds this gate shared from that check to its end;
  // begin_capture holds it alone, so a capture begins between whole operations, never inside one.
  // Taken before graphs_. end_capture and release_pool need not take it: they hold graphs_, which
  // begin_capture needs too.
  CaptureGate capture_gate_;

private:
  using PrivateBlock = PrivatePools<cudaStream_t>::Block;
  struct Capture {
    PrivatePoolId id;
    CaptureFilter filter;
    std::uint64_t number; // begin_capture's count
  };

  void* take_or_retry(cudaStream_t stream, std::size_t bytes, std::size_t& gave_back) noexcept {
    if (void* p = take(stream, bytes)) {
      return p;
    }
    const std::size_t before = books_.reserved.now();
    release_cache(); // no capture can have begun: the caller holds the gate
    const std::size_t after = books_.reserved.now();
    gave_back = before > after ? before - after : 0;
    return take(stream, bytes);
  }

  // During a capture: a stream that captures into a private pool gets a block that pool holds
  // free, or a new one the pool adopts; a stream that captures into none is refused (`unrouted`);
  // any other stream is served as usual, without giving anything back.
  void* take_during_capture(cudaStream_t stream, std::size_t bytes, bool& unrouted) noexcept {
    const std::optional<PrivatePoolId> id = pool_of(stream);
    if (!id) {
      unrouted = stream_capturing(stream);
      return unrouted ? nullptr : take(stream, bytes);
    }
    void* p = nullptr;
    try {
      if (void* kept = privates_.reuse(*id, stream, bytes)) {
        return kept;
      }
      p = take(stream, bytes);
      if (p != nullptr && !privates_.adopt(*id, p, bytes, stream)) {
        (void)give(stream, p, bytes); // its pool was released meanwhile
        return nullptr;
      }
      return p;
    } catch (const std::bad_alloc&) { // adopt() changes nothing when it throws: the block goes back
      if (p != nullptr) {
        (void)give(stream, p, bytes);
      }
      return nullptr;
    }
  }

  // The private pool `stream` captures into, if any (PyTorch's filters ask the driver).
  std::optional<PrivatePoolId> pool_of(cudaStream_t stream) noexcept {
    const std::lock_guard lock(graphs_);
    for (const Capture& c : underway_) {
      try {
        if (c.filter && c.filter(stream)) {
          return c.id;
        }
      } catch (...) { // a filter that fails routes nothing
      }
    }
    return std::nullopt;
  }

  Freed free_with_graphs(cudaStream_t stream, void* p, std::size_t bytes) noexcept {
    try {
      if (capturing() && used_elsewhere(p, stream)) {
        // A block another stream of the capture reads (record_stream): not reused in the capture
        // (its graph's pool could hand it to the next request), freed at the capture's end.
        const std::lock_guard lock(graphs_);
        if (capturing()) {
          used_in_capture_.push_back(PrivateBlock{p, bytes, stream});
          return {};
        }
      }
      const auto [freed, block] = privates_.free(p, stream, bytes);
      switch (freed) {
      case PrivatePools<cudaStream_t>::Freed::twice:
        return cuda::std::unexpected(Errc::not_allocated);
      case PrivatePools<cudaStream_t>::Freed::wrong_size:
        return cuda::std::unexpected(Errc::invalid_size);
      case PrivatePools<cudaStream_t>::Freed::kept:
        forget_uses(p);
        return {};
      case PrivatePools<cudaStream_t>::Freed::give_back:
        // The last block of a destroyed graph's pool: a replay on any stream may still use it.
        return capturing() ? wait_for_capture(block, true) : give_after_synchronize(block);
      case PrivatePools<cudaStream_t>::Freed::not_private:
        break;
      }
      return capturing() ? wait_for_capture(PrivateBlock{p, bytes, stream}) : give(stream, p, bytes);
    } catch (const std::bad_alloc&) {
      return cuda::std::unexpected(Errc::no_space);
    }
  }

  // A free during a capture: made at its end (a give now could record an event into the graph),
  // after the device has synchronised for a block of a released pool (`of_released_pool`).
  Freed wait_for_capture(const PrivateBlock& b, bool of_released_pool = false) {
    const std::lock_guard lock(graphs_);
    if (!capturing()) { // it ended meanwhile
      return of_released_pool ? give_after_synchronize(b) : give(b.stream, b.p, b.bytes);
    }
    (of_released_pool ? released_ : waited_).push_back(b);
    return {};
  }
  // A block a destroyed graph's replays may have used, back to the stack once the device has run
  // them: the replays ran on streams the block's own does not order.
  Freed give_after_synchronize(const PrivateBlock& b) noexcept {
    synchronize();
    return give(b.stream, b.p, b.bytes);
  }

  // Blocks of released private pools back to the stack, once the device has run every replay
  // that may use them.
  void give_back(const std::vector<PrivateBlock>& blocks) noexcept {
    if (blocks.empty()) {
      return;
    }
    synchronize();
    for (const PrivateBlock& b : blocks) {
      if (const Freed r = give(b.stream, b.p, b.bytes); !r) {
        report_misuse("carve_torch_release_pool", b.p, b.bytes, r.error());
      }
    }
  }

  std::atomic<int> captures_{0};         // captures under way
  std::uint64_t captures_begun_ = 0;     // begin_capture calls (under graphs_)
  std::atomic<bool> graphs_used_{false}; // a private pool was ever opened: frees ask privates_
  std::atomic<bool> guard_captures_{false};
  std::mutex graphs_;                         // underway_, waited_, released_
  std::vector<Capture> underway_;             // the captures under way, oldest first
  std::vector<PrivateBlock> waited_;          // frees made during a capture
  std::vector<PrivateBlock> used_in_capture_; // frees during a capture of blocks other streams read
  std::vector<PrivateBlock> released_;        // private pools' blocks released during a capture
  PrivatePools<cudaStream_t> privates_;
};

} // namespace carve::torch
