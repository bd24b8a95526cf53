/// @file carve/mr/address_only_card.hpp
/// A card that hands out addresses and backs no bytes: for replaying a program's allocations
/// through pools on a machine smaller than the program's GPU.
///
/// @code
/// carve::AddressOnlyCard card(80ull << 30);          // an 80 GiB card, on a laptop
/// carve::CachingPool pool(card);                     // a pool over it, as over cudaMalloc
/// void* p = *pool.try_allocate(20ull << 30, 256);    // a real, unique address; touching it faults
/// card.used_bytes();                                 // what the card has given out
/// @endcode
///
/// Its addresses come from one range reserved with no access (PROT_NONE, MAP_NORESERVE): twice the
/// capacity, because on a GPU a large cudaMalloc is mapped from pages anywhere, so only the bytes
/// count, and here the addresses must not be what runs out first. Twice is room for any history
/// short of one whose free holes (with the 2 MiB alignment of large blocks) pass the capacity
/// itself; a request refused for want of an address range then is refused as no_space all the
/// same, so a replay that fragments addresses that badly reads as needing a larger card. They are unique in the
/// process and fault if anything touches them, so a replay that reads or writes a block it was
/// given stops at once instead of corrupting memory. Nothing is ever backed: a replay of a
/// 60 GiB trace costs the bookkeeping alone.
///
/// What a request takes of the capacity is what cudaMalloc takes of a GPU: requests of a large
/// page or more are rounded up to whole pages (2 MiB) and start on one, smaller ones are rounded to
/// 512 bytes (the driver packs them into shared pages). calls() counts allocations and frees: each one a device call
/// that a pool over a real card would make.
///
/// An UpstreamResource, owning its memory (owns) and checking deallocations (try_deallocate).
/// Copies are handles to the same card and compare equal; thread-safe (one lock).
#pragma once

#include <carve/core/checked_math.hpp>
#include <carve/core/error.hpp>
#include <carve/core/misuse.hpp>
#include <carve/core/os_page_size.hpp>
#include <carve/mr/best_fit_ranges.hpp>
#include <carve/mr/cuda_mr.hpp>
#include <carve/mr/detail/block_lookup.hpp>
#include <carve/mr/memory_resource.hpp>

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>

namespace carve {

/// How an AddressOnlyCard counts a request against its capacity.
struct CardRounding {
  std::size_t granularity = 512; ///< small requests are rounded to this (a power of two)
  std::size_t large_page = std::size_t{2}
                           << 20; ///< requests of this much or more, to whole pages of it (a multiple of granularity)
};

/// A card of `capacity` bytes of addresses with nothing behind them (see the file's description).
class AddressOnlyCard : public CcclSpellings<AddressOnlyCard> {
public:
  /// A new, empty card; copies share it. Throws carve::Exception: invalid_argument for a zero
  /// capacity or a rounding whose granularity is not a power of two or whose page is not a
  /// multiple of it; no_space when the system refuses twice the capacity of addresses.
  explicit AddressOnlyCard(std::size_t capacity, CardRounding rounding = {})
      : state_(std::make_shared<State>(capacity, rounding)) {
    const std::size_t g = rounding.granularity;
    if (capacity == 0 || g == 0 || (g & (g - 1)) != 0 || rounding.large_page == 0 || rounding.large_page % g != 0) {
      throw Exception(
          Errc::invalid_argument,
          "carve::AddressOnlyCard: a capacity of " + std::to_string(capacity) + " bytes, granularity " +
              std::to_string(g) + " and large page " + std::to_string(rounding.large_page) +
              " (want a positive capacity, a power-of-two granularity and a page that is a multiple of it)");
    }
    const std::size_t align = std::max(rounding.large_page, os_page_size());
    const auto span = checked_mul(capacity, std::size_t{2});
    const std::size_t rounded = span ? round_up(*span, align) : 0;
    const auto with_slack = rounded != 0 ? checked_add(rounded, align) : cuda::std::nullopt;
    void* raw = with_slack ? ::mmap(nullptr, *with_slack, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
                           : MAP_FAILED;
    if (raw == MAP_FAILED) {
      throw Exception(Errc::no_space, "carve::AddressOnlyCard: cannot reserve addresses for a card of " +
                                          std::to_string(capacity) +
                                          " bytes: " + (with_slack ? std::strerror(errno) : "too large"));
    }
    state_->mapping = raw;
    state_->mapping_bytes = *with_slack;
    const auto start = reinterpret_cast<std::uintptr_t>(raw);
    const std::uintptr_t base = (start + align - 1) & ~std::uintptr_t{align - 1};
    state_->free = BestFitRanges(base, rounded);
  }

  /// Addresses for `bytes`. Errors: invalid_size (check_request, or a size that overflows when
  /// rounded); no_space when the rounded
  /// request would pass the capacity, or the alignment cannot be met.
  [[nodiscard]] cuda::std::expected<void*, Errc> try_allocate(std::size_t bytes, std::size_t alignment) noexcept {
    if (const auto ok = check_request(bytes, alignment); !ok) {
      return cuda::std::unexpected(ok.error());
    }
    const std::size_t size = taken(bytes);
    if (size == 0) { // overflows when rounded: no resource could serve it
      return cuda::std::unexpected(Errc::invalid_size);
    }
    try {
      const std::lock_guard lock(state_->mutex);
      if (size > state_->capacity - state_->used) {
        ++state_->refusals;
        return cuda::std::unexpected(Errc::no_space);
      }
      const std::size_t unit =
          bytes >= state_->rounding.large_page ? state_->rounding.large_page : state_->rounding.granularity;
      const auto taken = state_->free.take(size, std::max(alignment, unit));
      if (!taken) {
        ++state_->refusals;
        return cuda::std::unexpected(Errc::no_space);
      }
      try {
        state_->live.emplace(taken->start, taken->handle);
      } catch (const std::bad_alloc&) {
        state_->free.give(taken->handle);
        throw;
      }
      state_->used += size;
      state_->peak = std::max(state_->peak, state_->used);
      ++state_->calls;
      return reinterpret_cast<void*>(taken->start);
    } catch (const std::bad_alloc&) {
      return cuda::std::unexpected(Errc::no_space);
    }
  }

  /// Errors (nothing changes): not_allocated for an address it never gave or gave back already;
  /// invalid_size when `bytes` does not round to what was taken.
  [[nodiscard]] cuda::std::expected<void, Errc> try_deallocate(void* p, std::size_t bytes,
                                                               std::size_t alignment) noexcept {
    if (!check_request(bytes, alignment)) {
      return cuda::std::unexpected(Errc::invalid_size);
    }
    const std::lock_guard lock(state_->mutex);
    const auto it = state_->live.find(reinterpret_cast<std::uintptr_t>(p));
    if (it == state_->live.end()) {
      return cuda::std::unexpected(Errc::not_allocated);
    }
    const std::size_t size = state_->free.size(it->second);
    if (taken(bytes) != size) {
      return cuda::std::unexpected(Errc::invalid_size);
    }
    try {
      state_->free.give(it->second);
    } catch (const std::bad_alloc&) {
      return cuda::std::unexpected(Errc::no_space); // the free ranges could not grow: still allocated
    }
    state_->used -= size;
    state_->live.erase(it);
    ++state_->calls;
    return {};
  }

  /// Misuse ends the program with a message (see try_deallocate).
  void deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept {
    if (const auto r = try_deallocate(p, bytes, alignment); !r) {
      report_misuse("carve::AddressOnlyCard::deallocate", p, bytes, r.error());
    }
  }

  /// What a request of `bytes` takes of the capacity (0 when that overflows).
  std::size_t taken(std::size_t bytes) const noexcept {
    const CardRounding& r = state_->rounding;
    return round_up(bytes, bytes >= r.large_page ? r.large_page : r.granularity);
  }

  /// Whether `p` lies in an allocation it handed out.
  bool owns(const void* p) const noexcept {
    const std::lock_guard lock(state_->mutex);
    return detail::block_containing(state_->live, p, [&](BestFitRanges::Handle h) { return state_->free.size(h); }) !=
           state_->live.end();
  }

  /// The card's size.
  std::size_t capacity() const noexcept { return state_->capacity; }
  /// Bytes taken now.
  std::size_t used_bytes() const noexcept {
    const std::lock_guard lock(state_->mutex);
    return state_->used;
  }
  /// Bytes left.
  std::size_t free_bytes() const noexcept {
    const std::lock_guard lock(state_->mutex);
    return state_->capacity - state_->used;
  }
  /// The most bytes taken at once.
  std::size_t peak_used_bytes() const noexcept {
    const std::lock_guard lock(state_->mutex);
    return state_->peak;
  }
  /// Live allocations.
  std::size_t allocation_count() const noexcept {
    const std::lock_guard lock(state_->mutex);
    return state_->live.size();
  }
  /// Allocations and frees so far: the device calls a pool over it made.
  std::uint64_t calls() const noexcept {
    const std::lock_guard lock(state_->mutex);
    return state_->calls;
  }
  /// Requests refused for want of capacity.
  std::uint64_t refusals() const noexcept {
    const std::lock_guard lock(state_->mutex);
    return state_->refusals;
  }

  /// Equal when both are handles to the same card.
  friend bool operator==(const AddressOnlyCard& a, const AddressOnlyCard& b) noexcept { return a.state_ == b.state_; }

private:
  struct State {
    State(std::size_t c, CardRounding r) : capacity(c), rounding(r) {}
    State(const State&) = delete;
    State& operator=(const State&) = delete;
    ~State() {
      if (mapping != nullptr) {
        ::munmap(mapping, mapping_bytes);
      }
    }
    std::size_t capacity;
    CardRounding rounding;
    mutable std::mutex mutex;
    void* mapping = nullptr;
    std::size_t mapping_bytes = 0;
    BestFitRanges free;
    std::map<std::uintptr_t, BestFitRanges::Handle> live; ///< start -> its range
    std::size_t used = 0;
    std::size_t peak = 0;
    std::uint64_t calls = 0;
    std::uint64_t refusals = 0;
  };

  std::shared_ptr<State> state_;
};

static_assert(UpstreamResource<AddressOnlyCard> && OwnsMemory<AddressOnlyCard> && ChecksDeallocation<AddressOnlyCard>);
static_assert(SynchronousResource<AddressOnlyCard>);

} // namespace carve
