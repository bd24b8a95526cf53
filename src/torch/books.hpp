// src/torch/books.hpp — what libcarve_torch counts for one device, and the two thin layers that
// count what a pool takes from the device: CountingMapper (under ExpandablePool: physical memory
// mapped and unmapped) and CountingUpstream (under the caching pools: segments from the device,
// which it also keeps by address).
//
// The counts are atomics, so stats and the peaks are read and reset without the pools' locks, and
// the pools' own hot paths take no extra lock. Peaks are resettable (carve_torch_reset_peak), as
// PyTorch's reset_peak_memory_stats resets its own.
#pragma once

#include <carve/core/error.hpp>
#include <carve/mr/cuda_mr.hpp>
#include <carve/mr/memory_resource.hpp>
#include <carve/vmm/physical_memory_mapper.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <new>

namespace carve::torch {

// The device memory a caching stack took from cudaMalloc, by base address: PyTorch's
// getBaseAllocation asks which allocation holds a block, since CUDA exports only whole allocations
// to another process (cudaIpcGetMemHandle) and the block's offset travels beside the handle.
class Segments {
public:
  // False when the host cannot hold one more entry.
  bool add(const void* base, std::size_t bytes) noexcept {
    try {
      const std::lock_guard lock(mutex_);
      by_base_[reinterpret_cast<std::uintptr_t>(base)] = bytes;
      return true;
    } catch (const std::exception&) {
      return false;
    }
  }
  void remove(const void* base) noexcept {
    const std::lock_guard lock(mutex_);
    by_base_.erase(reinterpret_cast<std::uintptr_t>(base));
  }
  // The base of the segment holding `p` and, in `bytes`, its size; null when none does.
  void* holding(const void* p, std::size_t* bytes) const noexcept {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    const std::lock_guard lock(mutex_);
    auto it = by_base_.upper_bound(a); // the first segment past `a`: the one before may hold it
    if (it == by_base_.begin()) {
      return nullptr;
    }
    --it;
    if (a - it->first >= it->second) {
      return nullptr;
    }
    if (bytes != nullptr) {
      *bytes = it->second;
    }
    return reinterpret_cast<void*>(it->first);
  }

private:
  mutable std::mutex mutex_;
  std::map<std::uintptr_t, std::size_t> by_base_;
};

// A byte count with a resettable peak.
class PeakCounter {
public:
  void add(std::size_t bytes) noexcept {
    const std::size_t now = now_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    std::size_t peak = peak_.load(std::memory_order_relaxed);
    while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
    }
  }
  void sub(std::size_t bytes) noexcept { now_.fetch_sub(bytes, std::memory_order_relaxed); }
  std::size_t now() const noexcept { return now_.load(std::memory_order_relaxed); }
  std::size_t peak() const noexcept { return peak_.load(std::memory_order_relaxed); }
  void reset_peak() noexcept { peak_.store(now(), std::memory_order_relaxed); }

private:
  std::atomic<std::size_t> now_{0};
  std::atomic<std::size_t> peak_{0};
};

// One device's counts.
struct Books {
  PeakCounter live;                                          // bytes in blocks handed out (each rounded to 512)
  PeakCounter reserved;                                      // device memory the pool holds
  std::atomic<std::uint64_t> mallocs{0};                     // successful carve_torch_malloc calls
  std::atomic<std::uint64_t> frees{0};                       // carve_torch_free calls
  std::atomic<std::uint64_t> device_calls{0};                // calls that change what the device holds
  std::atomic<std::uint64_t> device_failures{0};             // such calls the device refused
  std::atomic<std::uint64_t> failures{0};                    // carve_torch_malloc calls that returned null
  std::size_t cap = std::numeric_limits<std::size_t>::max(); // the most `reserved` may reach
  Segments segments;                                         // what CountingUpstream took, by base

  // Blocks handed out and not freed: read while other threads allocate and free, so the two
  // counts may be of different moments; never below 0.
  std::uint64_t live_blocks() const noexcept {
    const std::uint64_t out = frees.load(std::memory_order_relaxed);
    const std::uint64_t in = mallocs.load(std::memory_order_relaxed);
    return in > out ? in - out : 0;
  }
};

inline void count(std::atomic<std::uint64_t>& c) noexcept { c.fetch_add(1, std::memory_order_relaxed); }

// A PhysicalMemoryMapper that counts, in a Books, the memory it holds and the calls that create, map
// and unmap it (what ExpandablePoolStats::device_calls counts). Memory is counted from its create to
// its handle's release, which OnDemandReservation makes when it unmaps the chunk, not by mapping:
// a hole lent to another block is one memory mapped twice. Copies share the Books.
template <PhysicalMemoryMapper Mapper>
class CountingMapper {
public:
  using physical_handle = typename Mapper::physical_handle;
  static constexpr ExportKind export_kind = Mapper::export_kind;

  CountingMapper(Mapper mapper, Books* books)
      : m_(std::move(mapper)), books_(books), sizes_(std::make_shared<HandleSizes>()) {}

  Result<std::size_t> granularity(int device) const { return m_.granularity(device); }
  Result<physical_handle> create(int device, std::size_t bytes) {
    auto h = counted(m_.create(device, bytes));
    if (h) {
      try {
        const std::lock_guard lock(sizes_->mutex);
        sizes_->bytes.emplace(*h, bytes);
      } catch (const std::bad_alloc&) {
        (void)m_.release(*h);
        return fail(Errc::no_space, "out of memory for the allocator's books");
      }
      books_->reserved.add(bytes);
    }
    return h;
  }
  Result<int> export_fd(physical_handle h) { return m_.export_fd(h); }
  Result<physical_handle> import_fd(int fd) { return m_.import_fd(fd); }
  Result<void> release(physical_handle h) {
    auto r = m_.release(h);
    const std::lock_guard lock(sizes_->mutex);
    if (const auto it = sizes_->bytes.find(h); r && it != sizes_->bytes.end()) {
      books_->reserved.sub(it->second);
      sizes_->bytes.erase(it);
    }
    return r;
  }
  Result<void*> reserve(std::size_t bytes, std::size_t alignment) { return m_.reserve(bytes, alignment); }
  Result<void> free_reservation(void* va, std::size_t bytes) { return m_.free_reservation(va, bytes); }
  Result<void> map(void* va, std::size_t bytes, physical_handle h, std::size_t offset = 0) {
    return counted(m_.map(va, bytes, h, offset));
  }
  Result<void> unmap(void* va, std::size_t bytes) { return counted(m_.unmap(va, bytes)); }
  Result<void> set_access(void* va, std::size_t bytes, int device, Access access) {
    return m_.set_access(va, bytes, device, access);
  }
  Result<Access> access(const void* va, int device) const { return m_.access(va, device); }
  // The driver's answer, passed on: a pool over this mapper must not lend where the driver refuses.
  Result<bool> maps_partial_allocations(int device) requires TellsPartialMaps<Mapper> {
    return m_.maps_partial_allocations(device);
  }

private:
  template <class R>
  R counted(R r) {
    count(r ? books_->device_calls : books_->device_failures);
    return r;
  }
  struct HandleSizes {
    std::mutex mutex;
    std::map<physical_handle, std::size_t> bytes; // what each handle created holds
  };
  Mapper m_;
  Books* books_;
  std::shared_ptr<HandleSizes> sizes_;
};

// An upstream byte resource that counts, in a Books, the segments a pool takes and gives back,
// and refuses what would take the device's memory past Books::cap. Copies share the resource and
// the Books (the resource must outlive them).
template <UpstreamResource Upstream>
class CountingUpstream : public CcclSpellings<CountingUpstream<Upstream>> {
public:
  CountingUpstream(Upstream* upstream, Books* books) noexcept : u_(upstream), books_(books) {}

  cuda::std::expected<void*, Errc> try_allocate(std::size_t bytes, std::size_t alignment) noexcept {
    if (bytes > books_->cap || books_->reserved.now() > books_->cap - bytes) {
      count(books_->device_failures);
      return cuda::std::unexpected(Errc::no_space);
    }
    auto p = u_->try_allocate(bytes, alignment);
    count(p ? books_->device_calls : books_->device_failures);
    if (p && !books_->segments.add(*p, bytes)) { // a segment carve could not name is not handed out
      u_->deallocate(*p, bytes, alignment);
      count(books_->device_calls);
      return cuda::std::unexpected(Errc::no_space);
    }
    if (p) {
      books_->reserved.add(bytes);
    }
    return p;
  }
  void deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept {
    books_->segments.remove(p);
    u_->deallocate(p, bytes, alignment);
    count(books_->device_calls);
    books_->reserved.sub(bytes);
  }
  std::size_t free_bytes() const {
    const std::size_t held = books_->reserved.now();
    const std::size_t below_cap = books_->cap > held ? books_->cap - held : 0;
    const std::size_t free = u_->free_bytes();
    return free < below_cap ? free : below_cap;
  }
  std::size_t capacity() const { return u_->capacity() < books_->cap ? u_->capacity() : books_->cap; }
  friend bool operator==(const CountingUpstream& a, const CountingUpstream& b) noexcept { return a.u_ == b.u_; }

private:
  Upstream* u_;
  Books* books_;
};

} // namespace carve::torch
