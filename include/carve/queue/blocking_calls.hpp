/// @file carve/queue/blocking_calls.hpp
/// A SizeTieredQueue's blocking calls (host only): push into a full tier and pop from an empty
/// queue, waiting without a deadline or with a timeout.
///
/// The queue's data path never blocks and runs on devices too; these calls retry it and sleep
/// in between on the queue's QueueWaiters (queue_waiters.hpp), announcing themselves in the
/// PushGate first so that the thread whose push or pop would wake them looks for sleepers
/// (push_gate.hpp says why that cannot miss a wake). SizeTieredQueue inherits them, with the
/// sleepers and the calls that wake them; in device code no thread sleeps, and the wakes do
/// nothing.
#pragma once

#include <carve/core/config.hpp>
#include <carve/core/errc.hpp>
#include <carve/queue/push_gate.hpp>

#include <cuda/atomic>
#include <cuda/std/cstddef>
#include <cuda/std/cstdint>
#include <cuda/std/expected>
#include <cuda/std/utility>

#include <carve/queue/queue_waiters.hpp>
#include <nv/target>

#if !defined(__CUDA_ARCH__)
#include <carve/core/error.hpp>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#endif

namespace carve::detail {

// push, pop and pop_bulk of the queue `Queue` of requests `T` whose PushGate has atomics at
// `Scope`, and the sleepers they wake (CRTP: Queue derives from this and befriends it; nothing
// here may name Queue's members outside a function body, since Queue is incomplete where it names
// this base). The same members in host and device code: a queue built on one side may be used on
// the other.
template <class Queue, class T, cuda::thread_scope Scope>
class BlockingCalls {
  using Gate = PushGate<Scope>;
  using Seat = typename Gate::Seat;
  using GateWord = typename Gate::word;

public:
#if !defined(__CUDA_ARCH__)
  /// Host only: try_push, waiting while the request's tier is full. Errors: closed, status()
  /// (a queue built in device code does not wait: full). On error the request is still in
  /// `request`.
  [[nodiscard]] cuda::std::expected<void, Errc> push(T&& request) { return push_waiting(request, std::nullopt); }
  /// push(), waiting at most `timeout` (then Errc::timed_out); a timeout of zero behaves like
  /// try_push.
  template <class Rep, class Period>
  [[nodiscard]] cuda::std::expected<void, Errc> push(T&& request, std::chrono::duration<Rep, Period> timeout) {
    return push_waiting(request, std::chrono::steady_clock::now() + timeout);
  }

  /// Host only: try_pop, waiting while the queue is empty. Errors: closed (once nothing is left
  /// or in flight), status().
  [[nodiscard]] cuda::std::expected<T, Errc> pop() { return pop_waiting(Gate::my_seat(), std::nullopt); }
  /// pop(), waiting at most `timeout` (then Errc::timed_out); a timeout of zero behaves like
  /// try_pop.
  template <class Rep, class Period>
  [[nodiscard]] cuda::std::expected<T, Errc> pop(std::chrono::duration<Rep, Period> timeout) {
    return pop_waiting(Gate::my_seat(), std::chrono::steady_clock::now() + timeout);
  }

  /// Host only: waits at most `timeout` for one request, then takes up to `max` in all into `out`
  /// without waiting further. Errors as pop(timeout); a `max` of 0 returns 0 at once.
  template <class Out, class Rep, class Period>
  [[nodiscard]] cuda::std::expected<cuda::std::size_t, Errc> pop_bulk(Out out, cuda::std::size_t max,
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
    const cuda::std::size_t n = 1 + queue().pop_many(out, max - 1, seat, why);
    if (n > 1) { // pop_waiting already woke writers for the first one
      wake_writers(queue().gate_, seat);
    }
    return n;
  }
#endif

protected:
  // Host: where blocking calls sleep; none in a queue built in device code, or not built.
  CARVE_HOST_DEVICE void open_waiters() { NV_IF_TARGET(NV_IS_HOST, (waiters_ = new QueueWaiters;)) }
  CARVE_HOST_DEVICE void close_waiters() noexcept { NV_IF_TARGET(NV_IS_HOST, (delete waiters_; waiters_ = nullptr;)) }

  // After a push (or a push refused because the queue closed), given the gate as the push left
  // it: wake a sleeping consumer, or all of them once the queue is closed (they wait for the
  // last in-flight push).
  CARVE_HOST_DEVICE void wake_readers(GateWord gate) noexcept {
    NV_IF_TARGET(NV_IS_HOST,
                 (if ((gate & Gate::readers_mask) != 0) { waiters_->wake_readers((gate & Gate::closed_bit) != 0); }))
  }
  // After a pop: the read-modify-write on `gate` that pairs with a sleeping producer's
  // announcement.
  CARVE_HOST_DEVICE void wake_writers(Gate& gate, const Seat& seat) noexcept {
    NV_IF_TARGET(NV_IS_HOST, (if ((gate.touch(seat) & Gate::writers_mask) != 0) { waiters_->wake_writers(); }))
  }
  // After close(): every sleeper.
  CARVE_HOST_DEVICE void wake_all() noexcept {
    NV_IF_TARGET(NV_IS_HOST, (if (waiters_ != nullptr) {
                   waiters_->wake_readers(true);
                   waiters_->wake_writers();
                 }))
  }

private:
#if !defined(__CUDA_ARCH__)
  using Deadline = std::optional<std::chrono::steady_clock::time_point>;

  Queue& queue() noexcept { return static_cast<Queue&>(*this); }

  // Retries `attempt` until it gives something other than `busy`, sleeping on `cv` in between.
  template <class Attempt>
  [[nodiscard]] auto wait_for_change(Attempt attempt, Errc busy, std::condition_variable& cv, GateWord announce,
                                     const Deadline& deadline) {
    auto r = attempt();
    if (r || r.error() != busy) {
      return r;
    }
    Queue& q = queue();
    CARVE_EXPECTS(waiters_ != nullptr); // a queue built in device code has no host waiters
    std::unique_lock lock(waiters_->mutex);
    q.gate_.announce(announce);
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
    q.gate_.withdraw(announce);
    return r;
  }

  [[nodiscard]] cuda::std::expected<void, Errc> push_waiting(T& request, const Deadline& deadline) {
    Queue& q = queue();
    GateWord gate = 0;
    if (waiters_ == nullptr) { // not usable (status()), or built in device code: no host waiters
      return Queue::result_of(q.push_quietly(request, gate));
    }
    const auto r = wait_for_change([&] { return Queue::result_of(q.push_quietly(request, gate)); }, Errc::full,
                                   waiters_->writable, Gate::writer, deadline);
    wake_readers(gate);
    return r;
  }

  [[nodiscard]] cuda::std::expected<T, Errc> pop_waiting(const Seat& seat, const Deadline& deadline) {
    Queue& q = queue();
    if (waiters_ == nullptr) {
      return q.pop_expected(seat);
    }
    auto r = wait_for_change([&q, seat] { return q.pop_expected(seat); }, Errc::empty, waiters_->readable, Gate::reader,
                             deadline);
    if (r) {
      wake_writers(q.gate_, seat);
    }
    return r;
  }
#endif

  QueueWaiters* waiters_ = nullptr; // host only
};

} // namespace carve::detail
