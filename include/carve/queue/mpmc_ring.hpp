/// @file carve/queue/mpmc_ring.hpp
/// A bounded multi-producer multi-consumer FIFO on cuda::atomic,
/// the default lane of SizeTieredQueue, usable from host threads and from kernels.
///
/// @code
/// carve::MpmcRing<Request, cuda::thread_scope_device> ring(1024);   // in a kernel or on the host
/// ring.try_push(request, stamp);   // false when full; `request` is moved from only on success
/// auto r = ring.try_pop();         // cuda::std::optional<Stamped<Request>>
/// @endcode
///
/// The array-of-turns design (D. Vyukov's bounded MPMC queue, with E. Rigtorp's turn numbers so
/// that a capacity of 1 works too): position p lives in cell p % capacity on lap p / capacity,
/// and each cell holds a turn number telling who may use it next. A producer claims p by a
/// compare-exchange of the enqueue counter when the cell's turn is 2 * lap (free), writes the
/// item and publishes 2 * lap + 1; a consumer claims p when the turn is 2 * lap + 1, moves the
/// item out and frees the cell for the next lap with 2 * lap + 2. So items leave in the order
/// their positions were claimed: FIFO across all producers. Each operation is one
/// compare-exchange on a counter that lives in its own cache line, plus one release store.
///
/// A full ring reopens with room to spare: once a push has found it full, pushes keep failing
/// until capacity / 16 + 1 cells are free (reopen_room()). Otherwise a producer retrying on full
/// takes each cell back the moment a consumer frees it, and the two cores pass that cell's line
/// back and forth once per item: twice the cost per request or more, whenever a producer
/// outruns its consumers (docs/queue-cost.md). The ring never holds more than
/// capacity() items, and below 16 cells a full ring reopens as soon as one cell is free.
///
/// A call that loses a race for a position waits `RaceBackoff` before it reads the counter
/// again (default LostRaceBackoff: on the host 8 us, doubling up to 64 us; RetryAtOnce never
/// waits). The winner has the counter and cell lines in its core's cache; retrying at once takes
/// them back, and both threads then pay a line transfer on nearly every operation, while a wait
/// lets the winner run on with the lines it holds. Where two threads both push and pop one ring
/// and their cores pass lines slowly (200-300 ns), retrying at once cost 355-495 ns per request
/// and waiting 12-17 (docs/queue-cost.md). A call that never loses a race, as in a
/// one-producer one-consumer pipeline, never waits.
///
/// Not strictly lock-free: a producer stopped between its claim and its publish holds back the
/// consumer of that one cell (others go on). Positions are 63-bit (the enqueue counter's top bit
/// marks a ring found full) and never wrap in practice.
/// The cells come from the heap (carve/core/heap_array.hpp), on a device from the device heap
/// (cudaLimitMallocHeapSize): there capacity() is 0 when that failed, and then every push
/// fails; on the host no memory throws carve::Exception (no_space).
#pragma once

#include <carve/core/config.hpp>
#include <carve/core/error.hpp>
#include <carve/core/heap_array.hpp>
#include <carve/queue/backoff.hpp>
#include <carve/queue/lane.hpp>
#include <carve/queue/poll_backoff.hpp>

#include <cuda/atomic>
#include <cuda/std/cstddef>
#include <cuda/std/cstdint>
#include <cuda/std/optional>
#include <cuda/std/utility>
#include <nv/target>

#include <new>

namespace carve {

/// Bounded MPMC FIFO of Stamped<T> with atomics at `Scope`, waiting `RaceBackoff` after a lost
/// race (see the file's description). A PeekableLane and a SinkLane; every call but the
/// destructor may run concurrently from any number of threads.
template <class T, cuda::thread_scope Scope = cuda::thread_scope_system, Backoff RaceBackoff = LostRaceBackoff>
class MpmcRing {
public:
  using value_type = T; ///< the item type

  /// Room for exactly `capacity` items, from the heap. capacity() is 0 when `capacity` is 0
  /// or, in device code, the device heap is full. On the host, no memory for them throws
  /// carve::Exception (no_space), as every carve constructor reports bad input on the host.
  CARVE_HOST_DEVICE explicit MpmcRing(cuda::std::size_t capacity) : cells_(new_cells(capacity)) {
    if (cells_ == nullptr) {
      return;
    }
    capacity_ = capacity;
    mask_ = capacity - 1;
    power_of_two_ = (capacity & mask_) == 0;
    for (cuda::std::size_t i = 0; i < capacity; ++i) {
      cells_[i].turn.store(0, cuda::std::memory_order_relaxed);
    }
    while ((cuda::std::size_t{1} << shift_) < capacity) {
      ++shift_;
    }
  }

  MpmcRing(const MpmcRing&) = delete;
  MpmcRing& operator=(const MpmcRing&) = delete;

  /// Destroys what is left. Not safe against concurrent calls, like any destructor.
  CARVE_HOST_DEVICE ~MpmcRing() {
    while (try_pop()) {
    }
    detail::delete_heap_array(cells_, capacity_);
  }

  /// Moves `item` in with `stamp` at the tail; false, with `item` untouched, when full (or
  /// reopening after full: see reopen_room()) or when capacity() is 0.
  CARVE_HOST_DEVICE CARVE_QUEUE_INLINE bool try_push(T& item,
                                                     std::uint64_t stamp) noexcept(noexcept(T(cuda::std::move(item)))) {
    Claim claim = claim_push();
    if (claim.outcome == Outcome::lost) {
      claim = after_losing([this] { return claim_push(); });
    }
    if (claim.outcome != Outcome::claimed) {
      return false;
    }
    const Place at = place(claim.pos);
    Cell& cell = cells_[at.index];
    ::new (static_cast<void*>(&cell.slot.item)) T(cuda::std::move(item));
    cell.stamp.store(stamp, cuda::std::memory_order_relaxed);
    cell.turn.store(2 * at.lap + 1, cuda::std::memory_order_release);
    return true;
  }

  /// The oldest item and its stamp, or nullopt when empty (or its push has not published yet).
  CARVE_HOST_DEVICE cuda::std::optional<Stamped<T>> try_pop() noexcept(noexcept(T(cuda::std::declval<T&&>()))) {
    cuda::std::optional<Stamped<T>> out;
    (void)try_pop_into([&out](T&& item, std::uint64_t stamp) {
      out.emplace(Stamped<T>{cuda::std::move(item), stamp});
    });
    return out;
  }

  /// Pops the oldest item by calling `sink(T&& item, std::uint64_t stamp)` while the item is still
  /// in its cell; false, without calling it, when the ring is empty. The sink must move the item
  /// out (or copy it) and must not throw. Saves the temporaries of try_pop: a pop that hands an
  /// optional<Stamped<T>> up through several calls copies it at each, and those copies, written
  /// in pieces and read back whole, cost more than the pop's compare-exchange on one thread.
  template <class Sink>
  CARVE_HOST_DEVICE CARVE_QUEUE_INLINE bool try_pop_into(Sink&& sink) noexcept {
    Claim claim = claim_pop();
    if (claim.outcome == Outcome::lost) {
      claim = after_losing([this] { return claim_pop(); });
    }
    if (claim.outcome != Outcome::claimed) {
      return false;
    }
    const Place at = place(claim.pos);
    Cell& cell = cells_[at.index];
    T* item = &cell.slot.item;
    sink(cuda::std::move(*item), cell.stamp.load(cuda::std::memory_order_relaxed));
    item->~T();
    cell.turn.store(2 * at.lap + 2, cuda::std::memory_order_release); // free for the next lap
    return true;
  }

  /// The stamp of the item at the head, or nullopt when the head is not written yet. A hint: by
  /// the time the caller looks, that item may be gone.
  CARVE_HOST_DEVICE CARVE_QUEUE_INLINE cuda::std::optional<std::uint64_t> front_stamp() const noexcept {
    std::uint64_t stamp = 0;
    return peek_stamp(stamp) ? cuda::std::optional<std::uint64_t>(stamp) : cuda::std::nullopt;
  }
  /// front_stamp() into `stamp`, or false: what the queue's drain view calls, with no optional to
  /// build (see force_inline.hpp).
  CARVE_HOST_DEVICE CARVE_QUEUE_INLINE bool peek_stamp(std::uint64_t& stamp) const noexcept {
    if (capacity_ == 0) {
      return false;
    }
    const std::uint64_t pos = dequeue_.value.load(cuda::std::memory_order_acquire);
    const Place at = place(pos);
    const Cell& cell = cells_[at.index];
    if (cell.turn.load(cuda::std::memory_order_acquire) != 2 * at.lap + 1) {
      return false;
    }
    stamp = cell.stamp.load(cuda::std::memory_order_relaxed);
    return true;
  }

  /// The most items held at once; 0 when the cells could not be allocated.
  CARVE_HOST_DEVICE cuda::std::size_t capacity() const noexcept { return capacity_; }
  /// Free cells a ring found full needs before it takes the next push: capacity() / 16 + 1.
  CARVE_HOST_DEVICE cuda::std::size_t reopen_room() const noexcept { return headroom() + 1; }
  /// Positions claimed by pushes so far (including pushes not yet published).
  CARVE_HOST_DEVICE std::uint64_t pushed() const noexcept {
    return enqueue_.value.load(cuda::std::memory_order_acquire) & ~reopening;
  }
  /// Positions claimed by pops so far.
  CARVE_HOST_DEVICE std::uint64_t popped() const noexcept {
    return dequeue_.value.load(cuda::std::memory_order_acquire);
  }
  /// Items held, counting pushes that have claimed a cell but not yet published it.
  CARVE_HOST_DEVICE cuda::std::size_t size() const noexcept {
    const std::uint64_t out = popped(); // first: a later `pushed` can only be larger
    return static_cast<cuda::std::size_t>(pushed() - out);
  }

private:
  // Raw room for one T: the ring starts and ends each item's lifetime itself.
  union Slot {
    CARVE_HOST_DEVICE Slot() noexcept {}
    CARVE_HOST_DEVICE ~Slot() {}
    T item;
  };
  struct Cell {
    cuda::atomic<std::uint64_t, Scope> turn{0}; // 2 * lap: free for that lap; 2 * lap + 1: written in it
    cuda::atomic<std::uint64_t, Scope> stamp{0};
    Slot slot;
  };
  // `capacity` cells, or nullptr for none or (device code) a full device heap; on the host no
  // memory throws, as every carve constructor reports bad input there.
  CARVE_HOST_DEVICE static Cell* new_cells(cuda::std::size_t capacity) {
    Cell* cells = detail::new_heap_array<Cell>(capacity);
    NV_IF_TARGET(NV_IS_HOST, (if (cells == nullptr && capacity != 0) {
                   throw Exception(Errc::no_space,
                                   "carve::MpmcRing: no memory for " + std::to_string(capacity) + " cells");
                 }))
    return cells;
  }

  // Producers and consumers each hammer their own counter: keep them out of each other's lines.
  struct alignas(interference_size) Counter {
    cuda::atomic<std::uint64_t, Scope> value{0};
  };

  // Cells beyond its own that a push needs free once the ring was found full.
  CARVE_HOST_DEVICE cuda::std::size_t headroom() const noexcept { return capacity_ / 16; }

  struct Place {
    cuda::std::size_t index; // the cell
    std::uint64_t lap;       // how many times the ring has wrapped before this position
  };
  CARVE_HOST_DEVICE CARVE_QUEUE_INLINE Place place(std::uint64_t pos) const noexcept {
    if (power_of_two_) {
      return {static_cast<cuda::std::size_t>(pos & mask_), pos >> shift_};
    }
    return {static_cast<cuda::std::size_t>(pos % capacity_), pos / capacity_}; // one division
  }

  enum class Outcome { claimed, lost, full_or_empty };
  struct Claim {
    Outcome outcome;
    std::uint64_t pos; // the position claimed
  };

  // One push's claim of the next position: `lost` when another push took the position this
  // one read from the counter.
  CARVE_HOST_DEVICE CARVE_QUEUE_INLINE Claim claim_push() noexcept {
    std::uint64_t pos = enqueue_.value.load(cuda::std::memory_order_relaxed);
    for (;;) {
      if (capacity_ == 0) {
        return {Outcome::full_or_empty, 0};
      }
      if ((pos & reopening) != 0) {
        // Found full before: wait until the cell headroom() places ahead is free too, which the
        // consumers left long ago. A hint only; the claim below still checks its own cell.
        const std::uint64_t next = pos & ~reopening;
        const Place far = place(next + headroom());
        const std::uint64_t turn = cells_[far.index].turn.load(cuda::std::memory_order_relaxed);
        if (static_cast<std::int64_t>(turn - 2 * far.lap) < 0) {
          return {Outcome::full_or_empty, 0};
        }
        if (enqueue_.value.compare_exchange_weak(pos, next, cuda::std::memory_order_relaxed)) {
          pos = next;
        }
        continue;
      }
      const Place at = place(pos);
      const std::uint64_t turn = cells_[at.index].turn.load(cuda::std::memory_order_acquire);
      const auto ahead = static_cast<std::int64_t>(turn - 2 * at.lap);
      if (ahead > 0) {
        return {Outcome::lost, 0}; // written on this lap already
      }
      if (ahead < 0) {
        if (headroom() != 0) { // a lost exchange means another call got there first: fine either way
          (void)enqueue_.value.compare_exchange_strong(pos, pos | reopening, cuda::std::memory_order_relaxed);
        }
        return {Outcome::full_or_empty, 0}; // the cell still holds the item of an earlier lap: full
      }
      const std::uint64_t seen = pos;
      if (enqueue_.value.compare_exchange_weak(pos, pos + 1, cuda::std::memory_order_relaxed)) {
        return {Outcome::claimed, pos};
      }
      if (pos != seen) {
        return {Outcome::lost, 0};
      }
      // A spurious failure (load-linked/store-conditional): nobody else took it; try again.
    }
  }

  // One pop's claim of the oldest position: `lost` when another pop took it first.
  CARVE_HOST_DEVICE CARVE_QUEUE_INLINE Claim claim_pop() noexcept {
    std::uint64_t pos = dequeue_.value.load(cuda::std::memory_order_relaxed);
    for (;;) {
      if (capacity_ == 0) {
        return {Outcome::full_or_empty, 0};
      }
      const Place at = place(pos);
      const std::uint64_t turn = cells_[at.index].turn.load(cuda::std::memory_order_acquire);
      const auto ahead = static_cast<std::int64_t>(turn - (2 * at.lap + 1));
      if (ahead > 0) {
        return {Outcome::lost, 0}; // taken on this lap already
      }
      if (ahead < 0) {
        return {Outcome::full_or_empty, 0}; // not written yet: empty (or a push still in flight)
      }
      const std::uint64_t seen = pos;
      if (dequeue_.value.compare_exchange_weak(pos, pos + 1, cuda::std::memory_order_relaxed)) {
        return {Outcome::claimed, pos};
      }
      if (pos != seen) {
        return {Outcome::lost, 0};
      }
    }
  }

  // After a lost race: waits RaceBackoff before each new claim until one is not lost. Out of
  // line, so that a call that never loses builds no back-off state and keeps its code small.
  template <class ClaimAgain>
  CARVE_HOST_DEVICE __attribute__((noinline)) Claim after_losing(ClaimAgain claim_again) noexcept {
    RaceBackoff lost;
    for (;;) {
      lost.wait();
      const Claim claim = claim_again();
      if (claim.outcome != Outcome::lost) {
        return claim;
      }
    }
  }

  Cell* cells_ = nullptr;
  cuda::std::size_t capacity_ = 0;
  cuda::std::size_t mask_ = 0;
  bool power_of_two_ = false; // then pos % capacity is pos & mask, and pos / capacity is pos >> shift
  std::uint32_t shift_ = 0;
  // The enqueue counter's top bit: a push found the ring full, and pushes wait for headroom().
  // Kept in the counter so that the push path reads nothing more than before.
  static constexpr std::uint64_t reopening = std::uint64_t{1} << 63;
  Counter enqueue_;
  Counter dequeue_;
};

/// The default lane policy: MpmcRing at `Scope` (system for host threads, device for a queue in
/// global memory shared by a grid, block for shared memory), waiting `RaceBackoff` after a lost race.
template <cuda::thread_scope Scope = cuda::thread_scope_system, Backoff RaceBackoff = LostRaceBackoff>
struct RingLanes {
  /// MpmcRing of the request type.
  template <class T>
  using lane = MpmcRing<T, Scope, RaceBackoff>;
  /// The queue's own counters use the lanes' scope.
  static constexpr cuda::thread_scope scope = Scope;
};

static_assert(PeekableLane<MpmcRing<int>, int> && SinkLane<MpmcRing<int>, int> && LanePolicyFor<RingLanes<>, int> &&
              LanePolicyFor<RingLanes<cuda::thread_scope_system, RetryAtOnce>, int>);

} // namespace carve
