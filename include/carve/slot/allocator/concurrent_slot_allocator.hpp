/// @file carve/slot/allocator/concurrent_slot_allocator.hpp
/// Slot allocation shared by many threads, lock-free.
///
/// @code
/// __shared__ carve::ConcurrentSlotAllocator<128, carve::BoundaryNearestFit, cuda::thread_scope_block> slots;
/// if (threadIdx.x == 0) slots.reset();   // shared memory is not constructed
/// __syncthreads();
/// auto r = slots.allocate(4);             // from any thread of the block
///
/// __shared__ carve::ConcurrentSlotAllocator<128, carve::ReleaseAlignedFit, cuda::thread_scope_block> timed;
/// auto t = timed.allocate(4, carve::ExpectedRelease{now + expected_cycles});   // a hinted policy
/// @endcode
///
/// Same calls, errors and policies as SlotAllocator; the words are updated with
/// cuda::atomic_ref<_, Scope>, so the identical code runs on host threads and device threads
/// (thread_scope_block for a bitmap in shared memory, device for global memory, system for
/// memory shared with the host).
///
/// allocate: find a candidate in a LazySnapshot of the words (loading only the words the policy
/// reads), then claim it word by word, lowest word first, with fetch_and and check the old
/// value. A word where some bits were already taken loses the race: exactly the bits this call
/// took are given back, and the search runs again on the same snapshot with the value the claim's
/// atomic returned in place of the word where it lost. So a lost race reloads no word the search
/// had seen: threads that exact placement sends to the same lowest free word each learn from
/// their atomic what the winners took there and go on to the next free bits. After a search that
/// finds nothing, or one whose run the words no longer show free, the next search starts from
/// fresh words; a search that runs bracketed (below) reads the live words themselves. Some thread
/// always wins a contested word, so the allocator is lock-free; no slot is ever held by two
/// callers, because a bit is taken only by the fetch_and that saw it free (for callers that free
/// only what they own: see deallocate).
///
/// Hinted policies (hinted_fit_policy.hpp) take `allocate(m, hint)` here as on SlotAllocator. A
/// policy that remembers its placements (ReleaseAlignedFit) is held in its shared form
/// (shared_fit_t: per-slot expected releases updated with atomic_ref): a claim that succeeded is
/// stamped by its owner, a deallocate clears the stamps before it gives the bits back, and other
/// threads' searches read the stamps racily. A stale stamp can only steer a search to a worse run;
/// ownership is still decided by the fetch_and alone, so the guarantee below is unchanged. One
/// thread gets exactly SlotAllocator's placements. Such an allocator must hold its words
/// (OwnedSlotWords): a view over borrowed words is copied freely, and each copy would keep
/// placements of its own.
///
/// deallocate: the caller owns the range, so no one else can change its bits; they are checked
/// (all taken) and then released word by word with a compare-exchange that refuses a word whose
/// bits are partly free. A double free of a range that is still free changes nothing and returns
/// not_allocated; of two threads freeing the same range at once, exactly one succeeds. (As with
/// any allocator, a double free that arrives after the slots were handed out again cannot be
/// told from a real free. Nor can one that arrives while a losing claim holds those free slots
/// for the moment before it gives them back: one bit per slot cannot say who holds it, so that
/// free succeeds and the claim's give-back may later free slots another caller has taken. A
/// double free is the caller's bug; the guarantee above is for callers that free what they own.)
#pragma once

#include <carve/core/bits.hpp>
#include <carve/core/compressed_pair.hpp>
#include <carve/core/config.hpp>
#include <carve/core/errc.hpp>
#include <carve/slot/allocator/slot_source.hpp>
#include <carve/slot/policy/boundary_nearest_fit.hpp>
#include <carve/slot/policy/fit_policy.hpp>
#include <carve/slot/policy/hinted_fit_policy.hpp>
#include <carve/slot/storage/atomic_words.hpp>
#include <carve/slot/storage/lazy_snapshot.hpp>
#include <carve/slot/storage/slot_bitmap.hpp>
#include <carve/slot/storage/slot_range.hpp>
#include <carve/slot/storage/slot_words.hpp>
#include <carve/slot/storage/word_fingerprint.hpp>

#include <cuda/atomic>
#include <cuda/std/cstdint>
#include <cuda/std/expected>
#include <cuda/std/optional>
#include <cuda/std/type_traits>

namespace carve {

/// N slots under policy `Fit`, allocated and freed lock-free by threads of scope `Scope`, over
/// words kept by `Words` (OwnedSlotWords: in the object; BorrowedSlotWords: elsewhere).
template <std::uint32_t N, class Fit = BoundaryNearestFit, cuda::thread_scope Scope = cuda::thread_scope_device,
          SlotWords Words = OwnedSlotWords<N>>
requires FitPolicyFor<shared_fit_t<Fit, N, Scope>, N>
class ConcurrentSlotAllocator {
public:
  /// The policy object, shared by every thread (a remembering policy's shared form).
  using policy_type = shared_fit_t<Fit, N, Scope>;
  /// Which threads may share the allocator (block, device or system).
  static constexpr cuda::thread_scope scope = Scope;
  /// Copies share their slots where the words are borrowed (SharesSlots); owned words are not copied.
  static constexpr bool shares_slots = !cuda::std::is_same_v<Words, OwnedSlotWords<N>>;

  static_assert(!RemembersPlacements<policy_type> || SharesPlacements<policy_type>,
                "ConcurrentSlotAllocator shares one policy object among all its threads and cannot report "
                "placements to it unless the policy keeps them in shared, atomically updated state (a "
                "for_shared_slots form, as ReleaseAlignedFit has); otherwise it would decide from memory that is "
                "never written: use SlotAllocator, which owns its policy");
  static_assert(!RemembersPlacements<policy_type> || cuda::std::is_same_v<Words, OwnedSlotWords<N>>,
                "a ConcurrentSlotAllocator over borrowed words (ConcurrentSlotAllocatorRef, a sharded allocator's "
                "shards) is a view that is copied freely, so it cannot report placements to it: every copy would "
                "keep placements of its own. Share one ConcurrentSlotAllocator that owns its words instead");

  /// All slots free, constant-initialised (so it can be a __device__ or static global).
  constexpr ConcurrentSlotAllocator() noexcept = default;
  /// Over words someone else provides (BorrowedSlotWords), e.g. dynamic shared memory. Words
  /// that report an error (none, or bad ones given in device code) leave status() reporting it.
  CARVE_HOST_DEVICE constexpr explicit ConcurrentSlotAllocator(Words words, policy_type fit = {}) noexcept
      : state_(fit, words) {}

  /// Success for words it owns; over borrowed words, their status(): invalid_argument when there
  /// are none (default-constructed, or bad ones given in device code; on the host those throw).
  /// An allocator whose status() fails refuses every call with it, free_count() is 0 and reset()
  /// does nothing.
  [[nodiscard]] CARVE_HOST_DEVICE constexpr cuda::std::expected<void, Errc> status() const noexcept {
    if constexpr (requires { state_.second().status(); }) {
      return state_.second().status();
    } else {
      return {};
    }
  }

  /// m contiguous slots placed by the policy. Errors: invalid_size (m == 0); no_space (m > N, or
  /// the policy found no place in words that a second read showed unchanged, see below); status();
  /// invalid_placement (the policy proposed a run that was not free in what it was shown; where
  /// that cannot be told from a race, as past 1024 slots, confirmed by fingerprint as below, and
  /// by the run still being taken).
  ///
  /// "No space" is confirmed by reading again every word the search read. Up to 1024 slots the
  /// snapshot still holds all of them and compares each. A larger bitmap does not fit in a
  /// thread's snapshot (and a copy per thread, N / 8 bytes, is too much on a device), so there the
  /// failed search is repeated between two reads of every word, compared by fingerprint
  /// (word_fingerprint.hpp): when both agree, the repeated search saw one unchanging picture. (As
  /// with any check by value, a word that changes and changes back between the two reads passes.)
  [[nodiscard]] CARVE_HOST_DEVICE cuda::std::expected<SlotRange, Errc> allocate(std::uint32_t m) noexcept {
    return allocate_with(
        m, [&](const auto& words) { return find(words, m); },
        [&](SlotRange range) {
          if constexpr (TracksPlacements<policy_type>) {
            fit().placed(range);
          }
        });
  }

  /// The same with a hint for a hinted policy (e.g. when the request is expected back, for
  /// ReleaseAlignedFit). Same errors; only exists for hinted policies.
  template <class F = policy_type>
  requires cuda::std::same_as<F, policy_type> && HintedFitPolicyFor<F, N>
  [[nodiscard]] CARVE_HOST_DEVICE cuda::std::expected<SlotRange, Errc>
  allocate(std::uint32_t m, const typename F::hint_type& hint) noexcept {
    return allocate_with(
        m,
        [&](const auto& words) -> cuda::std::optional<std::uint32_t> {
          // Through the member, not fit(): nvcc finds a call through the lambda's implicit `this`
          // unsatisfied here, and would copy the bitmap for the slow branch below.
          if constexpr (requires { state_.first().find_in(words, N, m, hint); }) {
            return fit().find_in(words, N, m, hint);
          } else {
            return fit().find(SlotBitmap<N>::from_source(words), m, hint);
          }
        },
        [&](SlotRange range) {
          if constexpr (TracksHintedPlacements<policy_type>) {
            fit().placed(range, hint);
          } else if constexpr (TracksPlacements<policy_type>) {
            fit().placed(range);
          }
        });
  }

  /// Errors: invalid_size (empty range), out_of_range (past N or wrapping), not_allocated (a slot
  /// of the range is free: a double free), status(). Racing frees of one range: exactly one
  /// succeeds. A free racing a double free of another range that overlaps it (misuse in both
  /// callers) may release its words below the overlap and still answer not_allocated: putting them
  /// back could take slots another thread has claimed since.
  [[nodiscard]] CARVE_HOST_DEVICE cuda::std::expected<void, Errc> deallocate(SlotRange r) noexcept {
    if (r.count == 0) {
      return cuda::std::unexpected(Errc::invalid_size);
    }
    if (const auto ok = status(); !ok) {
      return ok;
    }
    if (r.end() > N) {
      return cuda::std::unexpected(Errc::out_of_range);
    }
    const AtomicWords<N, Scope> words = live();
    const bool all_taken =
        for_each_word_mask(r, [&](std::uint32_t k, bits::word mask) { return (words[k] & mask) == 0; });
    if constexpr (SharesPlacements<policy_type>) {
      // Before the bits go back: the next owner stamps after its claim, so after this. (A racing
      // double free may clear a new owner's stamps: that costs placement quality, not ownership.)
      if (all_taken) {
        fit().released(r);
      }
    }
    // Release word by word, each with a compare-exchange that refuses if any of its bits is free
    // by now. Racing frees of one range all start at its lowest word, so exactly one of them gets
    // past it; the others stop there having changed nothing.
    const bool released =
        all_taken && for_each_word_mask(r, [&](std::uint32_t k, bits::word mask) {
          auto word = words.atomic(k);
          bits::word current = word.load(cuda::std::memory_order_relaxed);
          do {
            if ((current & mask) != 0) {
              return false;
            }
          } while (!word.compare_exchange_weak(current, current | mask, cuda::std::memory_order_release,
                                               cuda::std::memory_order_relaxed));
          return true;
        });
    if (!released) {
      return cuda::std::unexpected(Errc::not_allocated);
    }
    return {};
  }

  /// All slots free. Not safe against concurrent calls: use it before sharing the allocator
  /// (e.g. by one thread of a block, followed by __syncthreads()).
  CARVE_HOST_DEVICE void reset() noexcept {
    if (!status()) {
      return;
    }
    // Word by word (no SlotBitmap<N> on the stack: N / 8 bytes is a lot for a device thread).
    constexpr std::uint32_t last = bits::word_count(N) - 1;
    const AtomicWords<N, Scope> words = live();
    for (std::uint32_t k = 0; k + 1 <= last; ++k) { // not k < last: nvcc warns when last is 0
      words.atomic(k).store(bits::all_ones, cuda::std::memory_order_relaxed);
    }
    words.atomic(last).store(bits::low_mask(N - last * bits::word_bits), cuda::std::memory_order_relaxed);
    if constexpr (SharesPlacements<policy_type>) {
      fit().forget_all();
    }
  }

  /// The bitmap as read word by word now (exact when no other thread is active). A copy of all
  /// N / 8 bytes: on a device, for tests and tools rather than kernels that run wide.
  /// (All taken when status() fails.)
  CARVE_HOST_DEVICE SlotBitmap<N> snapshot() const noexcept {
    return status() ? LazySnapshot<N, Scope>(live()).bitmap() : SlotBitmap<N>::all_taken();
  }
  /// Free slots as read word by word now (only a hint while others allocate). Counted word by
  /// word, with no copy of the bitmap, so a kernel may call it at any N without a large frame.
  CARVE_HOST_DEVICE std::uint32_t free_count() const noexcept {
    if (!status()) {
      return 0;
    }
    const AtomicWords<N, Scope> words = live();
    std::uint32_t free = 0;
    for (std::uint32_t k = 0; k < words.size(); ++k) {
      free += bits::popcount(words[k]);
    }
    return free;
  }
  /// Slots in all: N.
  CARVE_HOST_DEVICE static constexpr std::uint32_t size() noexcept { return N; }
  /// The policy object.
  CARVE_HOST_DEVICE constexpr const policy_type& policy() const noexcept { return fit(); }

private:
  // Taken runs refused before a search is bracketed by fingerprints (allocate_with).
  static constexpr std::uint32_t refusals_before_bracketing = 8;

  /// allocate's loop (described above): `search(words)` proposes a start in a WordSource (the
  /// snapshot, or the live words when bracketed), `record(range)` runs once the range is claimed.
  template <class Search, class Record>
  [[nodiscard]] CARVE_HOST_DEVICE cuda::std::expected<SlotRange, Errc> allocate_with(std::uint32_t m, Search search,
                                                                                     Record record) noexcept {
    if (const auto ok = check_slot_request(m, N); !ok) {
      return cuda::std::unexpected(ok.error());
    }
    if (const auto ok = status(); !ok) {
      return cuda::std::unexpected(ok.error());
    }
    // What the searches have seen: forgotten before every search but one after a lost claim,
    // which goes on from what the claim's atomic returned.
    LazySnapshot<N, Scope> seen(live());
    std::uint32_t refusals = 0; // runs the check found taken without telling why
    while (refusals < refusals_before_bracketing) {
      const cuda::std::optional<std::uint32_t> start = search(seen);
      if (!start) {
        cuda::atomic_thread_fence(cuda::std::memory_order_acquire, Scope); // the search read before the re-read
        if (seen.unchanged()) {
          return cuda::std::unexpected(Errc::no_space);
        }
        if (!LazySnapshot<N, Scope>::holds_all()) {
          break; // the search could not keep every word it read, so only a bracketed one can tell
        }
        seen.forget(); // the words moved under the search: look again
        continue;
      }
      const SlotRange range{*start, m};
      const bool evicted = seen.evicted(); // by the search (the check may evict too)
      const SeenRun seen_run = range.end() <= N ? seen.check(range) : SeenRun::not_free;
      if (seen_run != SeenRun::free) {
        // Taken now. The policy's mistake for certain where the search read each word of the run
        // once and kept it (not_free without eviction: always up to 1024 slots). Otherwise the
        // search may have used an older copy of a word (read twice past 1024 slots) or proposed a
        // word it never read: taken for a race until several refusals send the search to
        // allocate_bracketed, which can tell.
        cuda::atomic_thread_fence(cuda::std::memory_order_acquire, Scope); // the check read before the re-read
        if (range.end() > N || (seen_run == SeenRun::not_free && !evicted)) {
          return cuda::std::unexpected(Errc::invalid_placement);
        }
        ++refusals;
        seen.forget();
        continue;
      }
      LostClaim lost;
      if (claim(range, lost)) {
        record(range);
        return range;
      }
      seen.saw(lost.word, lost.value);
    }
    return allocate_bracketed(m, search, record);
  }

  /// allocate's loop where its snapshot cannot decide (past 1024 slots after a failed search, or
  /// after several refused runs): each search reads the live words between two fingerprints of
  /// every word (see allocate), so the fingerprints, not a copy, say whether it saw one unchanging
  /// picture. A run the search proposes is claimed whenever it is free now; "no space" needs the
  /// fingerprints to agree, and invalid_placement a run past the end, or a taken run proposed
  /// twice running with them agreeing and the run still taken after the second (a word that
  /// changes and changes back between two reads looks unchanged: two such coincidences in a row
  /// are what a race does not repeat). A loop of its own, after the snapshot's: a kernel reserves
  /// registers for the busiest point of all its code, and with one loop for both, the
  /// fingerprints were live across every search (the sharded kernels of bench_gpu_slot_alloc took
  /// 40 to 45 registers at sm_90, 32 to 38 since; docs/concurrent-slots.md has the table).
  template <class Search, class Record>
  [[nodiscard]] CARVE_HOST_DEVICE cuda::std::expected<SlotRange, Errc>
  allocate_bracketed(std::uint32_t m, Search search, Record record) noexcept {
    const AtomicWords<N, Scope> words = live();
    std::uint32_t quiet = 0; // taken runs proposed in a row with the words unchanged
    for (;;) {
      const std::uint64_t point = fingerprint_point();
      // In memory (volatile), not a register: it is read once, after the second fingerprint's
      // loop, and held in a register through that loop it made an allocating kernel held to 32
      // registers (the most that lets an SM hold 2048 threads) spill.
      const volatile std::uint64_t before = word_fingerprint(words, point);
      cuda::atomic_thread_fence(cuda::std::memory_order_acquire, Scope); // read before the search
      const cuda::std::optional<std::uint32_t> start = search(words);
      if (!start) {
        cuda::atomic_thread_fence(cuda::std::memory_order_acquire, Scope); // the search read before the re-read
        if (word_fingerprint(words, point) == before) {
          return cuda::std::unexpected(Errc::no_space);
        }
        continue;
      }
      const SlotRange range{*start, m};
      if (range.end() > N) {
        return cuda::std::unexpected(Errc::invalid_placement); // no word read, however late, shows such a run
      }
      if (!free_now(range)) {
        // Taken now, yet the search may have read it free before a race took it (and a race may
        // give it back before the second fingerprint). Counted only when the fingerprints agree
        // and it is still taken after the second: two such runs in a row are the policy's mistake.
        cuda::atomic_thread_fence(cuda::std::memory_order_acquire, Scope); // the check read before the re-read
        quiet = word_fingerprint(words, point) == before && !free_now(range) ? quiet + 1 : 0;
        if (quiet == 2) {
          return cuda::std::unexpected(Errc::invalid_placement);
        }
        continue;
      }
      if (LostClaim lost; claim(range, lost)) {
        record(range);
        return range;
      }
    }
  }

  CARVE_HOST_DEVICE AtomicWords<N, Scope> live() const noexcept {
    return AtomicWords<N, Scope>(state_.second().data());
  }

  template <WordSource Source>
  CARVE_HOST_DEVICE cuda::std::optional<std::uint32_t> find(const Source& words, std::uint32_t m) const noexcept {
    // A sized policy (a remembering one's shared form) cannot be a WordSearchingFitPolicy, which
    // asks for every size, yet may still search words: its find_in is used whenever it has one
    // (asked through the member, as in allocate(m, hint)).
    if constexpr (WordSearchingFitPolicy<policy_type> || requires { state_.first().find_in(words, N, m); }) {
      return fit().find_in(words, N, m);
    } else {
      return fit().find(SlotBitmap<N>::from_source(words), m);
    }
  }

  // Whether every slot of `range` is free in the live words now.
  CARVE_HOST_DEVICE bool free_now(SlotRange range) const noexcept {
    const AtomicWords<N, Scope> words = live();
    bool free = true;
    for_each_word_mask(range, [&](std::uint32_t k, bits::word mask) {
      free = (words[k] & mask) == mask;
      return free;
    });
    return free;
  }

  /// Where a claim lost: the word, and that word as the claim's atomic found it (what the word
  /// holds again once the claim's bits are back).
  struct LostClaim {
    std::uint32_t word = 0;
    bits::word value = 0;
  };

  /// Takes every slot of `range` or none of them. When it takes none, `lost` says where it lost;
  /// the words before that one held the run's bits free.
  CARVE_HOST_DEVICE bool claim(SlotRange range, LostClaim& lost) noexcept {
    const AtomicWords<N, Scope> words = live();
    std::uint32_t claimed_words = 0;
    bits::word partial = 0; // bits taken in the word where the claim failed
    const bool won = for_each_word_mask(range, [&](std::uint32_t k, bits::word mask) {
      const bits::word old = words.atomic(k).fetch_and(~mask, cuda::std::memory_order_acq_rel);
      partial = old & mask;
      if (partial != mask) {
        lost = {k, old};
        return false;
      }
      ++claimed_words;
      return true;
    });
    if (won) {
      return true;
    }
    std::uint32_t undone = 0;
    for_each_word_mask(range, [&](std::uint32_t k, bits::word mask) {
      const bits::word give_back = undone < claimed_words ? mask : partial;
      if (give_back != 0) {
        words.atomic(k).fetch_or(give_back, cuda::std::memory_order_release);
      }
      return ++undone <= claimed_words;
    });
    return false;
  }

  CARVE_HOST_DEVICE constexpr policy_type& fit() noexcept { return state_.first(); }
  CARVE_HOST_DEVICE constexpr const policy_type& fit() const noexcept { return state_.first(); }

  // The policy (no bytes when it has no state) and the words. Mutable because the words are only
  // ever touched through atomic_ref, which needs a non-const word, in const calls too.
  mutable detail::CompressedPair<policy_type, Words> state_{};
};

/// A ConcurrentSlotAllocator over words it does not own.
template <std::uint32_t N, class Fit = BoundaryNearestFit, cuda::thread_scope Scope = cuda::thread_scope_device>
using ConcurrentSlotAllocatorRef = ConcurrentSlotAllocator<N, Fit, Scope, BorrowedSlotWords<N>>;

static_assert(SlotSource<ConcurrentSlotAllocator<128>>);

} // namespace carve
