/// @file carve/mr/simulated_card.hpp
/// A GPU card's memory played by host memory with a fixed capacity.
///
/// @code
/// carve::SimulatedCard card(64 << 20);   // a "card" with 64 MiB
/// auto p = card.try_allocate(1 << 20, 256);   // expected<void*, Errc>
/// @endcode
///
/// For tests, demos and planning on machines without GPUs: allocations are real host memory
/// (so sanitizers see misuse), counted against the capacity. Copies are handles to the same
/// card (like two references to one device), and compare equal. Thread-safe.
#pragma once

#include <carve/mr/byte_budget.hpp>
#include <carve/mr/cuda_mr.hpp>
#include <carve/mr/memory_resource.hpp>

#include <cstddef>
#include <new>

namespace carve {

/// A card of `capacity_bytes` of host memory: an UpstreamResource for tests and planning.
class SimulatedCard : public CcclSpellings<SimulatedCard> {
public:
  /// A new, empty card; copies share it.
  explicit SimulatedCard(std::size_t capacity_bytes) : budget_(capacity_bytes) {}

  /// Errors: invalid_size (0 bytes, an alignment that is not a power of two); no_space (the card
  /// is full, or the host itself is out of memory).
  [[nodiscard]] cuda::std::expected<void*, Errc> try_allocate(std::size_t bytes, std::size_t alignment) noexcept {
    if (const auto ok = check_request(bytes, alignment); !ok) {
      return cuda::std::unexpected(ok.error());
    }
    if (!budget_.take(bytes)) {
      return cuda::std::unexpected(Errc::no_space);
    }
    void* p = ::operator new (bytes, std::align_val_t{alignment}, std::nothrow);
    if (p == nullptr) {
      budget_.give_back(bytes);
      return cuda::std::unexpected(Errc::no_space);
    }
    return p;
  }

  /// Frees what try_allocate gave, with the same bytes and alignment.
  void deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept {
    ::operator delete (p, std::align_val_t{alignment});
    budget_.give_back(bytes);
  }

  /// The card's size.
  std::size_t capacity() const noexcept { return budget_.capacity(); }
  /// Bytes allocated now.
  std::size_t used_bytes() const noexcept { return budget_.used_bytes(); }
  /// Bytes left.
  std::size_t free_bytes() const noexcept { return budget_.free_bytes(); }
  /// Live allocations.
  std::size_t allocation_count() const noexcept { return budget_.allocation_count(); }

  /// Equal when both are handles to the same card.
  friend bool operator==(const SimulatedCard& a, const SimulatedCard& b) noexcept { return a.budget_ == b.budget_; }

#if defined(CARVE_HAS_CUDA_MR)
  /// Its memory is host memory.
  friend constexpr void get_property(const SimulatedCard&, cuda::mr::host_accessible) noexcept {}
#endif

private:
  ByteBudget budget_;
};

static_assert(MemoryResource<SimulatedCard> && UpstreamResource<SimulatedCard>);
static_assert(SynchronousResource<SimulatedCard>);
static_assert(detail::cccl_accepts<SimulatedCard>());
#if defined(CARVE_HAS_CUDA_MR)
static_assert(SynchronousResourceWith<SimulatedCard, cuda::mr::host_accessible>);
#endif

} // namespace carve
