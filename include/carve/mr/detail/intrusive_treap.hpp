/// @file carve/mr/detail/intrusive_treap.hpp
/// An ordered set of element ids whose links live in the elements themselves: BestFitRanges files
/// each size class's free ranges in one, so that finding the best fit in a class costs O(log n)
/// however many ranges it holds, and filing or unfiling a range never allocates (give() is
/// noexcept).
///
/// A treap: a binary search tree in the caller's order that is also a heap in a priority drawn
/// from a hash of each element's id, so its shape is that of a tree built in random order whatever
/// order the elements come in (expected depth O(log n), no balancing state to keep). Elements are
/// named by 32-bit ids; `Access` maps an id to its TreapLinks (`links(id)`) and orders two ids
/// (`before(a, b)`, a strict total order that must not change while the id is filed).
#pragma once

#include <cstddef>
#include <cstdint>

namespace carve::detail {

/// The id that names no element.
inline constexpr std::uint32_t treap_none = UINT32_MAX;

/// Where an element sits in its IntrusiveTreap (kept in the element).
struct TreapLinks {
  std::uint32_t parent = treap_none; ///< treap_none at the root
  std::uint32_t left = treap_none;   ///< the subtree ordered before it
  std::uint32_t right = treap_none;  ///< the subtree ordered after it
};

/// Operations on one treap, given its root (an id, treap_none when empty) and an `Access` to the
/// elements' links and order. Nothing allocates and nothing throws.
template <class Access>
struct IntrusiveTreap {
  /// Files `n` (not filed anywhere now).
  static void insert(std::uint32_t& root, std::uint32_t n, const Access& at) noexcept {
    at.links(n) = TreapLinks{};
    if (root == treap_none) {
      root = n;
      return;
    }
    for (std::uint32_t cur = root;;) {
      TreapLinks& c = at.links(cur);
      std::uint32_t& child = at.before(n, cur) ? c.left : c.right;
      if (child == treap_none) {
        child = n;
        at.links(n).parent = cur;
        break;
      }
      cur = child;
    }
    while (at.links(n).parent != treap_none && above(n, at.links(n).parent)) {
      rotate_up(root, n, at);
    }
  }

  /// Unfiles `n` (filed in this treap).
  static void erase(std::uint32_t& root, std::uint32_t n, const Access& at) noexcept {
    for (;;) { // rotate it down, its higher child up, until it is a leaf
      const TreapLinks& l = at.links(n);
      if (l.left == treap_none && l.right == treap_none) {
        break;
      }
      const bool left_up = l.right == treap_none || (l.left != treap_none && above(l.left, l.right));
      rotate_up(root, left_up ? l.left : l.right, at);
    }
    const std::uint32_t p = at.links(n).parent;
    if (p == treap_none) {
      root = treap_none;
    } else {
      TreapLinks& pl = at.links(p);
      (pl.left == n ? pl.left : pl.right) = treap_none;
    }
  }

  /// The first element in order, or treap_none.
  static std::uint32_t first(std::uint32_t root, const Access& at) noexcept {
    return outermost(root, at, &TreapLinks::left);
  }
  /// The last element in order, or treap_none.
  static std::uint32_t last(std::uint32_t root, const Access& at) noexcept {
    return outermost(root, at, &TreapLinks::right);
  }

  /// The element after `n` in order, or treap_none.
  static std::uint32_t next(std::uint32_t n, const Access& at) noexcept {
    if (at.links(n).right != treap_none) {
      return first(at.links(n).right, at);
    }
    std::uint32_t p = at.links(n).parent;
    while (p != treap_none && at.links(p).right == n) {
      n = p;
      p = at.links(p).parent;
    }
    return p;
  }

  /// The first element for which `below` is false, or treap_none; `below` must hold for a prefix
  /// of the order and for nothing after it.
  template <class Below>
  static std::uint32_t lower_bound(std::uint32_t root, const Access& at, Below below) noexcept {
    std::uint32_t found = treap_none;
    while (root != treap_none) {
      if (below(root)) {
        root = at.links(root).right;
      } else {
        found = root;
        root = at.links(root).left;
      }
    }
    return found;
  }

  /// Whether every link is right (parents match children, each element's priority is above its
  /// children's) and the elements run in strictly increasing order; `count` is set to how many
  /// there are. For tests; recursion as deep as the tree.
  static bool valid(std::uint32_t root, const Access& at, std::size_t& count) {
    count = 0;
    if (root != treap_none && (at.links(root).parent != treap_none || !valid_links(root, at))) {
      return false;
    }
    for (std::uint32_t n = first(root, at), prev = treap_none; n != treap_none; prev = n, n = next(n, at)) {
      if (prev != treap_none && !at.before(prev, n)) {
        return false;
      }
      ++count;
    }
    return true;
  }

private:
  // The priority of element `n`: a hash of its id (murmur3's finaliser), ties broken by the id.
  static bool above(std::uint32_t a, std::uint32_t b) noexcept {
    const std::uint32_t pa = mix(a);
    const std::uint32_t pb = mix(b);
    return pa != pb ? pa > pb : a > b;
  }
  static std::uint32_t mix(std::uint32_t x) noexcept {
    x ^= x >> 16;
    x *= 0x85ebca6bu;
    x ^= x >> 13;
    x *= 0xc2b2ae35u;
    x ^= x >> 16;
    return x;
  }

  // The element reached from `root` by following `side` links to their end, or treap_none.
  static std::uint32_t outermost(std::uint32_t root, const Access& at, std::uint32_t TreapLinks::*side) noexcept {
    if (root == treap_none) {
      return treap_none;
    }
    while (at.links(root).*side != treap_none) {
      root = at.links(root).*side;
    }
    return root;
  }

  // Rotates `n` above its parent, keeping the order.
  static void rotate_up(std::uint32_t& root, std::uint32_t n, const Access& at) noexcept {
    TreapLinks& nl = at.links(n);
    const std::uint32_t p = nl.parent;
    TreapLinks& pl = at.links(p);
    const std::uint32_t g = pl.parent;
    if (pl.left == n) {
      pl.left = nl.right;
      if (nl.right != treap_none) {
        at.links(nl.right).parent = p;
      }
      nl.right = p;
    } else {
      pl.right = nl.left;
      if (nl.left != treap_none) {
        at.links(nl.left).parent = p;
      }
      nl.left = p;
    }
    pl.parent = n;
    nl.parent = g;
    if (g == treap_none) {
      root = n;
    } else {
      TreapLinks& gl = at.links(g);
      (gl.left == p ? gl.left : gl.right) = n;
    }
  }

  static bool valid_links(std::uint32_t n, const Access& at) {
    const TreapLinks& l = at.links(n);
    const auto valid_child = [&](std::uint32_t child) {
      return child == treap_none || (at.links(child).parent == n && !above(child, n) && valid_links(child, at));
    };
    return valid_child(l.left) && valid_child(l.right);
  }
};

} // namespace carve::detail
