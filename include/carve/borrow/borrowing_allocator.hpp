/// @file carve/borrow/borrowing_allocator.hpp
/// Memory for a card, borrowed from its best-connected
/// peer when the card itself is full: one resource per card plus a BandwidthWeightedPicker.
///
/// @code
/// using Pool = carve::CachingPool<carve::SimulatedCard>;
/// carve::BorrowingAllocator<Pool> borrower(topology, [](int) { return Pool(carve::SimulatedCard(16ull << 30)); });
///
/// carve::CachingPool pool(borrower.card(0));          // GPU0's memory, borrowed when GPU0 is full
/// auto p = pool.try_allocate(3 << 20);                // expected<void*, Errc>
///
/// auto h = borrower.borrow_explained(/*requesting card*/ 0, 3ull << 30, 256); // the explained form
/// if (h) { use(h->card, h->address); (void)borrower.give_back(*h); }
/// else   { std::puts(h.error().message.c_str()); }   // "no card can hold 3.0 GiB (...)"
/// @endcode
///
/// CardResource is what each card allocates from: a CachingPool over the card, a StatsResource
/// over that, anything that models carve::UpstreamResource (free_bytes and capacity feed the
/// picker; a largest_allocation() is used where the resource has one). Cards are built from a
/// function of the GPU ordinal (for resources that cannot move, like CachingPool) or moved in
/// from a vector.
///
/// Two ways in, one decision. borrow_explained(requester, bytes, alignment) returns a BorrowHandle,
/// or a carve::Error whose message explains the refusal (BandwidthWeightedPicker::explain_no_pick);
/// the card comes first, as in the picker's pick(requester, bytes, ...), so that the call cannot be
/// read as an allocate(bytes, alignment). card(i) is a
/// carve::MemoryResource for card i that allocates locally when it fits and else on the lender
/// the strategy picks; peers(i) only ever borrows (a stack's level after the card's own pool).
/// Either frees by pointer: the allocator remembers which card holds every live block.
///
/// A borrowed block is used where it lies, by the requester's kernels, so a lender counts only if
/// the requester can map its memory: the Access policy (carve/borrow/peer_access.hpp) says which
/// pairs can, and is asked to switch a pair on before the pair's first borrow. AlwaysMapped, the
/// default, is right for host memory; CudaPeerAccess for cards behind CudaDeviceResource.
///
/// Each allocation snapshots every card's state, picks, and allocates from the chosen card;
/// should that card turn out full after all (a real GPU is shared with other processes), it is
/// struck off and the pick repeated. Borrows are recorded in a BorrowHistory for the weighted
/// strategy. Thread-safe: picks are serialised by one lock (so two threads never both count on
/// the same free block); the cards' own resources do the rest.
#pragma once

#include <carve/borrow/bandwidth_weighted_picker.hpp>
#include <carve/borrow/borrow_history.hpp>
#include <carve/borrow/peer_access.hpp>
#include <carve/borrow/strategies.hpp>
#include <carve/core/error.hpp>
#include <carve/core/misuse.hpp>
#include <carve/core/system_refusal.hpp>
#include <carve/mr/cuda_mr.hpp>
#include <carve/mr/detail/block_lookup.hpp>
#include <carve/mr/memory_resource.hpp>
#include <carve/mr/simulated_card.hpp>
#include <carve/topology/topology.hpp>

#include <cuda/std/expected>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <utility>
#include <vector>

namespace carve {

/// What borrow hands out and give_back takes back.
struct BorrowHandle {
  int card = -1;                             ///< the card whose memory this is
  int requester = -1;                        ///< the card that asked; card != requester means borrowed
  void* address = nullptr;                   ///< in the lending card's address space (host memory for SimulatedCard)
  std::size_t size = 0;                      ///< bytes asked for
  std::size_t alignment = default_alignment; ///< as asked for
  /// Whether the memory is on another card than the requester's.
  bool borrowed() const noexcept { return card != requester; }
};

/// One decision, with the figures that drove it; passed to the on_decision callback.
struct BorrowDecision {
  int requester = -1;             ///< the card that asked
  int lender = -1;                ///< the card chosen (the requester itself when local)
  std::size_t bytes = 0;          ///< bytes asked for
  double bandwidth_gbps = 0.0;    ///< requester -> lender (infinite when local)
  int hops = 0;                   ///< links on that path
  std::vector<CardState> cards;   ///< every card's state when the pick was made
  std::vector<double> bandwidths; ///< requester -> every card
};

/// A card resource that can say how large one block could be (CachingPool can).
template <class R>
concept ReportsLargestAllocation = requires(const R& r) {
  { r.largest_allocation() } -> std::convertible_to<std::size_t>;
};

/// One `CardResource` per GPU of a topology, and a picker that lends a full card's requests to a
/// peer the requester can map. Thread-safe.
template <UpstreamResource CardResource, PickStrategy Strategy = LargestBandwidth, PeerAccess Access = AlwaysMapped>
class BorrowingAllocator {
public:
  /// What each card allocates from.
  using card_resource_type = CardResource;
  class Card;

  /// `make_card(i)` builds the resource of GPU ordinal i, for every GPU of the topology. Throws
  /// carve::Exception (invalid_argument) for a topology without GPUs or a history window of 0.
  template <class MakeCard>
  requires std::invocable<MakeCard&, int> && std::same_as<std::invoke_result_t<MakeCard&, int>, CardResource>
  BorrowingAllocator(const Topology& topology, MakeCard make_card, Strategy strategy = {},
                     std::size_t history_window = 1024, Access access = {})
      : access_(std::move(access)), picker_(with_gpus(topology), strategy, mappable()),
        history_(topology.gpu_count(), history_window) {
    for (int i = 0; i < topology.gpu_count(); ++i) {
      cards_.push_back(std::unique_ptr<CardResource>(new CardResource(make_card(i))));
    }
    enabled_.assign(cards_.size() * cards_.size(), false);
  }

  /// `cards[i]` is the resource of GPU ordinal i; there must be one per GPU of the topology
  /// (else carve::Exception, invalid_argument).
  BorrowingAllocator(const Topology& topology, std::vector<CardResource> cards, Strategy strategy = {},
                     std::size_t history_window = 1024,
                     Access access = {}) requires std::move_constructible<CardResource>
      : access_(std::move(access)),
        picker_(with_gpus(topology), strategy, mappable()),
        history_(topology.gpu_count(), history_window) {
    if (cards.size() != static_cast<std::size_t>(topology.gpu_count()) || cards.empty()) {
      throw Exception(Errc::invalid_argument, "carve::BorrowingAllocator: " + std::to_string(cards.size()) +
                                                  " card resources for a topology with " +
                                                  std::to_string(topology.gpu_count()) + " GPUs");
    }
    for (CardResource& card : cards) {
      cards_.push_back(std::make_unique<CardResource>(std::move(card)));
    }
    enabled_.assign(cards_.size() * cards_.size(), false);
  }

  BorrowingAllocator(const BorrowingAllocator&) = delete;
  BorrowingAllocator& operator=(const BorrowingAllocator&) = delete;

  /// Errors (nothing is allocated): invalid_size for 0 bytes or an alignment that is not a power
  /// of two; out_of_range for an unknown requesting card; no_space when no card can lend the
  /// request, with the picker's explanation as the message (each card's largest free block, and
  /// why cards with room were ruled out), or, when a card with room failed because the system
  /// refused it memory (carve/core/system_refusal.hpp), that card and the system's reason;
  /// unsupported when the only lender could not be mapped (the PeerAccess policy's message).
  [[nodiscard]] Result<BorrowHandle> borrow_explained(int requesting_card, std::size_t bytes, std::size_t alignment) {
    Refusals refusals;
    const auto h = take(bytes, requesting_card, alignment, true, &refusals);
    if (h) {
      return *h;
    }
    if (h.error() == Errc::no_space && refusals.first) {
      // The picker chose cards with room and the system said no: that is the cause, not the
      // strategy or the cards' free memory.
      std::string m = "card " + std::to_string(refusals.first_card) + ": the system refused the memory (" +
                      describe(refusals.first) + ") while GPU" + std::to_string(requesting_card) + " asked for " +
                      format_bytes(bytes);
      for (std::size_t i = 1; i < refusals.cards.size(); ++i) {
        m += (i == 1 ? (refusals.cards.size() > 2 ? "; cards " : "; card ") : ", ") + std::to_string(refusals.cards[i]);
      }
      return fail(Errc::no_space,
                  refusals.cards.size() > 1 ? m + (refusals.cards.size() > 2 ? " were" : " was") + " refused too" : m);
    }
    switch (h.error()) {
    case Errc::invalid_size:
      return fail(Errc::invalid_size,
                  "cannot allocate " + std::to_string(bytes) + " bytes aligned to " + std::to_string(alignment));
    case Errc::out_of_range:
      return fail(Errc::out_of_range, "no card " + std::to_string(requesting_card) + " (the machine has " +
                                          std::to_string(card_count()) + ")");
    case Errc::no_space:
      return fail(Errc::no_space, explain_no_pick(requesting_card, bytes));
    case Errc::unsupported: { // the only lender could not be mapped after all
      const std::lock_guard lock(mutex_);
      return fail(Errc::unsupported, access_failure_);
    }
    default:
      return fail(h.error(), to_string(h.error()));
    }
  }

  /// Errors (nothing changes): out_of_range for a handle naming no card; not_allocated when the
  /// handle is stale, forged or altered (not a live block of that card); invalid_size when its
  /// size or alignment differs from the allocation's.
  [[nodiscard]] cuda::std::expected<void, Errc> give_back(const BorrowHandle& handle) noexcept {
    if (handle.card < 0 || handle.card >= card_count()) {
      return cuda::std::unexpected(Errc::out_of_range);
    }
    return release(handle.address, handle.size, handle.alignment, handle.card);
  }

  /// Card i's memory as a carve::MemoryResource: local when it fits, else borrowed. Throws
  /// carve::Exception (out_of_range) for a card outside 0..card_count()-1.
  Card card(int i) { return Card(*this, checked(i, "card"), true); }
  /// Memory for card i from its peers only: never its own. Throws carve::Exception (out_of_range)
  /// for a card outside 0..card_count()-1.
  Card peers(int i) { return Card(*this, checked(i, "peers"), false); }

  /// Why a request for `bytes` by `requesting_card` would find no card now.
  std::string explain_no_pick(int requesting_card, std::size_t bytes) const {
    const std::lock_guard lock(mutex_);
    return picker_.explain_no_pick(requesting_card, bytes, card_states(), &history_);
  }

  /// Called after every successful allocation, under the allocator's lock (keep it short; it
  /// must not throw).
  void on_decision(std::function<void(const BorrowDecision&)> callback) {
    const std::lock_guard lock(mutex_);
    on_decision_ = std::move(callback);
  }

  /// Every card's state now: what its resource has free, and the largest block it could give.
  std::vector<CardState> card_states() const {
    std::vector<CardState> states;
    states.reserve(cards_.size());
    for (const auto& card : cards_) {
      const std::size_t free = card->free_bytes();
      if constexpr (ReportsLargestAllocation<CardResource>) {
        states.push_back(CardState{free, card->largest_allocation()});
      } else {
        states.push_back(CardState{free, free});
      }
    }
    return states;
  }

  /// GPUs in the topology.
  int card_count() const noexcept { return static_cast<int>(cards_.size()); }
  /// Card i's own resource (its pool, say): for stats and trimming. Throws carve::Exception
  /// (out_of_range) for a card outside 0..card_count()-1.
  CardResource& resource(int card) { return *cards_[static_cast<std::size_t>(checked(card, "resource"))]; }
  /// Card i's own resource, read-only (throws as the other).
  const CardResource& resource(int card) const { return *cards_[static_cast<std::size_t>(checked(card, "resource"))]; }
  /// The picker that chooses lenders.
  const BandwidthWeightedPicker<Strategy>& picker() const noexcept { return picker_; }
  /// The peer-access policy (for its records; switching pairs on is the allocator's job).
  const Access& peer_access() const noexcept { return access_; }
  /// A copy of the borrowing history, taken under the lock.
  BorrowHistory history() const {
    const std::lock_guard lock(mutex_);
    return history_;
  }
  /// Blocks handed out and not yet given back.
  std::size_t live_blocks() const {
    const std::lock_guard lock(mutex_);
    return lent_.size();
  }

private:
  struct Lent {
    int card;
    int requester;
    std::size_t bytes;
    std::size_t alignment;
  };
  /// Cards whose resource failed because the system refused it memory (SystemRefusal).
  struct Refusals {
    SystemRefusal first;
    int first_card = -1;
    std::vector<int> cards;
  };

  /// `topology`, checked first so that a topology without GPUs is reported as the allocator's.
  static const Topology& with_gpus(const Topology& topology) {
    if (topology.gpu_count() < 1) {
      throw Exception(Errc::invalid_argument, "carve::BorrowingAllocator: the topology has no GPUs");
    }
    return topology;
  }

  /// `card` when it names one of the cards, else throws carve::Exception (out_of_range) naming
  /// the call.
  int checked(int card, const char* call) const {
    if (card < 0 || card >= card_count()) {
      throw Exception(Errc::out_of_range, std::string("carve::BorrowingAllocator::") + call + ": no card " +
                                              std::to_string(card) + " (the machine has " +
                                              std::to_string(card_count()) + ")");
    }
    return card;
  }

  /// The one allocation path. `local` false: the requester's own card is not a candidate.
  [[nodiscard]] cuda::std::expected<BorrowHandle, Errc> take(std::size_t bytes, int requester, std::size_t alignment,
                                                             bool local, Refusals* refusals = nullptr) noexcept {
    if (const auto ok = check_request(bytes, alignment); !ok) {
      return cuda::std::unexpected(ok.error());
    }
    if (requester < 0 || requester >= card_count()) {
      return cuda::std::unexpected(Errc::out_of_range);
    }
    try {
      const std::lock_guard lock(mutex_);
      std::vector<CardState> states = card_states();
      if (refusals != nullptr) {
        refusals->cards.reserve(cards_.size());
      }
      if (!local) {
        states[static_cast<std::size_t>(requester)] = CardState{};
      }
      const std::vector<CardState> seen = on_decision_ ? states : std::vector<CardState>{};
      Errc refused = Errc::no_space;
      for (int attempt = 0; attempt < card_count(); ++attempt) {
        const auto pick = picker_.pick(requester, bytes, states, &history_);
        if (!pick) {
          break;
        }
        const std::size_t pair =
            static_cast<std::size_t>(requester) * cards_.size() + static_cast<std::size_t>(pick->card);
        if (pick->card != requester && !enabled_[pair]) {
          if (auto on = access_.enable(requester, pick->card); !on) {
            access_failure_ = std::move(on.error().message);
            states[static_cast<std::size_t>(pick->card)] = CardState{}; // unreachable after all
            refused = Errc::unsupported;
            continue;
          }
          enabled_[pair] = true;
        }
        CardResource& lender = *cards_[static_cast<std::size_t>(pick->card)];
        clear_system_refusal();
        const auto block = lender.try_allocate(bytes, alignment);
        if (!block) {
          states[static_cast<std::size_t>(pick->card)] = CardState{}; // full after all: strike it off
          if (const SystemRefusal why = last_system_refusal(); why && refusals != nullptr) {
            if (!refusals->first) {
              refusals->first = why;
              refusals->first_card = pick->card;
            }
            refusals->cards.push_back(pick->card); // reserved below: cannot throw
          }
          continue;
        }
        // Recorded, reported, then counted in the history: whatever throws first (out of host
        // memory) leaves the block with its lender and nothing recorded.
        const auto address = reinterpret_cast<std::uintptr_t>(*block);
        bool recorded = false;
        try {
          recorded = lent_.emplace(address, Lent{pick->card, requester, bytes, alignment}).second;
          if (on_decision_) {
            BorrowDecision d{requester, pick->card, bytes, pick->bandwidth_gbps, pick->hops, seen, {}};
            for (int c = 0; c < card_count(); ++c) {
              d.bandwidths.push_back(picker_.bandwidth(requester, c));
            }
            on_decision_(d);
          }
          if (pick->card != requester) {
            history_.record(requester, pick->card, bytes);
          }
        } catch (...) {
          if (recorded) {
            lent_.erase(address);
          }
          lender.deallocate(*block, bytes, alignment);
          throw;
        }
        return BorrowHandle{pick->card, requester, *block, bytes, alignment};
      }
      return cuda::std::unexpected(refused);
    } catch (const std::bad_alloc&) { // the allocator's own bookkeeping could not grow
    }
    return cuda::std::unexpected(Errc::no_space);
  }

  /// The picker's view of the Access policy (used while the allocator is built).
  auto mappable() const {
    return [this](int requester, int lender) { return static_cast<bool>(access_.can_access(requester, lender)); };
  }

  /// `card` -1: whichever card holds it. `requester` -1: whoever asked.
  [[nodiscard]] cuda::std::expected<void, Errc> release(void* p, std::size_t bytes, std::size_t alignment, int card,
                                                        int requester = -1) noexcept {
    Lent lent{};
    {
      const std::lock_guard lock(mutex_);
      const auto it = lent_.find(reinterpret_cast<std::uintptr_t>(p));
      if (it == lent_.end() || (card >= 0 && it->second.card != card) ||
          (requester >= 0 && it->second.requester != requester)) {
        return cuda::std::unexpected(Errc::not_allocated);
      }
      if (it->second.bytes != bytes || it->second.alignment != alignment) {
        return cuda::std::unexpected(Errc::invalid_size);
      }
      lent = it->second;
      lent_.erase(it);
    }
    cards_[static_cast<std::size_t>(lent.card)]->deallocate(p, bytes, alignment);
    return {};
  }

  /// Whether `p` lies in a live block handed out for `requester`.
  bool lent_to(const void* p, int requester) const noexcept {
    const std::lock_guard lock(mutex_);
    const auto it = detail::block_containing(lent_, p, [](const Lent& l) { return l.bytes; });
    return it != lent_.end() && it->second.requester == requester;
  }

  /// What `requester` can reach: its own card (when `local`) and every card with a path to it.
  template <class Figure>
  std::size_t reachable_sum(int requester, bool local, Figure figure) const {
    std::size_t total = 0;
    for (int c = 0; c < card_count(); ++c) {
      if (c == requester ? local : picker_.bandwidth(requester, c) > 0.0) {
        const std::size_t f = figure(*cards_[static_cast<std::size_t>(c)]);
        total =
            f > std::numeric_limits<std::size_t>::max() - total ? std::numeric_limits<std::size_t>::max() : total + f;
      }
    }
    return total;
  }

  Access access_; ///< declared before picker_, which reads it when built
  BandwidthWeightedPicker<Strategy> picker_;
  BorrowHistory history_;
  std::string access_failure_; ///< why the last enable() failed
  std::vector<bool> enabled_;  ///< requester x lender: switched on already
  std::vector<std::unique_ptr<CardResource>> cards_;
  mutable std::mutex mutex_;
  std::map<std::uintptr_t, Lent> lent_; ///< every live block, by address
  std::function<void(const BorrowDecision&)> on_decision_;
};

/// Memory for one card as a carve::MemoryResource: a handle on the allocator (which must outlive
/// it), so it copies freely and stacks under pools and fallbacks. owns(p) is true for blocks it
/// handed out; free_bytes and capacity sum the cards it can reach.
template <UpstreamResource CardResource, PickStrategy Strategy, PeerAccess Access>
class BorrowingAllocator<CardResource, Strategy, Access>::Card : public CcclSpellings<Card> {
public:
  /// From this card when it fits (unless this is a peers() handle), else from the lender the
  /// strategy picks. Errors: invalid_size (check_request); no_space when no card can lend (one
  /// that cannot be mapped included, so that a fallback takes the request).
  [[nodiscard]] cuda::std::expected<void*, Errc> try_allocate(std::size_t bytes, std::size_t alignment) noexcept {
    const auto h = borrower_->take(bytes, requester_, alignment, local_);
    if (!h) {
      return cuda::std::unexpected(h.error() == Errc::unsupported ? Errc::no_space : h.error());
    }
    return h->address;
  }
  /// Back to the card that holds it; misuse ends the program (see try_deallocate).
  void deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept {
    if (const auto r = try_deallocate(p, bytes, alignment); !r) {
      report_misuse("carve::BorrowingAllocator::Card::deallocate", p, bytes, r.error());
    }
  }
  /// Errors (nothing changes): not_allocated when `p` is not a live block this card handed out;
  /// invalid_size when `bytes` or `alignment` differ from the allocation's.
  [[nodiscard]] cuda::std::expected<void, Errc> try_deallocate(void* p, std::size_t bytes,
                                                               std::size_t alignment) noexcept {
    return borrower_->release(p, bytes, alignment, -1, requester_);
  }
  /// Whether `p` is a live block this handle's card was given.
  bool owns(const void* p) const noexcept { return borrower_->lent_to(p, requester_); }

  /// Free bytes summed over the cards this handle can reach.
  std::size_t free_bytes() const {
    return borrower_->reachable_sum(requester_, local_, [](const CardResource& r) { return r.free_bytes(); });
  }
  /// Capacity summed over the cards this handle can reach.
  std::size_t capacity() const {
    return borrower_->reachable_sum(requester_, local_, [](const CardResource& r) { return r.capacity(); });
  }

  /// The card this handle allocates for.
  int requester() const noexcept { return requester_; }
  /// Why a request for `bytes` would find no card now.
  std::string explain_no_pick(std::size_t bytes) const { return borrower_->explain_no_pick(requester_, bytes); }

  /// Equal when both are handles for the same card of the same allocator, in the same mode.
  friend bool operator==(const Card& a, const Card& b) noexcept {
    return a.borrower_ == b.borrower_ && a.requester_ == b.requester_ && a.local_ == b.local_;
  }

  /// Where the memory lives is where every card's memory lives.
  template <class Property>
  requires detail::declares_property<CardResource, Property>
  friend constexpr void get_property(const Card&, Property) noexcept {}

private:
  friend class BorrowingAllocator;
  Card(BorrowingAllocator& borrower, int requester, bool local) noexcept
      : borrower_(&borrower), requester_(requester), local_(local) {}

  BorrowingAllocator* borrower_;
  int requester_;
  bool local_;
};

static_assert(UpstreamResource<BorrowingAllocator<SimulatedCard>::Card> &&
              OwnsMemory<BorrowingAllocator<SimulatedCard>::Card> &&
              ChecksDeallocation<BorrowingAllocator<SimulatedCard>::Card>);

} // namespace carve
