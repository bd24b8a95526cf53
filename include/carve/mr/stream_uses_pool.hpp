/// @file carve/mr/stream_uses_pool.hpp
/// StreamUsesPool: a stream-ordered pool whose blocks may also be used on streams besides their
/// own, each such block's free held until the work those streams had queued by the free has run.
/// It is the rule PyTorch's `Tensor.record_stream` asks of an allocator, over any carve pool.
///
/// A stream-ordered pool hands a block freed on stream S to S's next request at once, because
/// what S runs next is queued behind the kernels that used the block. A kernel on another stream T
/// that reads the block (a copy on a side stream, a collective on its own stream) is not ordered
/// that way: reused at once, the block could be overwritten while T still reads it. So the code
/// that launches work on T names the block with `record_stream(p, T)`, and at p's free this
/// adaptor records an event on each such stream and holds the free. Once every event has
/// completed the free is made on the block's own stream, and from there the pool's own rules
/// apply. Held frees are collected at each allocation and free, at trim() and at collect().
///
/// @code
/// using Pool = carve::StreamOrderedPool<carve::CudaDeviceResource, carve::CudaStreams>;
/// carve::StreamUsesPool<Pool> pool(std::piecewise_construct, std::forward_as_tuple(carve::CudaDeviceResource(0)));
/// void* p = pool.allocate(compute, bytes, 256);
/// reduce<<<grid, block, 0, side.get()>>>(p);
/// (void)pool.record_stream(p, side);       // p's free now waits for `side`
/// pool.deallocate(compute, p, bytes, 256); // held until reduce has run
/// @endcode
///
/// - A free the pool would refuse (a wrong size, a block it never handed out) is refused at the
///   call, with the pool's error, before it is held (the pool's check_deallocate); a second free
///   of a held block is not_allocated.
/// - An event that cannot be recorded (a stream of another device) is tried again at each
///   collection, or the stream synchronised instead where the Streams can
///   (StreamEventsThatSynchronize). Out of host memory at a free, the streams are synchronised
///   and the free made at once where they can; where they cannot, the free is no_space and
///   changes nothing.
/// - While `hold(true)` (a CUDA graph capture is under way, and a stream the capture takes in must
///   see no event calls) the adaptor records and asks no event: a free it holds then records its
///   events after `hold(false)` (they cover more work then, never less).
///
/// Thread-safe where the pool is: the uses and the held frees are kept under the adaptor's own
/// lock, taken before the pool's only for blocks with streams named. The adaptor records its
/// events on Streams of its own (default-constructed, or passed in), since a pool calls its own
/// Streams under its lock. Two CudaStreams see the same CUDA streams; a host twin whose queued work
/// lives in the Streams object itself (SimulatedStreams) must be handed to both through a handle
/// they share, or the adaptor sees no work queued and holds nothing for long.
///
/// Checked on the host, over simulated streams (tests/mr/test_stream_uses_pool.cpp) and under
/// libcarve_torch's host backend; with CudaStreams it compiles for sm_80 and sm_90 but has not yet
/// run on a GPU.
#pragma once

#include <carve/core/errc.hpp>
#include <carve/core/misuse.hpp>
#include <carve/mr/cuda_mr.hpp>
#include <carve/mr/detail/make_part.hpp>
#include <carve/mr/stream_events.hpp>
#include <carve/mr/stream_ordered_resource.hpp>

#include <cuda/std/expected>

#include <algorithm>
#include <atomic>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <new>
#include <optional>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace carve {

/// What a StreamUsesPool holds now, and what it has done.
struct StreamUsesStats {
  std::size_t blocks_with_uses = 0;       ///< live blocks with a stream named by record_stream
  std::size_t held_frees = 0;             ///< frees waiting for other streams' work
  std::size_t held_bytes = 0;             ///< the bytes of those blocks
  std::uint64_t frees_held = 0;           ///< frees ever held
  std::uint64_t streams_synchronized = 0; ///< streams synchronised where no event could be recorded or kept
};

namespace detail {
// The Streams a pool's streams() hands out.
template <class Pool>
using streams_of_t = std::remove_cvref_t<decltype(std::declval<Pool&>().streams())>;
} // namespace detail

/// A StreamOrderedResource that holds the free of a block used on other streams (record_stream)
/// until their work has run; see the file comment.
template <StreamOrderedResource Pool, StreamEvents Streams = detail::streams_of_t<Pool>>
requires std::same_as<typename Streams::stream_type, typename Pool::stream_type>
class StreamUsesPool : public StreamOrderedSpellings<StreamUsesPool<Pool, Streams>, typename Pool::stream_type> {
public:
  /// The pool's streams.
  using stream_type = typename Pool::stream_type;
  /// The name a misused deallocate reports.
  static constexpr const char* resource_name = "carve::StreamUsesPool::deallocate";

  /// `pool` (the pool itself, or what its constructor takes), and `streams` for the adaptor's events.
  template <class P>
  requires std::constructible_from<Pool, P>
  explicit StreamUsesPool(P&& pool, Streams streams = Streams())
      : pool_(std::forward<P>(pool)), streams_(std::move(streams)) {}
  /// The pool built in place from `pool_args`, its constructor's arguments
  /// (`std::piecewise_construct, std::forward_as_tuple(...)`; for pools that cannot move), and
  /// `streams` for the adaptor's events.
  template <class Tag, class Args>
  requires detail::piecewise_tag<Tag> && detail::part_arguments<Pool, Args> StreamUsesPool(Tag, Args&& pool_args,
                                                                                           Streams streams = Streams())
      : pool_(detail::make_part<Pool>(std::forward<Args>(pool_args))), streams_(std::move(streams)) {}
  StreamUsesPool(const StreamUsesPool&) = delete;
  StreamUsesPool& operator=(const StreamUsesPool&) = delete;
  /// Makes the held frees, first waiting for their streams where the Streams can (an event never
  /// recorded is recorded now, or its stream synchronised where the Streams can).
  ~StreamUsesPool() {
    for (Held& h : held_) {
      (void)passed(h, true);
      release_events(h);
      (void)free_now(h.own, h.p, h.bytes, h.alignment);
    }
  }

  /// `p`, a live block of this pool (the address allocate returned, as a tensor's storage names it:
  /// the free that waits is the free of that address), is also used by work queued on `stream`: its
  /// free will wait for the work `stream` has queued by then. Naming the block's own stream, or a
  /// stream named already, changes nothing. Errors (nothing recorded): not_allocated for an address
  /// that is no live block's start (an address inside a block, whose name no free would find, or a
  /// block whose free is held already), as PyTorch refuses one; no_space out of host memory.
  [[nodiscard]] cuda::std::expected<void, Errc> record_stream(void* p, stream_type stream) noexcept {
    // The pool knows its live blocks: a wrong size is invalid_size, no block at all not_allocated.
    if (const auto live = pool_.check_deallocate(p, 1, 1); !live && live.error() == Errc::not_allocated) {
      return live;
    }
    const std::lock_guard lock(mutex_);
    if (holds(p)) {
      return cuda::std::unexpected(Errc::not_allocated);
    }
    try {
      std::vector<stream_type>& streams = uses_[p];
      any_uses_.store(true, std::memory_order_release);
      if (std::find(streams.begin(), streams.end(), stream) == streams.end()) {
        streams.push_back(stream);
      }
      return {};
    } catch (const std::bad_alloc&) {
      if (const auto it = uses_.find(p); it != uses_.end() && it->second.empty()) {
        forget(it); // the entry made for this call: nothing is recorded
      }
      return cuda::std::unexpected(Errc::no_space);
    }
  }

  /// A block for work on `stream`, from the pool, once the held frees whose streams have run are
  /// made.
  [[nodiscard]] cuda::std::expected<void*, Errc> try_allocate(stream_type stream, std::size_t bytes,
                                                              std::size_t alignment) noexcept {
    (void)collect();
    return pool_.try_allocate(stream, bytes, alignment);
  }
  /// try_allocate with no stream (the pool's synchronous spelling).
  [[nodiscard]] cuda::std::expected<void*, Errc> try_allocate(std::size_t bytes,
                                                              std::size_t alignment) noexcept requires
      requires(Pool& pool, std::size_t n) {
    pool.try_allocate(n, n);
  }
  {
    (void)collect();
    return pool_.try_allocate(bytes, alignment);
  }

  /// Frees `p` for work queued on `stream` (its own) after the work that used it; held while
  /// streams besides `stream` were named for it. The pool's errors, checked before a free is held;
  /// not_allocated for a block whose free is held already.
  [[nodiscard]] cuda::std::expected<void, Errc> try_deallocate(stream_type stream, void* p, std::size_t bytes,
                                                               std::size_t alignment) noexcept {
    return free(stream, p, bytes, alignment);
  }
  /// try_deallocate with no stream (the pool's synchronous spelling): held while any stream was named.
  [[nodiscard]] cuda::std::expected<void, Errc> try_deallocate(void* p, std::size_t bytes,
                                                               std::size_t alignment) noexcept requires
      requires(Pool& pool, void* q, std::size_t n) {
    pool.try_deallocate(q, n, n);
  }
  { return free(std::nullopt, p, bytes, alignment); }
  /// What try_deallocate would say now, changing nothing.
  [[nodiscard]] cuda::std::expected<void, Errc> check_deallocate(void* p, std::size_t bytes,
                                                                 std::size_t alignment) noexcept {
    if (count_.load(std::memory_order_acquire) != 0) {
      const std::lock_guard lock(mutex_);
      if (holds(p)) {
        return cuda::std::unexpected(Errc::not_allocated);
      }
    }
    return pool_.check_deallocate(p, bytes, alignment);
  }

  /// Makes the held frees whose streams have run their work up to the free (first waiting for
  /// each where the Streams can, when `wait`). Returns how many it made; none while held. A free
  /// the pool cannot take yet (no_space: its tables could not grow) stays held.
  std::size_t collect(bool wait = false) noexcept {
    if (count_.load(std::memory_order_acquire) == 0 || holding_.load(std::memory_order_acquire)) {
      return 0;
    }
    const std::lock_guard lock(mutex_);
    if (holding_.load(std::memory_order_acquire)) { // held while this call waited for the lock
      return 0;
    }
    std::size_t made = 0;
    for (std::size_t i = 0; i < held_.size();) {
      Held& h = held_[i];
      if (!passed(h, wait)) {
        ++i;
        continue;
      }
      if (const auto r = free_now(h.own, h.p, h.bytes, h.alignment); !r) {
        if (r.error() == Errc::no_space) {
          ++i;
          continue;
        }
        report_misuse(resource_name, h.p, h.bytes, r.error()); // checked at the free: the pool was misused since
      }
      release_events(h);
      held_bytes_ -= h.bytes;
      held_[i] = std::move(held_.back());
      held_.pop_back();
      count_.fetch_sub(1, std::memory_order_release);
      ++made;
    }
    return made;
  }
  /// Makes the held frees, waiting for their streams where the Streams can, then the pool's trim().
  std::size_t trim() noexcept requires requires(Pool& pool) { pool.trim(); }
  {
    (void)collect(true);
    return pool_.trim();
  }
  /// While `held`, no event is recorded or asked about (and the pool's hold(), where it has one).
  void hold(bool held) noexcept {
    {
      const std::lock_guard lock(mutex_); // a collection under way ends first
      holding_.store(held, std::memory_order_release);
    }
    if constexpr (requires { pool_.hold(held); }) {
      pool_.hold(held);
    }
  }

  /// Whether a stream besides `own` was named for `p`.
  bool used_elsewhere(const void* p, const stream_type& own) noexcept {
    if (!any_uses_.load(std::memory_order_acquire)) {
      return false;
    }
    const std::lock_guard lock(mutex_);
    const auto it = uses_.find(const_cast<void*>(p));
    return it != uses_.end() && elsewhere(it->second, own);
  }
  /// Forgets the streams named for `p` (its uses are ordered some other way: a CUDA graph's pool,
  /// whose replays order them).
  void forget(const void* p) noexcept {
    if (!any_uses_.load(std::memory_order_acquire)) {
      return;
    }
    const std::lock_guard lock(mutex_);
    if (const auto it = uses_.find(const_cast<void*>(p)); it != uses_.end()) {
      forget(it);
    }
  }

  /// Counters (under the lock).
  StreamUsesStats stats() const {
    const std::lock_guard lock(mutex_);
    return StreamUsesStats{uses_.size(), held_.size(), held_bytes_, frees_held_, streams_synchronized_};
  }
  /// Whether `p` lies in the pool's memory.
  bool owns(const void* p) const noexcept requires requires(const Pool& pool, const void* q) { pool.owns(q); }
  { return pool_.owns(p); }
  /// The pool (its stats, its options, what only it can do).
  Pool& pool() noexcept { return pool_; }
  /// The pool.
  const Pool& pool() const noexcept { return pool_; }
  /// The Streams the adaptor records its events on.
  Streams& streams() noexcept { return streams_; }

  /// Only an adaptor frees what it handed out.
  friend bool operator==(const StreamUsesPool& a, const StreamUsesPool& b) noexcept { return &a == &b; }
  /// Forwards every property the pool declares (CCCL's get_property protocol).
  template <class Property>
  requires detail::declares_property<Pool, Property>
  friend constexpr void get_property(const StreamUsesPool&, Property) noexcept {}

private:
  using event_type = typename Streams::event_type;
  struct Event {
    stream_type stream;
    std::optional<event_type> event; // nullopt: not recorded yet (failed, or recorded while held)
    bool synchronized = false;       // waited for by synchronising the stream
  };
  struct Held {
    void* p;
    std::size_t bytes;
    std::size_t alignment;
    std::optional<stream_type> own; // nullopt: freed with no stream
    std::vector<Event> events;
  };
  using Uses = std::unordered_map<void*, std::vector<stream_type>>;

  // Whether `s` is another stream than `own` (every stream is, for a free made with no stream).
  static bool other_than(const stream_type& s, const std::optional<stream_type>& own) { return !own || !(s == *own); }
  static bool elsewhere(const std::vector<stream_type>& streams, const std::optional<stream_type>& own) {
    return std::any_of(streams.begin(), streams.end(), [&](const stream_type& s) { return other_than(s, own); });
  }
  void release_events(Held& h) noexcept {
    for (Event& e : h.events) {
      if (e.event) {
        streams_.release(*e.event);
      }
    }
  }
  cuda::std::expected<void, Errc> free_now(const std::optional<stream_type>& own, void* p, std::size_t bytes,
                                           std::size_t alignment) noexcept {
    if constexpr (requires { pool_.try_deallocate(p, bytes, alignment); }) {
      if (!own) {
        return pool_.try_deallocate(p, bytes, alignment);
      }
    }
    return own ? pool_.try_deallocate(*own, p, bytes, alignment) : cuda::std::unexpected(Errc::unsupported);
  }

  // The free: at once where no other stream was named for `p`, else checked and held.
  cuda::std::expected<void, Errc> free(const std::optional<stream_type>& own, void* p, std::size_t bytes,
                                       std::size_t alignment) noexcept {
    (void)collect(); // what other streams have run past goes back first, as at an allocation
    if (!any_uses_.load(std::memory_order_acquire) && count_.load(std::memory_order_acquire) == 0) {
      return free_now(own, p, bytes, alignment);
    }
    std::unique_lock lock(mutex_);
    if (holds(p)) {
      return cuda::std::unexpected(Errc::not_allocated); // its free waits already
    }
    const auto it = uses_.find(p);
    if (it == uses_.end()) {
      lock.unlock(); // the pool's free needs no lock of ours: frees of other blocks go on meanwhile
      return free_now(own, p, bytes, alignment);
    }
    if (!elsewhere(it->second, own)) {
      const auto r = free_now(own, p, bytes, alignment);
      if (r) {
        forget(it);
      }
      return r;
    }
    if (const auto r = pool_.check_deallocate(p, bytes, alignment); !r) {
      return r; // refused now, as a free made at once would be; its uses kept
    }
    Held h{p, bytes, alignment, own, {}};
    try {
      if (held_.size() == held_.capacity()) {
        held_.reserve(std::max<std::size_t>(8, 2 * held_.capacity()));
      }
      h.events.reserve(it->second.size());
    } catch (const std::bad_alloc&) {
      return free_after_synchronizing(it, own, p, bytes, alignment);
    }
    for (const stream_type& s : it->second) { // room was made for all: no event is lost
      if (other_than(s, own)) {
        h.events.push_back(Event{s, holding_.load(std::memory_order_relaxed) ? std::nullopt : record(s), false});
      }
    }
    forget(it);
    held_.push_back(std::move(h));
    held_bytes_ += bytes;
    ++frees_held_;
    count_.fetch_add(1, std::memory_order_release);
    return {};
  }
  // Out of host memory: the free made once the streams named for it have run their work, where
  // the Streams can wait for a stream; else nothing changes.
  cuda::std::expected<void, Errc> free_after_synchronizing(typename Uses::iterator it,
                                                           const std::optional<stream_type>& own, void* p,
                                                           std::size_t bytes, std::size_t alignment) noexcept {
    if constexpr (StreamEventsThatSynchronize<Streams>) {
      for (const stream_type& s : it->second) {
        if (other_than(s, own)) {
          streams_.synchronize(s);
          ++streams_synchronized_;
        }
      }
      const auto r = free_now(own, p, bytes, alignment);
      if (r) {
        forget(it);
      }
      return r;
    } else {
      (void)it, (void)own, (void)p, (void)bytes, (void)alignment;
      return cuda::std::unexpected(Errc::no_space);
    }
  }
  void forget(typename Uses::iterator it) noexcept {
    uses_.erase(it);
    any_uses_.store(!uses_.empty(), std::memory_order_release);
  }
  bool holds(const void* p) const noexcept {
    return std::any_of(held_.begin(), held_.end(), [p](const Held& h) { return h.p == p; });
  }
  std::optional<event_type> record(const stream_type& s) noexcept {
    try {
      if (auto e = streams_.record(s)) {
        return *e;
      }
    } catch (const std::exception&) {
    }
    return std::nullopt;
  }
  // Whether every stream `h` waits for has run its work up to the free. An event not recorded at
  // the free is recorded now (it covers more work then, never less); a stream on which none can
  // be recorded is synchronised where the Streams can, else the free waits on.
  bool passed(Held& h, bool wait) noexcept {
    for (Event& e : h.events) {
      if (e.synchronized) {
        continue;
      }
      if (!e.event) {
        e.event = record(e.stream);
      }
      if (!e.event) {
        if constexpr (StreamEventsThatSynchronize<Streams>) {
          streams_.synchronize(e.stream);
          ++streams_synchronized_;
          e.synchronized = true;
          continue;
        }
        return false;
      }
      if constexpr (StreamEventsThatWait<Streams>) {
        if (wait) {
          streams_.wait(*e.event);
        }
      }
      try {
        if (!streams_.completed(*e.event)) {
          return false;
        }
      } catch (const std::exception&) {
        return false;
      }
    }
    return true;
  }

  Pool pool_;
  Streams streams_;
  mutable std::mutex mutex_; // uses_, held_ and the counters; taken before the pool's lock
  Uses uses_;
  std::vector<Held> held_;
  std::size_t held_bytes_ = 0;
  std::uint64_t frees_held_ = 0;
  std::uint64_t streams_synchronized_ = 0;
  std::atomic<bool> any_uses_{false}; // !uses_.empty(), read without the lock
  std::atomic<std::size_t> count_{0}; // held_.size(), read without the lock
  std::atomic<bool> holding_{false};
};

} // namespace carve
