// PagedMirror on the host backend: random writes against a shadow copy, sync reports, bad input,
// fetch, placement, the compute dispatcher, and what an empty 1 TiB mirror costs.
#include "mirror_helpers.hpp"
#include "support/errors.hpp"
#include "support/topology_data.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

// In a namespace of its own: the area's test files compile as one translation unit.
namespace test_paged_mirror {

using carve::Errc;
using carve::MirrorOptions;
using carve::PagedMirror;
using carve::WriteTracking;
using namespace carve::test;

namespace {

// Three GPUs: 0-1 joined by NVLink, 2 reached over PCIe only.
carve::Topology three_gpus() {
  return carve::Topology::from_description("cpu CPU0\n"
                                           "gpu GPU0\n"
                                           "gpu GPU1\n"
                                           "gpu GPU2\n"
                                           "link CPU0 GPU0 pcie\n"
                                           "link CPU0 GPU1 pcie\n"
                                           "link CPU0 GPU2 pcie\n"
                                           "link GPU0 GPU1 nvlink x2\n");
}

// Resident bytes of the mappings that lie inside [begin, end), from /proc/self/smaps.
std::size_t resident_bytes_in(const std::byte* begin, const std::byte* end) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  std::size_t total = 0;
  while (std::getline(smaps, line)) {
    unsigned long lo = 0;
    unsigned long hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(':') > line.find(' ')) {
      inside = lo >= reinterpret_cast<std::uintptr_t>(begin) && hi <= reinterpret_cast<std::uintptr_t>(end);
    } else if (inside && line.rfind("Rss:", 0) == 0) {
      total += std::stoul(line.substr(4)) * KiB;
    }
  }
  return total;
}

struct Live {
  unsigned char* p;
  std::size_t bytes;
  std::vector<unsigned char> shadow;
};

// Random bytes, eight at a time (writes of several 2 MiB pages stay cheap).
void fill_random(std::vector<unsigned char>& data, std::mt19937_64& rng) {
  for (std::size_t i = 0; i < data.size(); i += 8) {
    const std::uint64_t word = rng();
    std::memcpy(data.data() + i, &word, std::min<std::size_t>(8, data.size() - i));
  }
}

// Random allocations and writes; after each sync every device page behind every allocation must
// equal the shadow, and the report must count exactly the pages written since the last sync.
// The cards hold 64, 96 and 32 pages of 64 KiB (4, 6 and 2 MiB), or of the page size if larger.
template <class Placement>
void shadow_workout(WriteTracking mode, std::size_t page_size, Placement placement, std::uint64_t seed) {
  HostBackend devices;
  const std::size_t unit = std::max(page_size, 64 * KiB);
  add_cards(devices, {{64 * unit, 8}, {96 * unit, 8}, {32 * unit, 8}});
  PagedMirror mirror(devices, MirrorOptions{.page_size = page_size, .tracking = mode}, std::move(placement));
  std::mt19937_64 rng(seed);
  std::vector<Live> live;
  const auto page_of = [&](const void* p) {
    return static_cast<std::size_t>(static_cast<const std::byte*>(p) - mirror.host_base()) / page_size;
  };
  const auto add = [&] {
    const std::size_t bytes = std::uniform_int_distribution<std::size_t>(1, 3 * page_size + 100)(rng);
    const auto p = mirror.try_allocate_placed(bytes, 1, {.priority = std::uniform_int_distribution<int>(0, 3)(rng)});
    if (p) {
      live.push_back({static_cast<unsigned char*>(*p), bytes, std::vector<unsigned char>(bytes, 0)});
    } else {
      CHECK(p.error() == Errc::no_space);
    }
  };
  for (int i = 0; i < 8; ++i) {
    add();
  }
  REQUIRE(!live.empty());
  const bool automatic = mode != WriteTracking::explicit_calls;
  for (int round = 0; round < 12; ++round) {
    std::set<std::size_t> dirty;
    const int writes = std::uniform_int_distribution<int>(0, 40)(rng);
    for (int w = 0; w < writes; ++w) {
      Live& a = live[std::uniform_int_distribution<std::size_t>(0, live.size() - 1)(rng)];
      std::size_t at = std::uniform_int_distribution<std::size_t>(0, a.bytes - 1)(rng);
      if (a.bytes > page_size && rng() % 4 == 0) { // start just before a page boundary: most cross it
        const std::size_t boundary =
            page_size * std::uniform_int_distribution<std::size_t>(1, (a.bytes - 1) / page_size)(rng);
        at = boundary - std::uniform_int_distribution<std::size_t>(1, 4096)(rng);
      }
      // Up to two pages, at most 512 KiB: 2 MiB pages are dirtied by small writes too.
      const std::size_t n =
          std::uniform_int_distribution<std::size_t>(1, std::min({a.bytes - at, 2 * page_size, 512 * KiB}))(rng);
      std::vector<unsigned char> data(n);
      fill_random(data, rng);
      if (automatic && (rng() & 1) != 0) {
        std::memcpy(a.p + at, data.data(), n); // plain stores: the tracker must notice
      } else {
        REQUIRE(mirror.write(a.p + at, data.data(), n));
      }
      std::memcpy(a.shadow.data() + at, data.data(), n);
      for (std::size_t pg = page_of(a.p + at); pg <= page_of(a.p + at + n - 1); ++pg) {
        dirty.insert(pg);
      }
    }
    CHECK(mirror.dirty_pages() == dirty.size());
    const auto report = mirror.sync();
    REQUIRE(report);
    CHECK(report->pages == dirty.size());
    CHECK(report->bytes == dirty.size() * page_size);
    CHECK(report->copies <= report->pages);
    std::uint64_t pages = 0;
    std::uint64_t copies = 0;
    for (const auto& d : report->per_device()) {
      pages += d.pages;
      copies += d.copies;
      CHECK(d.bytes == d.pages * page_size);
    }
    CHECK(pages == report->pages);
    CHECK(copies == report->copies);
    for (const Live& a : live) {
      CHECK(std::memcmp(a.p, a.shadow.data(), a.bytes) == 0); // reads come from the host copy
      CHECK(device_mismatches(mirror, devices, a.p, a.shadow) == 0);
    }
    const auto again = mirror.sync();
    REQUIRE(again);
    CHECK(again->pages == 0);
    // Churn: free one allocation, make another.
    if (live.size() > 1 && (rng() & 1) != 0) {
      const std::size_t victim = std::uniform_int_distribution<std::size_t>(0, live.size() - 1)(rng);
      REQUIRE(mirror.try_deallocate(live[victim].p));
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(victim));
      add();
      wait_all(devices); // the new allocation's device pages are zeroed on the device streams
      CHECK(device_mismatches(mirror, devices, live.back().p, live.back().shadow) == 0);
    }
  }
}

} // namespace

TEST_CASE("construction learns the devices and reserves their total") {
  HostBackend devices;
  add_cards(devices, {{4 * MiB, 16}, {3 * MiB + 5000, 8}, {8 * MiB, 4, false}});
  PagedMirror mirror(devices, {.page_size = 64 * KiB});
  CHECK(mirror.device_count() == 3);
  CHECK(mirror.device_pages(0) == 64);
  CHECK(mirror.device_pages(1) == 48); // whole pages only
  CHECK(mirror.device_pages(2) == 0);  // unavailable: no pages
  CHECK(mirror.capacity() == 112 * 64 * KiB);
  CHECK(mirror.free_bytes() == mirror.capacity());
  CHECK(mirror.devices()[0].compute_units == 16);
}

TEST_CASE("by default plain stores are tracked and synced") {
  HostBackend devices;
  add_cards(devices, {{256 * KiB, 1}});
  PagedMirror mirror(devices, {.page_size = 4 * KiB});
  CHECK(mirror.tracking_mechanism() == (carve::userfaultfd_tracking_available() ? carve::TrackingMechanism::userfaultfd
                                                                                : carve::TrackingMechanism::mprotect));
  auto* p = static_cast<unsigned char*>(*mirror.try_allocate(64 * KiB, 1));
  CHECK(mirror.sync()->pages == 0);
  std::memset(p + 4 * KiB, 0x3c, 8 * KiB); // two pages, no write() or mark_dirty()
  CHECK(mirror.sync()->pages == 2);
  wait_all(devices);
  std::vector<unsigned char> want(64 * KiB, 0);
  std::fill_n(want.begin() + 4 * KiB, 8 * KiB, 0x3c);
  CHECK(device_mismatches(mirror, devices, p, want) == 0);
  REQUIRE(mirror.try_deallocate(p));
}

TEST_CASE("page sizes must be powers of two, whole OS pages, at most 1 GiB") {
  HostBackend devices;
  add_cards(devices, {{4 * MiB, 1}});
  for (const std::size_t bad : {std::size_t{0}, std::size_t{3000}, 3 * carve::os_page_size(), std::size_t{2} << 30}) {
    CHECK_THROWS_ERRC(carve::Errc::invalid_argument, PagedMirror(devices, {.page_size = bad}));
  }
  for (const std::size_t good : {4 * KiB, 64 * KiB, 2 * MiB}) {
    PagedMirror mirror(devices, {.page_size = good});
    CHECK(mirror.capacity() == 4 * MiB);
  }
  HostBackend tiny;
  add_cards(tiny, {{1000, 1}});
  CHECK_THROWS_ERRC(carve::Errc::invalid_argument, PagedMirror(tiny, {.page_size = 4 * KiB})); // no whole page anywhere
}

TEST_CASE("random writes against a shadow copy, then sync: every device page equals the shadow") {
  std::uint64_t seed = 1;
  for (const WriteTracking mode : tracking_modes()) {
    for (const std::size_t page : {4 * KiB, 64 * KiB, 2 * MiB}) {
      CAPTURE(static_cast<int>(mode));
      CAPTURE(page);
      shadow_workout(mode, page, carve::FillPlacement{}, seed++);
      shadow_workout(mode, page, carve::StripePlacement{.stripe_pages = 3}, seed++);
      shadow_workout(mode, page, carve::PickerPlacement(carve::BandwidthWeightedPicker(three_gpus()), 1), seed++);
    }
  }
}

TEST_CASE("sync copies only dirty pages, one copy per run that is contiguous on its device") {
  HostBackend devices;
  add_cards(devices, {{1 * MiB, 1}});
  PagedMirror mirror(devices, {.page_size = 4 * KiB});
  auto* p = static_cast<unsigned char*>(*mirror.try_allocate(64 * 4 * KiB, 1));
  const unsigned char one = 1;
  for (const std::size_t page : {3u, 4u, 5u, 10u, 63u}) {
    REQUIRE(mirror.write(p + page * 4 * KiB + 7, &one, 1));
  }
  const auto r = mirror.sync();
  REQUIRE(r);
  CHECK(r->pages == 5);
  CHECK(r->bytes == 5 * 4 * KiB);
  CHECK(r->copies == 3); // 3-5, 10, 63
  CHECK(r->devices[0].copies == 3);

  // Stripes of two pages over two devices: pages 0-1 on device 0, 2-3 on device 1, ...
  HostBackend two;
  add_cards(two, {{1 * MiB, 1}, {1 * MiB, 1}});
  PagedMirror striped(two, {.page_size = 4 * KiB}, carve::StripePlacement{.stripe_pages = 2});
  auto* q = static_cast<unsigned char*>(*striped.try_allocate(8 * 4 * KiB, 1));
  CHECK(striped.locate(q)->device == 0);
  CHECK(striped.locate(q + 2 * 4 * KiB)->device == 1);
  CHECK(striped.locate(q + 4 * 4 * KiB)->device == 0);
  REQUIRE(striped.mark_dirty(q, 8 * 4 * KiB)); // all eight pages
  const auto s = striped.sync();
  REQUIRE(s);
  CHECK(s->pages == 8);
  CHECK(s->devices[0].pages == 4);
  CHECK(s->devices[1].pages == 4);
  // Device 0 holds host pages 0-1 and 4-5 at device pages 0-3: the first stripe of each device is
  // contiguous with its second there, but not in host memory, so they are two copies per device.
  CHECK(s->devices[0].copies == 2);
  CHECK(s->devices[1].copies == 2);
  const auto segs = striped.segments(q + 100, 3 * 4 * KiB);
  REQUIRE(segs);
  REQUIRE(segs->size() == 2);
  CHECK((*segs)[0].host == reinterpret_cast<std::byte*>(q + 100));
  CHECK((*segs)[0].bytes == 2 * 4 * KiB - 100);
  CHECK((*segs)[1].device == 1);
  CHECK((*segs)[1].bytes == 4 * KiB + 100);
}

TEST_CASE("sync_all copies every allocated page and leaves them clean") {
  HostBackend devices;
  add_cards(devices, {{1 * MiB, 1}, {1 * MiB, 1}});
  PagedMirror mirror(devices, {.page_size = 4 * KiB});
  auto* p = static_cast<unsigned char*>(*mirror.try_allocate(300 * 4 * KiB, 1));
  std::memset(p, 0x5a, 300 * 4 * KiB); // behind the tracker's back (explicit mode)
  REQUIRE(mirror.mark_dirty(p, 1));
  const auto r = mirror.sync_all();
  REQUIRE(r);
  CHECK(r->pages == 300);
  CHECK(r->copies == 2); // 256 pages on device 0, 44 on device 1
  CHECK(mirror.dirty_pages() == 0);
  CHECK(device_mismatches(mirror, devices, p, std::vector<unsigned char>(300 * 4 * KiB, 0x5a)) == 0);
}

TEST_CASE("allocation past the total capacity is a clear error and changes nothing") {
  HostBackend devices;
  add_cards(devices, {{1 * MiB, 1}, {2 * MiB, 1}});
  PagedMirror mirror(devices, {.page_size = 64 * KiB});
  const auto a = mirror.try_allocate(1 * MiB, 1);
  REQUIRE(a);
  const std::size_t free = mirror.free_bytes();
  const auto big = mirror.try_allocate(3 * MiB + 1, 1);
  REQUIRE_FALSE(big);
  CHECK(big.error() == Errc::no_space); // could never fit: a fallback's to serve
  const auto now = mirror.try_allocate(2 * MiB + 1, 1);
  REQUIRE_FALSE(now);
  CHECK(now.error() == Errc::no_space); // could fit, once memory is freed
  CHECK_FALSE(mirror.try_allocate(0, 1));
  CHECK(mirror.try_allocate(0, 1).error() == Errc::invalid_size);
  CHECK(mirror.free_bytes() == free);
  CHECK(mirror.allocation_count() == 1);
  CHECK(mirror.device_free_pages(0) + mirror.device_free_pages(1) == free / (64 * KiB));
  CHECK(mirror.allocation_failure_message(3 * MiB + 1) ==
        "cannot allocate 3.0 MiB: the mirror holds 3.0 MiB (2.0 MiB free: card 0 0 B, card 1 2.0 MiB)");
  const auto fits = mirror.try_allocate(2 * MiB, 1);
  CHECK(fits);
  CHECK(mirror.free_bytes() == 0);
}

TEST_CASE("the explicit API rejects ranges outside an allocation and writes nothing") {
  HostBackend devices;
  add_cards(devices, {{1 * MiB, 1}});
  PagedMirror mirror(devices, {.page_size = 4 * KiB});
  auto* a = static_cast<unsigned char*>(*mirror.try_allocate(10000, 1));
  auto* b = static_cast<unsigned char*>(*mirror.try_allocate(4 * KiB, 1));
  const std::vector<unsigned char> data(20000, 7);
  CHECK(mirror.write(a + 9999, data.data(), 2).error() == Errc::out_of_range);    // runs past the allocation
  CHECK(mirror.write(a, data.data(), 20000).error() == Errc::out_of_range);       // into the next one
  CHECK(mirror.write(b + 4 * KiB, data.data(), 1).error() == Errc::out_of_range); // unallocated page
  int outside = 0;
  CHECK(mirror.write(&outside, data.data(), 1).error() == Errc::out_of_range);
  CHECK(mirror.mark_dirty(a + 10000, 1).error() == Errc::out_of_range);
  CHECK(mirror.fetch(b + 5000, 1).error() == Errc::out_of_range);
  CHECK(mirror.segments(a - 1, 2).error() == Errc::out_of_range);
  CHECK_FALSE(mirror.locate(b + 4 * KiB));
  CHECK(a[9999] == 0);
  CHECK(mirror.dirty_pages() == 0);
  CHECK(mirror.write(a + 9999, data.data(), 1));
  CHECK(mirror.write(a, data.data(), 0)); // an empty write inside an allocation is fine
  CHECK(mirror.try_deallocate(a + 1).error() == Errc::not_allocated);
  CHECK(mirror.try_deallocate(&outside).error() == Errc::not_allocated);
  CHECK(mirror.try_deallocate(a));
  CHECK(mirror.try_deallocate(a).error() == Errc::not_allocated); // twice
  CHECK(mirror.allocation_count() == 1);
}

TEST_CASE("fetch pulls device-written pages back and leaves them clean") {
  for (const WriteTracking mode : tracking_modes()) {
    CAPTURE(static_cast<int>(mode));
    HostBackend devices;
    add_cards(devices, {{1 * MiB, 1}, {1 * MiB, 1}});
    PagedMirror mirror(devices, {.page_size = 4 * KiB, .tracking = mode}, carve::StripePlacement{.stripe_pages = 1});
    auto* p = static_cast<unsigned char*>(*mirror.try_allocate(8 * 4 * KiB, 1));
    REQUIRE(mirror.sync());
    // Device code writes pages 2 and 3 (on different devices): here, straight into device memory.
    std::vector<unsigned char> kernel_output(2 * 4 * KiB, 0xee);
    const auto written = mirror.segments(p + 2 * 4 * KiB, 2 * 4 * KiB);
    REQUIRE(written);
    for (const carve::MirrorSegment& s : *written) {
      REQUIRE(devices.copy_to_device(s.device, s.device_offset, kernel_output.data(), s.bytes));
    }
    wait_all(devices);
    p[3 * 4 * KiB] = 1; // a host write to page 3 not yet synced: the fetch replaces it
    if (mode == WriteTracking::explicit_calls) {
      REQUIRE(mirror.mark_dirty(p + 3 * 4 * KiB, 1));
    }
    const auto r = mirror.fetch(p + 2 * 4 * KiB, 2 * 4 * KiB);
    REQUIRE(r);
    CHECK(r->pages == 2);
    CHECK(r->copies == 2);
    CHECK(r->discarded_dirty_pages == 1);
    CHECK(std::all_of(p + 2 * 4 * KiB, p + 4 * 4 * KiB, [](unsigned char c) { return c == 0xee; }));
    CHECK(p[4 * 4 * KiB] == 0);
    CHECK(mirror.dirty_pages() == 0);
    CHECK(mirror.sync()->pages == 0);
    // Tracking goes on after a fetch.
    if (mode == WriteTracking::explicit_calls) {
      REQUIRE(mirror.write(p + 2 * 4 * KiB, "x", 1));
    } else {
      p[2 * 4 * KiB] = 'x';
    }
    CHECK(mirror.is_dirty(p + 2 * 4 * KiB));
    CHECK_FALSE(mirror.is_dirty(p + 3 * 4 * KiB));
    CHECK(mirror.sync()->pages == 1);
  }
}

TEST_CASE("memory from a freed allocation comes back zeroed on the host and the devices") {
  HostBackend devices;
  add_cards(devices, {{256 * KiB, 1}});
  PagedMirror mirror(devices, {.page_size = 4 * KiB, .tracking = WriteTracking::automatic});
  auto* p = static_cast<unsigned char*>(*mirror.try_allocate(256 * KiB, 1));
  std::memset(p, 0xab, 256 * KiB);
  CHECK(mirror.sync()->pages == 64);
  REQUIRE(mirror.try_deallocate(p));
  auto* q = static_cast<unsigned char*>(*mirror.try_allocate(256 * KiB, 1));
  CHECK(q == p);
  CHECK(std::all_of(q, q + 256 * KiB, [](unsigned char c) { return c == 0; }));
  wait_all(devices);
  CHECK(device_mismatches(mirror, devices, q, std::vector<unsigned char>(256 * KiB, 0)) == 0);
}

TEST_CASE("placement policies: fill, stripe and the bandwidth picker") {
  HostBackend devices;
  add_cards(devices, {{8 * 64 * KiB, 1}, {8 * 64 * KiB, 1}, {8 * 64 * KiB, 1}});
  SUBCASE("fill uses device 0 until it is full") {
    PagedMirror mirror(devices, {.page_size = 64 * KiB});
    auto* p = static_cast<std::byte*>(*mirror.try_allocate(10 * 64 * KiB, 1));
    CHECK(mirror.locate(p)->device == 0);
    CHECK(mirror.locate(p + 7 * 64 * KiB)->device == 0);
    CHECK(mirror.locate(p + 8 * 64 * KiB)->device == 1);
    CHECK(mirror.device_free_pages(0) == 0);
    CHECK(mirror.device_free_pages(1) == 6);
  }
  SUBCASE("stripe deals stripes round robin and starts where it stopped") {
    PagedMirror mirror(devices, {.page_size = 64 * KiB}, carve::StripePlacement{.stripe_pages = 2});
    auto* p = static_cast<std::byte*>(*mirror.try_allocate(5 * 64 * KiB, 1));
    CHECK(mirror.locate(p)->device == 0);
    CHECK(mirror.locate(p + 2 * 64 * KiB)->device == 1);
    CHECK(mirror.locate(p + 4 * 64 * KiB)->device == 2);
    auto* q = static_cast<std::byte*>(*mirror.try_allocate(64 * KiB, 1));
    CHECK(mirror.locate(q)->device == 0); // the cursor moved on past device 2
  }
  SUBCASE("the picker keeps memory on the requesting device, then borrows over the widest link") {
    PagedMirror mirror(devices, {.page_size = 64 * KiB},
                       carve::PickerPlacement(carve::BandwidthWeightedPicker(three_gpus())));
    auto* local = static_cast<std::byte*>(*mirror.try_allocate_placed(4 * 64 * KiB, 1, {.priority = 0, .near = 2}));
    CHECK(mirror.locate(local)->device == 2);
    // GPU2 has 4 pages left; GPU0 and GPU1 are equally far (over PCIe): the lower ordinal lends.
    auto* borrowed = static_cast<std::byte*>(*mirror.try_allocate_placed(6 * 64 * KiB, 1, {.priority = 0, .near = 2}));
    CHECK(mirror.locate(borrowed)->device == 0);
    // GPU0 has 2 pages left; GPU1 is its NVLink neighbour.
    auto* near0 = static_cast<std::byte*>(*mirror.try_allocate_placed(4 * 64 * KiB, 1, {.priority = 0, .near = 0}));
    CHECK(mirror.locate(near0)->device == 1);
    // No single device holds 10 pages: the requester's own first, then the picker's order.
    auto* spread = static_cast<std::byte*>(*mirror.try_allocate_placed(10 * 64 * KiB, 1, {.priority = 0, .near = 1}));
    CHECK(mirror.locate(spread)->device == 1);
    CHECK(mirror.locate(spread + 4 * 64 * KiB)->device == 0);
    CHECK(mirror.locate(spread + 6 * 64 * KiB)->device == 2);
    CHECK(mirror.free_bytes() == 0);
    CHECK(mirror.try_allocate_placed(64 * KiB, 1, {.priority = 0, .near = 1}).error() == Errc::no_space);
    CHECK(mirror.try_allocate_placed(64 * KiB, 1, {.priority = 0, .near = 3}).error() ==
          Errc::out_of_range); // no device 3
  }
}

TEST_CASE("a placement policy that breaks its contract is refused") {
  struct Greedy {
    cuda::std::expected<carve::PlacementPlan, Errc> place(const carve::PlacementRequest& r,
                                                          std::span<const carve::DevicePageState>) {
      return carve::PlacementPlan{{0, r.pages + 1}}; // more pages than asked for
    }
  };
  static_assert(carve::PagePlacement<Greedy>);
  HostBackend devices;
  add_cards(devices, {{1 * MiB, 1}});
  PagedMirror mirror(devices, {.page_size = 4 * KiB}, Greedy{});
  CHECK(mirror.try_allocate(4 * KiB, 1).error() == Errc::invalid_placement);
  CHECK(mirror.free_bytes() == 1 * MiB);
}

TEST_CASE("compute and memory together: grants in priority order, memory near the granted device") {
  HostBackend devices;
  add_cards(devices, {{1 * MiB, 4}, {1 * MiB, 4}, {1 * MiB, 4}});
  PagedMirror mirror(devices, {.page_size = 64 * KiB},
                     carve::PickerPlacement(carve::BandwidthWeightedPicker(three_gpus())));
  const auto low = mirror.submit({.bytes = 128 * KiB, .priority = 0, .compute_units = 0});  // a whole device
  const auto high = mirror.submit({.bytes = 256 * KiB, .priority = 9, .compute_units = 2}); // real-time
  const auto mid = mirror.submit({.bytes = 64 * KiB, .priority = 5, .compute_units = 4});
  const auto huge = mirror.submit({.bytes = 4 * MiB, .priority = 1, .compute_units = 1});
  CHECK(huge.error() == Errc::no_space); // more memory than the mirror holds
  CHECK(mirror.submit({.bytes = 1, .priority = 0, .compute_units = 5}).error() == Errc::no_space);
  REQUIRE(low);
  REQUIRE(high);
  REQUIRE(mid);
  const auto grants = mirror.dispatch();
  REQUIRE(grants.size() == 3);
  CHECK(grants[0].compute.ticket == *high);
  CHECK(grants[1].compute.ticket == *mid);
  CHECK(grants[2].compute.ticket == *low);
  CHECK(grants[2].compute.units == carve::SlotRange{0, 4}); // the whole of a free device
  for (const carve::ResourceGrant& g : grants) {
    CHECK(mirror.locate(g.address)->device == g.compute.device); // memory where the work runs
  }
  CHECK(grants[0].compute.device != grants[1].compute.device); // least loaded device first
  // Nothing is free for a whole device now; a queued request waits and then is served.
  const auto next = mirror.submit({.bytes = 64 * KiB, .priority = 3, .compute_units = 0});
  REQUIRE(next);
  CHECK(mirror.dispatch().empty());
  CHECK(mirror.queued_requests() == 1);
  REQUIRE(mirror.release(grants[1]));
  CHECK(mirror.release(grants[1]).error() == Errc::not_allocated);
  const auto later = mirror.dispatch();
  REQUIRE(later.size() == 1);
  CHECK(later[0].compute.ticket == *next);
  CHECK(later[0].compute.device == grants[1].compute.device);
  CHECK(mirror.cancel(*next).error() == Errc::not_allocated); // no longer queued
}

TEST_CASE("requests whose memory does not fit yet wait, and in strict order hold back the rest") {
  HostBackend devices;
  add_cards(devices, {{4 * 64 * KiB, 2}, {4 * 64 * KiB, 2}});
  PagedMirror mirror(devices, {.page_size = 64 * KiB});
  const auto hog = mirror.try_allocate(7 * 64 * KiB, 1);
  REQUIRE(hog);
  const auto big = mirror.submit({.bytes = 2 * 64 * KiB, .priority = 5, .compute_units = 1});
  const auto small = mirror.submit({.bytes = 64 * KiB, .priority = 1, .compute_units = 1});
  REQUIRE(big);
  REQUIRE(small);
  CHECK(mirror.dispatch().empty()); // big waits for memory, small waits behind it
  CHECK(mirror.queued_requests() == 2);
  REQUIRE(mirror.try_deallocate(*hog));
  const auto grants = mirror.dispatch();
  REQUIRE(grants.size() == 2);
  CHECK(grants[0].compute.ticket == *big);
}

TEST_CASE("sizes near SIZE_MAX are refused, not wrapped to zero pages") {
  HostBackend devices;
  add_cards(devices, {{4 * 64 * KiB, 2}});
  PagedMirror mirror(devices, {.page_size = 64 * KiB});
  constexpr std::size_t huge = std::numeric_limits<std::size_t>::max();
  for (const std::size_t bytes : {huge, huge - 64 * KiB + 2, huge / 2 + 1}) {
    CAPTURE(bytes);
    CHECK(mirror.submit({.bytes = bytes, .priority = 9, .compute_units = 1}).error() == Errc::no_space);
    CHECK(mirror.try_allocate(bytes, 1).error() == Errc::no_space);
  }
  CHECK(mirror.queued_requests() == 0);
  // Nothing was queued ahead of it, so a small request is granted at once.
  REQUIRE(mirror.submit({.bytes = 4 * KiB, .priority = 0, .compute_units = 1}));
  CHECK(mirror.dispatch().size() == 1);
  CHECK(mirror.free_bytes() == 3 * 64 * KiB);
}

TEST_CASE("higher-priority allocations are copied first on every device") {
  // A backend that records the order in which copies reach each device, and passes them on.
  struct Recording {
    HostBackend& inner;
    std::vector<std::pair<std::size_t, std::size_t>> copies; // (device, offset)
    std::vector<carve::DeviceInfo> devices() const { return inner.devices(); }
    cuda::std::expected<void, Errc> copy_to_device(std::size_t d, std::size_t off, const void* src,
                                                   std::size_t n) noexcept {
      copies.emplace_back(d, off);
      return inner.copy_to_device(d, off, src, n);
    }
    cuda::std::expected<void, Errc> copy_to_host(std::size_t d, void* dst, std::size_t off, std::size_t n) noexcept {
      return inner.copy_to_host(d, dst, off, n);
    }
    cuda::std::expected<void, Errc> zero(std::size_t d, std::size_t off, std::size_t n) noexcept {
      return inner.zero(d, off, n);
    }
    cuda::std::expected<void, Errc> wait(std::size_t d) noexcept { return inner.wait(d); }
  };
  HostBackend devices;
  add_cards(devices, {{1 * MiB, 1}});
  Recording recording{devices, {}};
  PagedMirror mirror(recording, {.page_size = 4 * KiB});
  auto* low = static_cast<char*>(*mirror.try_allocate_placed(4 * KiB, 1, {.priority = 0}));
  auto* high = static_cast<char*>(*mirror.try_allocate_placed(4 * KiB, 1, {.priority = 7}));
  REQUIRE(mirror.write(low, "l", 1));
  REQUIRE(mirror.write(high, "h", 1));
  REQUIRE(mirror.sync());
  REQUIRE(recording.copies.size() == 2);
  CHECK(recording.copies[0].second == mirror.locate(high)->page * 4 * KiB);
  CHECK(recording.copies[1].second == mirror.locate(low)->page * 4 * KiB);
}

TEST_CASE("a failed sync leaves its pages dirty for the next; a failed fetch leaves clean pages clean") {
  struct Flaky {
    HostBackend& inner;
    bool fail_waits = false;
    std::vector<carve::DeviceInfo> devices() const { return inner.devices(); }
    cuda::std::expected<void, Errc> copy_to_device(std::size_t d, std::size_t off, const void* src,
                                                   std::size_t n) noexcept {
      return inner.copy_to_device(d, off, src, n);
    }
    cuda::std::expected<void, Errc> copy_to_host(std::size_t d, void* dst, std::size_t off, std::size_t n) noexcept {
      return inner.copy_to_host(d, dst, off, n);
    }
    cuda::std::expected<void, Errc> zero(std::size_t d, std::size_t off, std::size_t n) noexcept {
      return inner.zero(d, off, n);
    }
    cuda::std::expected<void, Errc> wait(std::size_t d) noexcept {
      auto r = inner.wait(d);
      if (fail_waits) {
        return cuda::std::unexpected(Errc::device_error);
      }
      return r;
    }
  };
  HostBackend devices;
  add_cards(devices, {{1 * MiB, 1}});
  Flaky flaky{devices, false};
  PagedMirror mirror(flaky, {.page_size = 4 * KiB});
  auto* p = static_cast<char*>(*mirror.try_allocate(16 * KiB, 1));
  REQUIRE(mirror.write(p, "abc", 3));
  REQUIRE(mirror.write(p + 3 * 4 * KiB, "d", 1));
  flaky.fail_waits = true;
  const auto failed = mirror.sync();
  REQUIRE_FALSE(failed);
  CHECK(failed.error() == Errc::device_error);
  CHECK(mirror.dirty_pages() == 2);
  flaky.fail_waits = false;
  CHECK(mirror.sync()->pages == 2);
  // A failed fetch: a page written on the host stays dirty; the clean ones stay clean, so the next
  // sync pushes nothing half-fetched over what the devices hold.
  REQUIRE(mirror.write(p, "x", 1));
  flaky.fail_waits = true;
  CHECK(mirror.fetch(p, 16 * KiB).error() == Errc::device_error);
  CHECK(mirror.dirty_pages() == 1);
  flaky.fail_waits = false;
  CHECK(mirror.sync()->pages == 1);
}

TEST_CASE("sync while other threads store: a page stored to during a sync is copied by the next one") {
  // Not run under ThreadSanitizer: a sync's copy reads a page while a writer may be storing to it,
  // which is the race the protocol tolerates (the page is dirty again and copied next time).
  for (const WriteTracking mode : tracking_modes()) {
    if (mode == WriteTracking::explicit_calls) {
      continue;
    }
    CAPTURE(static_cast<int>(mode));
    HostBackend devices;
    add_cards(devices, {{2 * MiB, 1}, {2 * MiB, 1}});
    PagedMirror mirror(devices, {.page_size = 4 * KiB, .tracking = mode}, carve::StripePlacement{});
    constexpr std::size_t bytes = 1 * MiB;
    auto* p = static_cast<std::uint32_t*>(*mirror.try_allocate(bytes, 1));
    std::atomic<bool> stop{false};
    std::thread writer([&] {
      std::mt19937 rng(7);
      for (std::uint32_t value = 1; !stop.load(std::memory_order_relaxed); ++value) {
        p[rng() % (bytes / 4)] = value;
      }
    });
    for (int i = 0; i < 50; ++i) {
      REQUIRE(mirror.sync());
    }
    stop = true;
    writer.join();
    REQUIRE(mirror.sync());
    std::vector<unsigned char> host(reinterpret_cast<unsigned char*>(p), reinterpret_cast<unsigned char*>(p) + bytes);
    CHECK(device_mismatches(mirror, devices, p, host) == 0);
  }
}

TEST_CASE("an empty 1 TiB mirror costs almost nothing; memory is committed as it is used") {
  if (under_asan) {
    // Each 16 GiB card would cost AddressSanitizer 2 GiB of shadow writes when it is freed.
    MESSAGE("skipped under AddressSanitizer: 1 TiB of simulated cards takes minutes to free there");
    return;
  }
  const auto resident = [] {
    std::ifstream statm("/proc/self/statm");
    std::size_t size = 0;
    std::size_t pages = 0;
    statm >> size >> pages;
    return pages * carve::os_page_size();
  };
  HostBackend devices;
  for (int i = 0; i < 64; ++i) {
    add_cards(devices, {{std::size_t{16} << 30, 132}}); // 64 x 16 GiB of untouched host memory
  }
  const std::size_t before = resident();
  PagedMirror mirror(devices, {.page_size = 64 * KiB, .tracking = WriteTracking::automatic});
  CHECK(mirror.capacity() == std::size_t{1} << 40);
  const std::size_t after = resident();
  MESSAGE("resident set growth for an empty 1 TiB mirror: " << (after - before) / KiB << " KiB");
  CHECK(after - before < 16 * MiB); // bitmaps of 2 bits per page; the table and the range are lazy
  const std::byte* base = mirror.host_base();
  CHECK(resident_bytes_in(base, base + mirror.capacity()) == 0);
  auto* p = static_cast<unsigned char*>(*mirror.try_allocate(std::size_t{64} << 20, 1));
  CHECK(resident_bytes_in(base, base + mirror.capacity()) == 0); // allocated, not yet touched
  p[5 << 20] = 1;
  CHECK(resident_bytes_in(base, base + mirror.capacity()) <= 2 * MiB); // the page stored to
  const auto r = mirror.sync();
  REQUIRE(r);
  CHECK(r->pages == 1);
  CHECK(r->bytes == 64 * KiB);
}

TEST_CASE("compute grants backed by green contexts (twin): SMs and memory return once the work has run") {
  HostBackend devices;
  add_cards(devices, {{1 * MiB, 132}, {1 * MiB, 108}});
  PagedMirror<HostBackend, carve::FillPlacement, carve::FirstFit, carve::SimulatedGreenContexts> mirror(
      devices, {.page_size = 64 * KiB}, {},
      carve::SimulatedGreenContexts(
          {{.sm_count = 132, .cc_major = 9, .cc_minor = 0}, {.sm_count = 108, .cc_major = 8, .cc_minor = 0}}));
  CHECK(mirror.compute_enforced(0));
  CHECK(mirror.compute_enforced(1));
  const auto job = mirror.submit({.bytes = 256 * KiB, .priority = 5, .compute_units = 20});
  REQUIRE(job);
  const auto grants = mirror.dispatch();
  REQUIRE(grants.size() == 1);
  const carve::ResourceGrant g = grants[0];
  CHECK(g.compute.device == 0);
  CHECK(g.compute.units.count == 24); // 20 SMs rounded up to groups of 8
  CHECK(g.compute.enforced);
  CHECK(mirror.locate(g.address)->device == 0);
  const std::size_t free_before = mirror.free_bytes();
  const auto stream = mirror.compute_stream(g);
  REQUIRE(stream);
  REQUIRE(mirror.partitioner().enqueue(*stream)); // a kernel on the grant's SMs
  REQUIRE(mirror.release(g));
  CHECK(mirror.release(g).error() == Errc::not_allocated);
  CHECK(mirror.compute_stream(g).error() == Errc::not_allocated);
  CHECK(mirror.held_grants() == 1); // the kernel still runs: nothing returns yet
  CHECK(mirror.free_bytes() == free_before);
  CHECK(mirror.reclaim() == 0);
  CHECK(mirror.locate(g.address).has_value());
  mirror.partitioner().complete(*stream);
  CHECK(mirror.reclaim() == 1);
  CHECK(mirror.held_grants() == 0);
  CHECK(mirror.free_bytes() == free_before + 256 * KiB);
  CHECK_FALSE(mirror.locate(g.address).has_value());
  CHECK(mirror.partitioner().live() == 0);

  // run(): the work and the hand-back in one step; nothing returns until the work has run.
  REQUIRE(mirror.submit({.bytes = 128 * KiB, .priority = 1, .compute_units = 100}));
  const auto more = mirror.dispatch();
  REQUIRE(more.size() == 1);
  CHECK(more[0].compute.device == 0);        // least loaded: 128 SMs against 108
  CHECK(more[0].compute.units.count == 104); // 13 groups of 8
  carve::SimulatedStream used{};
  REQUIRE(mirror.run(more[0], [&](carve::SimulatedStream s) {
    used = s;
    CHECK(mirror.partitioner().enqueue(s));
  }));
  CHECK(mirror.compute_stream(more[0]).error() == Errc::not_allocated);
  CHECK(mirror.run(more[0], [](carve::SimulatedStream) { FAIL("work for a released grant"); }).error() ==
        Errc::not_allocated);
  CHECK(mirror.reclaim() == 0);
  CHECK(mirror.free_bytes() == free_before + 128 * KiB);
  mirror.partitioner().complete(used);
  CHECK(mirror.dispatch().empty()); // reclaims first
  CHECK(mirror.held_grants() == 0);
  CHECK(mirror.free_bytes() == free_before + 256 * KiB);
}

// A partitioner whose partitions go idle at their third poll: work that finishes between two
// polls of one dispatch, as a real stream's can.
struct IdleAtThirdPoll {
  using stream_type = carve::NoStream;
  struct partition_type {
    std::shared_ptr<int> polls;
  };
  carve::SmLayout layout(std::uint32_t, std::uint32_t units) const noexcept { return {1, units, true}; }
  carve::Result<partition_type> create(std::uint32_t, carve::SlotRange) {
    return partition_type{std::make_shared<int>(0)};
  }
  carve::NoStream stream(const partition_type&) const noexcept { return {}; }
  bool idle(const partition_type& p) { return ++*p.polls >= 3; }
  void destroy(const partition_type&) noexcept {}
};
static_assert(carve::SmPartitioner<IdleAtThirdPoll>);

TEST_CASE("a grant whose work finishes during a dispatch returns its memory with its units") {
  HostBackend devices;
  add_cards(devices, {{1 * MiB, 8}});
  PagedMirror<HostBackend, carve::FillPlacement, carve::FirstFit, IdleAtThirdPoll> mirror(devices,
                                                                                          {.page_size = 64 * KiB});
  const std::size_t free_before = mirror.free_bytes();
  REQUIRE(mirror.submit({.bytes = 256 * KiB, .priority = 1, .compute_units = 4}));
  const auto grants = mirror.dispatch();
  REQUIRE(grants.size() == 1);
  // A grant's memory goes back with the grant, never on its own (its address could be reused
  // before the grant is taken back, and the grant would then free someone else's allocation).
  CHECK(mirror.try_deallocate(grants[0].address).error() == Errc::not_allocated);
  CHECK(mirror.try_deallocate(grants[0].address, 256 * KiB, 1).error() == Errc::not_allocated);
  REQUIRE(mirror.release(grants[0])); // poll 1: still running
  CHECK(mirror.dispatch().empty());   // the dispatcher's own polls may find the work done
  (void)mirror.reclaim();
  CHECK(mirror.held_grants() == 0);
  CHECK(mirror.allocation_count() == 0);
  CHECK(mirror.free_bytes() == free_before);
}

TEST_CASE("ViewPlacement: the reader's pages first, then peers by load bandwidth, on six real machines") {
  const char* files[] = {"dgx1_v100.txt", "dgx_a100.txt",        "hgx_h100.txt",
                         "hgx_h200.txt",  "pcie_8x_rtx4090.txt", "power8_minsky_p100.txt"};
  constexpr std::size_t page = 64 << 10;
  for (const char* file : files) {
    CAPTURE(file);
    const carve::Topology t = carve::Topology::from_nvidia_smi(topology_text(file));
    // The reference's bandwidths: the topology's paths with no GPU relaying, read directly.
    const carve::Topology loads = t.with_options({t.options().max_hops, carve::GpuRelay::never});
    const auto n = static_cast<std::uint32_t>(t.gpu_count());
    const auto bw = [&](std::uint32_t r, std::uint32_t o) {
      return loads.path_bandwidth(loads.gpu(static_cast<int>(r)), loads.gpu(static_cast<int>(o)));
    };
    const carve::ViewPlacement placement(t);
    for (std::uint32_t reader = 0; reader < n; ++reader) {
      CAPTURE(reader);
      std::vector<carve::DevicePageState> devices(n);
      std::uint32_t reachable = 0;
      for (std::uint32_t d = 0; d < n; ++d) {
        devices[d] = {(reader * 7 + d * 3) % 9, 8, d != (reader + 5) % n || n < 6}; // one unavailable
        reachable += devices[d].available && (d == reader || bw(reader, d) > 0) ? devices[d].free_pages : 0;
      }
      const std::uint32_t want = reachable / 2 + 1;
      const auto plan = placement.place({want, page, 0, reader}, devices);
      REQUIRE(plan);
      std::vector<std::uint32_t> took(n, 0);
      std::uint32_t total = 0;
      for (const carve::PlacementChunk& c : *plan) {
        took[c.device] += c.pages;
        total += c.pages;
      }
      CHECK(total == want);
      CHECK(took[reader] == std::min(want, devices[reader].free_pages)); // local first
      for (std::uint32_t a = 0; a < n; ++a) {
        CHECK(took[a] <= devices[a].free_pages);
        if (a == reader || took[a] == 0) {
          continue;
        }
        CHECK(devices[a].available);
        CHECK(bw(reader, a) > 0);               // reachable by loads
        for (std::uint32_t b = 0; b < n; ++b) { // nothing faster left with free pages
          if (b != reader && b != a && devices[b].available && bw(reader, b) > bw(reader, a)) {
            CHECK(took[b] == devices[b].free_pages);
          }
        }
      }
      // explain(): the time to read every byte once, from the reference's bandwidths.
      std::vector<carve::MirrorSegment> segments;
      double seconds = 0;
      for (std::uint32_t d = 0; d < n; ++d) {
        if (took[d] != 0) {
          segments.push_back({d, 0, nullptr, took[d] * page});
          seconds += d == reader ? 0.0 : static_cast<double>(took[d] * page) / 1e9 / bw(reader, d);
        }
      }
      const carve::ViewReadEstimate e = placement.explain(reader, segments);
      if (seconds == 0) {
        CHECK(std::isinf(e.expected_gbps));
      } else {
        CHECK(e.expected_gbps == doctest::Approx(static_cast<double>(total * page) / 1e9 / seconds));
      }
      CHECK(e.text.find("GPU" + std::to_string(reader) + " reads") == 0);
    }
    // Bad input: a reader the topology lacks, devices that are not its GPUs.
    std::vector<carve::DevicePageState> devices(n, {8, 8, true});
    CHECK(placement.place({1, page, 0, n}, devices).error() == Errc::out_of_range);
    devices.pop_back();
    CHECK(placement.place({1, page, 0, 0}, devices).error() == Errc::out_of_range);
  }
}

} // namespace test_paged_mirror
