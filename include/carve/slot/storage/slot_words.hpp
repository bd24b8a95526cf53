/// @file carve/slot/storage/slot_words.hpp
/// Where a concurrent slot bitmap's words live.
///
/// ConcurrentSlotAllocator works on words it owns (OwnedSlotWords: a member array, constant-
/// initialised to all free, so the allocator can be a __device__ global) or on words it does not
/// own (BorrowedSlotWords: e.g. dynamic shared memory that a block sets up, or a device buffer).
/// Either way the words follow SlotBitmap's layout: slot s is bit s % 64 of word s / 64, 1 = free,
/// bits past slot N - 1 zero.
#pragma once

#include <carve/core/bits.hpp>
#include <carve/core/config.hpp>
#include <carve/core/errc.hpp>
#include <carve/core/error.hpp>

#include <nv/target>

#include <cuda/std/concepts>
#include <cuda/std/cstdint>
#include <cuda/std/expected>

namespace carve {

/// Storage concept: gives the word array, and is cheap to hold by value.
template <class S>
concept SlotWords = requires(S& s) {
  { s.data() } -> cuda::std::same_as<bits::word*>;
};

/// SlotWords held in the object itself: N slots, all free when constructed.
template <std::uint32_t N>
class OwnedSlotWords {
public:
  /// Words held: ceil(N / 64).
  static constexpr std::uint32_t word_count = bits::word_count(N);

  /// All slots free: constant initialisation, so `__device__ OwnedSlotWords<N> w;` needs no kernel.
  CARVE_HOST_DEVICE constexpr OwnedSlotWords() noexcept : words_{} {
    for (std::uint32_t k = 0; k + 1 < word_count; ++k) {
      words_[k] = bits::all_ones;
    }
    words_[word_count - 1] = bits::low_mask(N - (word_count - 1) * bits::word_bits);
  }

  /// Live words are updated atomically by many threads; a plain copy would tear.
  OwnedSlotWords(const OwnedSlotWords&) = delete;
  OwnedSlotWords& operator=(const OwnedSlotWords&) = delete;

  /// The words.
  CARVE_HOST_DEVICE constexpr bits::word* data() noexcept { return words_; }

private:
  alignas(8) bits::word words_[word_count];
};

/// SlotWords somewhere else (shared memory, a device buffer): a pointer, copied freely.
template <std::uint32_t N>
class BorrowedSlotWords {
public:
  /// Words needed: ceil(N / 64).
  static constexpr std::uint32_t word_count = bits::word_count(N);

  /// No words yet (a __shared__ declaration, say): assign real ones before use; until then
  /// status() reports invalid_argument and an allocator over them refuses every call.
  constexpr BorrowedSlotWords() noexcept = default;
  /// `words` must hold word_count 8-byte-aligned words laid out as above (reset() writes them).
  /// A null or misaligned pointer throws carve::Exception (invalid_argument) on the host; in
  /// device code it leaves no words, which status() reports.
  CARVE_HOST_DEVICE explicit BorrowedSlotWords(bits::word* words) : words_(words) {
    if (words == nullptr || reinterpret_cast<cuda::std::uintptr_t>(words) % alignof(bits::word) != 0) {
      NV_IF_TARGET(NV_IS_HOST,
                   (throw Exception(Errc::invalid_argument, words == nullptr ? "carve::BorrowedSlotWords: null words"
                                                                             : "carve::BorrowedSlotWords: words not "
                                                                               "8-byte aligned");));
      words_ = nullptr;
    }
  }

  /// invalid_argument when there are no words (none given yet, or bad ones given in device code).
  [[nodiscard]] CARVE_HOST_DEVICE constexpr cuda::std::expected<void, Errc> status() const noexcept {
    if (words_ == nullptr) {
      return cuda::std::unexpected(Errc::invalid_argument);
    }
    return {};
  }

  /// The words.
  CARVE_HOST_DEVICE constexpr bits::word* data() const noexcept { return words_; }

private:
  bits::word* words_ = nullptr;
};

static_assert(SlotWords<OwnedSlotWords<130>> && SlotWords<BorrowedSlotWords<130>>);

} // namespace carve
