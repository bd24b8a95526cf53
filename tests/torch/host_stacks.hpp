// tests/torch/host_stacks.hpp — what the C++ tests of libcarve_torch share: each stack built on
// the host backend, stream handles, and this program's table of host streams (the stacks built
// in a test count on it; the library has its own, behind its test hooks).
#pragma once

#include <pool_stacks.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>

namespace host_stacks {

using carve::torch::DeviceStack;
using carve::torch::PoolKind;

inline cudaStream_t stream(std::uintptr_t handle) { return reinterpret_cast<cudaStream_t>(handle); }

// Streams are process-wide on the host backend: each test takes handles no other test used.
inline std::uintptr_t fresh_streams(std::uintptr_t count) {
  static std::atomic<std::uintptr_t> next{0x1000};
  return next.fetch_add(count);
}

// A stack of `kind` for device 0 over host memory, capped at `cap` bytes.
inline std::unique_ptr<DeviceStack> make(PoolKind kind, std::size_t cap = std::numeric_limits<std::size_t>::max()) {
  using carve::torch::HostBackend;
  carve::torch::StackOptions o;
  o.pool = kind;
  o.max_reserved = cap;
  switch (kind) {
  case PoolKind::caching:
    return std::make_unique<carve::torch::CachingStack<HostBackend>>(0, o);
  case PoolKind::stream_ordered:
    return std::make_unique<carve::torch::StreamOrderedStack<HostBackend>>(0, o);
  case PoolKind::expandable:
    break;
  }
  return std::make_unique<carve::torch::ExpandableStack<HostBackend>>(0, o);
}

inline carve::torch::HostStreamTable& streams() { return carve::torch::HostStreamTable::instance(); }
inline void enqueue(cudaStream_t s) { streams().enqueue(reinterpret_cast<std::uintptr_t>(s)); }
inline void complete(cudaStream_t s) { streams().complete(reinterpret_cast<std::uintptr_t>(s)); }
inline void set_capturing(cudaStream_t s, bool on) { streams().set_capturing(reinterpret_cast<std::uintptr_t>(s), on); }

inline const char* name(PoolKind kind) {
  return kind == PoolKind::caching ? "caching" : kind == PoolKind::stream_ordered ? "stream-ordered" : "expandable";
}

inline constexpr PoolKind kinds[] = {PoolKind::expandable, PoolKind::stream_ordered, PoolKind::caching};

} // namespace host_stacks
