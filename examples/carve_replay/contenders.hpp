// The allocators carve_replay runs side by side: carve's pools, PyTorch's allocator modelled in its
// two modes, and every request a device call. Each is built over an AddressOnlyCard or an
// address-only HostMemoryMapper (addresses and tables, no memory and no system calls), so what is
// timed is the allocator, with the device calls timed apart.
#pragma once

#include "pytorch_caching_model.hpp"
#include "pytorch_expandable_model.hpp"
#include "replay.hpp"
#include "timed_parts.hpp"

#include <carve/mr/address_only_card.hpp>
#include <carve/mr/stream_caching_pool.hpp>
#include <carve/mr/stream_events.hpp>
#include <carve/mr/stream_ordered_pool.hpp>
#include <carve/tier/byte_size.hpp>
#include <carve/vmm/expandable_pool.hpp>
#include <carve/vmm/host_memory_mapper.hpp>

#include <array>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace carve::replay {

// The device's granularity in every replay: 2 MiB, as on today's GPUs.
inline constexpr std::size_t device_granule = std::size_t{2} << 20;
// Alignment asked of every allocator: what PyTorch's blocks have.
inline constexpr std::size_t block_alignment = 512;

// Parts every subject shares: the device clock and a card or a mapper.
struct Device {
  std::shared_ptr<DeviceClock> clock = std::make_shared<DeviceClock>();

  TimedCard card(std::uint64_t capacity) const { return TimedCard(AddressOnlyCard(capacity), clock); }
  // `partial_maps` false: a driver that maps whole allocations only (HostMapperOptions).
  static_assert(TellsPartialMaps<TimedMapper<HostMemoryMapper>>);
  TimedMapper<HostMemoryMapper> mapper(bool partial_maps = true) const {
    return TimedMapper<HostMemoryMapper>(
        HostMemoryMapper(
            {.granularity = device_granule, .address_only = true, .maps_partial_allocations = partial_maps}),
        clock);
  }
};

// A subject over a card: the card tells what is reserved and how many calls were made.
template <class Pool>
class CardSubject : public Subject {
public:
  template <class Make>
  CardSubject(std::uint64_t capacity, Make make) : card_(device_.card(capacity)), pool_(make(card_)) {}

  void* allocate(std::size_t bytes, std::uint32_t stream) noexcept override {
    if constexpr (requires { pool_->try_allocate(SimulatedStream{}, bytes, block_alignment); }) {
      const auto p = pool_->try_allocate(SimulatedStream{stream}, bytes, block_alignment);
      return p ? *p : nullptr;
    } else if constexpr (requires { pool_->try_allocate(SimulatedStream{}, bytes); }) {
      const auto p = pool_->try_allocate(SimulatedStream{stream}, bytes);
      return p ? *p : nullptr;
    } else {
      const auto p = pool_->try_allocate(bytes, block_alignment);
      return p ? *p : nullptr;
    }
  }
  void free(void* p, std::size_t bytes, std::uint32_t stream) noexcept override {
    if constexpr (requires { pool_->deallocate(SimulatedStream{}, p, bytes, block_alignment); }) {
      pool_->deallocate(SimulatedStream{stream}, p, bytes, block_alignment);
    } else if constexpr (requires { pool_->deallocate(p); }) {
      pool_->deallocate(p);
    } else {
      pool_->deallocate(p, bytes, block_alignment);
    }
  }
  std::uint64_t reserved() const override { return card_.card().used_bytes(); }
  std::uint64_t peak_reserved() const override { return card_.card().peak_used_bytes(); }
  std::uint64_t device_calls() const override { return card_.card().calls(); }
  std::uint64_t device_ns() const override { return device_.clock->ns; }
  bool seed(const trace::AllocationTrace& t, const StreamNumbers& streams, std::vector<void*>& at) override {
    if constexpr (requires { pool_->seed(t.start_segments, t.blocks, t.start_blocks, number_of_nothing, at); }) {
      // Segments' streams numbered as the blocks' are; a stream no block used gets a new number.
      std::unordered_map<std::uint64_t, std::uint32_t> number;
      for (std::size_t b = 0; b < t.blocks.size(); ++b) {
        number.emplace(t.blocks[b].stream, streams.of_block[b]);
      }
      std::uint32_t next = streams.count;
      const auto stream_of = [&](std::uint64_t handle) {
        const auto [it, added] = number.emplace(handle, next);
        next += added ? 1u : 0u;
        return it->second;
      };
      return !t.start_segments.empty() && pool_->seed(t.start_segments, t.blocks, t.start_blocks, stream_of, at);
    } else {
      return false;
    }
  }

private:
  static std::uint32_t number_of_nothing(std::uint64_t) noexcept { return 0; }

  Device device_;
  TimedCard card_;
  std::unique_ptr<Pool> pool_;
};

// Every request a device call: the card itself.
class NoCacheSubject : public Subject {
public:
  explicit NoCacheSubject(std::uint64_t capacity) : card_(device_.card(capacity)) {}
  void* allocate(std::size_t bytes, std::uint32_t) noexcept override {
    const auto p = card_.try_allocate(bytes, block_alignment);
    return p ? *p : nullptr;
  }
  void free(void* p, std::size_t bytes, std::uint32_t) noexcept override {
    card_.deallocate(p, bytes, block_alignment);
  }
  std::uint64_t reserved() const override { return card_.card().used_bytes(); }
  std::uint64_t peak_reserved() const override { return card_.card().peak_used_bytes(); }
  std::uint64_t device_calls() const override { return card_.card().calls(); }
  std::uint64_t device_ns() const override { return 0; } // the calls are the allocator here

private:
  Device device_;
  TimedCard card_;
};

// carve's ExpandablePool over the host twin of the VMM driver, the card's capacity its cap.
class ExpandableSubject : public Subject {
public:
  using Pool = ExpandablePool<TimedMapper<HostMemoryMapper>, SimulatedStreams>;
  ExpandableSubject(std::uint64_t capacity, std::uint32_t streams, ExpandablePoolOptions options,
                    bool partial_maps = true)
      : pool_(device_.mapper(partial_maps), with_cap(options, capacity), SimulatedStreams(streams)) {}
  void* allocate(std::size_t bytes, std::uint32_t stream) noexcept override {
    const auto p = pool_.try_allocate(SimulatedStream{stream}, bytes, block_alignment);
    return p ? *p : nullptr;
  }
  void free(void* p, std::size_t bytes, std::uint32_t stream) noexcept override {
    pool_.deallocate(SimulatedStream{stream}, p, bytes, block_alignment);
  }
  std::uint64_t reserved() const override { return pool_.stats().bytes_reserved; }
  std::uint64_t peak_reserved() const override { return pool_.stats().peak_reserved; }
  std::uint64_t device_calls() const override { return pool_.stats().device_calls(); }
  std::uint64_t device_ns() const override { return device_.clock->ns; }

private:
  static ExpandablePoolOptions with_cap(ExpandablePoolOptions o, std::uint64_t capacity) {
    o.max_reserved_bytes = capacity;
    return o;
  }
  Device device_;
  Pool pool_;
};

// PyTorch's expandable segments, modelled over the same mapper.
class TorchExpandableSubject : public Subject {
public:
  TorchExpandableSubject(std::uint64_t capacity, std::uint32_t)
      : model_(device_.mapper(), PytorchExpandableOptions{.capacity_bytes = capacity}) {}
  void* allocate(std::size_t bytes, std::uint32_t stream) noexcept override {
    const auto p = model_.try_allocate(SimulatedStream{stream}, bytes);
    return p ? *p : nullptr;
  }
  void free(void* p, std::size_t, std::uint32_t) noexcept override { model_.deallocate(p); }
  std::uint64_t reserved() const override { return model_.stats().reserved_bytes; }
  std::uint64_t peak_reserved() const override { return model_.stats().peak_reserved_bytes; }
  std::uint64_t device_calls() const override {
    const auto s = model_.stats();
    return s.device_allocations + s.maps + s.unmaps;
  }
  std::uint64_t device_ns() const override { return device_.clock->ns; }

private:
  Device device_;
  PytorchExpandableModel<TimedMapper<HostMemoryMapper>> model_;
};

template <class Pool, class Make>
Contender card_contender(std::string name, std::string description, Make make) {
  return {std::move(name), std::move(description), [make](std::uint64_t capacity, std::uint32_t streams) {
            return std::unique_ptr<Subject>(std::make_unique<CardSubject<Pool>>(
                capacity, [&](const TimedCard& card) { return make(card, streams); }));
          }};
}

inline Contender expandable_contender(std::string name, std::string description, ExpandablePoolOptions options,
                                      bool partial_maps = true) {
  return {
      std::move(name), std::move(description), [options, partial_maps](std::uint64_t capacity, std::uint32_t streams) {
        return std::unique_ptr<Subject>(std::make_unique<ExpandableSubject>(capacity, streams, options, partial_maps));
      }};
}

// carve's caching pools built as libcarve_torch builds them (src/torch/pool_stacks.hpp:
// CachingStack, StreamOrderedStack): blocks of 512 bytes, over the card, on the replay's streams;
// so the caching-pool and stream-ordered-pool rows are what carve_gpu.torch runs. (It wraps each
// pool in a StreamUsesPool, which passes every call straight to the pool while no stream is named
// with record_stream; a snapshot names none, its frees replayed where PyTorch completed them.)
using Caching = StreamCachingPool<TimedCard, SimulatedStreams>;
using StreamOrdered = StreamOrderedPool<TimedCard, SimulatedStreams>;
template <class Options>
Options torch_options(Options o) {
  o.granularity = block_alignment;
  return o;
}
inline Contender caching_contender(std::string name, std::string description, PoolOptions options) {
  return card_contender<Caching>(std::move(name), std::move(description),
                                 [options](const TimedCard& card, std::uint32_t n) {
                                   return std::make_unique<Caching>(card, torch_options(options), SimulatedStreams(n));
                                 });
}

// Every allocator carve_replay knows, the default set first.
inline std::vector<Contender> all_contenders() {
  using TorchCaching = PytorchCachingModel<TimedCard>;
  std::vector<Contender> all;
  all.push_back(caching_contender("caching-pool",
                                  "carve::StreamCachingPool (a CachingPool per stream), as carve_gpu.torch's "
                                  "caching, over cudaMalloc",
                                  PoolOptions{}));
  all.push_back(card_contender<StreamOrdered>(
      "stream-ordered-pool", "carve::StreamOrderedPool, as carve_gpu.torch's stream-ordered, over cudaMalloc",
      [](const TimedCard& card, std::uint32_t n) {
        return std::make_unique<StreamOrdered>(card, torch_options(StreamPoolOptions{}), SimulatedStreams(n));
      }));
  all.push_back(expandable_contender("expandable-pool", "carve::ExpandablePool, default options, over the VMM driver",
                                     ExpandablePoolOptions{}));
  all.push_back(card_contender<TorchCaching>(
      "pytorch-model", "PyTorch's caching allocator, default settings (model)",
      [](const TimedCard& card, std::uint32_t) { return std::make_unique<TorchCaching>(card); }));
  all.push_back({"pytorch-expandable-model", "PyTorch with expandable_segments:True (model)",
                 [](std::uint64_t capacity, std::uint32_t streams) {
                   return std::unique_ptr<Subject>(std::make_unique<TorchExpandableSubject>(capacity, streams));
                 }});
  all.push_back(
      {"no-cache", "every request a cudaMalloc and every free a cudaFree", [](std::uint64_t capacity, std::uint32_t) {
         return std::unique_ptr<Subject>(std::make_unique<NoCacheSubject>(capacity));
       }});
  // More stacks, run when named with --allocators.
  all.push_back(expandable_contender("expandable-pool-release-0",
                                     "carve::ExpandablePool unmapping every chunk as it falls idle",
                                     ExpandablePoolOptions{.release_threshold = 0}));
  all.push_back(expandable_contender("expandable-pool-exact",
                                     "carve::ExpandablePool mapping only the granules each request touches",
                                     ExpandablePoolOptions{.growth_divisor = 0}));
  all.push_back(caching_contender("caching-pool-idle-256m",
                                  "carve::StreamCachingPool returning each stream's idle segments above 256 MiB",
                                  PoolOptions{.idle_threshold = std::size_t{256} << 20}));
  return all;
}

// The headroom settings (ExpandablePoolOptions::headroom_permille) at which carve_replay shows
// expandable-pool's reserve against its device calls: tight to none.
inline constexpr std::array<std::size_t, 7> headroom_settings = {
    1, 2, 5, 10, 20, 50, std::numeric_limits<std::size_t>::max()};

// expandable-pool with `permille` headroom and the other options at their defaults.
inline Contender expandable_with_headroom(std::size_t permille) {
  return expandable_contender("expandable-pool:headroom=" + std::to_string(permille), "carve::ExpandablePool",
                              ExpandablePoolOptions{.headroom_permille = permille});
}

// The hole-lending settings (ExpandablePoolOptions::lend_min_bytes) carve_replay shows: lending to
// blocks of 256 MiB or more, up to never.
inline constexpr std::array<std::size_t, 5> lending_settings = {std::size_t{256} << 20, std::size_t{512} << 20,
                                                                std::size_t{1} << 30, std::size_t{4} << 30,
                                                                std::numeric_limits<std::size_t>::max()};

// expandable-pool lending to blocks of `min_bytes` or more, the other options at their defaults.
inline Contender expandable_lending(std::size_t min_bytes) {
  return expandable_contender("expandable-pool:lend=" + std::to_string(min_bytes), "carve::ExpandablePool",
                              ExpandablePoolOptions{.lend_min_bytes = min_bytes});
}

// The most one physical allocation holds (ExpandablePoolOptions::max_chunk_bytes) at which
// carve_replay shows expandable-pool over a driver that maps whole allocations only: no cut to 4 MiB.
inline constexpr std::array<std::size_t, 5> whole_allocation_settings = {std::numeric_limits<std::size_t>::max(),
                                                                         std::size_t{64} << 20, std::size_t{16} << 20,
                                                                         std::size_t{8} << 20, std::size_t{4} << 20};

// expandable-pool over such a driver, its allocations `max_bytes` at most.
inline Contender expandable_whole_allocations(std::size_t max_bytes) {
  return expandable_contender("expandable-pool:partial-maps=0:max-chunk=" + std::to_string(max_bytes),
                              "carve::ExpandablePool", ExpandablePoolOptions{.max_chunk_bytes = max_bytes}, false);
}

// How many of all_contenders() run when none is named.
inline constexpr std::size_t default_contenders = 6;

// A pool with options of the user's, written `name:key=value:key=value`: expandable-pool takes growth
// (ExpandablePoolOptions::growth_divisor), min-chunk, max-chunk, release (release_threshold, bytes), headroom
// (headroom_permille; `none` for no line), lend (lend_min_bytes; `none` never lends), home
// (bring_holes_home: 1 brings lent holes home) and partial-maps
// (0: the driver maps whole allocations only, and says so, as CUDA documents cuMemMap; 1, the
// default: parts too);
// caching-pool takes segment, idle, shared and near-full (PoolOptions::segment_size,
// idle_threshold, shared_segment_size, near_full_permille; shared=0 gives every request of segment
// or more its own, near-full=1000 never takes a new segment over a free one). Sizes are
// written as `--capacity` takes them ("8MiB"). Throws std::invalid_argument naming what is wrong.
inline Contender configured(const std::string& spec) {
  const auto colon = spec.find(':');
  const std::string name = spec.substr(0, colon);
  std::vector<std::pair<std::string, std::uint64_t>> settings;
  for (std::size_t at = colon + 1; colon != std::string::npos && at <= spec.size();) {
    const std::size_t end = std::min(spec.find(':', at), spec.size());
    const std::string item = spec.substr(at, end - at);
    const auto eq = item.find('=');
    if (eq == std::string::npos) {
      throw std::invalid_argument("'" + item + "' in '" + spec + "': expected key=value");
    }
    try {
      const std::string value = item.substr(eq + 1);
      settings.emplace_back(item.substr(0, eq),
                            value == "none" ? std::numeric_limits<std::uint64_t>::max() : parse_bytes(value));
    } catch (const Exception& e) {
      throw std::invalid_argument("'" + spec + "': " + e.what());
    }
    at = end + 1;
  }
  const auto unknown = [&](const std::string& key) {
    return std::invalid_argument("'" + spec + "': " + name + " has no setting '" + key + "'");
  };
  if (name == "expandable-pool") {
    ExpandablePoolOptions o;
    bool partial_maps = true;
    for (const auto& [key, value] : settings) {
      if (key == "growth") {
        o.growth_divisor = value;
      } else if (key == "min-chunk") {
        o.min_chunk_bytes = value;
      } else if (key == "max-chunk") {
        o.max_chunk_bytes = value;
      } else if (key == "release") {
        o.release_threshold = value;
      } else if (key == "headroom") {
        o.headroom_permille = value;
      } else if (key == "lend") {
        o.lend_min_bytes = value;
      } else if (key == "home") {
        o.bring_holes_home = value != 0;
      } else if (key == "partial-maps") {
        partial_maps = value != 0;
      } else {
        throw unknown(key);
      }
    }
    return expandable_contender(spec, "carve::ExpandablePool, " + spec.substr(colon + 1), o, partial_maps);
  }
  if (name == "caching-pool") {
    PoolOptions o;
    for (const auto& [key, value] : settings) {
      if (key == "segment") {
        o.segment_size = value;
      } else if (key == "idle") {
        o.idle_threshold = value;
      } else if (key == "shared") {
        o.shared_segment_size = value;
      } else if (key == "near-full") {
        o.near_full_permille = value;
      } else {
        throw unknown(key);
      }
    }
    return caching_contender(spec, "carve::StreamCachingPool, " + spec.substr(colon + 1), o);
  }
  throw std::invalid_argument("'" + spec + "': only expandable-pool and caching-pool take settings");
}

} // namespace carve::replay
