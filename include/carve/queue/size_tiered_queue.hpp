/// @file carve/queue/size_tiered_queue.hpp
/// SizeTieredQueue: requests sorted into per-size tiers, so
/// that small requests are not held up behind large ones.
///
/// @code
/// struct Lookup { std::uint32_t table; std::vector<std::uint32_t> rows; };
/// struct Rows { std::uint64_t operator()(const Lookup& q) const { return q.rows.size(); } };
///
/// using Queue = carve::SizeTieredQueue<Lookup, Rows>;          // MpmcRing lanes, round-robin
/// Queue q({128, 512}, 4096);            // host: throws carve::Exception on bad input
/// q.try_push(std::move(lookup));        // expected<void, Errc>: full or closed; never blocks
/// q.push(std::move(lookup));            // waits while the request's tier is full
/// auto r = q.pop(std::chrono::milliseconds(5));   // expected<Lookup, Errc>: timed_out, closed
/// q.try_push_front(std::move(*r));      // not placeable now: back at the head of its tier
/// q.try_pop_bulk(out, 16);              // expected<size_t, Errc>: how many, or empty / closed
/// @endcode
///
/// Options (QueueOptions, a constructor argument after the capacity or after the size function):
/// wait_sample, how many requests the wait histograms take one from (default 16; 1 for every
/// request). Time stamps are read only for those and where the drain policy compares them.
///
/// Tiers: thresholds t1 < ... < tk give k + 1 tiers, each threshold an inclusive upper bound
/// (tier_thresholds.hpp): with {128, 512}, sizes 0..128 go to tier 0 (exactly 128 included),
/// 129..512 to tier 1, 513 and up to tier 2. For a latency target drain with
/// StrictPriority::with_aging(bound), or take turns with DeficitRoundRobin::small_first
/// (benchmarks/queue.md); RoundRobin, the default, gives the small tier one turn in k + 1 while
/// every tier is backlogged, so small requests can wait longer than in one FIFO.
///
/// Template parameters: the request type T (move-only is fine; its move must not throw), a size
/// function (T -> bytes or any unit the thresholds use), the lane policy (a bounded MPMC queue
/// per tier: RingLanes<Scope> by default, MoodycamelLanes, or your own; see lane.hpp), the
/// drain policy (which tier the next pop serves: RoundRobin, WeightedRoundRobin,
/// DeficitRoundRobin, StrictPriority with optional aging, PriorityTag; see drain_policy.hpp) and
/// the clock that stamps requests (queue_clock.hpp).
///
/// Host and device: everything that does not block (try_push, try_push_front, try_pop,
/// try_pop_bulk, close, size, stats) is CARVE_HOST_DEVICE and lock-free apart from the lanes' own
/// guarantees, so with RingLanes<cuda::thread_scope_device> the queue can serve a GPU-resident
/// scheduler. Bad input
/// (invalid thresholds, a capacity of zero, a drain policy that does not fit the tiers, lane
/// storage that could not be allocated) makes the constructor throw carve::Exception on the
/// host; device code cannot throw, so there the queue refuses every call with the Errc, which
/// status() tells. Blocking calls (push, pop, pop_bulk, with or without timeout) are host-only.
///
/// Guarantees: a request whose push succeeded is popped exactly once, also across close();
/// within a tier, requests leave in push order across all producers (with FIFO lanes); a failed
/// push leaves the request with the caller. close() refuses further pushes, wakes every waiter
/// and lets consumers drain what is queued: pops then fail with Errc::closed only once nothing
/// is left and no push is still in flight. size() and the stats are exact when no call is in
/// flight. A queue used by host threads and a kernel at the same time must be closed from the
/// host (push_gate.hpp says why).
#pragma once

#include <carve/core/config.hpp>
#include <carve/core/error.hpp>
#include <carve/queue/bounded_count.hpp>
#include <carve/queue/drain_policy.hpp>
#include <carve/queue/lane.hpp>
#include <carve/queue/mpmc_ring.hpp>
#include <carve/queue/push_gate.hpp>
#include <carve/queue/queue_clock.hpp>
#include <carve/queue/queue_stats.hpp>
#include <carve/queue/queue_waiters.hpp>
#include <carve/queue/round_robin.hpp>
#include <carve/queue/tier_thresholds.hpp>

#include <cuda/atomic>
#include <cuda/std/concepts>
#include <cuda/std/cstddef>
#include <cuda/std/cstdint>
#include <cuda/std/expected>
#include <cuda/std/optional>
#include <cuda/std/span>
#include <cuda/std/type_traits>
#include <cuda/std/utility>
#include <nv/target>

#if !defined(__CUDA_ARCH__)
#include <chrono>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#endif

namespace carve {

/// What sorts requests into tiers: a copyable callable giving a request's size (bytes, rows, any
/// unit the thresholds use).
template <class F, class T>
concept SizeFunction = cuda::std::copy_constructible<F> && requires(const F& size, const T& request) {
  { size(request) } -> cuda::std::convertible_to<std::uint64_t>;
};

/// Bounded MPMC queue of requests in per-size tiers, drained by a DrainPolicy (see the file's
/// description). Every call but the destructor may run concurrently from any number of threads.
template <class T, class SizeFn, class Lanes = RingLanes<>, class Drain = RoundRobin, class Clock = QueueClock>
requires SizeFunction<SizeFn, T> && LanePolicyFor<Lanes, T> && DrainPolicy<Drain> && StampClock<Clock>
class SizeTieredQueue {
public:
  using value_type = T;                               ///< the request type
  using size_function = SizeFn;                       ///< the size function
  using lane_type = typename Lanes::template lane<T>; ///< each tier's queue
  using drain_policy = Drain;                         ///< the drain policy
  using clock = Clock;                                ///< the clock that stamps requests
  /// The thread scope of the lanes and the queue's own atomics.
  static constexpr cuda::thread_scope scope = Lanes::scope;
  /// PriorityTag-like policies: the capacity given is one bound for the whole queue.
  static constexpr bool shared_capacity = drain_shares_capacity<Drain>;
  /// Requests each tier holds for try_push_front (at most its capacity).
  static constexpr cuda::std::size_t requeue_capacity = 64;

  static_assert(cuda::std::is_nothrow_move_constructible_v<T>,
                "a request is moved into a claimed lane cell: its move constructor must not throw");
  static_assert(!drain_needs_head_stamps<Drain> || PeekableLane<lane_type, T>,
                "this drain policy reads the oldest request of each tier: its lanes must model PeekableLane");

  /// `capacity` requests per tier (or in all, for a shared-capacity policy). Throws
  /// carve::Exception on the host for bad input (see status() for the codes); in device code
  /// status() tells.
  CARVE_HOST_DEVICE SizeTieredQueue(const TierThresholds& thresholds, cuda::std::size_t capacity, Drain drain = Drain{},
                                    SizeFn size = SizeFn{}, QueueOptions options = {})
      : thresholds_(thresholds), size_(size), options_(options), drain_(drain), held_(capacity) {
    build({}, capacity);
    refuse_on_host();
  }
  /// The same, with the options before the policies.
  CARVE_HOST_DEVICE SizeTieredQueue(const TierThresholds& thresholds, cuda::std::size_t capacity, QueueOptions options,
                                    Drain drain = Drain{}, SizeFn size = SizeFn{})
      : SizeTieredQueue(thresholds, capacity, drain, size, options) {}
  /// One capacity per tier (not for shared-capacity policies: Errc::invalid_argument). Fails as
  /// the constructor above does.
  CARVE_HOST_DEVICE SizeTieredQueue(const TierThresholds& thresholds,
                                    cuda::std::span<const cuda::std::size_t> capacities, Drain drain = Drain{},
                                    SizeFn size = SizeFn{}, QueueOptions options = {})
      : thresholds_(thresholds), size_(size), options_(options), drain_(drain) {
    build(capacities, 0);
    refuse_on_host();
  }

  SizeTieredQueue(const SizeTieredQueue&) = delete;
  SizeTieredQueue& operator=(const SizeTieredQueue&) = delete;

  /// Destroys the requests still queued. No other call may be running.
  CARVE_HOST_DEVICE ~SizeTieredQueue() { release(); }

  /// What a queue built in device code from bad input refuses every call with:
  /// invalid_thresholds, invalid_argument (zero capacity, capacities or drain parameters not
  /// matching the tiers) or no_space (lane storage could not be allocated); otherwise success.
  /// (On the host such a queue is never built: the constructor throws.)
  CARVE_HOST_DEVICE cuda::std::expected<void, Errc> status() const noexcept {
    if (status_ != 0) {
      return cuda::std::unexpected(static_cast<Errc>(status_));
    }
    return {};
  }

  /// The tier `request` goes to, by its size.
  CARVE_HOST_DEVICE std::uint32_t tier_of(const T& request) const noexcept {
    return thresholds_.tier_of(static_cast<std::uint64_t>(size_(request)));
  }

  /// Never blocks. Errors: full (the request's tier, or the shared bound), closed, or status().
  /// On error the request is still in `request`. A tier found full takes pushes again once its
  /// lane has room to spare (with RingLanes, 1/16 of the tier; lane.hpp).
  CARVE_HOST_DEVICE CARVE_QUEUE_INLINE cuda::std::expected<void, Errc> try_push(T&& request) noexcept {
    typename Gate::word gate = 0;
    const std::uint32_t why = push_quietly(request, gate);
    wake_readers(gate);
    return result_of(why);
  }
  /// try_push of a copy of `request`.
  CARVE_HOST_DEVICE cuda::std::expected<void, Errc>
  try_push(const T& request) requires cuda::std::is_copy_constructible_v<T> {
    T copy(request);
    return try_push(cuda::std::move(copy));
  }

  /// Puts a request a consumer took but cannot serve yet (its slots are taken, say) back at the
  /// head of its tier: the tier's next pop returns it before anything pushed meanwhile (requests
  /// put back earlier come first). Accepted after close() too, since the request was already in
  /// the queue; a pop reports closed only once these are gone as well. Never blocks. Errors: full
  /// (the tier already holds requeue_capacity such requests; the request stays in `request`),
  /// status(). Not counted against the tier's capacity: it held the request before.
  CARVE_HOST_DEVICE cuda::std::expected<void, Errc> try_push_front(T&& request) noexcept {
    if (status_ != 0) {
      return cuda::std::unexpected(static_cast<Errc>(status_));
    }
    const std::uint32_t tier = tier_of(request);
    const auto entry = gate_.enter(); // counted in flight even when closed: drained() waits for it
    const bool pushed = front(tier).try_push(request, stamp_for(entry.seat));
    if (pushed) {
      fronted_.fetch_add(1, cuda::std::memory_order_release);
    }
    typename Gate::word gate = gate_.leave(entry);
    if (!pushed) {
      return cuda::std::unexpected(Errc::full);
    }
    wake_readers(gate);
    return {};
  }

  /// The next request in drain order. Never blocks. Errors: empty; closed (closed, and nothing
  /// is left or in flight); status().
  CARVE_HOST_DEVICE CARVE_QUEUE_INLINE cuda::std::expected<T, Errc> try_pop() noexcept {
    const Seat seat = Gate::my_seat();
    Held held;
    if (const std::uint32_t why = pop_quietly(seat, held); why != 0) {
      return cuda::std::unexpected(static_cast<Errc>(why));
    }
    wake_writers(seat);
    return take(held);
  }

  /// Up to `max` requests into `out` (an output iterator), in drain order; never blocks. The
  /// number taken, at least 1; when there was nothing to take, the error try_pop would give:
  /// empty, or closed once nothing is left or in flight (so a consumer learns that the queue is
  /// done from the same call), or status(). A `max` of 0 takes nothing and returns 0.
  template <class Out>
  CARVE_HOST_DEVICE cuda::std::expected<cuda::std::size_t, Errc> try_pop_bulk(Out out, cuda::std::size_t max) noexcept {
    if (max == 0) {
      return cuda::std::size_t{0};
    }
    const Seat seat = Gate::my_seat();
    std::uint32_t why = 0;
    const cuda::std::size_t n = pop_many(out, max, seat, why);
    if (n == 0) {
      return cuda::std::unexpected(static_cast<Errc>(why));
    }
    wake_writers(seat);
    return n;
  }

  /// No more pushes (try_push_front still takes requests back); wakes every waiting thread.
  /// Requests already queued can still be popped. Idempotent.
  CARVE_HOST_DEVICE void close() noexcept {
    gate_.close();
    NV_IF_TARGET(NV_IS_HOST, (if (waiters_ != nullptr) {
                   waiters_->wake_readers(true);
                   waiters_->wake_writers();
                 }))
  }
  /// Whether close() was called.
  CARVE_HOST_DEVICE bool closed() const noexcept { return gate_.closed(); }

#if !defined(__CUDA_ARCH__)
  /// Host only: try_push, waiting while the request's tier is full. Errors: closed, status()
  /// (a queue built in device code does not wait: full). On error the request is still in
  /// `request`.
  cuda::std::expected<void, Errc> push(T&& request) { return push_waiting(request, std::nullopt); }
  /// push(), waiting at most `timeout` (then Errc::timed_out); a timeout of zero behaves like
  /// try_push.
  template <class Rep, class Period>
  cuda::std::expected<void, Errc> push(T&& request, std::chrono::duration<Rep, Period> timeout) {
    return push_waiting(request, std::chrono::steady_clock::now() + timeout);
  }

  /// Host only: try_pop, waiting while the queue is empty. Errors: closed (once nothing is left
  /// or in flight), status().
  cuda::std::expected<T, Errc> pop() { return pop_waiting(Gate::my_seat(), std::nullopt); }
  /// pop(), waiting at most `timeout` (then Errc::timed_out); a timeout of zero behaves like
  /// try_pop.
  template <class Rep, class Period>
  cuda::std::expected<T, Errc> pop(std::chrono::duration<Rep, Period> timeout) {
    return pop_waiting(Gate::my_seat(), std::chrono::steady_clock::now() + timeout);
  }

  /// Host only: waits at most `timeout` for one request, then takes up to `max` in all into `out`
  /// without waiting further. Errors as pop(timeout); a `max` of 0 returns 0 at once.
  template <class Out, class Rep, class Period>
  cuda::std::expected<cuda::std::size_t, Errc> pop_bulk(Out out, cuda::std::size_t max,
                                                        std::chrono::duration<Rep, Period> timeout) {
    if (max == 0) {
      return cuda::std::size_t{0};
    }
    const Seat seat = Gate::my_seat();
    auto first = pop_waiting(seat, std::chrono::steady_clock::now() + timeout);
    if (!first) {
      return cuda::std::unexpected(first.error());
    }
    *out = cuda::std::move(*first);
    ++out;
    std::uint32_t why = 0;
    const cuda::std::size_t n = 1 + pop_many(out, max - 1, seat, why);
    if (n > 1) { // pop_waiting already woke writers for the first one
      wake_writers(seat);
    }
    return n;
  }
#endif

  /// Thresholds + 1.
  CARVE_HOST_DEVICE std::uint32_t tier_count() const noexcept { return tiers_; }
  /// The thresholds the queue was built with.
  CARVE_HOST_DEVICE const TierThresholds& thresholds() const noexcept { return thresholds_; }
  /// The queue's drain policy (prepared).
  CARVE_HOST_DEVICE const Drain& drain() const noexcept { return drain_; }
  /// The bound of `tier` (the whole queue's, for a shared-capacity policy); 0 for a tier that
  /// does not exist or was not built.
  CARVE_HOST_DEVICE cuda::std::size_t capacity(std::uint32_t tier) const noexcept {
    return tier < built_ ? capacity_[shared_capacity ? 0 : tier] : 0;
  }

  /// Requests in `tier`, including those put back and pushes in flight; exact when no call is
  /// in flight.
  CARVE_HOST_DEVICE cuda::std::size_t size(std::uint32_t tier) const noexcept {
    if (tier >= built_) {
      return 0;
    }
    const std::uint64_t out = lane(tier).popped() + front(tier).popped(); // first: `pushed` read later is never smaller
    return static_cast<cuda::std::size_t>(lane(tier).pushed() + front(tier).pushed() - out);
  }
  /// Requests in all tiers (as size(tier)).
  CARVE_HOST_DEVICE cuda::std::size_t size() const noexcept {
    cuda::std::size_t n = 0;
    for (std::uint32_t t = 0; t < built_; ++t) {
      n += size(t);
    }
    return n;
  }
  /// size(tier) == 0.
  CARVE_HOST_DEVICE bool empty(std::uint32_t tier) const noexcept { return size(tier) == 0; }
  /// size() == 0.
  CARVE_HOST_DEVICE bool empty() const noexcept { return size() == 0; }

  /// Depth, capacity, counts and wait histogram per tier; exact when no call is in flight.
  CARVE_HOST_DEVICE QueueStats stats() const noexcept {
    QueueStats s;
    s.tiers = built_;
    const double ns_per_tick = Clock::ns_per_tick();
    for (std::uint32_t t = 0; t < built_; ++t) {
      TierStats& ts = s.tier[t];
      ts.dequeued = lane(t).popped() + front(t).popped();
      ts.requeued = front(t).pushed();
      ts.enqueued = lane(t).pushed() + ts.requeued;
      ts.depth = ts.enqueued - ts.dequeued;
      ts.capacity = capacity(t);
      ts.rejected = rejected_[t].load(cuda::std::memory_order_relaxed);
      ts.wait_sample = options_.wait_sample;
      ts.wait.ns_per_tick = ns_per_tick;
      for (std::uint32_t slot = 0; slot < histogram_slots(); ++slot) {
        waits(slot, t).add_to(ts.wait);
      }
    }
    return s;
  }

  /// The options the queue was built with.
  CARVE_HOST_DEVICE const QueueOptions& options() const noexcept { return options_; }

  /// What a drain policy sees during one pop (see drain_policy.hpp). Lives for one pop call.
  class View {
  public:
    static constexpr cuda::thread_scope scope = Lanes::scope; ///< for the policy's own atomics
    /// Over `q`, with `tried` the bit mask of tiers this pop found empty.
    CARVE_HOST_DEVICE View(const SizeTieredQueue& q, const std::uint32_t& tried) noexcept : q_(q), tried_(tried) {}
    /// The queue's tiers.
    CARVE_HOST_DEVICE std::uint32_t tier_count() const noexcept { return q_.built_; }
    /// Whether this pop already found `tier` empty.
    CARVE_HOST_DEVICE bool known_empty(std::uint32_t tier) const noexcept { return ((tried_ >> tier) & 1U) != 0; }
    /// The stamp of the oldest request in `tier`'s lane (a hint; requests put back are not
    /// looked at), or nullopt when its head is not visible or the lane cannot peek.
    CARVE_HOST_DEVICE CARVE_QUEUE_INLINE cuda::std::optional<std::uint64_t>
    head_stamp(std::uint32_t tier) const noexcept {
      if constexpr (PeekableLane<lane_type, T>) {
        return q_.lane(tier).front_stamp();
      } else {
        return cuda::std::nullopt;
      }
    }
    /// head_stamp() into `stamp`, or false (detail::head_stamp_into uses it where a view has it).
    CARVE_HOST_DEVICE CARVE_QUEUE_INLINE bool head_stamp_into(std::uint32_t tier, std::uint64_t& stamp) const noexcept {
      if constexpr (requires(const lane_type& l, std::uint64_t& s) { l.peek_stamp(s); }) {
        return q_.lane(tier).peek_stamp(stamp);
      } else {
        const cuda::std::optional<std::uint64_t> s = head_stamp(tier);
        stamp = s.value_or(0);
        return s.has_value();
      }
    }
    /// Clock ticks, read on the first call of the pop, so that a pop nothing asks the time of
    /// does not read it.
    CARVE_HOST_DEVICE std::uint64_t now() const noexcept {
      if (!have_now_) {
        now_ = Clock::now();
        have_now_ = true;
      }
      return now_;
    }

  private:
    const SizeTieredQueue& q_;
    const std::uint32_t& tried_;
    mutable std::uint64_t now_ = 0;
    mutable bool have_now_ = false;
  };

private:
  // The closed flag, the pushes in flight and the sleeping threads (push_gate.hpp).
  using Gate = detail::PushGate<Lanes::scope>;
  using Seat = typename Gate::Seat; // the calling thread's shard (Gate::my_seat)

  // What a queue without a shared bound keeps in place of its BoundedCount.
  struct NoBound {
    CARVE_HOST_DEVICE explicit NoBound(cuda::std::size_t) noexcept {}
  };

  // Room for the request a pop takes: the lane moves it here from its cell, and the call moves
  // it once more, into what it returns.
  union Held {
    CARVE_HOST_DEVICE Held() noexcept {}
    CARVE_HOST_DEVICE ~Held() {}
    T value;
  };
  CARVE_HOST_DEVICE static cuda::std::expected<T, Errc> take(Held& held) noexcept {
    cuda::std::expected<T, Errc> r(cuda::std::in_place, cuda::std::move(held.value));
    held.value.~T();
    return r;
  }

  union LaneSlot {
    CARVE_HOST_DEVICE LaneSlot() noexcept {}
    CARVE_HOST_DEVICE ~LaneSlot() {}
    lane_type lane;
  };

  // Destroys the lanes built so far unless dismissed (a lane constructor may throw on the host).
  struct BuildGuard {
    SizeTieredQueue& q;
    bool dismissed = false;
    CARVE_HOST_DEVICE ~BuildGuard() {
      if (!dismissed) {
        q.release();
      }
    }
  };

  CARVE_HOST_DEVICE void build(cuda::std::span<const cuda::std::size_t> capacities, cuda::std::size_t single) {
    tiers_ = thresholds_.tier_count();
    const auto refuse = [this](Errc code, const char* why) {
      status_ = static_cast<std::uint32_t>(code);
      refusal_ = why;
    };
    if (const auto t = thresholds_.status(); !t) {
      return refuse(t.error(), "the tier thresholds are invalid");
    }
    if (!capacities.empty() && (shared_capacity || capacities.size() != tiers_)) {
      return refuse(Errc::invalid_argument, shared_capacity ? "this drain policy takes one capacity for the whole queue"
                                                            : "one capacity per tier is needed");
    }
    for (std::uint32_t t = 0; t < tiers_; ++t) {
      capacity_[t] = capacities.empty() ? single : capacities[t];
      if (capacity_[t] == 0) {
        return refuse(Errc::invalid_argument, "a queue needs a capacity of at least 1");
      }
    }
    if (const auto p = drain_.template prepare<Clock>(tiers_); !p) {
      return refuse(p.error(), "the drain policy's parameters do not fit the tiers");
    }
    stamp_every_ = drain_reads_stamps(drain_) || options_.wait_sample == 1;
    BuildGuard guard{*this};
    NV_IF_TARGET(NV_IS_HOST, (waiters_ = new detail::QueueWaiters;))
    owner_slots_ = Gate::owned_shards();
    waits_ = new WaitHistogram<Lanes::scope>[histogram_slots() * tiers_]; // on a device: nullptr when the heap is full
    if (waits_ == nullptr) {
      refuse(Errc::no_space, "no memory for the wait histograms");
      guard.dismissed = true;
      return;
    }
    for (std::uint32_t t = 0; t < tiers_; ++t) {
      const cuda::std::size_t capacity = capacity_[shared_capacity ? 0 : t];
      const cuda::std::size_t front_capacity = capacity < requeue_capacity ? capacity : requeue_capacity;
      ::new (static_cast<void*>(&lanes_[t].lane)) lane_type(capacity);
      ::new (static_cast<void*>(&fronts_[t].lane)) lane_type(front_capacity);
      ++built_;
      if (lanes_[t].lane.capacity() != capacity || fronts_[t].lane.capacity() != front_capacity) {
        refuse(Errc::no_space, "no memory for the lanes");
      }
    }
    guard.dismissed = true;
  }

  // On the host a queue that could not be built is not built: its constructor throws, saying
  // why (after giving back whatever build() took).
  CARVE_HOST_DEVICE void refuse_on_host() {
    if (status_ == 0) {
      return;
    }
    release();
    NV_IF_TARGET(NV_IS_HOST, (throw Exception(static_cast<Errc>(status_),
                                              std::string("carve::SizeTieredQueue: ") + refusal_ + " (drain policy '" +
                                                  drain_name<Drain>() + "', " + std::to_string(tiers_) + " tiers)");))
  }

  CARVE_HOST_DEVICE void release() noexcept {
    for (std::uint32_t t = 0; t < built_; ++t) {
      lanes_[t].lane.~lane_type();
      fronts_[t].lane.~lane_type();
    }
    built_ = 0;
    delete[] waits_;
    waits_ = nullptr;
    NV_IF_TARGET(NV_IS_HOST, (delete waiters_; waiters_ = nullptr;))
  }

  CARVE_HOST_DEVICE lane_type& lane(std::uint32_t tier) noexcept { return lanes_[tier].lane; }
  CARVE_HOST_DEVICE const lane_type& lane(std::uint32_t tier) const noexcept { return lanes_[tier].lane; }
  CARVE_HOST_DEVICE lane_type& front(std::uint32_t tier) noexcept { return fronts_[tier].lane; }
  CARVE_HOST_DEVICE const lane_type& front(std::uint32_t tier) const noexcept { return fronts_[tier].lane; }

  // Pops from `l` into `held`, and its stamp into `stamp`.
  CARVE_HOST_DEVICE CARVE_QUEUE_INLINE static bool pop_lane(lane_type& l, Held& held, std::uint64_t& stamp) noexcept {
    if constexpr (SinkLane<lane_type, T>) {
      return l.try_pop_into([&held, &stamp](T&& item, std::uint64_t s) {
        ::new (static_cast<void*>(&held.value)) T(cuda::std::move(item));
        stamp = s;
      });
    } else {
      auto got = l.try_pop();
      if (!got) {
        return false;
      }
      ::new (static_cast<void*>(&held.value)) T(cuda::std::move(got->value));
      stamp = got->stamp;
      return true;
    }
  }

  // The head of a tier into `held`: a request put back (try_push_front) if there is one, else
  // the lane's. Requests put back are rare, so a pop reads one counter to skip them.
  CARVE_HOST_DEVICE CARVE_QUEUE_INLINE bool take_from(std::uint32_t tier, Held& held, std::uint64_t& stamp) noexcept {
    if (fronted_.load(cuda::std::memory_order_acquire) != 0) {
      if (pop_lane(front(tier), held, stamp)) {
        fronted_.fetch_sub(1, cuda::std::memory_order_relaxed);
        return true;
      }
    }
    if (!pop_lane(lane(tier), held, stamp)) {
      return false;
    }
    if constexpr (shared_capacity) {
      held_.release();
    }
    return true;
  }

  // The stamp a push puts on its request. The clock is read only where something reads the
  // stamp: every request when the drain policy compares stamps (aging, arrival order) or every
  // wait is recorded; otherwise one push in options_.wait_sample, marked by its low bit so that
  // a pop knows to record its wait, and 0 for the rest. (Reading the time-stamp counter costs
  // about as much as the ring's push; two reads a request were a third of its cost.)
  CARVE_HOST_DEVICE CARVE_QUEUE_INLINE std::uint64_t stamp_for(const Seat& seat) noexcept {
    if (stamp_every_) {
      return Clock::now();
    }
    if (options_.wait_sample != 0 && gate_.sample(seat, options_.wait_sample)) {
      return Clock::now() | 1U;
    }
    return 0;
  }
  // Mutable from const calls too: stats() reads the same histograms pops record into.
  CARVE_HOST_DEVICE WaitHistogram<Lanes::scope>& waits(std::uint32_t slot, std::uint32_t tier) const noexcept {
    return waits_[slot * tiers_ + tier];
  }
  // A shard's owner counts alone in its slot, without a read-modify-write; the threads that
  // share shards count in the slots after the owners'.
  CARVE_HOST_DEVICE WaitHistogram<Lanes::scope>& my_waits(const Seat& seat, std::uint32_t tier) const noexcept {
    return waits(seat.owner ? seat.shard : owner_slots_ + seat.shard, tier);
  }
  // Only sampled requests are recorded (see stamp_for); where every request is stamped, one pop
  // in options_.wait_sample records (counted in the seat's tier-0 histogram).
  CARVE_HOST_DEVICE void record_wait(const Seat& seat, std::uint32_t tier, const View& view,
                                     std::uint64_t stamp) noexcept {
    if (stamp_every_) {
      if (options_.wait_sample == 0 || (options_.wait_sample != 1 && !my_waits(seat, 0).sample(options_.wait_sample))) {
        return;
      }
    } else if (stamp == 0) {
      return;
    }
    const std::uint64_t now = view.now();
    const std::uint64_t ticks = now > stamp ? now - stamp : 0;
    if (seat.owner) {
      my_waits(seat, tier).record_alone(ticks);
    } else {
      my_waits(seat, tier).record(ticks);
    }
  }
  CARVE_HOST_DEVICE std::uint32_t histogram_slots() const noexcept { return owner_slots_ + Gate::shards; }

  // A push's outcome as the call returns it: 0 is success, anything else an Errc. Calls pass
  // plain numbers between them: an expected<void, Errc> returned out of line is written in two
  // pieces and read back whole (see force_inline.hpp), a stall on every push.
  CARVE_HOST_DEVICE CARVE_QUEUE_INLINE static cuda::std::expected<void, Errc> result_of(std::uint32_t why) noexcept {
    if (why != 0) {
      return cuda::std::unexpected(static_cast<Errc>(why));
    }
    return {};
  }

  // 0, or the Errc that refused the push. `gate` receives gate_ as this push left it, for
  // wake_readers.
  CARVE_HOST_DEVICE std::uint32_t push_quietly(T& request, typename Gate::word& gate) noexcept {
    if (status_ != 0) {
      return status_;
    }
    const std::uint32_t tier = tier_of(request);
    const auto entry = gate_.enter();
    if (!entry.open) {
      gate = gate_.leave(entry);
      return static_cast<std::uint32_t>(Errc::closed);
    }
    bool pushed = true;
    if constexpr (shared_capacity) {
      pushed = held_.try_acquire();
    }
    if (pushed) {
      pushed = lane(tier).try_push(request, stamp_for(entry.seat));
      if constexpr (shared_capacity) {
        if (!pushed) {
          held_.cancel();
        }
      }
    }
    gate = gate_.leave(entry); // after the lane published the request
    if (!pushed) {
      gate &= ~Gate::readers_mask; // nothing new for sleeping consumers
      rejected_[tier].fetch_add(1, cuda::std::memory_order_relaxed);
      return static_cast<std::uint32_t>(Errc::full);
    }
    return 0;
  }

  // One request into `held` (0), or why not (an Errc: empty; closed once nothing is left or in
  // flight; status()). `seat`: the calling thread's (Gate::my_seat), for its share of the wait
  // histograms.
  CARVE_HOST_DEVICE std::uint32_t pop_quietly(const Seat& seat, Held& held) noexcept {
    if (status_ != 0) {
      return status_;
    }
    if (pop_one(seat, held)) {
      return 0;
    }
    if (gate_.drained()) {
      // Closed with no push in flight: every accepted request is visible now; one more look.
      return pop_one(seat, held) ? 0 : static_cast<std::uint32_t>(Errc::closed);
    }
    return static_cast<std::uint32_t>(Errc::empty);
  }
  CARVE_HOST_DEVICE cuda::std::expected<T, Errc> pop_expected(const Seat& seat) noexcept {
    Held held;
    if (const std::uint32_t why = pop_quietly(seat, held); why != 0) {
      return cuda::std::unexpected(static_cast<Errc>(why));
    }
    return take(held);
  }

  // At most one pop attempt per tier: each failed attempt marks its tier as found empty.
  CARVE_HOST_DEVICE CARVE_QUEUE_INLINE bool pop_one(const Seat& seat, Held& held) noexcept {
    std::uint32_t tried = 0;
    const View view(*this, tried);
    for (std::uint32_t attempt = 0; attempt < built_; ++attempt) {
      // A plain number from here on: an optional copied or reassigned makes GCC go through
      // memory (see force_inline.hpp).
      const cuda::std::optional<std::uint32_t> pick = drain_.pick(view);
      std::uint32_t tier = pick.has_value() ? *pick : detail::no_tier;
      if (tier != detail::no_tier && (tier >= built_ || view.known_empty(tier))) {
        tier = detail::first_untried(view, 0); // a policy that names a spent tier gets the next one
      }
      if (tier == detail::no_tier) {
        return false;
      }
      std::uint64_t stamp = 0;
      if (take_from(tier, held, stamp)) {
        drain_.served(view, tier, static_cast<std::uint64_t>(size_(held.value)));
        record_wait(seat, tier, view, stamp);
        return true;
      }
      tried |= 1U << tier;
    }
    return false;
  }

  // `why`: what stopped it before `max` (an Errc, as pop_quietly gives it).
  template <class Out>
  CARVE_HOST_DEVICE cuda::std::size_t pop_many(Out& out, cuda::std::size_t max, const Seat& seat,
                                               std::uint32_t& why) noexcept {
    cuda::std::size_t n = 0;
    while (n < max) {
      Held held;
      why = pop_quietly(seat, held);
      if (why != 0) {
        break;
      }
      *out = cuda::std::move(held.value);
      held.value.~T();
      ++out;
      ++n;
    }
    return n;
  }

  // After a push (or a push refused because the queue closed), given gate_ as the push left it:
  // wake a sleeping consumer, or all of them once the queue is closed (they wait for the last
  // in-flight push).
  CARVE_HOST_DEVICE void wake_readers(typename Gate::word gate) noexcept {
    NV_IF_TARGET(NV_IS_HOST,
                 (if ((gate & Gate::readers_mask) != 0) { waiters_->wake_readers((gate & Gate::closed_bit) != 0); }))
  }
  // After a pop: the read-modify-write that pairs with a sleeping producer's announcement.
  CARVE_HOST_DEVICE void wake_writers(const Seat& seat) noexcept {
    NV_IF_TARGET(NV_IS_HOST, (if ((gate_.touch(seat) & Gate::writers_mask) != 0) { waiters_->wake_writers(); }))
  }

#if !defined(__CUDA_ARCH__)
  using Deadline = std::optional<std::chrono::steady_clock::time_point>;

  // Retries `attempt` until it gives something other than `busy`, sleeping on `cv` in between.
  template <class Attempt>
  auto wait_for_change(Attempt attempt, Errc busy, std::condition_variable& cv, typename Gate::word announce,
                       const Deadline& deadline) {
    auto r = attempt();
    if (r || r.error() != busy) {
      return r;
    }
    CARVE_EXPECTS(waiters_ != nullptr); // a queue built in device code has no host waiters
    std::unique_lock lock(waiters_->mutex);
    gate_.announce(announce);
    for (;;) {
      r = attempt();
      if (r || r.error() != busy) {
        break;
      }
      if (!deadline) {
        cv.wait(lock);
      } else if (cv.wait_until(lock, *deadline) == std::cv_status::timeout) {
        r = attempt();
        if (!r && r.error() == busy) {
          r = cuda::std::unexpected(Errc::timed_out);
        }
        break;
      }
    }
    gate_.withdraw(announce);
    return r;
  }

  cuda::std::expected<void, Errc> push_waiting(T& request, const Deadline& deadline) {
    typename Gate::word gate = 0;
    if (waiters_ == nullptr) { // not usable (status()), or built in device code: no host waiters
      return result_of(push_quietly(request, gate));
    }
    const auto r = wait_for_change([&] { return result_of(push_quietly(request, gate)); }, Errc::full,
                                   waiters_->writable, Gate::writer, deadline);
    wake_readers(gate);
    return r;
  }

  cuda::std::expected<T, Errc> pop_waiting(const Seat& seat, const Deadline& deadline) {
    if (waiters_ == nullptr) {
      return pop_expected(seat);
    }
    auto r = wait_for_change([this, seat] { return pop_expected(seat); }, Errc::empty, waiters_->readable, Gate::reader,
                             deadline);
    if (r) {
      wake_writers(seat);
    }
    return r;
  }
#endif

  // Read on every call: kept apart from everything the calls write, so that producers and
  // consumers on different cores do not take the line from each other.
  TierThresholds thresholds_;
  [[no_unique_address]] SizeFn size_;
  QueueOptions options_;
  bool stamp_every_ = true; // every push reads the clock (see stamp_for)
  std::uint32_t tiers_ = 0;
  std::uint32_t built_ = 0;       // lanes constructed (tiers_ once the queue is usable)
  std::uint32_t status_ = 0;      // an Errc, or 0
  const char* refusal_ = nullptr; // why status_ is not 0
  cuda::std::size_t capacity_[max_tiers]{};
  detail::QueueWaiters* waiters_ = nullptr; // host only
  // Wait histograms, histogram_slots() x tiers_: a consumer records in its own shard's, so that
  // two consumers do not fight over the bucket both just hit (see record_wait).
  WaitHistogram<Lanes::scope>* waits_ = nullptr;
  // Slots for shard owners: none in a queue built in device code (which host threads cannot
  // reach, and whose device threads never own a shard) or on a host without asymmetric fences.
  std::uint32_t owner_slots_ = 0;

  alignas(interference_size) Drain drain_; // written by consumers
  Gate gate_;
  // Requests held, for shared capacity; other queues carry an empty stand-in.
  [[no_unique_address]] cuda::std::conditional_t<shared_capacity, BoundedCount<Lanes::scope>, NoBound> held_{0};
  alignas(interference_size) cuda::atomic<std::uint64_t, Lanes::scope> rejected_[max_tiers]{};
  LaneSlot lanes_[max_tiers];
  // Requests put back at the head of their tier (try_push_front), and how many there are.
  alignas(interference_size) cuda::atomic<std::uint32_t, Lanes::scope> fronted_{0};
  LaneSlot fronts_[max_tiers];
};

} // namespace carve
