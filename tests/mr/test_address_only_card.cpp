// BestFitRanges against a reference model of best fit, and AddressOnlyCard: capacity counted as
// cudaMalloc counts it, addresses that fault when touched, cards far larger than this machine.
#include "support/errors.hpp"
#include "support/resident_memory.hpp"

#include <carve/mr.hpp>

#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

// In a namespace of its own: the area's test files compile as one translation unit.
namespace test_address_only_card {

using carve::AddressOnlyCard;
using carve::BestFitRanges;
using carve::Errc;

static_assert(carve::UpstreamResource<AddressOnlyCard> && carve::OwnsMemory<AddressOnlyCard> &&
              carve::ChecksDeallocation<AddressOnlyCard>);

namespace {

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t GiB = std::size_t{1} << 30;

// Best fit the slow way: free ranges per region as a sorted map, searched whole every time.
struct ReferenceRanges {
  std::vector<std::map<std::uintptr_t, std::size_t>> regions;

  std::optional<std::pair<std::uintptr_t, std::size_t>> take(std::size_t bytes, std::size_t alignment) {
    std::optional<std::tuple<std::size_t, std::uintptr_t, std::size_t>> best; // (size, start, region)
    for (std::size_t r = 0; r < regions.size(); ++r) {
      for (const auto& [start, size] : regions[r]) {
        const std::uintptr_t aligned = (start + alignment - 1) / alignment * alignment;
        if (aligned - start <= size && size - (aligned - start) >= bytes &&
            (!best || std::tie(size, start) < std::tie(std::get<0>(*best), std::get<1>(*best)))) {
          best = std::tuple{size, start, r};
        }
      }
    }
    if (!best) {
      return std::nullopt;
    }
    const auto [size, start, r] = *best;
    const std::uintptr_t aligned = (start + alignment - 1) / alignment * alignment;
    regions[r].erase(start);
    if (aligned > start) {
      regions[r][start] = aligned - start;
    }
    if (aligned + bytes < start + size) {
      regions[r][aligned + bytes] = start + size - aligned - bytes;
    }
    return std::pair{aligned, r};
  }

  void give(std::size_t r, std::uintptr_t start, std::size_t bytes) {
    auto& m = regions[r];
    auto next = m.lower_bound(start);
    if (next != m.end() && next->first == start + bytes) {
      bytes += next->second;
      next = m.erase(next);
    }
    if (next != m.begin() && std::prev(next)->first + std::prev(next)->second == start) {
      std::prev(next)->second += bytes;
    } else {
      m[start] = bytes;
    }
  }

  std::vector<std::pair<std::uintptr_t, std::size_t>> free_ranges() const {
    std::vector<std::pair<std::uintptr_t, std::size_t>> out;
    for (const auto& m : regions) {
      out.insert(out.end(), m.begin(), m.end());
    }
    std::sort(out.begin(), out.end());
    return out;
  }
};

std::vector<std::pair<std::uintptr_t, std::size_t>> free_ranges(const BestFitRanges& r) {
  std::vector<std::pair<std::uintptr_t, std::size_t>> out;
  r.for_each_free([&](std::uintptr_t start, std::size_t bytes) { out.emplace_back(start, bytes); });
  std::sort(out.begin(), out.end());
  return out;
}

} // namespace

TEST_CASE("best fit: the smallest range that holds the request, the lowest among equals") {
  BestFitRanges r(0x10000, 64 * KiB);
  const auto a = r.take(4 * KiB);
  const auto b = r.take(8 * KiB);
  const auto c = r.take(4 * KiB);
  const auto d = r.take(8 * KiB);
  REQUIRE((a && b && c && d));
  CHECK(a->start == 0x10000);
  CHECK(b->start == 0x11000);
  CHECK(c->start == 0x13000);
  r.give(a->handle); // a 4 KiB hole at the start
  r.give(c->handle); // a 4 KiB hole between b and d
  const auto e = r.take(4 * KiB);
  CHECK(e->start == 0x10000); // equal holes: the lower one
  const auto f = r.take(2 * KiB);
  CHECK(f->start == 0x13000); // the 4 KiB hole beats the 36 KiB end
  const auto span = r.give(b->handle);
  CHECK(span.start == 0x11000);
  CHECK(span.bytes == 8 * KiB); // b's neighbours are taken: nothing to merge with
  CHECK(r.consistent());
  CHECK(r.taken() == 3);
  CHECK(r.free_bytes() == 64 * KiB - 14 * KiB);
}

TEST_CASE("take_at takes exactly the range asked for, only where it is free, and gives it back like any") {
  BestFitRanges r(0x10000, 64 * KiB);
  const auto a = r.take(16 * KiB);
  REQUIRE(a);
  const auto b = r.take_at(0x18000, 8 * KiB); // inside the free 48 KiB after a: pad and tail stay free
  REQUIRE(b);
  CHECK(b->start == 0x18000);
  CHECK(b->rest == 40 * KiB);
  CHECK(r.count() == 2);
  CHECK(r.take_at(0x10000, 4 * KiB) == std::nullopt);  // a's
  CHECK(r.take_at(0x17000, 8 * KiB) == std::nullopt);  // runs into b
  CHECK(r.take_at(0x1e000, 16 * KiB) == std::nullopt); // past the region
  CHECK(r.consistent());
  CHECK(r.free_bytes() == 40 * KiB);
  const auto c = r.take_at(0x14000, 16 * KiB); // an exact fit: the whole free range between a and b
  REQUIRE(c);
  CHECK(c->rest == 0);
  CHECK(r.take(4 * KiB)->start == 0x1a000); // best fit passes the taken ranges by
  const auto span = r.give(b->handle);
  CHECK(span.start == 0x18000);
  CHECK(span.bytes == 8 * KiB); // c and the take after it are its neighbours
  CHECK(r.consistent());
}

TEST_CASE("for_each_range_near visits every range that overlaps a window, walking out from a taken one") {
  BestFitRanges r(0x10000, 64 * KiB);
  const auto a = r.take(8 * KiB);  // [0x10000, 0x12000)
  const auto b = r.take(8 * KiB);  // [0x12000, 0x14000)
  const auto c = r.take(16 * KiB); // [0x14000, 0x18000); the rest free
  REQUIRE((a && b && c));
  r.give(b->handle); // [0x12000, 0x14000) free between a and c
  std::vector<std::tuple<std::uintptr_t, std::size_t, bool>> seen;
  const auto visit = [&](std::uintptr_t start, std::size_t bytes, bool free) { seen.emplace_back(start, bytes, free); };
  r.for_each_range_near(c->handle, 0x11000, 0x19000, visit); // from c back to a, and on into the free end
  CHECK(seen == decltype(seen){{0x10000, 8 * KiB, false},
                               {0x12000, 8 * KiB, true},
                               {0x14000, 16 * KiB, false},
                               {0x18000, 32 * KiB, true}});
  seen.clear();
  r.for_each_range_near(a->handle, 0x14000, 0x18000, visit); // exactly c: its free neighbours left out
  CHECK(seen == decltype(seen){{0x14000, 16 * KiB, false}});
}

TEST_CASE("aligned takes leave the pad free, and regions never merge") {
  BestFitRanges r;
  const auto first = r.add_region(0x100000, 64 * KiB);
  const auto second = r.add_region(0x110000, 64 * KiB); // touches the first
  const auto a = r.take(1 * KiB, 1);
  REQUIRE(a);
  const auto b = r.take(4 * KiB, 16 * KiB);
  REQUIRE(b);
  CHECK(b->start % (16 * KiB) == 0);
  CHECK(r.consistent());
  CHECK(r.take(200 * KiB) == std::nullopt); // 128 KiB in all, and no range crosses the regions' border
  r.give(a->handle);
  r.give(b->handle);
  CHECK(r.region_free(first));
  CHECK(r.region_free(second));
  CHECK(r.count() == 2); // one free range per region, not one merged range
  r.remove_region(first);
  CHECK(r.free_bytes() == 64 * KiB);
  CHECK(r.consistent());
}

TEST_CASE("region ids of removed regions are reused, so a long run of segments does not grow the table") {
  BestFitRanges r;
  const auto keep = r.add_region(0x100000, 4096);
  for (std::uintptr_t i = 0; i < 1000; ++i) {
    const auto region = r.add_region(0x200000 + i * 0x10000, 8192);
    const auto got = r.take(8192);
    REQUIRE(got.has_value());
    CHECK(r.region(got->handle) == region);
    CHECK(!r.region_free(region));
    r.give(got->handle);
    r.remove_region(region);
  }
  CHECK(r.region_ids() == 2);
  CHECK(r.region_free(keep));
  CHECK(r.consistent());
}

TEST_CASE("best fit against a reference model, over many regions and alignments") {
  std::mt19937_64 rng(7);
  BestFitRanges r;
  ReferenceRanges ref;
  for (std::size_t i = 0; i < 3; ++i) {
    const std::uintptr_t start = 0x1000000 + i * 0x100000; // regions that touch
    CHECK(r.add_region(start, 0x100000) == i);
    ref.regions.push_back({{start, 0x100000}});
  }
  struct Out {
    BestFitRanges::Handle handle;
    std::uintptr_t start;
    std::size_t bytes;
    std::size_t region;
  };
  std::vector<Out> out;
  for (int step = 0; step < 4000; ++step) {
    if (out.empty() || rng() % 100 < 55) {
      const std::size_t bytes = std::size_t{1} << (rng() % 15) | (rng() % 4) * 512;
      const std::size_t alignment = std::size_t{1} << (rng() % 14);
      const auto got = r.take(bytes, alignment);
      const auto want = ref.take(bytes, alignment);
      REQUIRE(got.has_value() == want.has_value());
      if (got) {
        REQUIRE(got->start == want->first);
        REQUIRE(r.start(got->handle) == got->start);
        REQUIRE(r.size(got->handle) == bytes);
        out.push_back({got->handle, got->start, bytes, want->second});
      }
    } else {
      const std::size_t k = rng() % out.size();
      const Out o = out[k];
      out[k] = out.back();
      out.pop_back();
      r.give(o.handle);
      ref.give(o.region, o.start, o.bytes);
    }
    if (step % 97 == 0) {
      REQUIRE(r.consistent());
      REQUIRE(free_ranges(r) == ref.free_ranges());
    }
  }
  CHECK(r.consistent());
  CHECK(free_ranges(r) == ref.free_ranges());
}

// Elements for an IntrusiveTreap test: a key each, links beside it.
struct TreapElements {
  std::vector<std::uint64_t> keys;
  mutable std::vector<carve::detail::TreapLinks> nodes;
  carve::detail::TreapLinks& links(std::uint32_t n) const { return nodes[n]; }
  bool before(std::uint32_t a, std::uint32_t b) const { return keys[a] != keys[b] ? keys[a] < keys[b] : a < b; }
};

TEST_CASE("an intrusive treap against std::set: order, neighbours, bounds and shape after every change") {
  using Treap = carve::detail::IntrusiveTreap<TreapElements>;
  constexpr std::uint32_t none = carve::detail::treap_none;
  std::mt19937_64 rng(11);
  TreapElements e;
  constexpr std::uint32_t n = 3000;
  e.nodes.resize(n);
  for (std::uint32_t i = 0; i < n; ++i) {
    e.keys.push_back(rng() % 500); // many equal keys: ties go by id
  }
  std::set<std::pair<std::uint64_t, std::uint32_t>> model;
  std::vector<bool> filed(n, false);
  std::uint32_t root = none;
  for (int step = 0; step < 20000; ++step) {
    const auto i = static_cast<std::uint32_t>(rng() % n);
    if (filed[i]) {
      Treap::erase(root, i, e);
      model.erase({e.keys[i], i});
    } else {
      Treap::insert(root, i, e);
      model.insert({e.keys[i], i});
    }
    filed[i] = !filed[i];
    const std::uint64_t key = rng() % 520;
    const auto want = model.lower_bound({key, 0});
    const std::uint32_t got = Treap::lower_bound(root, e, [&](std::uint32_t m) { return e.keys[m] < key; });
    REQUIRE(got == (want == model.end() ? none : want->second));
    REQUIRE(Treap::first(root, e) == (model.empty() ? none : model.begin()->second));
    REQUIRE(Treap::last(root, e) == (model.empty() ? none : model.rbegin()->second));
    if (step % 500 == 0) {
      std::size_t count = 0;
      REQUIRE(Treap::valid(root, e, count));
      REQUIRE(count == model.size());
      std::uint32_t at = Treap::first(root, e);
      for (const auto& [k, id] : model) {
        REQUIRE(at == id);
        at = Treap::next(at, e);
      }
      REQUIRE(at == none);
    }
  }
  e.nodes[Treap::first(root, e)].parent = 0; // a broken link is caught
  std::size_t count = 0;
  CHECK_FALSE(Treap::valid(root, e, count));
}

TEST_CASE("best fit with thousands of equal and near-equal holes, against a reference model") {
  // Blocks of four sizes in one size class (4096 to 4223 bytes), freed at random so that
  // thousands of holes share a class; requests of those sizes, some aligned beyond the holes'
  // starts so that the search walks past holes that cannot be aligned.
  std::mt19937_64 rng(5);
  BestFitRanges r;
  ReferenceRanges ref;
  const std::uintptr_t base = 0x100000000;
  const std::size_t length = 64 * MiB;
  r.add_region(base, length);
  ref.regions.push_back({{base, length}});
  constexpr std::array<std::size_t, 4> sizes = {4096, 4100, 4160, 4223};
  struct Out {
    BestFitRanges::Handle handle;
    std::uintptr_t start;
    std::size_t bytes;
  };
  std::vector<Out> out;
  const auto take = [&](std::size_t bytes, std::size_t alignment) {
    const auto got = r.take(bytes, alignment);
    const auto want = ref.take(bytes, alignment);
    REQUIRE(got.has_value() == want.has_value());
    if (got) {
      REQUIRE(got->start == want->first);
      out.push_back({got->handle, got->start, bytes});
    }
  };
  for (int i = 0; i < 6000; ++i) {
    take(sizes[rng() % sizes.size()], 1);
  }
  for (int step = 0; step < 6000; ++step) {
    if (rng() % 100 < 70 && !out.empty()) {
      const std::size_t k = rng() % out.size();
      r.give(out[k].handle);
      ref.give(0, out[k].start, out[k].bytes);
      out[k] = out.back();
      out.pop_back();
    } else {
      take(sizes[rng() % sizes.size()] - rng() % 3, rng() % 8 == 0 ? 4096 : 1);
    }
    if (step % 1000 == 0) {
      REQUIRE(r.consistent());
      // Smallest first, the lowest among equals; the largest is the last of them.
      std::vector<std::pair<std::size_t, std::uintptr_t>> visited;
      r.for_each_free([&](std::uintptr_t start, std::size_t bytes) { visited.emplace_back(bytes, start); });
      REQUIRE(std::is_sorted(visited.begin(), visited.end()));
      REQUIRE(r.largest() == visited.back().first);
      REQUIRE(free_ranges(r) == ref.free_ranges());
    }
  }
  CHECK(r.count() > 1000);
  CHECK(r.consistent());
  CHECK(free_ranges(r) == ref.free_ranges());
}

TEST_CASE("an address-only card counts what cudaMalloc would take") {
  AddressOnlyCard card(64 * MiB);
  CHECK(card.taken(1) == 512);
  CHECK(card.taken(1000) == 1 * KiB);
  CHECK(card.taken(2 * MiB - 1) == 2 * MiB);
  CHECK(card.taken(2 * MiB) == 2 * MiB);
  CHECK(card.taken(2 * MiB + 1) == 4 * MiB);
  void* a = *card.try_allocate(1000, 256);
  void* b = *card.try_allocate(3 * MiB, 256);
  CHECK(reinterpret_cast<std::uintptr_t>(b) % (2 * MiB) == 0);
  CHECK(card.used_bytes() == 1 * KiB + 4 * MiB);
  CHECK(card.free_bytes() == 64 * MiB - 1 * KiB - 4 * MiB);
  CHECK(card.allocation_count() == 2);
  CHECK(card.owns(static_cast<char*>(b) + 3 * MiB));
  CHECK_FALSE(card.owns(static_cast<char*>(b) + 4 * MiB));
  const AddressOnlyCard copy = card; // a handle to the same card
  CHECK(copy == card);
  CHECK(copy.used_bytes() == card.used_bytes());
  card.deallocate(a, 1000, 256);
  card.deallocate(b, 3 * MiB, 256);
  CHECK(card.used_bytes() == 0);
  CHECK(card.peak_used_bytes() == 1 * KiB + 4 * MiB);
  CHECK(card.calls() == 4);
}

TEST_CASE("an address-only card refuses what it cannot hold and changes nothing") {
  AddressOnlyCard card(8 * MiB);
  void* p = *card.try_allocate(6 * MiB, 256);
  CHECK(card.try_allocate(4 * MiB, 256).error() == Errc::no_space);
  CHECK(card.try_allocate(0, 256).error() == Errc::invalid_size);
  CHECK(card.try_allocate(64, 3).error() == Errc::invalid_size);
  CHECK(card.try_allocate(SIZE_MAX, 256).error() == Errc::invalid_size); // overflows when rounded
  int on_stack = 0;
  CHECK(card.try_deallocate(&on_stack, 4, 256).error() == Errc::not_allocated);
  CHECK(card.try_deallocate(p, 1 * MiB, 256).error() == Errc::invalid_size);
  CHECK(card.used_bytes() == 6 * MiB);
  CHECK(card.refusals() == 1);
  CHECK(card.try_deallocate(p, 6 * MiB, 256));
  CHECK(card.try_deallocate(p, 6 * MiB, 256).error() == Errc::not_allocated);
  CHECK(carve::test::thrown_code([] { AddressOnlyCard(0); }) == Errc::invalid_argument);
  CHECK(carve::test::thrown_code([] { AddressOnlyCard(1 * MiB, {.granularity = 3}); }) == Errc::invalid_argument);
}

TEST_CASE("a card far larger than this machine backs nothing, and its addresses fault when touched") {
  const std::size_t before = carve::test::resident_bytes();
  AddressOnlyCard card(std::size_t{256} * GiB);
  std::vector<void*> blocks;
  for (int i = 0; i < 60; ++i) {
    blocks.push_back(*card.try_allocate(4 * GiB, 256)); // 240 GiB on a machine with far less
  }
  CHECK(card.used_bytes() == 240 * GiB);
  CHECK(carve::test::resident_bytes() < before + 64 * MiB);
  int status = 0;
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::signal(SIGSEGV, SIG_DFL);                        // no test framework's crash report: the plain default
    static_cast<volatile char*>(blocks[7])[12345] = 1; // no page is behind it
    ::_exit(0);
  }
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGSEGV);
  for (void* p : blocks) {
    card.deallocate(p, 4 * GiB, 256);
  }
  CHECK(card.used_bytes() == 0);
}

TEST_CASE("pools stack on an address-only card as on cudaMalloc") {
  AddressOnlyCard card(1 * GiB);
  carve::CachingPool pool(card);
  void* a = *pool.try_allocate(100 * KiB, 256);
  void* b = *pool.try_allocate(300 * MiB, 256);
  CHECK(card.allocation_count() == 2); // a 2 MiB segment and one of its own
  pool.deallocate(a, 100 * KiB, 256);
  pool.deallocate(b, 300 * MiB, 256);
  CHECK(pool.trim() == 2 * MiB + 300 * MiB);
  CHECK(card.used_bytes() == 0);
}

TEST_CASE("threads share one address-only card") {
  AddressOnlyCard card(1 * GiB);
  std::vector<std::vector<std::pair<void*, std::size_t>>> held(4); // what each thread holds at its end
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t));
      auto& mine = held[static_cast<std::size_t>(t)];
      for (int i = 0; i < 2000; ++i) {
        if (mine.size() < 50 && rng() % 3 != 0) {
          const std::size_t bytes = (rng() % 64 + 1) * KiB;
          if (auto p = card.try_allocate(bytes, 256)) {
            mine.emplace_back(*p, bytes);
          }
        } else if (!mine.empty()) {
          card.deallocate(mine.back().first, mine.back().second, 256);
          mine.pop_back();
        }
      }
    });
  }
  for (auto& t : threads) {
    t.join();
  }
  std::vector<std::pair<void*, std::size_t>> all; // no two blocks overlap, whichever thread holds them
  for (const auto& mine : held) {
    all.insert(all.end(), mine.begin(), mine.end());
  }
  CHECK(all.size() > 100);
  std::sort(all.begin(), all.end());
  for (std::size_t i = 1; i < all.size(); ++i) {
    CHECK(static_cast<char*>(all[i - 1].first) + all[i - 1].second <= all[i].first);
  }
  for (auto [p, bytes] : all) {
    card.deallocate(p, bytes, 256);
  }
  CHECK(card.used_bytes() == 0);
  CHECK(card.allocation_count() == 0);
}

} // namespace test_address_only_card
