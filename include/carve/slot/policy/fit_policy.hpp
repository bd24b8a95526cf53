/// @file carve/slot/policy/fit_policy.hpp
/// The concept every fit policy models.
///
/// A fit policy chooses where a request for m contiguous slots goes:
///
/// @code
/// struct MyFit {
///   template <std::uint32_t N>
///   CARVE_HOST_DEVICE constexpr cuda::std::optional<std::uint32_t>
///   find(const carve::SlotBitmap<N>& bitmap, std::uint32_t m) const;
/// };
/// @endcode
///
/// Semantic requirements (not checkable by the compiler; the policy tests check carve's own):
/// - for 1 <= m <= N, find returns a start s with slots [s, s + m) all free, and returns
///   nullopt only when no such run exists;
/// - for m == 0 or m > N it returns nullopt;
/// - it reads the bitmap and its own members only, so one policy object may serve many threads.
/// A policy may also carry `static constexpr const char* name` for reports and tools, and a
/// `find_in(words, slots, m)` that searches any WordSource directly (WordSearchingFitPolicy):
/// ConcurrentSlotAllocator then reads a live bitmap word by word instead of copying it first.
#pragma once

#include <carve/core/bits.hpp>
#include <carve/slot/search/run_search.hpp>
#include <carve/slot/storage/slot_bitmap.hpp>

#include <cuda/std/concepts>
#include <cuda/std/cstdint>
#include <cuda/std/optional>

namespace carve {

/// A fit policy for bitmaps of N slots: a copyable `F` with `find(bitmap, m)` returning the start
/// of a free run of m slots, or nullopt (semantic requirements above).
template <class F, std::uint32_t N>
concept FitPolicyFor = cuda::std::copyable<F> && requires(const F& fit, const SlotBitmap<N>& bitmap, std::uint32_t m) {
  { fit.find(bitmap, m) } -> cuda::std::same_as<cuda::std::optional<std::uint32_t>>;
};

/// A policy that works for any bitmap size; probed on one word, exactly one full word, and
/// several words with a partial last one.
template <class F>
concept FitPolicy = FitPolicyFor<F, 1> && FitPolicyFor<F, 64> && FitPolicyFor<F, 130>;

/// A FitPolicy that also searches any WordSource through `find_in(words, slots, m)`, with the
/// same answers as find on the same words.
template <class F>
concept WordSearchingFitPolicy = FitPolicy<F> &&
    requires(const F& fit, cuda::std::span<const bits::word> words, std::uint32_t m) {
  { fit.find_in(words, m, m) } -> cuda::std::same_as<cuda::std::optional<std::uint32_t>>;
};

/// A policy that decides from the lowest and highest candidate alone (first, last, boundary-
/// nearest fit) through `pick(bounds, slots, m)`; the cooperative searches in warp_scan.hpp
/// compute exactly those two, so such policies run there too.
template <class F>
concept BoundsFitPolicy = FitPolicy<F> && requires(const F& fit, runs::StartBounds b, std::uint32_t m) {
  { fit.pick(b, m, m) } -> cuda::std::same_as<cuda::std::optional<std::uint32_t>>;
};

/// A policy whose state depends on the number of slots (per-slot memory, say) names its sized
/// form, so users write the policy once: SlotAllocator<128, MyFit>, not MyFit<128> beside 128.
///
/// @code
/// struct MyFit {
///   template <std::uint32_t N> using for_slots = MyFitState<N>;   // the FitPolicyFor<_, N>
/// };
/// @endcode
///
/// sized_fit_t<Fit, N> is that form, or Fit itself for a policy that works at any size. The sized
/// form should be constructible from Fit, so an allocator built from a Fit value can make it.
template <class Fit, std::uint32_t N>
struct sized_fit {
  using type = Fit; ///< the policy for N slots
};
/// @cond
template <class Fit, std::uint32_t N>
requires requires { typename Fit::template for_slots<N>; }
struct sized_fit<Fit, N> {
  using type = typename Fit::template for_slots<N>;
};
/// @endcond
/// The policy `Fit` names for N slots (see sized_fit).
template <class Fit, std::uint32_t N>
using sized_fit_t = typename sized_fit<Fit, N>::type;

/// The policy's display name, or "custom" when it has none.
template <class F>
CARVE_HOST_DEVICE constexpr const char* policy_name() noexcept {
  if constexpr (requires { F::name; }) {
    return F::name;
  } else {
    return "custom";
  }
}

} // namespace carve
