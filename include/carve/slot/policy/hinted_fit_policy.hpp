/// @file carve/slot/policy/hinted_fit_policy.hpp
/// Policies that take a hint beside m, and policies that
/// remember what they placed.
///
/// A scheduler often knows more about a request than its size: how long the workgroup is expected
/// to run, or which kernel it belongs to. A hinted policy receives that as a value of its own
/// `hint_type`:
///
/// @code
/// struct MyHintedFit {
///   using hint_type = MyHint;
///   find(const SlotBitmap<N>&, m) const;                  // still a FitPolicyFor<MyHintedFit, N>
///   find(const SlotBitmap<N>&, m, const MyHint&) const;   // what SlotAllocator::allocate(m, hint) calls
/// };
/// @endcode
///
/// The plain find is required too, so a hinted policy works wherever any policy does (a request
/// without a hint gets the plain choice). The semantic rules of FitPolicy apply to both finds.
///
/// A policy may also keep per-slot memory of its own placements (e.g. when each run is expected
/// back). SlotAllocator calls `placed(range, hint)` after each successful hinted allocation and
/// `placed(range)` after each successful allocation without one, and nothing else: a tracking
/// policy may rely on what it recorded only for slots that are taken now, because releases, partial
/// releases and reset() are not reported to it.
///
/// Allocators shared by many threads have one policy object for all of them. They can feed a
/// remembering policy only when its memory is itself shared state, updated atomically: a policy
/// names such a form as `Fit::for_shared_slots<N, Scope>` (shared_fit_t), which SharesPlacements
/// describes. ConcurrentSlotAllocator then calls placed() after each claim succeeded, released()
/// before each deallocate gives slots back and forget_all() on reset(), from any thread; the
/// searches of other threads read that memory meanwhile, so it must tolerate stale reads (a stale
/// record may only make a placement worse; ownership is decided on the bitmap alone). See
/// SharedReleaseAlignedPlacements.
#pragma once

#include <carve/slot/policy/fit_policy.hpp>
#include <carve/slot/storage/slot_bitmap.hpp>
#include <carve/slot/storage/slot_range.hpp>

#include <cuda/atomic>
#include <cuda/std/concepts>
#include <cuda/std/cstdint>
#include <cuda/std/optional>

namespace carve {

/// A FitPolicyFor<F, N> that also takes a hint: `F::hint_type` and `find(bitmap, m, hint)`.
template <class F, std::uint32_t N>
concept HintedFitPolicyFor = FitPolicyFor<F, N> && requires {
  typename F::hint_type;
} && requires(const F& fit, const SlotBitmap<N>& bitmap, std::uint32_t m, const typename F::hint_type& hint) {
  { fit.find(bitmap, m, hint) } -> cuda::std::same_as<cuda::std::optional<std::uint32_t>>;
};

/// Tracks placements made without a hint.
template <class F>
concept TracksPlacements = requires(F& fit, SlotRange range) {
  fit.placed(range);
};

/// Tracks placements made with a hint.
template <class F>
concept TracksHintedPlacements = requires(F& fit, SlotRange range, const typename F::hint_type& hint) {
  fit.placed(range, hint);
};

/// Keeps memory of its placements: SlotAllocator, which owns its policy object and reports every
/// placement to it, feeds any such policy; ConcurrentSlotAllocator only one that SharesPlacements.
/// ShardedSlotAllocator and DynamicSlotAllocator refuse it at compile time.
template <class F>
concept RemembersPlacements = TracksPlacements<F> || TracksHintedPlacements<F>;

/// Remembers its placements in state that many threads update atomically: besides placed(), it
/// hears of releases (`released(range)`, before the slots are given back) and of a reset
/// (`forget_all()`), and all of it may run while other threads search.
template <class F>
concept SharesPlacements = RemembersPlacements<F> && requires(F& fit, SlotRange range) {
  fit.released(range);
  fit.forget_all();
};

/// The form of policy `Fit` that threads of `Scope` share for N slots (see shared_fit_t).
template <class Fit, std::uint32_t N, cuda::thread_scope Scope>
struct shared_fit {
  using type = sized_fit_t<Fit, N>; ///< the shared policy for N slots
};
/// @cond
template <class Fit, std::uint32_t N, cuda::thread_scope Scope>
requires requires { typename Fit::template for_shared_slots<N, Scope>; }
struct shared_fit<Fit, N, Scope> {
  using type = typename Fit::template for_shared_slots<N, Scope>;
};
/// @endcond
/// `Fit::for_shared_slots<N, Scope>` when the policy names one, else sized_fit_t<Fit, N>: what a
/// ConcurrentSlotAllocator<N, Fit, Scope> holds.
template <class Fit, std::uint32_t N, cuda::thread_scope Scope>
using shared_fit_t = typename shared_fit<Fit, N, Scope>::type;

} // namespace carve
