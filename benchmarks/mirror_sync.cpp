// PagedMirror on the host backend: what syncing only the dirty pages saves, and what automatic
// dirty tracking costs.
//
// The mirror: 1 GiB over four simulated cards of 256 MiB (FillPlacement, 4 KiB pages), one 1 GiB
// allocation whose host and device pages are all committed before timing. 1% of its pages
// (2621, chosen at random) are dirtied before each timed sync.
//   sync/dirty-1%/<mechanism>   sync() after the 1% were written: explicit write() calls, or plain
//                               stores under mprotect or userfaultfd tracking. The difference
//                               between an automatic mode and explicit is the cost of collecting
//                               and write-protecting again (per sync, and per dirty page).
//   sync/full                   sync_all(): every page, coalesced into one copy per card.
//   first-store/<mechanism>     one plain store to each of the 1% pages while they are clean (the
//                               syncs between iterations are not timed): per store, the fault and
//                               the bookkeeping; `untracked` is the same stores in explicit mode.
// Before timing, sync() must move exactly dirty pages x 4 KiB and leave every device page equal
// to the host. Copies run on the cards' stream threads, so times are wall-clock.
// --mirror_mib=N shrinks the mirror (the smoke test uses 64).
#include "compare.hpp"

#include <carve/mirror.hpp>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace {

using namespace carve;
using namespace carve::bench;

constexpr std::size_t page = 4096;
constexpr std::size_t cards = 4;
std::size_t mirror_bytes = std::size_t{1} << 30;

using Mirror = PagedMirror<HostMirrorBackend<>>;

struct Setup {
  explicit Setup(WriteTracking mode) {
    for (std::size_t c = 0; c < cards; ++c) {
      devices.register_device(SimulatedCard(mirror_bytes / cards));
    }
    mirror.emplace(devices, MirrorOptions{.page_size = page, .tracking = mode});
    data = static_cast<unsigned char*>(*mirror->try_allocate(mirror_bytes, 1));
    std::memset(data, 1, mirror_bytes); // commits the host pages
    (void)mirror->sync_all();           // and the device pages
    std::mt19937_64 rng(42);
    std::vector<std::size_t> all(mirror_bytes / page);
    for (std::size_t i = 0; i < all.size(); ++i) {
      all[i] = i;
    }
    std::shuffle(all.begin(), all.end(), rng);
    dirty.assign(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(all.size() / 100));
  }

  // Dirties the chosen pages the way the mode expects: write() in explicit mode, plain stores
  // otherwise.
  void dirty_pages(unsigned char value) {
    for (const std::size_t p : dirty) {
      if (mirror->tracking_mechanism() == TrackingMechanism::explicit_calls) {
        (void)mirror->write(data + p * page, &value, 1);
      } else {
        data[p * page] = value;
      }
    }
  }

  HostMirrorBackend<> devices;
  std::optional<Mirror> mirror;
  unsigned char* data = nullptr;
  std::vector<std::size_t> dirty;
};

// One mirror alive at a time (each holds 2 GiB); benchmarks of one mode run one after another.
Setup& setup(WriteTracking mode) {
  static std::unique_ptr<Setup> current;
  static WriteTracking current_mode{};
  if (!current || current_mode != mode) {
    current.reset();
    current = std::make_unique<Setup>(mode);
    current_mode = mode;
  }
  return *current;
}

void fail(const char* what) {
  std::fprintf(stderr, "mirror_sync: %s; refusing to time\n", what);
  std::exit(1);
}

// sync() moves exactly the dirty pages, and the devices then equal the host.
void verify(WriteTracking mode) {
  Setup& s = setup(mode);
  s.dirty_pages(7);
  const auto r = s.mirror->sync();
  if (!r || r->pages != s.dirty.size() || r->bytes != s.dirty.size() * page) {
    fail("sync did not move exactly the dirty pages");
  }
  for (std::size_t d = 0; d < cards; ++d) {
    (void)s.devices.wait(d);
  }
  const auto parts = s.mirror->segments(s.data, mirror_bytes);
  for (const MirrorSegment& seg : *parts) {
    if (std::memcmp(s.devices.device_memory(seg.device).data() + seg.device_offset, seg.host, seg.bytes) != 0) {
      fail("a device differs from the host after sync");
    }
  }
}

void sync_dirty(benchmark::State& state, WriteTracking mode) {
  Setup& s = setup(mode);
  std::uint64_t bytes = 0;
  double collect_ns = 0;
  unsigned char value = 0;
  for (auto _ : state) {
    state.PauseTiming();
    s.dirty_pages(++value);
    state.ResumeTiming();
    const auto r = s.mirror->sync();
    if (!r || r->bytes != s.dirty.size() * page) {
      state.SkipWithError("sync moved the wrong number of bytes");
      return;
    }
    bytes += r->bytes;
    collect_ns += static_cast<double>(r->collect_time.count());
  }
  state.counters["MiB"] = static_cast<double>(bytes) / static_cast<double>(state.iterations()) / (1 << 20);
  state.counters["collect_us"] = collect_ns / static_cast<double>(state.iterations()) / 1e3;
}

void sync_full(benchmark::State& state) {
  Setup& s = setup(WriteTracking::explicit_calls);
  std::uint64_t bytes = 0;
  for (auto _ : state) {
    const auto r = s.mirror->sync_all();
    if (!r || r->bytes != mirror_bytes) {
      state.SkipWithError("sync_all moved the wrong number of bytes");
      return;
    }
    bytes += r->bytes;
  }
  state.counters["MiB"] = static_cast<double>(bytes) / static_cast<double>(state.iterations()) / (1 << 20);
}

void first_store(benchmark::State& state, WriteTracking mode) {
  Setup& s = setup(mode);
  unsigned char value = 0;
  for (auto _ : state) {
    state.PauseTiming();
    (void)s.mirror->sync(); // every page clean (and write-protected) again
    ++value;
    state.ResumeTiming();
    for (const std::size_t p : s.dirty) {
      s.data[p * page] = value;
    }
  }
  state.counters["per_item"] = per_item(s.dirty.size());
}

std::string name(WriteTracking mode) {
  switch (mode) {
  case WriteTracking::explicit_calls:
    return "explicit";
  case WriteTracking::automatic_mprotect:
    return "mprotect";
  default:
    return "userfaultfd";
  }
}

} // namespace

int main(int argc, char** argv) {
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--mirror_mib=", 0) == 0) {
      mirror_bytes = std::stoul(a.substr(13)) << 20;
    } else {
      args.push_back(argv[i]);
    }
  }
  std::vector<WriteTracking> modes{WriteTracking::explicit_calls, WriteTracking::automatic_mprotect};
  if (userfaultfd_tracking_available()) {
    modes.push_back(WriteTracking::automatic_userfaultfd);
  } else {
    std::printf("userfaultfd write-protection is not available here: not measured\n");
  }
  for (const WriteTracking mode : modes) {
    verify(mode);
    const std::string m = name(mode);
    benchmark::RegisterBenchmark(("sync/dirty-1%/" + m).c_str(), [mode](benchmark::State& s) { sync_dirty(s, mode); })
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
    if (mode == WriteTracking::explicit_calls) {
      benchmark::RegisterBenchmark("sync/full", sync_full)->UseRealTime()->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark("first-store/untracked", [mode](benchmark::State& s) { first_store(s, mode); });
    } else {
      benchmark::RegisterBenchmark(("first-store/" + m).c_str(), [mode](benchmark::State& s) { first_store(s, mode); });
    }
  }

  MedianCollector c;
  run_with_medians(static_cast<int>(args.size()), args.data(), c);

  const std::size_t dirty = mirror_bytes / page / 100;
  std::printf("\n%zu MiB mirror, %zu of %zu pages dirty (%.2f%%), medians:\n", mirror_bytes >> 20, dirty,
              mirror_bytes / page, 100.0 * static_cast<double>(dirty) / static_cast<double>(mirror_bytes / page));
  std::printf("  bytes moved: dirty sync %zu = %zu pages x %zu (exact, checked); full sync %zu (%.2f%%)\n",
              dirty * page, dirty, page, mirror_bytes,
              100.0 * static_cast<double>(dirty * page) / static_cast<double>(mirror_bytes));
  // Wall-clock benchmarks carry Google Benchmark's "/real_time" suffix.
  print_ratio(c, "full sync / dirty sync (time; target: dirty < 5% of full)", "sync/full/real_time",
              "sync/dirty-1%/explicit/real_time", 20.0);
  for (const WriteTracking mode : modes) {
    if (mode == WriteTracking::explicit_calls) {
      continue;
    }
    const std::string m = name(mode);
    print_bound(c, "first store to a clean page, " + m + " (fault + bookkeeping)", "first-store/" + m, 5000.0);
    const auto tracked = c.ns("sync/dirty-1%/" + m + "/real_time");
    const auto plain = c.ns("sync/dirty-1%/explicit/real_time");
    if (tracked && plain) {
      std::printf("  %-58s %9.1f us per sync, %.0f ns per dirty page\n", ("re-protect cost, " + m).c_str(),
                  (*tracked - *plain) / 1e3, (*tracked - *plain) / static_cast<double>(dirty));
    }
  }
  if (const auto untracked = c.ns("first-store/untracked")) {
    std::printf("  %-58s %9.2f ns\n", "a store to a page already dirty / untracked", *untracked);
  }
  return 0;
}
