/// @file carve/borrow/peer_access.hpp
/// Whether one card can map another's memory, and turning that on: BorrowingAllocator's
/// PeerAccess policy.
///
/// A block borrowed on a lender is used by the requester's kernels where it lies, so the
/// requester must be able to map the lender's memory. On CUDA that is peer access, which the
/// driver may refuse for a pair (cudaDeviceCanAccessPeer) and which must be switched on once per
/// (requester, lender) pair before the first access (cudaDeviceEnablePeerAccess):
/// carve/borrow/cuda_peer_access.hpp. Host memory needs neither (AlwaysMapped), and
/// SimulatedPeerAccess is the host twin of a machine's peer matrix for tests.
#pragma once

#include <carve/core/error.hpp>

#include <concepts>
#include <cstddef>
#include <string>
#include <vector>

namespace carve {

/// A policy that says which cards can map which, and switches a pair on. BorrowingAllocator calls
/// `enable` under its lock once per pair, before the pair's first borrow (again only after a
/// failure); its error's message reaches the caller of BorrowingAllocator::borrow.
template <class P>
concept PeerAccess = std::move_constructible<P> && requires(P& p, const P& cp, int requester, int lender) {
  { cp.can_access(requester, lender) } -> std::convertible_to<bool>;
  { p.enable(requester, lender) } -> std::same_as<Result<void>>;
};

/// Every card maps every other's memory and nothing needs switching on: host memory, simulated
/// cards, or machines where the caller has enabled peer access already.
struct AlwaysMapped {
  /// Always true.
  bool can_access(int, int) const noexcept { return true; }
  /// Nothing to do.
  [[nodiscard]] Result<void> enable(int, int) noexcept { return {}; }
};

/// A host twin of a machine's peer matrix: `can[r][l]` says whether card r can map card l's
/// memory. It records each pair's enable() so tests can check that a pair is switched on once,
/// before its first borrow, and never for a card's own memory.
class SimulatedPeerAccess {
public:
  /// `can` is square, one row per card. Throws carve::Exception (invalid_argument) otherwise.
  explicit SimulatedPeerAccess(std::vector<std::vector<bool>> can) : can_(std::move(can)) {
    for (const auto& row : can_) {
      if (row.size() != can_.size()) {
        throw Exception(Errc::invalid_argument, "SimulatedPeerAccess: the peer matrix must be square");
      }
    }
    enabled_.assign(can_.size(), std::vector<int>(can_.size(), 0));
  }

  /// Whether `requester` can map `lender`'s memory (a card always maps its own).
  bool can_access(int requester, int lender) const noexcept {
    return requester == lender || (known(requester, lender) && can_[index(requester)][index(lender)]);
  }
  /// Switches the pair on, as cudaDeviceEnablePeerAccess would; a second call is a no-op (the
  /// driver's "already enabled"). Errors: unsupported for a pair that cannot map each other.
  [[nodiscard]] Result<void> enable(int requester, int lender) {
    if (!can_access(requester, lender) || requester == lender) {
      return fail(Errc::unsupported, "GPU" + std::to_string(requester) + " cannot map GPU" + std::to_string(lender) +
                                         "'s memory (no peer access between them)");
    }
    ++enabled_[index(requester)][index(lender)];
    return {};
  }
  /// How often enable() switched the pair on (calls after the first are not counted by a
  /// policy that remembers; this twin counts every call so a test can see repeats). Throws
  /// carve::Exception (out_of_range) naming a card the matrix does not have.
  int enable_calls(int requester, int lender) const {
    for (const int card : {requester, lender}) {
      if (!known(card, card)) {
        throw Exception(Errc::out_of_range, "SimulatedPeerAccess::enable_calls: no card " + std::to_string(card) +
                                                " (the matrix has " + std::to_string(can_.size()) + ")");
      }
    }
    return enabled_[index(requester)][index(lender)];
  }

private:
  bool known(int r, int l) const noexcept {
    return r >= 0 && l >= 0 && static_cast<std::size_t>(r) < can_.size() && static_cast<std::size_t>(l) < can_.size();
  }
  static std::size_t index(int card) noexcept { return static_cast<std::size_t>(card); }

  std::vector<std::vector<bool>> can_;
  std::vector<std::vector<int>> enabled_;
};

static_assert(PeerAccess<AlwaysMapped> && PeerAccess<SimulatedPeerAccess>);

} // namespace carve
