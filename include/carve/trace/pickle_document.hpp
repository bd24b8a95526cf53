/// @file carve/trace/pickle_document.hpp
/// What read_pickle (carve/trace/pickle_reader.hpp) returns: the decoded values, kept apart from
/// the opcode machine that builds them, since a caller walks the document and never needs the
/// machine. The machine is its one writer (a friend); everyone else only reads.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace carve::trace {

namespace detail {
class PickleMachine;
} // namespace detail

/// A decoded pickle: every value in one arena, containers referring to their items by index, so
/// shared values (memo references) are stored once and cycles cost nothing.
///
/// Every accessor is total: asked about a value of another kind, or an Id not in the arena, it
/// returns the neutral value (Kind::none, false, 0, 0.0, empty text, no items, nullopt) rather
/// than failing. A caller checks kind() first; one that does not, on a document read from hostile
/// bytes, gets a wrong answer, never undefined behaviour.
class PickleDocument {
public:
  /// A value's index in the arena, 0 .. size() - 1.
  using Id = std::uint32_t;
  /// What a value is. A bool is not an integer here; sets and frozensets are lists, bytearrays bytes.
  /// big_integer: an int beyond 64-bit signed, binary or text, whose value is not kept, only its sign
  /// (PyTorch writes 2^64 - 1 as the line of a C++ frame it has no line for; carve reads no such field).
  enum class Kind : std::uint8_t { none, boolean, integer, floating, string, bytes, list, tuple, dict, big_integer };

  /// The value the pickle stopped with.
  Id root() const noexcept { return root_; }
  /// Values in the arena: each object of the pickle once, however often it is referred to.
  std::size_t size() const noexcept { return values_.size(); }
  /// The offset just after STOP: the bytes from there on were not read.
  std::size_t bytes_read() const noexcept { return bytes_read_; }

  /// What `v` is; Kind::none for an Id not in the arena.
  Kind kind(Id v) const noexcept { return v < values_.size() ? values_[v].kind : Kind::none; }
  /// A bool's value; false for any other kind.
  bool boolean(Id v) const noexcept { return is(v, Kind::boolean) && values_[v].bits != 0; }
  /// An int's value; 0 for any other kind.
  std::int64_t integer(Id v) const noexcept {
    return is(v, Kind::integer) ? static_cast<std::int64_t>(values_[v].bits) : 0;
  }
  /// Whether a big_integer is below -2^63 (else it is above 2^63 - 1); false for any other kind.
  bool big_negative(Id v) const noexcept { return is(v, Kind::big_integer) && values_[v].bits != 0; }
  /// A float's value; 0.0 for any other kind.
  double floating(Id v) const noexcept { return is(v, Kind::floating) ? std::bit_cast<double>(values_[v].bits) : 0.0; }
  /// A str's text (UTF-8) or a bytes' bytes; empty for any other kind.
  std::string_view text(Id v) const noexcept {
    if (!is(v, Kind::string) && !is(v, Kind::bytes)) {
      return {};
    }
    return std::string_view(text_.data() + values_[v].bits, values_[v].length);
  }
  /// A list's or tuple's items in order; empty for any other kind. A list may hold itself.
  std::span<const Id> items(Id v) const noexcept {
    if (!is(v, Kind::list) && !is(v, Kind::tuple)) {
      return {};
    }
    return {items_.data() + values_[v].bits, static_cast<std::size_t>(values_[v].length)};
  }
  /// A dict's (key, value) pairs in insertion order; empty for any other kind.
  std::span<const std::pair<Id, Id>> entries(Id v) const noexcept {
    if (!is(v, Kind::dict)) {
      return {};
    }
    return {entries_.data() + values_[v].bits, static_cast<std::size_t>(values_[v].length)};
  }
  /// The value of `dict`'s str key `key` (the later, should it be set twice); nullopt when absent
  /// or when `dict` is not a dict. Linear in the dict's size: walk entries() to read many keys of
  /// a large dict.
  std::optional<Id> find(Id dict, std::string_view key) const noexcept {
    const auto e = entries(dict);
    for (auto it = e.rbegin(); it != e.rend(); ++it) {
      if (kind(it->first) == Kind::string && text(it->first) == key) {
        return it->second;
      }
    }
    return std::nullopt;
  }

private:
  friend class detail::PickleMachine;

  /// Which Python type a list is: ADDITEMS extends only a set, APPEND(S) only a list.
  enum class Form : std::uint8_t { plain, set, frozenset };
  static constexpr std::uint32_t no_batch = UINT32_MAX;
  struct Value {
    std::uint64_t bits = 0;   ///< a bool, an int (two's complement), a float (IEEE bits); a text's offset in text_;
                              ///< a container's first item in items_ (a dict's first pair in entries_)
    std::uint64_t length = 0; ///< a text's length; a container's items (while reading, its first batch's)
    std::uint32_t slot = no_batch; ///< while reading, a container's latest Batch after its first
    Kind kind = Kind::none;
    Form form = Form::plain;
  };
  /// Items added to a container after its first batch, while reading, where they could not extend
  /// its last run (another container's items came between): `count` of them from `first` in
  /// items_ or entries_, then the batch before (`before`; no_batch: the Value's own run).
  struct Batch {
    std::uint64_t first = 0;
    std::uint64_t count = 0;
    std::uint32_t before = no_batch;
  };

  bool is(Id v, Kind k) const noexcept { return v < values_.size() && values_[v].kind == k; }

  /// While reading: `append` adds items to the end of `arena` (items_ or entries_) for container
  /// `c`, growing its last run where that ends the arena, else starting a batch. False, adding
  /// nothing, when there would be 2^32 - 1 batches.
  template <class T, class Append>
  static bool add_batch(Value& c, std::vector<T>& arena, std::vector<Batch>& batches, Append&& append) {
    const std::uint64_t start = arena.size();
    if (c.slot == no_batch && c.length == 0) {
      c.bits = start; // the first items of an empty container: its run starts here
    }
    if (c.slot == no_batch ? c.bits + c.length != start : batches[c.slot].first + batches[c.slot].count != start) {
      if (batches.size() >= no_batch) {
        return false;
      }
      batches.push_back(Batch{start, 0, c.slot});
      c.slot = static_cast<std::uint32_t>(batches.size() - 1);
    }
    append();
    (c.slot == no_batch ? c.length : batches[c.slot].count) += arena.size() - start;
    return true;
  }
  /// At STOP: each container with batches gets its run and its batches, in order, copied to the
  /// end of `arena`, so that its items are one run. Linear in the items; the arena grows by those
  /// copied, and the runs they came from are left unused.
  template <class T>
  void join_batches(std::vector<T>& arena, const std::vector<Batch>& batches, bool dicts) {
    const auto batched = [&](const Value& v) {
      return v.slot != no_batch && (dicts ? v.kind == Kind::dict : v.kind == Kind::list || v.kind == Kind::tuple);
    };
    std::uint64_t total = arena.size();
    for (const Value& v : values_) {
      for (std::uint32_t b = batched(v) ? v.slot : no_batch; b != no_batch; b = batches[b].before) {
        total += batches[b].count + (batches[b].before == no_batch ? v.length : 0);
      }
    }
    arena.reserve(static_cast<std::size_t>(total)); // no reallocation below: arena[k] stays valid
    const auto copy = [&](std::uint64_t first, std::uint64_t count) {
      for (std::uint64_t k = first; k < first + count; ++k) {
        arena.push_back(arena[static_cast<std::size_t>(k)]);
      }
    };
    std::vector<std::uint32_t> order;
    for (Value& v : values_) {
      if (!batched(v)) {
        continue;
      }
      order.clear();
      for (std::uint32_t b = v.slot; b != no_batch; b = batches[b].before) {
        order.push_back(b);
      }
      const std::uint64_t first = arena.size();
      copy(v.bits, v.length);
      for (auto b = order.rbegin(); b != order.rend(); ++b) {
        copy(batches[*b].first, batches[*b].count);
      }
      v = Value{first, arena.size() - first, no_batch, v.kind, v.form};
    }
  }

  std::vector<Value> values_;
  std::vector<Id> items_;                  ///< every list's and tuple's items, each one's a run
  std::vector<std::pair<Id, Id>> entries_; ///< every dict's pairs, likewise
  std::string text_;                       ///< every str and bytes, end to end
  Id root_ = 0;
  std::size_t bytes_read_ = 0;
};

} // namespace carve::trace
