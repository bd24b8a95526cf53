/// @file carve/service/reclaim_waits.hpp
/// The WaitReclaimed requests an AllocationService has not answered yet: each waits until the
/// client or the process it names has no connection left, or until its deadline.
///
/// A wait is answered (Reclaimed) when a disconnect leaves it waiting for no one, and ends with
/// timed_out when its deadline passes first; a client that goes away drops its own waits. One
/// client may keep at most max_waits_per_client waits, which bounds what it can make the server
/// hold. The service decides who is still connected and sends the answers; this only keeps the
/// list.
///
/// Not thread-safe: the service's thread owns it.
#pragma once

#include <carve/service/protocol_messages.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace carve::service::detail {

/// The unanswered WaitReclaimed requests (see the file's description).
class ReclaimWaits {
public:
  using Clock = std::chrono::steady_clock;
  /// A WaitReclaimed not answered yet.
  struct Wait {
    ClientId waiter = 0;        ///< who asked
    std::uint32_t seq = 0;      ///< its request's sequence, for the answer
    WaitReclaimed what;         ///< whom it waits for
    Clock::time_point deadline; ///< when it ends with timed_out
  };
  /// The most waits one client keeps at once.
  static constexpr std::size_t max_waits_per_client = 64;

  /// Whether `waiter` may wait once more.
  bool room_for(ClientId waiter) const {
    return static_cast<std::size_t>(std::count_if(waits_.begin(), waits_.end(), [waiter](const Wait& w) {
             return w.waiter == waiter;
           })) < max_waits_per_client;
  }
  /// Keeps `what` from `waiter` (request `seq`) until it is answered or `what.timeout_ms` from now.
  void add(ClientId waiter, std::uint32_t seq, const WaitReclaimed& what) {
    waits_.push_back(Wait{waiter, seq, what, Clock::now() + std::chrono::milliseconds(what.timeout_ms)});
  }

  /// Ends the waits whose deadline is not after `now`, calling `timed_out(const Wait&)` for each.
  template <class TimedOut>
  void expire(Clock::time_point now, TimedOut&& timed_out) {
    std::erase_if(waits_, [&](const Wait& w) {
      if (now < w.deadline) {
        return false;
      }
      timed_out(w);
      return true;
    });
  }
  /// Client `gone` has been reclaimed: its own waits end unanswered, and each wait for which
  /// `still_connected(const WaitReclaimed&)` is now false ends with `answer(const Wait&)`.
  template <class StillConnected, class Answer>
  void settle(ClientId gone, StillConnected&& still_connected, Answer&& answer) {
    std::erase_if(waits_, [&](const Wait& w) {
      if (w.waiter == gone) {
        return true;
      }
      if (still_connected(w.what)) {
        return false;
      }
      answer(w);
      return true;
    });
  }

  /// Whether some wait is not answered yet.
  bool pending() const noexcept { return !waits_.empty(); }
  /// Whether `waiter` waits for an answer.
  bool waiting(ClientId waiter) const {
    return std::any_of(waits_.begin(), waits_.end(), [waiter](const Wait& w) { return w.waiter == waiter; });
  }

private:
  std::vector<Wait> waits_;
};

} // namespace carve::service::detail
