// libcarve_torch.so: carve's pools behind the C functions PyTorch's CUDAPluggableAllocator and
// CuPy's allocator hooks call (carve_torch.h says what each does). One DeviceStack per device,
// built on first use from the settings read once (config.hpp), kept until the process ends: PyTorch
// frees tensors from its own static destructors, after which a destroyed pool would be a crash.
#include "carve_torch.h"

#include "config.hpp"
#include "pool_stacks.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using carve::Errc;
using carve::torch::BackendKind;
using carve::torch::Config;
using carve::torch::DeviceStack;

using carve::torch::max_devices;

std::size_t slot(int device) { return static_cast<std::size_t>(device); }

const Config& config() {
  static const Config c = carve::torch::read_config();
  return c;
}

[[noreturn]] void fatal(const std::string& message) {
  std::fprintf(stderr, "%s\n", message.c_str());
  std::fflush(stderr);
  std::abort();
}

const Config& checked_config() {
  const Config& c = config();
  if (!c.error.empty()) {
    fatal(c.error);
  }
  return c;
}

const char* pool_name(carve::torch::PoolKind k) {
  switch (k) {
  case carve::torch::PoolKind::caching:
    return "caching";
  case carve::torch::PoolKind::stream_ordered:
    return "stream-ordered";
  case carve::torch::PoolKind::expandable:
    break;
  }
  return "expandable";
}

template <class Backend>
std::unique_ptr<DeviceStack> make_stack(int device, const carve::torch::StackOptions& o) {
  switch (o.pool) {
  case carve::torch::PoolKind::caching:
    return std::make_unique<carve::torch::CachingStack<Backend>>(device, o);
  case carve::torch::PoolKind::stream_ordered:
    return std::make_unique<carve::torch::StreamOrderedStack<Backend>>(device, o);
  case carve::torch::PoolKind::expandable:
    break;
  }
  return std::make_unique<carve::torch::ExpandableStack<Backend>>(device, o);
}

// The stacks, by device; a device whose stack could not be built keeps the reason.
struct Registry {
  std::array<std::atomic<DeviceStack*>, max_devices> stacks{};
  std::mutex build;
  std::array<std::string, max_devices> errors;                   // under `build`
  std::array<std::atomic<std::uint64_t>, max_devices> refused{}; // mallocs that found no stack
};

// Opens the expandable memory of `device` (its stack `made`, just built) and of every device built
// before it to each other, where the pair reaches each other directly, as PyTorch's expandable
// segments are opened once it enables peer access. PyTorch's pluggable allocator does not say when
// it does (it enables peer access for cudaMalloc memory itself), and a copy between two GPUs, or
// a kernel on one that reads the other's tensor, faults on memory not opened to its device. A
// process that uses one device opens nothing. A refusal is reported on stderr; the stack serves on.
template <class Backend>
void open_to_peers(const Registry& r, int device, DeviceStack& made) {
  const auto report = [](int owner, int peer, const std::string& why) {
    if (!why.empty()) {
      std::fprintf(stderr, "libcarve_torch: device %d cannot open its memory to device %d: %s\n", owner, peer,
                   why.c_str());
    }
  };
  for (int other = 0; other < max_devices; ++other) {
    DeviceStack* built = r.stacks[slot(other)].load(std::memory_order_acquire);
    if (built == nullptr || other == device) {
      continue;
    }
    if (Backend::can_access_peer(device, other)) {
      report(other, device, built->grant_access(device));
    }
    if (Backend::can_access_peer(other, device)) {
      report(device, other, made.grant_access(other));
    }
  }
}

// carve_torch_guard_captures, for stacks built later.
std::atomic<bool>& guard_captures_on() {
  static std::atomic<bool> on{false};
  return on;
}

Registry& registry() {
  static Registry* r = new Registry; // never destroyed (see the top of this file)
  return *r;
}

// The stack of `device`, built now if it is the first use; null (the reason reported once on
// stderr) when the device does not exist or the pool cannot be built.
DeviceStack* stack(int device) {
  if (device < 0 || device >= max_devices) {
    return nullptr;
  }
  Registry& r = registry();
  if (DeviceStack* s = r.stacks[slot(device)].load(std::memory_order_acquire)) {
    return s;
  }
  const Config& c = checked_config();
  const std::lock_guard lock(r.build);
  if (DeviceStack* s = r.stacks[slot(device)].load(std::memory_order_acquire)) {
    return s;
  }
  if (!r.errors[slot(device)].empty()) {
    return nullptr;
  }
  try {
    std::unique_ptr<DeviceStack> made;
    if (c.backend == BackendKind::host) {
      made = make_stack<carve::torch::HostBackend>(device, c.stack);
      open_to_peers<carve::torch::HostBackend>(r, device, *made);
    } else {
#ifdef CARVE_TORCH_HAS_CUDA
      made = make_stack<carve::torch::CudaBackend>(device, c.stack);
      open_to_peers<carve::torch::CudaBackend>(r, device, *made);
#endif
    }
    made->guard_captures(guard_captures_on().load(std::memory_order_relaxed));
    r.stacks[slot(device)].store(made.get(), std::memory_order_release);
    return made.release();
  } catch (const std::exception& e) {
    r.errors[slot(device)] =
        std::string("libcarve_torch: no pool for device ") + std::to_string(device) + ": " + e.what();
    std::fprintf(stderr, "%s\n", r.errors[slot(device)].c_str());
    return nullptr;
  }
}

// The stack of `device` if it was built (hooks that only end or release something build none).
DeviceStack* existing_stack(int device) {
  return device >= 0 && device < max_devices ? registry().stacks[slot(device)].load(std::memory_order_acquire)
                                             : nullptr;
}

// The last capture the calling thread began, and how many it has begun
// (carve_torch_captures_begun).
struct BegunCaptures {
  unsigned long long count = 0;
  int device = 0;
  carve_torch_pool_id pool{0, 0};
  std::uint64_t number = 0; // the device stack's number for it
};
thread_local BegunCaptures begun_captures;

// The pool the calling thread watches for a release (carve_torch_watch_release).
struct WatchedRelease {
  bool watching = false;
  bool released = false;
  int device = 0;
  carve_torch_pool_id pool{0, 0};
};
thread_local WatchedRelease watched_release;

// PyTorch 2.1's captures, by device and stream (several on one stream when a capture begun on a
// capturing stream was refused), each with its number in its device's stack, oldest first.
struct StreamPools {
  struct Entry {
    int device;
    cudaStream_t stream;
    std::uint64_t number;
  };
  std::mutex mutex;
  std::vector<Entry> of;
};
StreamPools& stream_pools() {
  static StreamPools* p = new StreamPools; // never destroyed (see the top of this file)
  return *p;
}

std::string hex(const void* p) {
  char text[32];
  std::snprintf(text, sizeof text, "%p", p);
  return text;
}

[[noreturn]] void free_misuse(const void* p, ssize_t size, int device, const char* why) {
  fatal("carve_torch_free(" + hex(p) + ", " + std::to_string(size) + " bytes, device " + std::to_string(device) +
        "): " + why);
}

// `bytes` as PyTorch's out-of-memory messages write sizes ("3.00 GiB", "20.00 MiB", "512 bytes"),
// so that a refusal reads like one from PyTorch's own allocator.
std::string torch_size(std::size_t bytes) {
  static constexpr const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) {
    return std::to_string(bytes) + " bytes";
  }
  double value = static_cast<double>(bytes) / 1024.0;
  std::size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < std::size(units)) {
    value /= 1024.0;
    ++unit;
  }
  char text[48];
  std::snprintf(text, sizeof text, "%.2f %s", value, units[unit]);
  return text;
}

// The calling thread's last refusal (carve_torch_last_refusal).
thread_local std::string last_refusal;

// Every refusal's first sentence, PyTorch's own ("CUDA out of memory. Tried to allocate 3.00
// GiB."), which the tools that shrink a batch on out-of-memory look for, and the device.
std::string refusal_start(std::size_t bytes, int device) {
  return "CUDA out of memory. Tried to allocate " + torch_size(bytes) + ". GPU " + std::to_string(device) + ": ";
}

// Why a pool refused: what carve holds and did, and what to try.
std::string refusal(int device, std::size_t bytes, std::size_t released, const carve::torch::Books& b,
                    const Config& c) {
  std::string text = refusal_start(bytes, device) + "carve's " + pool_name(c.stack.pool) + " pool holds " +
                     torch_size(b.reserved.now()) + " reserved, " + torch_size(b.live.now()) + " of it in " +
                     std::to_string(b.live_blocks()) + " live blocks";
  const bool capped = c.stack.max_reserved != std::numeric_limits<std::size_t>::max();
  if (capped) {
    text += ", under its cap of " + torch_size(c.stack.max_reserved) + " (max_reserved)";
  }
  text += "; before refusing it gave back " + torch_size(released) +
          " of cached memory (empty_cache) and tried again. Free tensors that are no longer needed or lower "
          "the batch size";
  text += capped ? ", or raise max_reserved." : ".";
  return text;
}

// A request refused by a device whose context is broken (`fault`: the CUDA error every call now
// fails with). Not PyTorch's out-of-memory sentence, nor its words: freeing memory or a smaller
// batch cannot help, and the tools that shrink a batch must not retry.
std::string fault_refusal(int device, std::size_t bytes, const std::string& fault) {
  return fault + ". libcarve_torch could not serve " + torch_size(bytes) + " on GPU " + std::to_string(device) +
         ": the device fails every call since an earlier error (a kernel's illegal memory access, say), which is "
         "no shortage of memory; the process must start again.";
}

// Why `device` cannot serve anything, when its context is broken; empty while it answers.
std::string device_fault(int device) {
  if (config().backend == BackendKind::host) {
    return carve::torch::HostBackend::fault(device);
  }
#ifdef CARVE_TORCH_HAS_CUDA
  return carve::torch::CudaBackend::fault(device);
#else
  return {};
#endif
}

// A request from a stream that captures a CUDA graph with no private pool open for it.
std::string capture_refusal(int device, std::size_t bytes) {
  return "libcarve_torch: a CUDA graph capture on GPU " + std::to_string(device) + " asked for " + torch_size(bytes) +
         ", but no private pool is open for its stream, so carve cannot keep the graph's memory from the next "
         "allocation. PyTorch opens one through the allocator's pool hooks (set_begin_allocate_to_pool, PyTorch "
         "2.1 and later), which carve_gpu.torch.use() installs; with an older PyTorch, or a capture begun outside "
         "torch.cuda.graph, capture under PyTorch's own allocator.";
}

void append(std::string& json, const char* key, std::uint64_t value) {
  json += ",\"";
  json += key;
  json += "\":";
  json += std::to_string(value);
}

} // namespace

extern "C" {

void* carve_torch_malloc(ssize_t size, int device, cudaStream_t stream) {
  if (size <= 0) {
    (void)checked_config();
    return nullptr;
  }
  DeviceStack* s = stack(device);
  if (s == nullptr) { // no pool to ask: not out of memory, and no retry with less will help
    if (device >= 0 && device < max_devices) {
      registry().refused[slot(device)].fetch_add(1, std::memory_order_relaxed);
      const std::lock_guard lock(registry().build);
      last_refusal = registry().errors[slot(device)];
    } else {
      last_refusal = "libcarve_torch: no device " + std::to_string(device);
    }
    last_refusal += " (asked for " + torch_size(static_cast<std::size_t>(size)) + ")";
    return nullptr;
  }
  std::size_t released = 0;
  bool uncaptured = false;
  void* p = s->allocate(stream, static_cast<std::size_t>(size), &released, &uncaptured);
  if (p == nullptr) {
    const auto bytes = static_cast<std::size_t>(size);
    if (uncaptured) {
      last_refusal = capture_refusal(device, bytes);
    } else if (const std::string fault = device_fault(device); !fault.empty()) {
      last_refusal = fault_refusal(device, bytes, fault);
    } else {
      last_refusal = refusal(device, bytes, released, s->books(), checked_config());
    }
  }
  return p;
}

const char* carve_torch_last_refusal(void) { return last_refusal.empty() ? nullptr : last_refusal.c_str(); }

void carve_torch_free(void* ptr, ssize_t size, int device, cudaStream_t stream) {
  if (ptr == nullptr) {
    return;
  }
  DeviceStack* s = size > 0 ? stack(device) : nullptr;
  if (s == nullptr) {
    free_misuse(ptr, size, device, "no block of libcarve_torch on that device has this address and size");
  }
  const auto freed = s->deallocate(stream, ptr, static_cast<std::size_t>(size));
  if (freed) {
    return;
  }
  switch (freed.error()) {
  case Errc::not_allocated:
    free_misuse(ptr, size, device, "not a live block of libcarve_torch (never handed out, or freed already)");
  case Errc::invalid_size:
    free_misuse(ptr, size, device, "the block was allocated with another size");
  default:
    free_misuse(ptr, size, device, "the pool could not record the free (out of host memory)");
  }
}

void carve_torch_record_stream(void* ptr, cudaStream_t stream) {
  if (ptr == nullptr) {
    return;
  }
  for (int device = 0; device < max_devices; ++device) { // PyTorch names the block by address alone
    DeviceStack* s = existing_stack(device);
    if (s == nullptr) {
      continue;
    }
    const auto recorded = s->record_stream(ptr, stream);
    if (recorded) {
      return;
    }
    if (recorded.error() == carve::Errc::no_space) { // out of host memory: its free will not wait; say so
      std::fprintf(stderr,
                   "carve_torch_record_stream(%p): out of host memory; the block's free will not wait for "
                   "that stream\n",
                   ptr);
      return;
    }
  }
  std::fprintf(stderr,
               "carve_torch_record_stream(%p): not a live block of libcarve_torch (never handed out, freed already, "
               "or inside a block); nothing recorded\n",
               ptr);
}

void carve_torch_empty_cache(void) {
  (void)checked_config();
  Registry& r = registry();
  for (auto& slot : r.stacks) {
    if (DeviceStack* s = slot.load(std::memory_order_acquire)) {
      s->empty_cache();
    }
  }
}

void* carve_torch_base_allocation(void* ptr, size_t* size) {
  for (int device = 0; device < max_devices; ++device) {
    if (const DeviceStack* s = existing_stack(device)) {
      if (void* base = s->base_allocation(ptr, size)) {
        return base;
      }
    }
  }
  if (size != nullptr) {
    *size = 0;
  }
  return ptr;
}

int carve_torch_peer_access(const void* ptr, int device, int peer) {
  const DeviceStack* s = existing_stack(device);
  return s != nullptr && peer >= 0 && peer < max_devices ? s->access(ptr, peer) : -1;
}

const char* carve_torch_stats_json(int device) {
  thread_local std::string json;
  const Config& c = config();
  json = "{\"device\":" + std::to_string(device) + ",\"backend\":\"" +
         (c.backend == BackendKind::host ? "host" : "cuda") + "\",\"pool\":\"" + pool_name(c.stack.pool) + "\"";
  const DeviceStack* s = nullptr;
  std::string error = c.error;
  if (error.empty() && (device < 0 || device >= max_devices)) {
    error = "libcarve_torch: no device " + std::to_string(device);
  } else if (error.empty()) {
    Registry& r = registry();
    s = r.stacks[slot(device)].load(std::memory_order_acquire);
    if (s == nullptr) {
      const std::lock_guard lock(r.build);
      error = r.errors[slot(device)];
    }
  }
  static const carve::torch::Books unused;
  const carve::torch::Books& b = s != nullptr ? s->books() : unused;
  const auto load = [](const std::atomic<std::uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  append(json, "reserved_bytes", b.reserved.now());
  append(json, "peak_reserved_bytes", b.reserved.peak());
  append(json, "live_bytes", b.live.now());
  append(json, "peak_live_bytes", b.live.peak());
  append(json, "live_blocks", b.live_blocks());
  append(json, "mallocs", load(b.mallocs));
  append(json, "frees", load(b.frees));
  append(json, "device_calls", load(b.device_calls));
  append(json, "device_failures", load(b.device_failures));
  const std::uint64_t refused =
      device >= 0 && device < max_devices ? load(registry().refused[slot(device)]) : std::uint64_t{0};
  append(json, "failures", load(b.failures) + refused);
  const DeviceStack::MappingFigures mapping = s != nullptr ? s->mapping_figures() : DeviceStack::MappingFigures{};
  json += mapping.lending_refused ? ",\"lending_refused\":true" : ",\"lending_refused\":false";
  append(json, "lent_bytes", mapping.lent_bytes);
  append(json, "stream_waits", mapping.stream_waits);
  append(json, "refusals_served", mapping.refusals_served);
  json += c.stack.holes_home ? ",\"bring_holes_home\":true" : ",\"bring_holes_home\":false";
  for (const auto& [key, value] :
       {std::pair{"max_reserved_bytes", c.stack.max_reserved},
        std::pair{"idle_threshold_bytes", c.stack.idle_threshold}, std::pair{"max_chunk_bytes", c.stack.max_chunk},
        std::pair{"lend_min_bytes", c.stack.lend_min}}) {
    json += ",\"";
    json += key;
    json += value == std::numeric_limits<std::size_t>::max() ? "\":null" : "\":" + std::to_string(value);
  }
  if (!error.empty()) {
    json += ",\"error\":\"";
    for (const char ch : error) { // bytes of a setting echoed back need not be UTF-8: \u00XX keeps it JSON
      const auto byte = static_cast<unsigned char>(ch);
      if (ch == '"' || ch == '\\') {
        json += '\\';
      }
      if (byte >= 0x80) {
        constexpr const char* hex = "0123456789abcdef";
        json += "\\u00";
        json += hex[byte >> 4];
        json += hex[byte & 0xf];
      } else {
        json += byte < 0x20 ? ' ' : ch;
      }
    }
    json += '"';
  }
  json += '}';
  return json.c_str();
}

void carve_torch_guard_captures(int on) {
  // Under the builders' lock: a stack being built reads the flag before it is published, and
  // must not read the old one and then miss this loop.
  const std::lock_guard lock(registry().build);
  guard_captures_on().store(on != 0, std::memory_order_relaxed);
  for (auto& slot : registry().stacks) {
    if (DeviceStack* s = slot.load(std::memory_order_acquire)) {
      s->guard_captures(on != 0);
    }
  }
}

void carve_torch_reset_peak(int device) {
  if (device >= 0 && device < max_devices) {
    if (DeviceStack* s = registry().stacks[slot(device)].load(std::memory_order_acquire)) {
      s->reset_peak();
    }
  }
}

const char* carve_torch_config_error(void) {
  const Config& c = config();
  return c.error.empty() ? nullptr : c.error.c_str();
}

void carve_torch_host_stream_enqueue(cudaStream_t stream) {
  if (config().backend == BackendKind::host) {
    carve::torch::HostStreamTable::instance().enqueue(reinterpret_cast<std::uintptr_t>(stream));
  }
}

void carve_torch_host_stream_complete(cudaStream_t stream) {
  if (config().backend == BackendKind::host) {
    carve::torch::HostStreamTable::instance().complete(reinterpret_cast<std::uintptr_t>(stream));
  }
}

void carve_torch_host_device_fault(const char* message) {
  if (config().backend == BackendKind::host) {
    carve::torch::HostBackend::set_fault(message != nullptr ? message : "");
  }
}

void carve_torch_host_stream_capturing(cudaStream_t stream, int capturing) {
  if (config().backend == BackendKind::host) {
    using Capture = carve::torch::HostStreamTable::Capture;
    carve::torch::HostStreamTable::instance().set_capture(reinterpret_cast<std::uintptr_t>(stream),
                                                          capturing == 2   ? Capture::invalidated
                                                          : capturing != 0 ? Capture::active
                                                                           : Capture::none);
  }
}

// The graph hooks: PyTorch calls them from C++, where an exception is its own to report (it
// becomes a RuntimeError in the Python call that began the capture).
void carve_torch_begin_allocate_to_pool(int device, carve_torch_pool_id pool,
                                        std::function<bool(cudaStream_t)> filter) {
  DeviceStack* s = stack(device);
  if (s == nullptr) {
    throw std::runtime_error("libcarve_torch: cannot capture a CUDA graph on GPU " + std::to_string(device) +
                             ": it has no carve pool");
  }
  const std::uint64_t number = s->begin_capture(carve::PrivatePoolId{pool.first, pool.second}, std::move(filter));
  begun_captures = BegunCaptures{begun_captures.count + 1, device, pool, number};
}

void carve_torch_end_allocate_to_pool(int device, carve_torch_pool_id pool) {
  if (DeviceStack* s = existing_stack(device)) {
    s->end_capture(carve::PrivatePoolId{pool.first, pool.second});
  }
}

void carve_torch_release_pool(int device, carve_torch_pool_id pool) {
  if (WatchedRelease& w = watched_release; w.watching && w.device == device && w.pool == pool) {
    w.released = true;
  }
  if (DeviceStack* s = existing_stack(device)) {
    s->release_pool(carve::PrivatePoolId{pool.first, pool.second});
  }
}

// PyTorch 2.1 names the capturing stream itself, and ends a capture by its stream (the oldest
// under way on it, as its own allocator does).
void carve_torch_begin_allocate_stream_to_pool(int device, cudaStream_t stream, carve_torch_pool_id pool) {
  carve_torch_begin_allocate_to_pool(device, pool, [stream](cudaStream_t s) { return s == stream; });
  const std::lock_guard lock(stream_pools().mutex);
  stream_pools().of.push_back({device, stream, begun_captures.number});
}

void carve_torch_end_allocate_stream_to_pool(int device, cudaStream_t stream) {
  std::optional<std::uint64_t> number;
  {
    const std::lock_guard lock(stream_pools().mutex);
    auto& of = stream_pools().of;
    if (const auto it =
            std::find_if(of.begin(), of.end(), [&](const auto& e) { return e.device == device && e.stream == stream; });
        it != of.end()) {
      number = it->number;
      of.erase(it);
    }
  }
  if (DeviceStack* s = existing_stack(device); s != nullptr && number) {
    s->end_begun_capture(*number);
  }
}

unsigned long long carve_torch_captures_begun(int* device, unsigned long long* pool_first,
                                              unsigned long long* pool_second, unsigned long long* number) {
  const BegunCaptures& b = begun_captures;
  if (device != nullptr) {
    *device = b.device;
  }
  if (pool_first != nullptr) {
    *pool_first = b.pool.first;
  }
  if (pool_second != nullptr) {
    *pool_second = b.pool.second;
  }
  if (number != nullptr) {
    *number = b.number;
  }
  return b.count;
}

int carve_torch_stream_in_capture(cudaStream_t stream) {
  if (config().backend == BackendKind::host) {
    return carve::torch::HostBackend::in_capture(stream) ? 1 : 0;
  }
#ifdef CARVE_TORCH_HAS_CUDA
  return carve::torch::CudaBackend::in_capture(stream) ? 1 : 0;
#else
  return 0;
#endif
}

int carve_torch_end_failed_capture(int device, unsigned long long number) {
  DeviceStack* s = existing_stack(device);
  if (s == nullptr || !s->end_begun_capture(number)) {
    return 0;
  }
  const std::lock_guard lock(stream_pools().mutex); // a PyTorch 2.1 capture: its stream names it no more
  std::erase_if(stream_pools().of, [&](const auto& e) { return e.device == device && e.number == number; });
  return 1;
}

void carve_torch_watch_release(int device, unsigned long long pool_first, unsigned long long pool_second) {
  watched_release = WatchedRelease{true, false, device, carve_torch_pool_id{pool_first, pool_second}};
}

int carve_torch_watched_release(void) {
  const bool released = watched_release.released;
  watched_release = WatchedRelease{};
  return released ? 1 : 0;
}

void carve_torch_release_failed_capture(int device, unsigned long long pool_first, unsigned long long pool_second) {
  carve_torch_release_pool(device, carve_torch_pool_id{pool_first, pool_second});
}

} // extern "C"
