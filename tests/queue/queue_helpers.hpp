// Request types, size functions and a scripted clock for the SizeTieredQueue tests.
#pragma once

#include <carve/queue.hpp>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

namespace carve::test {

// A move-only request: the payload's pointer is what must survive every hand-over.
struct Request {
  std::uint64_t size = 0;
  std::uint64_t id = 0;
  std::unique_ptr<std::uint64_t> payload;

  static Request make(std::uint64_t size, std::uint64_t id) { return {size, id, std::make_unique<std::uint64_t>(id)}; }
};

struct RequestSize {
  std::uint64_t operator()(const Request& r) const noexcept { return r.size; }
};

// A request that counts its live instances, to prove nothing leaks and nothing is destroyed twice.
struct Counted {
  static inline std::atomic<int> live{0};
  std::uint64_t size = 0;
  std::uint64_t id = 0;
  bool owner = true;

  Counted(std::uint64_t s, std::uint64_t i) : size(s), id(i) { ++live; }
  Counted(Counted&& o) noexcept : size(o.size), id(o.id), owner(o.owner) {
    o.owner = false;
    ++live;
  }
  Counted& operator=(Counted&& o) noexcept {
    size = o.size;
    id = o.id;
    owner = o.owner;
    o.owner = false;
    return *this;
  }
  ~Counted() { --live; }
};

struct CountedSize {
  std::uint64_t operator()(const Counted& c) const noexcept { return c.size; }
};

// Time moves only when a test says so.
struct ScriptedClock {
  static inline std::atomic<std::uint64_t> ticks{0};
  static std::uint64_t now() noexcept { return ticks.load(std::memory_order_relaxed); }
  static std::uint64_t ticks_from_ns(std::uint64_t ns) noexcept { return ns; }
  static double ns_per_tick() noexcept { return 1.0; }
  static void set(std::uint64_t t) { ticks.store(t, std::memory_order_relaxed); }
  static void advance(std::uint64_t d = 1) { ticks.fetch_add(d, std::memory_order_relaxed); }
};
static_assert(StampClock<ScriptedClock>);

inline TierThresholds thresholds(std::initializer_list<std::uint64_t> list) { return TierThresholds(list); }

} // namespace carve::test
