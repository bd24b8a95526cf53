// The device under a replayed allocator, counted and timed: every call it takes is a device call
// (cudaMalloc, cuMemCreate, ...), whose count the replay reports and whose time it takes out of
// the allocator's own cost per request, so that what is compared is bookkeeping alone.
#pragma once

#include <carve/mr/address_only_card.hpp>
#include <carve/vmm/physical_memory_mapper.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <utility>

namespace carve::replay {

// Time spent in device calls, shared by the copies of a timed part (pools copy their upstream).
struct DeviceClock {
  std::uint64_t ns = 0;

  // Runs `call`, adding its duration.
  template <class Call>
  auto time(Call&& call) {
    const auto start = std::chrono::steady_clock::now();
    auto result = std::forward<Call>(call)();
    ns += static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count());
    return result;
  }
};

// An AddressOnlyCard whose calls are timed: the cudaMalloc/cudaFree under a replayed pool.
class TimedCard {
public:
  TimedCard(AddressOnlyCard card, std::shared_ptr<DeviceClock> clock)
      : card_(std::move(card)), clock_(std::move(clock)) {}

  cuda::std::expected<void*, Errc> try_allocate(std::size_t bytes, std::size_t alignment) noexcept {
    return clock_->time([&] { return card_.try_allocate(bytes, alignment); });
  }
  void deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept {
    clock_->time([&] {
      card_.deallocate(p, bytes, alignment);
      return 0;
    });
  }
  std::size_t free_bytes() const noexcept { return card_.free_bytes(); }
  std::size_t capacity() const noexcept { return card_.capacity(); }
  const AddressOnlyCard& card() const noexcept { return card_; }
  friend bool operator==(const TimedCard& a, const TimedCard& b) noexcept { return a.card_ == b.card_; }

private:
  AddressOnlyCard card_;
  std::shared_ptr<DeviceClock> clock_;
};

static_assert(UpstreamResource<TimedCard>);

// A PhysicalMemoryMapper whose calls are timed: the driver under a replayed ExpandablePool.
template <PhysicalMemoryMapper Mapper>
class TimedMapper {
public:
  using physical_handle = typename Mapper::physical_handle;
  static constexpr ExportKind export_kind = Mapper::export_kind;

  TimedMapper(Mapper mapper, std::shared_ptr<DeviceClock> clock)
      : mapper_(std::move(mapper)), clock_(std::move(clock)) {}

  Result<std::size_t> granularity(int device) const { return mapper_.granularity(device); }
  Result<physical_handle> create(int device, std::size_t bytes) {
    return clock_->time([&] { return mapper_.create(device, bytes); });
  }
  Result<int> export_fd(physical_handle h) { return mapper_.export_fd(h); }
  Result<physical_handle> import_fd(int fd) { return mapper_.import_fd(fd); }
  Result<void> release(physical_handle h) {
    return clock_->time([&] { return mapper_.release(h); });
  }
  Result<void*> reserve(std::size_t bytes, std::size_t alignment) {
    return clock_->time([&] { return mapper_.reserve(bytes, alignment); });
  }
  Result<void> free_reservation(void* va, std::size_t bytes) {
    return clock_->time([&] { return mapper_.free_reservation(va, bytes); });
  }
  Result<void> map(void* va, std::size_t bytes, physical_handle h, std::size_t offset = 0) {
    return clock_->time([&] { return mapper_.map(va, bytes, h, offset); });
  }
  Result<void> unmap(void* va, std::size_t bytes) {
    return clock_->time([&] { return mapper_.unmap(va, bytes); });
  }
  Result<void> set_access(void* va, std::size_t bytes, int device, Access access) {
    return clock_->time([&] { return mapper_.set_access(va, bytes, device, access); });
  }
  Result<Access> access(void* va, int device) const { return mapper_.access(va, device); }
  // The mapper's answer, passed on: the replay lends where the card would.
  Result<bool> maps_partial_allocations(int device) requires TellsPartialMaps<Mapper> {
    return mapper_.maps_partial_allocations(device);
  }

private:
  Mapper mapper_;
  std::shared_ptr<DeviceClock> clock_;
};

} // namespace carve::replay
