/// @file carve/mr/as_pmr.hpp
/// Any carve resource as a std::pmr::memory_resource, so the standard
/// library's pmr containers allocate from it.
///
/// @code
/// carve::CachingPool pool(carve::SimulatedCard(64 << 20));
/// auto pmr = carve::as_pmr(pool);                  // refers to pool; does not copy it
/// std::pmr::vector<int> v(&pmr);                   // v's storage comes from the pool
/// @endcode
///
/// The adaptor refers to the resource, which must outlive it (and every container using it).
/// do_allocate throws carve::Exception (which the pmr contract allows: any exception) with the
/// resource's error: no_space when it has no room, invalid_size for a request no resource could
/// serve; a request for 0 bytes is served as 1 byte, since pmr allows it and carve
/// resources do not. Two adaptors are equal when they refer to the same resource. Host-only.
#pragma once

#include <carve/core/error.hpp>
#include <carve/mr/memory_resource.hpp>

#include <cstddef>
#include <memory_resource>
#include <string>

namespace carve {

/// A std::pmr::memory_resource that allocates from a carve resource `R` it refers to.
template <MemoryResource R>
class PmrResource final : public std::pmr::memory_resource {
public:
  /// Allocates from `resource`, which must outlive the adaptor.
  explicit PmrResource(R& resource) noexcept : r_(&resource) {}

  /// The resource referred to.
  R& resource() const noexcept { return *r_; }

private:
  void* do_allocate(std::size_t bytes, std::size_t alignment) override {
    const auto p = r_->try_allocate(bytes == 0 ? 1 : bytes, alignment);
    if (p) {
      return *p;
    }
    detail::throw_allocation_failure("carve::PmrResource", p.error(), bytes, alignment);
  }
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment) override {
    r_->deallocate(p, bytes == 0 ? 1 : bytes, alignment);
  }
  bool do_is_equal(const std::pmr::memory_resource& other) const noexcept override {
    const auto* o = dynamic_cast<const PmrResource*>(&other);
    return o != nullptr && o->r_ == r_;
  }

  R* r_;
};

/// A std::pmr::memory_resource that allocates from `resource`.
template <MemoryResource R>
PmrResource<R> as_pmr(R& resource) noexcept {
  return PmrResource<R>(resource);
}

} // namespace carve
