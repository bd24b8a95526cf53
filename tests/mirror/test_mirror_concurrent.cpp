// PagedMirror under concurrent writers (run under ThreadSanitizer too: label `concurrent`).
//
// Writers store with plain stores (automatic tracking: first stores fault, or are caught by the
// kernel, on many threads at once, often on the same page), call write() and mark_dirty(), while
// another thread allocates and frees. Each writer also records what it wrote in a plain host
// vector, the shadow, which never passes through the mirror; after a sync the devices (and the
// host mirror) must equal it byte for byte. Syncs happen between rounds: a sync that copies a
// page while a thread stores to it is the race the protocol tolerates (tests/test_paged_mirror.cpp
// checks it outside ThreadSanitizer), and ThreadSanitizer would rightly call it one.
#include "mirror_helpers.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

using carve::PagedMirror;
using carve::WriteTracking;
using namespace carve::test;

namespace {

constexpr unsigned threads = 4;

} // namespace

TEST_CASE("concurrent writers: every written page is dirty exactly once, and the devices match") {
  for (const WriteTracking mode : tracking_modes()) {
    CAPTURE(static_cast<int>(mode));
    HostBackend devices;
    add_cards(devices, {{2 * MiB, 1}, {2 * MiB, 1}});
    PagedMirror mirror(devices, {.page_size = 4 * KiB, .tracking = mode}, carve::StripePlacement{.stripe_pages = 4});
    constexpr std::size_t bytes = 3 * MiB;
    auto* p = static_cast<unsigned char*>(*mirror.try_allocate(bytes, 1));
    std::vector<unsigned char> shadow(bytes, 0);
    for (int round = 0; round < 4; ++round) {
      std::vector<std::set<std::size_t>> touched(threads);
      std::vector<std::thread> pool;
      for (unsigned t = 0; t < threads; ++t) {
        pool.emplace_back([&, t] {
          std::mt19937_64 rng(static_cast<std::uint64_t>(round) * 100 + t);
          for (int i = 0; i < 400; ++i) {
            // Thread t owns the bytes whose offset is t modulo `threads`: no two threads store to
            // the same byte, but they share pages.
            const std::size_t at = (rng() % (bytes / threads)) * threads + t;
            const auto value = static_cast<unsigned char>(rng() | 1);
            if (mode == WriteTracking::explicit_calls) {
              if (i % 2 == 0) {
                CHECK(mirror.write(p + at, &value, 1));
              } else {
                p[at] = value;
                CHECK(mirror.mark_dirty(p + at, 1));
              }
            } else {
              p[at] = value;
            }
            shadow[at] = value; // only thread t writes this byte, here or in the mirror
            touched[t].insert(at / (4 * KiB));
          }
        });
      }
      for (std::thread& th : pool) {
        th.join();
      }
      std::set<std::size_t> pages;
      for (const auto& s : touched) {
        pages.insert(s.begin(), s.end());
      }
      CHECK(mirror.dirty_pages() == pages.size());
      const auto r = mirror.sync();
      REQUIRE(r);
      CHECK(r->pages == pages.size());
      CHECK(r->bytes == pages.size() * 4 * KiB);
      CHECK(device_mismatches(mirror, devices, p, shadow) == 0);
      CHECK(std::equal(shadow.begin(), shadow.end(), p)); // and the host copy reads the same
    }
  }
}

TEST_CASE("writers keep storing while another thread allocates and frees") {
  for (const WriteTracking mode : tracking_modes()) {
    CAPTURE(static_cast<int>(mode));
    HostBackend devices;
    add_cards(devices, {{4 * MiB, 1}});
    PagedMirror mirror(devices, {.page_size = 4 * KiB, .tracking = mode});
    std::vector<unsigned char*> own(threads);
    for (auto& p : own) {
      p = static_cast<unsigned char*>(*mirror.try_allocate(256 * KiB, 1));
    }
    // What each writer stored in its allocation (which starts zeroed), kept apart from the mirror.
    std::vector<std::vector<unsigned char>> shadow(threads, std::vector<unsigned char>(256 * KiB, 0));
    std::atomic<bool> stop{false};
    std::thread churn([&] {
      std::mt19937 rng(5);
      std::vector<void*> held;
      while (!stop.load()) {
        if (held.size() < 8 && (rng() & 1) != 0) {
          if (auto q = mirror.try_allocate(4 * KiB * (1 + rng() % 16), 1)) {
            static_cast<unsigned char*>(*q)[0] = 1; // a store while the others store too
            held.push_back(*q);
          }
        } else if (!held.empty()) {
          CHECK(mirror.try_deallocate(held.back()));
          held.pop_back();
        }
      }
      for (void* q : held) {
        CHECK(mirror.try_deallocate(q));
      }
    });
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        std::mt19937 rng(t);
        for (int i = 0; i < 2000; ++i) {
          const std::size_t at = rng() % (256 * KiB);
          const auto value = static_cast<unsigned char>(i);
          if (mode == WriteTracking::explicit_calls || i % 3 == 0) {
            CHECK(mirror.write(own[t] + at, &value, 1));
          } else {
            own[t][at] = value;
          }
          shadow[t][at] = value;
        }
      });
    }
    for (std::thread& th : pool) {
      th.join();
    }
    stop = true;
    churn.join();
    REQUIRE(mirror.sync());
    for (unsigned t = 0; t < threads; ++t) {
      CAPTURE(t);
      CHECK(device_mismatches(mirror, devices, own[t], shadow[t]) == 0);
      CHECK(std::equal(shadow[t].begin(), shadow[t].end(), own[t]));
    }
    CHECK(mirror.allocation_count() == threads);
  }
}

TEST_CASE("green contexts (twin): a device thread completes work while the owner dispatches and releases") {
  const std::vector<carve::DeviceInfo> devices{{.name = "gpu", .capacity = 0, .compute_units = 64, .available = true}};
  carve::PriorityDispatcher<carve::SimulatedGreenContexts> d(
      devices, carve::DispatchOrder::backfill, carve::SimulatedGreenContexts({{.sm_count = 64, .cc_major = 9}}));
  auto& gpu = d.partitioner();
  std::mutex m;
  std::vector<carve::SimulatedStream> running; // released grants' streams, for the device thread
  std::atomic<bool> done{false};
  std::thread device([&] {
    std::mt19937_64 rng(7);
    while (!done.load()) {
      std::vector<carve::SimulatedStream> now;
      {
        const std::lock_guard lock(m);
        now.swap(running);
      }
      for (const carve::SimulatedStream s : now) {
        gpu.complete(s, rng() % 2 + 1); // one kernel or both
        if (gpu.pending(s) != 0) {
          const std::lock_guard lock(m);
          running.push_back(s);
        }
      }
      std::this_thread::yield();
    }
  });
  std::mt19937_64 rng(11);
  std::uint32_t served = 0;
  for (int step = 0; step < 400; ++step) {
    (void)d.submit(
        {.priority = static_cast<int>(rng() % 4), .compute_units = static_cast<std::uint32_t>(rng() % 40 + 1)});
    for (const carve::ComputeGrant& g : d.dispatch()) {
      ++served;
      const auto s = d.stream(g);
      REQUIRE(s);
      REQUIRE(gpu.enqueue(*s));
      REQUIRE(gpu.enqueue(*s));
      REQUIRE(d.release(g));
      const std::lock_guard lock(m);
      running.push_back(*s);
    }
    std::uint32_t held_units = 0;
    for (std::uint32_t group = 0; group < 8; ++group) {
      held_units += gpu.owner(0, group) != 0 ? 8U : 0U;
    }
    REQUIRE(held_units + d.free_units(0) == 64); // the ledger and the partitions agree
  }
  while (d.held() != 0 || d.queued() != 0) {
    for (const carve::ComputeGrant& g : d.dispatch()) {
      ++served;
      REQUIRE(d.release(g));
    }
    std::this_thread::yield();
  }
  done.store(true);
  device.join();
  CHECK(served == 400);
  CHECK_FALSE(d.last_error()); // no partition was ever refused: grants stayed disjoint
  CHECK(gpu.live() == 0);
  CHECK(d.free_units(0) == 64);
}

TEST_CASE("device view: stores, device_pointer and views mapped and unmapped on other threads; syncs between") {
  carve::HostMemoryMapper mapper(
      {.granularity = 64 * KiB, .device_count = 3, .cpu_device = carve::HostMemoryMapper::every_device});
  carve::VmmMirrorBackend<> devices(mapper);
  for (int d = 0; d < 3; ++d) {
    devices.register_device(d, 2 * MiB);
  }
  PagedMirror mirror(devices, {.page_size = 64 * KiB, .device_view = true}, carve::StripePlacement{.stripe_pages = 1});
  constexpr std::size_t bytes = 1 * MiB;
  auto* p = static_cast<unsigned char*>(*mirror.try_allocate(bytes, 1));
  const auto* view = static_cast<const unsigned char*>(*mirror.device_pointer(p));
  std::vector<unsigned char> shadow(bytes, 0);
  for (int round = 0; round < 3; ++round) {
    std::atomic<bool> stop{false};
    std::thread churn([&] { // other allocations' views come and go meanwhile
      while (!stop.load()) {
        if (auto q = mirror.try_allocate(3 * 64 * KiB, 1)) {
          CHECK(mirror.device_pointer(*q));
          CHECK(mirror.try_deallocate(*q));
        }
      }
    });
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        std::mt19937_64 rng(static_cast<std::uint64_t>(round) * 100 + t);
        for (int i = 0; i < 300; ++i) {
          const std::size_t at = (rng() % (bytes / threads)) * threads + t;
          const auto value = static_cast<unsigned char>(rng() | 1);
          p[at] = value;
          shadow[at] = value;
          CHECK(mirror.device_pointer(p + at) == static_cast<const void*>(view + at));
        }
      });
    }
    for (std::thread& th : pool) {
      th.join();
    }
    stop.store(true);
    churn.join();
    REQUIRE(mirror.sync());
    CHECK(std::equal(shadow.begin(), shadow.end(), view)); // the device side reads what the host wrote
  }
  REQUIRE(mirror.try_deallocate(p));
}
