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
/// Tiers: each threshold is an inclusive upper bound (tier_thresholds.hpp; {128, 512}: 0..128,
/// 129..512, 513 and up). For a latency target drain with StrictPriority::with_aging(bound)
/// (docs/queues.md); RoundRobin, the default, gives the small tier one turn in k + 1 while every
/// tier is backlogged, so small requests can wait longer than in one FIFO. QueueOptions: how
/// often waits are sampled (queue_wait_stats.hpp).
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
/// scheduler. Bad input (invalid thresholds, a capacity of zero, a drain policy that does not
/// fit the tiers, lane storage that could not be allocated) makes the constructor throw
/// carve::Exception on the host; device code cannot throw, so there the queue refuses every call
/// with the Errc, which status() tells. Blocking calls (push, pop, pop_bulk) are host-only.
///
/// Guarantees: a request whose push succeeded is popped exactly once, also across close();
/// within a tier, requests leave in push order across all producers (with FIFO lanes); a failed
/// push leaves the request with the caller. close() refuses further pushes, wakes every waiter
/// and lets consumers drain what is queued: pops then fail with Errc::closed only once nothing
/// is left and no push is still in flight. size() and the stats are exact when no call is in
/// flight. A queue used by host threads and a kernel at the same time must be closed from the
/// host (push_gate.hpp says why).
#pragma once

#include <carve/core/compressed_pair.hpp>
#include <carve/core/config.hpp>
#include <carve/core/error.hpp>
#include <carve/queue/blocking_calls.hpp>
#include <carve/queue/bounded_count.hpp>
#include <carve/queue/drain_policy.hpp>
#include <carve/queue/drain_view.hpp>
#include <carve/queue/lane.hpp>
#include <carve/queue/mpmc_ring.hpp>
#include <carve/queue/push_gate.hpp>
#include <carve/queue/queue_clock.hpp>
#include <carve/queue/queue_stats.hpp>
#include <carve/queue/queue_wait_stats.hpp>
#include <carve/queue/round_robin.hpp>
#include <carve/queue/tier_thresholds.hpp>
#include <carve/queue/tiered_lanes.hpp>

#include <cuda/atomic>
#include <cuda/std/cstddef>
#include <cuda/std/cstdint>
#include <cuda/std/expected>
#include <cuda/std/optional>
#include <cuda/std/span>
#include <cuda/std/type_traits>
#include <cuda/std/utility>
#include <nv/target>

#if !defined(__CUDA_ARCH__)
#include <string>
#endif

namespace carve {

/// Bounded MPMC queue of requests in per-size tiers, drained by a DrainPolicy (see the file's
/// description). Every call but the destructor may run concurrently from any number of threads.
/// The blocking calls push, pop and pop_bulk (host only) come from detail::BlockingCalls
/// (blocking_calls.hpp); the lanes are kept by detail::TieredLanes (tiered_lanes.hpp) and the
/// wait histograms by detail::QueueWaitStats (queue_wait_stats.hpp).
template <class T, class SizeFn, class Lanes = RingLanes<>, class Drain = RoundRobin, class Clock = QueueClock>
requires SizeFunction<SizeFn, T> && LanePolicyFor<Lanes, T> && DrainPolicy<Drain> && StampClock<Clock>
class SizeTieredQueue : public detail::BlockingCalls<SizeTieredQueue<T, SizeFn, Lanes, Drain, Clock>, T, Lanes::scope> {
  friend class detail::BlockingCalls<SizeTieredQueue, T, Lanes::scope>;

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
      : sizing_(size, thresholds), options_(options), drain_(drain), held_(capacity) {
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
      : sizing_(size, thresholds), options_(options), drain_(drain) {
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
  [[nodiscard]] CARVE_HOST_DEVICE cuda::std::expected<void, Errc> status() const noexcept {
    if (status_ != 0) {
      return cuda::std::unexpected(static_cast<Errc>(status_));
    }
    return {};
  }

  /// The tier `request` goes to, by its size.
  CARVE_HOST_DEVICE std::uint32_t tier_of(const T& request) const noexcept {
    return sizing_.second().tier_of(static_cast<std::uint64_t>(sizing_.first()(request)));
  }

  /// Never blocks. Errors: full (the request's tier, or the shared bound), closed, or status().
  /// On error the request is still in `request`. A tier found full takes pushes again once its
  /// lane has room to spare (with RingLanes, 1/16 of the tier; lane.hpp).
  [[nodiscard]] CARVE_HOST_DEVICE CARVE_QUEUE_INLINE cuda::std::expected<void, Errc> try_push(T&& request) noexcept {
    typename Gate::word gate = 0;
    const std::uint32_t why = push_quietly(request, gate);
    this->wake_readers(gate);
    return result_of(why);
  }
  /// try_push of a copy of `request`.
  [[nodiscard]] CARVE_HOST_DEVICE cuda::std::expected<void, Errc>
  try_push(const T& request) requires cuda::std::is_copy_constructible_v<T> {
    T copy(request);
    return try_push(cuda::std::move(copy));
  }

  /// Puts a request a consumer took but cannot serve yet (its slots are taken, say) back at the
  /// head of its tier: the tier's next pop returns it before anything pushed meanwhile (requests
  /// put back earlier come first). Accepted after close() too, since the request was already in
  /// the queue; a pop reports closed only once these are gone as well. Never blocks. Errors: full
  /// (the request stays in `request`): the tier holds requeue_capacity such requests, or held
  /// that many and its put-back lane has not reopened yet (RingLanes: an MpmcRing found full takes
  /// the next only once capacity / 16 + 1 cells are free, 5 of 64); status(). Not counted against the
  /// tier's capacity: it held the request before.
  [[nodiscard]] CARVE_HOST_DEVICE cuda::std::expected<void, Errc> try_push_front(T&& request) noexcept {
    if (status_ != 0) {
      return cuda::std::unexpected(static_cast<Errc>(status_));
    }
    const std::uint32_t tier = tier_of(request);
    const auto entry = gate_.enter(); // counted in flight even when closed: drained() waits for it
    const bool pushed = lanes_.push_front(tier, request, stamp_for(entry.seat));
    typename Gate::word gate = gate_.leave(entry);
    if (!pushed) {
      return cuda::std::unexpected(Errc::full);
    }
    this->wake_readers(gate);
    return {};
  }

  /// The next request in drain order. Never blocks. Errors: empty; closed (closed, and nothing
  /// is left or in flight); status().
  [[nodiscard]] CARVE_HOST_DEVICE CARVE_QUEUE_INLINE cuda::std::expected<T, Errc> try_pop() noexcept {
    const Seat seat = Gate::my_seat();
    Held held;
    if (const std::uint32_t why = pop_quietly(seat, held); why != 0) {
      return cuda::std::unexpected(static_cast<Errc>(why));
    }
    this->wake_writers(gate_, seat);
    return held.take();
  }

  /// Up to `max` requests into `out` (an output iterator), in drain order; never blocks. The
  /// number taken, at least 1; when there was nothing to take, the error try_pop would give:
  /// empty, or closed once nothing is left or in flight (so a consumer learns that the queue is
  /// done from the same call), or status(). A `max` of 0 takes nothing and returns 0.
  template <class Out>
  [[nodiscard]] CARVE_HOST_DEVICE cuda::std::expected<cuda::std::size_t, Errc>
  try_pop_bulk(Out out, cuda::std::size_t max) noexcept {
    if (max == 0) {
      return cuda::std::size_t{0};
    }
    const Seat seat = Gate::my_seat();
    std::uint32_t why = 0;
    const cuda::std::size_t n = pop_many(out, max, seat, why);
    if (n == 0) {
      return cuda::std::unexpected(static_cast<Errc>(why));
    }
    this->wake_writers(gate_, seat);
    return n;
  }

  /// No more pushes (try_push_front still takes requests back); wakes every waiting thread.
  /// Requests already queued can still be popped. Idempotent.
  CARVE_HOST_DEVICE void close() noexcept {
    gate_.close();
    this->wake_all();
  }
  /// Whether close() was called.
  CARVE_HOST_DEVICE bool closed() const noexcept { return gate_.closed(); }

  // push, pop and pop_bulk (host only, blocking): see blocking_calls.hpp.

  /// Thresholds + 1.
  CARVE_HOST_DEVICE std::uint32_t tier_count() const noexcept { return tiers_; }
  /// The thresholds the queue was built with.
  CARVE_HOST_DEVICE const TierThresholds& thresholds() const noexcept { return sizing_.second(); }
  /// The queue's drain policy (prepared).
  CARVE_HOST_DEVICE const Drain& drain() const noexcept { return drain_; }
  /// The bound of `tier` (the whole queue's, for a shared-capacity policy); 0 for a tier that
  /// does not exist or was not built.
  CARVE_HOST_DEVICE cuda::std::size_t capacity(std::uint32_t tier) const noexcept { return lanes_.capacity(tier); }

  /// Requests in `tier`, including those put back and pushes in flight; exact when no call is
  /// in flight.
  CARVE_HOST_DEVICE cuda::std::size_t size(std::uint32_t tier) const noexcept { return lanes_.size(tier); }
  /// Requests in all tiers (as size(tier)).
  CARVE_HOST_DEVICE cuda::std::size_t size() const noexcept {
    cuda::std::size_t n = 0;
    for (std::uint32_t t = 0; t < lanes_.built(); ++t) {
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
    s.tiers = lanes_.built();
    const double ns_per_tick = Clock::ns_per_tick();
    for (std::uint32_t t = 0; t < lanes_.built(); ++t) {
      TierStats& ts = s.tier[t];
      lanes_.count_into(t, ts);
      ts.rejected = rejected_[t].load(cuda::std::memory_order_relaxed);
      ts.wait_sample = options_.wait_sample;
      ts.wait.ns_per_tick = ns_per_tick;
      waits_.add_to(t, ts.wait);
    }
    return s;
  }

  /// The options the queue was built with.
  CARVE_HOST_DEVICE const QueueOptions& options() const noexcept { return options_; }

  /// What a drain policy sees during one pop (drain_view.hpp).
  using View = detail::TieredDrainView<detail::TieredLanes<T, lane_type, Lanes::scope, shared_capacity>, Clock>;

private:
  // The closed flag, the pushes in flight and the sleeping threads (push_gate.hpp).
  using Gate = detail::PushGate<Lanes::scope>;
  using Seat = typename Gate::Seat; // the calling thread's shard (Gate::my_seat)
  using Lanes_ = detail::TieredLanes<T, lane_type, Lanes::scope, shared_capacity>;

  using Held = detail::HeldRequest<T>;

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
    tiers_ = sizing_.second().tier_count();
    const auto refuse = [this](Errc code, const char* why) {
      status_ = static_cast<std::uint32_t>(code);
      refusal_ = why;
    };
    if (const auto t = sizing_.second().status(); !t) {
      return refuse(t.error(), "the tier thresholds are invalid");
    }
    if (const char* why = lanes_.set_capacities(tiers_, capacities, single); why != nullptr) {
      return refuse(Errc::invalid_argument, why);
    }
    if (const auto p = drain_.template prepare<Clock>(tiers_); !p) {
      return refuse(p.error(), "the drain policy's parameters do not fit the tiers");
    }
    BuildGuard guard{*this};
    this->open_waiters();
    const bool stamp_every = drain_reads_stamps(drain_) || options_.wait_sample == 1;
    if (!waits_.allocate(tiers_, Gate::owned_shards(), options_.wait_sample, stamp_every)) {
      refuse(Errc::no_space, "no memory for the wait histograms");
    } else if (!lanes_.construct(requeue_capacity)) {
      refuse(Errc::no_space, "no memory for the lanes");
    }
    guard.dismissed = true; // refuse_on_host() releases what a refused queue took
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
    lanes_.destroy();
    waits_.release();
    this->close_waiters();
  }

  // The head of a tier into `held`; a request taken from the lane (not one put back) frees its
  // unit of a shared capacity.
  CARVE_HOST_DEVICE CARVE_QUEUE_INLINE bool take_from(std::uint32_t tier, Held& held, std::uint64_t& stamp) noexcept {
    const auto took = lanes_.take(tier, held, stamp);
    if constexpr (shared_capacity) {
      if (took == Lanes_::Took::lane) {
        held_.release();
      }
    }
    return took != Lanes_::Took::nothing;
  }

  // The stamp a push puts on its request (queue_wait_stats.hpp says which pushes read the clock).
  CARVE_HOST_DEVICE CARVE_QUEUE_INLINE std::uint64_t stamp_for(const Seat& seat) noexcept {
    return waits_.template stamp<Clock>(gate_, seat);
  }

  // A push's outcome as the call returns it: 0 is success, anything else an Errc. Calls pass
  // plain numbers between them: an expected<void, Errc> returned out of line is written in two
  // pieces and read back whole (see force_inline.hpp), a stall on every push.
  [[nodiscard]] CARVE_HOST_DEVICE CARVE_QUEUE_INLINE static cuda::std::expected<void, Errc>
  result_of(std::uint32_t why) noexcept {
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
      pushed = lanes_.lane(tier).try_push(request, stamp_for(entry.seat));
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
  [[nodiscard]] CARVE_HOST_DEVICE cuda::std::expected<T, Errc> pop_expected(const Seat& seat) noexcept {
    Held held;
    if (const std::uint32_t why = pop_quietly(seat, held); why != 0) {
      return cuda::std::unexpected(static_cast<Errc>(why));
    }
    return held.take();
  }

  // At most one pop attempt per tier: each failed attempt marks its tier as found empty.
  CARVE_HOST_DEVICE CARVE_QUEUE_INLINE bool pop_one(const Seat& seat, Held& held) noexcept {
    std::uint32_t tried = 0;
    const View view(lanes_, tried);
    const std::uint32_t tiers = lanes_.built();
    for (std::uint32_t attempt = 0; attempt < tiers; ++attempt) {
      // A plain number from here on: an optional copied or reassigned makes GCC go through
      // memory (see force_inline.hpp).
      const cuda::std::optional<std::uint32_t> pick = drain_.pick(view);
      std::uint32_t tier = pick.has_value() ? *pick : detail::no_tier;
      if (tier != detail::no_tier && (tier >= tiers || view.known_empty(tier))) {
        tier = detail::first_untried(view, 0); // a policy that names a spent tier gets the next one
      }
      if (tier == detail::no_tier) {
        return false;
      }
      std::uint64_t stamp = 0;
      if (take_from(tier, held, stamp)) {
        drain_.served(view, tier, static_cast<std::uint64_t>(sizing_.first()(held.value)));
        waits_.record(seat, tier, stamp, [&view] { return view.now(); });
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

  // Read on every call: kept apart from everything the calls write, so that producers and
  // consumers on different cores do not take the line from each other.
  // The size function takes no bytes when it has no state (a base of the pair: see
  // compressed_pair.hpp for why not [[no_unique_address]]).
  detail::CompressedPair<SizeFn, TierThresholds> sizing_;
  QueueOptions options_;
  std::uint32_t tiers_ = 0;
  std::uint32_t status_ = 0;                   // an Errc, or 0
  const char* refusal_ = nullptr;              // why status_ is not 0
  detail::QueueWaitStats<Lanes::scope> waits_; // the clock rule and the wait histograms

  alignas(interference_size) Drain drain_; // written by consumers
  Gate gate_;
  // Requests held, for shared capacity; other queues carry an empty stand-in (a byte, beside the
  // padding before the next line-aligned member).
  cuda::std::conditional_t<shared_capacity, BoundedCount<Lanes::scope>, detail::NoBound> held_{0};
  alignas(interference_size) cuda::atomic<std::uint64_t, Lanes::scope> rejected_[max_tiers]{};
  // Per tier, the lane and the lane of requests put back (try_push_front).
  Lanes_ lanes_;
};

} // namespace carve
