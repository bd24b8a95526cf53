/// @file carve/slot/allocator/dynamic_slot_allocator.hpp
/// SlotAllocator with the number of slots chosen at run time.
///
/// @code
/// carve::DynamicSlotAllocator<carve::FirstFit> pages(device_bytes / page_size);
/// auto r = pages.allocate(16);           // expected<SlotRange, Errc>, exactly as SlotAllocator
/// @endcode
///
/// For slot spaces whose size is only known once a program runs and may be large: a GPU's pages
/// (millions of them), a device's SMs. The words follow SlotBitmap's layout (slot s is bit s % 64 of
/// word s / 64, 1 = free, bits past the last slot zero) and every search is the fit policy's
/// `find_in` over them (WordSearchingFitPolicy), so placement is the same code SlotBitmap uses.
/// Errors and guarantees are SlotAllocator's: a failed call returns an Errc and changes nothing.
/// Host-only (the words live in a std::vector); not synchronised.
#pragma once

#include <carve/core/bits.hpp>
#include <carve/core/error.hpp>
#include <carve/slot/allocator/slot_source.hpp>
#include <carve/slot/policy/boundary_nearest_fit.hpp>
#include <carve/slot/policy/fit_policy.hpp>
#include <carve/slot/policy/hinted_fit_policy.hpp>
#include <carve/slot/search/free_runs.hpp>
#include <carve/slot/storage/slot_bitmap.hpp>
#include <carve/slot/storage/slot_range.hpp>

#include <cuda/std/expected>
#include <cuda/std/span>

#include <cstdint>
#include <string>
#include <vector>

namespace carve {

/// A run-time number of slots under policy `Fit` (a WordSearchingFitPolicy); host only, one owner.
template <class Fit = BoundaryNearestFit>
class DynamicSlotAllocator {
  static_assert(
      !requires { typename Fit::template for_slots<1>; } && !RemembersPlacements<Fit>,
      "DynamicSlotAllocator picks its size at run time and never reports placements to its policy, so "
      "a policy sized at compile time that remembers its placements (such as ReleaseAlignedFit) cannot "
      "serve it: use SlotAllocator<N, Fit>");
  static_assert(WordSearchingFitPolicy<Fit>,
                "DynamicSlotAllocator searches its words through the policy's find_in (WordSearchingFitPolicy)");

public:
  /// The policy object.
  using policy_type = Fit;

  /// All `slots` free. Throws carve::Exception (invalid_argument) for 0 slots or more than max_slots.
  explicit DynamicSlotAllocator(std::uint32_t slots, Fit fit = {}) : slots_(slots), fit_(fit) {
    if (slots == 0 || slots > max_slots) {
      throw Exception(Errc::invalid_argument,
                      "carve::DynamicSlotAllocator: " + std::to_string(slots) + " slots; need 1 to 2^31");
    }
    words_.resize(bits::word_count(slots));
    reset();
  }

  /// m contiguous slots placed by the policy. Errors: invalid_size (m == 0), no_space (no free
  /// run of m, m > size() included), invalid_placement (a policy that proposed a run that is not
  /// free).
  [[nodiscard]] cuda::std::expected<SlotRange, Errc> allocate(std::uint32_t m) noexcept {
    if (const auto ok = check_slot_request(m, slots_); !ok) {
      return cuda::std::unexpected(ok.error());
    }
    if (m > free_) {
      return cuda::std::unexpected(Errc::no_space);
    }
    const auto start = fit_.find_in(words(), slots_, m);
    if (!start) {
      return cuda::std::unexpected(Errc::no_space);
    }
    const SlotRange range{*start, m};
    if (range.end() > slots_ || free_count(range) != m) {
      return cuda::std::unexpected(Errc::invalid_placement);
    }
    set(range, false);
    return range;
  }

  /// Returns a taken range (all or part of an allocation). Errors: invalid_size (empty),
  /// out_of_range (past the end or wrapping), not_allocated (any slot of it already free).
  [[nodiscard]] cuda::std::expected<void, Errc> deallocate(SlotRange r) noexcept {
    if (r.count == 0) {
      return cuda::std::unexpected(Errc::invalid_size);
    }
    if (r.end() > slots_) {
      return cuda::std::unexpected(Errc::out_of_range);
    }
    if (free_count(r) != 0) {
      return cuda::std::unexpected(Errc::not_allocated);
    }
    set(r, true);
    return {};
  }

  /// Frees every slot.
  void reset() noexcept {
    for (bits::word& w : words_) {
      w = bits::all_ones;
    }
    words_.back() = bits::low_mask(slots_ - (static_cast<std::uint32_t>(words_.size()) - 1) * bits::word_bits);
    free_ = slots_;
  }

  /// Slots in all, as constructed.
  std::uint32_t size() const noexcept { return slots_; }
  /// Free slots (kept as a count, so O(1)).
  std::uint32_t free_count() const noexcept { return free_; }
  /// Whether `slot` is free; false past the end.
  bool is_free(std::uint32_t slot) const noexcept {
    return slot < slots_ && (words_[slot / bits::word_bits] >> (slot % bits::word_bits) & 1) != 0;
  }
  /// Free slots inside `r`, which must lie within the allocator.
  std::uint32_t free_count(SlotRange r) const noexcept {
    std::uint32_t n = 0;
    for (const WordMask w : word_masks(r)) {
      n += bits::popcount(words_[w.word] & w.mask);
    }
    return n;
  }
  /// The largest request that can succeed now. O(words + runs).
  std::uint32_t largest_free_run() const noexcept {
    std::uint32_t best = 0;
    for (const SlotRange run : free_runs()) {
      best = run.count > best ? run.count : best;
    }
    return best;
  }
  /// The maximal free runs, lowest first; a view of this allocator (not on a temporary).
  FreeRuns<> free_runs() const& noexcept { return {words(), slots_}; }
  void free_runs() const&& = delete;
  /// The bitmap words (SlotBitmap's layout), valid until the allocator changes or dies.
  cuda::std::span<const bits::word> words() const noexcept { return {words_.data(), words_.size()}; }
  /// The policy object.
  const Fit& policy() const noexcept { return fit_; }

private:
  void set(SlotRange r, bool free) noexcept {
    for (const WordMask w : word_masks(r)) {
      words_[w.word] = free ? words_[w.word] | w.mask : words_[w.word] & ~w.mask;
    }
    free_ = free ? free_ + r.count : free_ - r.count;
  }

  std::uint32_t slots_;
  std::uint32_t free_ = 0;
  std::vector<bits::word> words_;
  Fit fit_; // a host object, never in a kernel: an empty policy's byte costs nothing that matters
};

static_assert(SlotSource<DynamicSlotAllocator<>>);

} // namespace carve
