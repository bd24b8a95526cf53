/// @file carve/vmm/expandable_pool_options.hpp
/// How an ExpandablePool grows and shrinks, and what it reports about itself.
#pragma once

#include <carve/core/error.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

namespace carve {

/// How an ExpandablePool places, maps and unmaps.
struct ExpandablePoolOptions {
  int device = 0; ///< the device whose memory the pool maps (and which gets read/write access)
  /// Block sizes are multiples of it (a power of two): 512, as PyTorch's and cudaMalloc's.
  std::size_t granularity = 512;
  /// Physical memory the pool may map in all: the card's share for this pool. A request that would
  /// pass it is refused (no_space) after idle memory is unmapped.
  std::size_t max_reserved_bytes = std::numeric_limits<std::size_t>::max();
  /// Addresses reserved per stream (physical memory is mapped into them only where blocks land).
  /// 0: twice max_reserved_bytes when that is at most 1 TiB (a cap was set), else 256 GiB, enough
  /// for any one card today.
  std::size_t address_space_bytes = 0;
  /// A new chunk of physical memory maps at least the memory held so far divided by this (where the
  /// granules after the request are free), so a pool that grows by many small requests makes few
  /// driver calls: about growth_divisor times the natural logarithm of its growth chunks, two calls
  /// each (create and map), never one per request.
  /// The price is the unused end of the last chunk, at most 1/growth_divisor of what is held.
  /// 0: a chunk maps only the granules its request touches.
  std::size_t growth_divisor = 48;
  /// The least a new chunk maps (where the granules after the request are free), in whole granules
  /// (rounded down). 0: one granule.
  std::size_t min_chunk_bytes = 0;
  /// The most one physical allocation holds, in whole granules (rounded down; at least one): a
  /// longer chunk is made of several, and each is unmapped once no block touches it. For a driver
  /// that maps whole allocations only (no hole is lent there, see lend_min_bytes): the unused
  /// granules between live blocks then go back to the device where a whole allocation lies among
  /// them, at the price of a create and a map per allocation. carve_replay prints reserve against
  /// calls at a few sizes for such a driver. max(): a chunk is one allocation.
  std::size_t max_chunk_bytes = std::numeric_limits<std::size_t>::max();
  /// Mapped memory no block uses that the pool keeps for reuse. Whole chunks beyond it are
  /// unmapped, least recently used first, as blocks are freed. The default keeps them all (the next
  /// training step needs them again) and unmaps only when the device refuses memory or on trim().
  std::size_t release_threshold = std::numeric_limits<std::size_t>::max();
  /// Mapped memory the pool allows itself above the most bytes its live blocks have ever held
  /// (the running peak, this request included), in thousandths of that peak: before it maps more
  /// than that, it unmaps idle chunks (highest addresses first, where best fit reaches last; first
  /// those whose stream's work has run, then, where the Streams can wait, each once the work
  /// queued before its last free has run), and a growth chunk stops at the line.
  /// Lower keeps the card smaller and costs driver calls when memory moves between sizes;
  /// carve_replay prints both at a few settings for a recorded snapshot. The default, 1 (0.1%),
  /// holds reserve at 1.001x-1.004x the peak live bytes in the host replay of the four real
  /// snapshots carve has (not yet run on a card), at 2.1x-2.6x PyTorch's segment calls; a tight
  /// line also brings lending (below) in sooner, which keeps a long run's typical reserve from
  /// drifting: GPT-2 small holds 1.006x over 20 more runs of its steps at 0.1%, where 0.5% drifts
  /// to 1.03x; over 300 the median run holds 1.002x, but a block that passes the line while
  /// nothing is idle lifts one run in fifteen above 1.01x, the worst to 1.028x (host replay,
  /// docs/replay.md). max(): never unmap for it (grow by growth_divisor alone).
  std::size_t headroom_permille = 1;
  /// A block at least this large that must map memory past the headroom line first maps, a second
  /// time, the unused granules inside chunks live blocks pin (holes, which cost their memory until
  /// their chunk's last block dies), and takes their own addresses out of use until that second
  /// mapping goes. One driver call per hole, so it pays for large blocks: the default, 512 MiB,
  /// lends to the few largest blocks of a training step (a transformer's logits, a convolutional
  /// network's first activations) and nothing else on the snapshots carve has; at 256 MiB GPT-2
  /// small's mid-sized blocks borrow too, for more calls and a higher reserve (docs/replay.md gives
  /// the figures). carve_replay prints other settings against a snapshot of one's own. A block of
  /// any size that the device (or max_reserved_bytes) refuses memory maps holes when it tries again:
  /// on a full card, what live blocks leave unused still holds it. max(): never lend, not even then.
  /// For a long run, 64 MiB with bring_holes_home (below).
  std::size_t lend_min_bytes = std::size_t{512} << 20;
  /// Once no block touches a lent hole's chunk nor the second mappings of its holes, unmap those
  /// second mappings, so the chunk is one free range again (it stays mapped where it lives).
  /// Without it, a second mapping outlives the block it was lent to and keeps its hole's addresses
  /// out of use, so the chunk around it stays cut. The unmap waits for the stream's work on the
  /// freed blocks (an unmap under a running kernel faults) but never at a free: where that work
  /// has not run at the free that left the chunk unused, the first allocation after it has brings
  /// the holes home (if no block has landed on the chunk since); while held, the first after the
  /// hold. Off by default: at the 0.5% headroom line it held GPT-2 small at 1.005x over some 25
  /// more steps where the pool drifted to 1.016x, but at the default 0.1% line the pool holds
  /// 1.006x without it and 1.012x-1.017x with it (the variable-length model: 1.008x without, 1.005x
  /// with; carve_replay --again on the host, docs/replay.md), and counting the blocks on lent
  /// chunks costs host time where holes are lent (bench_replay: 1.14x pytorch-model's on GPT-2,
  /// 0.94x without). With lend_min_bytes at 64 MiB it is the setting for a long run: what mid-sized
  /// blocks borrow comes home, so lending to them no longer cuts chunks for good; over 300 more
  /// runs of each snapshot's steps the worst run holds 1.002x-1.012x peak live (the default:
  /// 1.001x-1.029x), below PyTorch's expandable segments on each, for more driver calls in the
  /// first run (GPT-2 small: 1,167 against 491; host replay, docs/replay.md, "For a long run").
  bool bring_holes_home = false;
};

/// address_space_bytes as a pool over a device of granularity `granule` uses it (0 resolved as its
/// comment says).
constexpr std::size_t resolved_address_space(const ExpandablePoolOptions& o, std::size_t granule) noexcept {
  if (o.address_space_bytes != 0) {
    return o.address_space_bytes;
  }
  const std::size_t cap = o.max_reserved_bytes;
  return cap <= (std::size_t{1} << 40) ? std::max(2 * cap, granule) : std::size_t{256} << 30;
}

/// `o` checked for a device of granularity `granule`, with address_space_bytes resolved. Throws
/// carve::Exception (invalid_argument) for a granularity that is not a power of two at most the
/// device's, or an address space below one granule.
inline ExpandablePoolOptions resolved(ExpandablePoolOptions o, std::size_t granule) {
  const std::size_t b = o.granularity;
  if (b == 0 || (b & (b - 1)) != 0 || b > granule) {
    throw Exception(Errc::invalid_argument, "carve::ExpandablePool: granularity " + std::to_string(b) +
                                                " is not a power of two at most the device's " +
                                                std::to_string(granule));
  }
  const std::size_t requested = o.address_space_bytes;
  o.address_space_bytes = resolved_address_space(o, granule);
  if (o.address_space_bytes < granule) {
    throw Exception(Errc::invalid_argument, "carve::ExpandablePool: an address space of " + std::to_string(requested) +
                                                " bytes is below the granularity " + std::to_string(granule));
  }
  return o;
}

/// An ExpandablePool's figures at one moment (ExpandablePool::stats()).
struct ExpandablePoolStats {
  std::size_t bytes_in_use = 0;        ///< in live blocks (rounded to the granularity)
  std::size_t bytes_reserved = 0;      ///< physical memory mapped now
  std::size_t peak_in_use = 0;         ///< the most bytes_in_use has been
  std::size_t peak_reserved = 0;       ///< the most bytes_reserved has been
  std::size_t live_blocks = 0;         ///< blocks handed out and not yet freed
  std::size_t pending_frees = 0;       ///< blocks freed on another stream whose work has not yet passed the free
  std::size_t chunks = 0;              ///< mappings now: physical allocations, and holes mapped again
  std::size_t address_spaces = 0;      ///< reservations: one per stream that has allocated
  std::size_t address_space_bytes = 0; ///< addresses reserved in all
  std::size_t free_ranges = 0;         ///< free address ranges in all spaces (mapped or not)
  std::size_t lent_bytes = 0;          ///< holes mapped a second time now (ExpandablePoolOptions::lend_min_bytes)
  std::uint64_t holes_home = 0;        ///< second mappings unmapped to bring their holes home (bring_holes_home)
  std::uint64_t allocations = 0;       ///< successful allocations
  std::uint64_t deallocations = 0;     ///< successful frees
  std::uint64_t creates = 0;           ///< physical allocations made (cuMemCreate)
  std::uint64_t maps = 0;              ///< mappings made (cuMemMap)
  std::uint64_t unmaps = 0;            ///< mappings removed (cuMemUnmap)
  std::uint64_t accesses = 0;          ///< cuMemSetAccess calls: one per map and device granted, and grant_access's
  std::uint64_t peer_refusals = 0;     ///< chunks the driver refused to open to a granted device (kept, closed to it)
  std::uint64_t releases = 0;          ///< handles released (cuMemRelease, one per create)
  std::uint64_t mapper_failures = 0;   ///< driver calls refused (then idle memory was unmapped and the request retried)
  /// Requests the device or max_reserved_bytes refused that the retry then served (on memory idle
  /// chunks gave back, or on holes lent whatever the block's size): how often the card was full.
  std::uint64_t refusals_served = 0;
  /// Times the pool blocked the calling thread until a stream's work had run, so that it could
  /// unmap memory that work used (the headroom line, trim(), the retry under pressure): a host
  /// sync with the device each (where the Streams can wait: CudaStreams), which lets the device
  /// run dry while the host catches up, as PyTorch's num_sync_all_streams counts for its own.
  std::uint64_t stream_waits = 0;
  /// The mapper cannot map part of an allocation (CUDA documents that cuMemMap's offset must be 0):
  /// it said so when the pool was made (TellsPartialMaps), or refused a hole's second mapping for
  /// any reason but a want of memory, and no hole is lent from then on.
  /// carve_replay's `expandable-pool:partial-maps=0` replays a driver that says so.
  bool lending_refused = false;

  /// The driver calls that change what is mapped: creates, maps and unmaps (the access grant and
  /// the handle release that go with each are not counted).
  std::uint64_t device_calls() const noexcept { return creates + maps + unmaps; }
  /// Adds one reservation's calls (its MappingCounts).
  template <class Counts>
  void add_calls(const Counts& c) noexcept {
    creates += c.creates;
    maps += c.maps;
    unmaps += c.unmaps;
    accesses += c.accesses;
    peer_refusals += c.peer_refusals;
    releases += c.releases;
    mapper_failures += c.failures;
  }
};

} // namespace carve
