/// @file carve/queue/queue_stats.hpp
/// What a SizeTieredQueue reports about itself.
///
/// Per tier: depth, capacity, requests taken in, handed out and refused because the tier was
/// full, and a histogram of the time requests waited (push to pop). The histogram has a bucket
/// per power of two clock ticks, so recording is one relaxed fetch_add and any wait from a few
/// ticks to days fits; quantiles are read back within a factor of two, interpolated inside the
/// bucket. By default one request in 16 is recorded (QueueOptions::wait_sample); the counts of
/// requests in, out and refused are exact whatever the sample.
#pragma once

#include <carve/core/config.hpp>
#include <carve/queue/tier_thresholds.hpp>

#include <cuda/atomic>
#include <cuda/std/bit>
#include <cuda/std/cstdint>

#include <cstdio>
#include <string>

namespace carve {

/// Buckets of a wait histogram. Bucket 0 holds waits of 0 ticks, bucket b >= 1 waits in
/// [2^(b-1), 2^b); the last bucket also holds everything longer (2^46 ticks: hours at any clock
/// rate).
inline constexpr std::uint32_t wait_buckets = 48;

/// A wait histogram's counts at one moment, with the clock rate to read them in nanoseconds.
struct WaitHistogramSnapshot {
  std::uint64_t counts[wait_buckets]{}; ///< waits recorded per bucket (see wait_buckets)
  double ns_per_tick = 1.0;             ///< the clock's rate, for quantile_ns()

  /// Waits recorded, over all buckets.
  CARVE_HOST_DEVICE constexpr std::uint64_t count() const noexcept {
    std::uint64_t n = 0;
    for (const std::uint64_t c : counts) {
      n += c;
    }
    return n;
  }

  /// The wait (ns) below which a fraction q of the recorded waits fall, within a factor of two
  /// (interpolated inside its bucket); 0 when nothing was recorded.
  CARVE_HOST_DEVICE constexpr double quantile_ns(double q) const noexcept {
    const std::uint64_t n = count();
    if (n == 0) {
      return 0.0;
    }
    const double rank = q <= 0 ? 1.0 : (q >= 1 ? static_cast<double>(n) : q * static_cast<double>(n));
    double below = 0;
    for (std::uint32_t b = 0; b < wait_buckets; ++b) {
      const double here = static_cast<double>(counts[b]);
      if (here > 0 && below + here >= rank) {
        const double lo = b == 0 ? 0.0 : static_cast<double>(std::uint64_t{1} << (b - 1));
        const double hi = b == 0 ? 1.0 : 2.0 * lo;
        return (lo + (hi - lo) * ((rank - below) / here)) * ns_per_tick;
      }
      below += here;
    }
    return static_cast<double>(std::uint64_t{1} << (wait_buckets - 1)) * ns_per_tick;
  }
};

/// Waits counted per power of two ticks, with atomics at `Scope`: record() from any number of
/// threads at once, one relaxed fetch_add each.
template <cuda::thread_scope Scope>
class WaitHistogram {
public:
  /// The bucket a wait of `ticks` falls in (see wait_buckets).
  CARVE_HOST_DEVICE static constexpr std::uint32_t bucket(std::uint64_t ticks) noexcept {
    const auto b = static_cast<std::uint32_t>(cuda::std::bit_width(ticks));
    return b < wait_buckets ? b : wait_buckets - 1;
  }

  /// Counts one wait of `ticks`. Thread-safe.
  CARVE_HOST_DEVICE void record(std::uint64_t ticks) noexcept {
    counts_[bucket(ticks)].fetch_add(1, cuda::std::memory_order_relaxed);
  }
  /// record(), only when no other thread records into this histogram at the same time: no
  /// read-modify-write, which costs a full fence on x86.
  CARVE_HOST_DEVICE void record_alone(std::uint64_t ticks) noexcept {
    auto& count = counts_[bucket(ticks)];
    count.store(count.load(cuda::std::memory_order_relaxed) + 1, cuda::std::memory_order_relaxed);
  }

  /// True once in `every` calls: which requests a sampling queue records. Load and store, not a
  /// read-modify-write: where threads share the histogram a lost count only moves the sample.
  CARVE_HOST_DEVICE bool sample(std::uint32_t every) noexcept {
    const std::uint32_t n = sampled_.load(cuda::std::memory_order_relaxed) + 1;
    const bool take = n >= every;
    sampled_.store(take ? 0 : n, cuda::std::memory_order_relaxed);
    return take;
  }

  /// The counts now, to be read at `ns_per_tick` (relaxed loads: exact when nobody records).
  CARVE_HOST_DEVICE WaitHistogramSnapshot snapshot(double ns_per_tick) const noexcept {
    WaitHistogramSnapshot s;
    s.ns_per_tick = ns_per_tick;
    add_to(s);
    return s;
  }
  /// For histograms kept in shards: sums this one into `s`.
  CARVE_HOST_DEVICE void add_to(WaitHistogramSnapshot& s) const noexcept {
    for (std::uint32_t b = 0; b < wait_buckets; ++b) {
      s.counts[b] += counts_[b].load(cuda::std::memory_order_relaxed);
    }
  }

private:
  cuda::atomic<std::uint64_t, Scope> counts_[wait_buckets]{};
  cuda::atomic<std::uint32_t, Scope> sampled_{0};
};

/// One tier of a SizeTieredQueue::stats() snapshot.
struct TierStats {
  std::uint64_t depth = 0;    ///< requests waiting now
  std::uint64_t capacity = 0; ///< the tier's bound (the queue's, when tiers share one)
  std::uint64_t enqueued = 0; ///< pushes accepted so far
  std::uint64_t dequeued = 0; ///< pops so far
  std::uint64_t rejected = 0; ///< pushes refused because the tier was full
  std::uint64_t requeued = 0; ///< requests put back at the head (try_push_front); counted in enqueued too
  /// Push-to-pop waits of one request in `wait_sample` (QueueOptions::wait_sample; 0: none kept).
  WaitHistogramSnapshot wait;
  std::uint32_t wait_sample = 1; ///< the queue's QueueOptions::wait_sample
};

/// How a SizeTieredQueue is built beyond its thresholds, capacity and policies.
struct QueueOptions {
  /// The wait histograms record one request in this many: 1 records every request, 0 none. Each
  /// recorded wait costs two clock reads (push and pop), about as much as the rest of a request
  /// on one thread; one in 16 keeps the quantiles and costs about a nanosecond a request.
  std::uint32_t wait_sample = 16;
};

/// A SizeTieredQueue's report on itself (SizeTieredQueue::stats()): exact when no call is in
/// flight.
struct QueueStats {
  std::uint32_t tiers = 0;   ///< tiers in use: `tier[0 .. tiers)`
  TierStats tier[max_tiers]; ///< per tier

  /// Requests waiting, over all tiers.
  CARVE_HOST_DEVICE constexpr std::uint64_t depth() const noexcept {
    std::uint64_t n = 0;
    for (std::uint32_t t = 0; t < tiers; ++t) {
      n += tier[t].depth;
    }
    return n;
  }
};

/// Host: a header and one line per tier (sizes, depth, counts, wait p50 and p99), e.g. for a
/// monitoring log. `thresholds` must be the queue's.
inline std::string format_stats(const QueueStats& s, const TierThresholds& thresholds) {
  std::string out = "tier  sizes                  depth   enqueued   dequeued  rejected   wait p50     p99\n";
  for (std::uint32_t t = 0; t < s.tiers; ++t) {
    const TierStats& ts = s.tier[t];
    char range[48];
    if (t + 1 == s.tiers) {
      std::snprintf(range, sizeof range, "> %llu", static_cast<unsigned long long>(thresholds.smallest(t) - 1));
    } else {
      std::snprintf(range, sizeof range, "%llu..%llu", static_cast<unsigned long long>(thresholds.smallest(t)),
                    static_cast<unsigned long long>(thresholds.largest(t)));
    }
    char line[192];
    std::snprintf(line, sizeof line, "%-5u %-20s %7llu %10llu %10llu %9llu %8.1f us %7.1f us\n", t, range,
                  static_cast<unsigned long long>(ts.depth), static_cast<unsigned long long>(ts.enqueued),
                  static_cast<unsigned long long>(ts.dequeued), static_cast<unsigned long long>(ts.rejected),
                  ts.wait.quantile_ns(0.5) / 1e3, ts.wait.quantile_ns(0.99) / 1e3);
    out += line;
  }
  return out;
}

} // namespace carve
