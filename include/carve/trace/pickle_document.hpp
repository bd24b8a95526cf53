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
  enum class Kind : std::uint8_t { none, boolean, integer, floating, string, bytes, list, tuple, dict };

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
    return lists_[values_[v].slot];
  }
  /// A dict's (key, value) pairs in insertion order; empty for any other kind.
  std::span<const std::pair<Id, Id>> entries(Id v) const noexcept {
    if (!is(v, Kind::dict)) {
      return {};
    }
    return dicts_[values_[v].slot];
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
  struct Value {
    std::uint64_t bits = 0;   ///< a bool, an int (two's complement), a float (IEEE bits); a text's offset in text_
    std::uint64_t length = 0; ///< a text's length
    std::uint32_t slot = 0;   ///< a list's or tuple's index in lists_, a dict's in dicts_
    Kind kind = Kind::none;
    Form form = Form::plain;
  };

  bool is(Id v, Kind k) const noexcept { return v < values_.size() && values_[v].kind == k; }

  std::vector<Value> values_;
  std::vector<std::vector<Id>> lists_;
  std::vector<std::vector<std::pair<Id, Id>>> dicts_;
  std::string text_; ///< every str and bytes, end to end
  Id root_ = 0;
  std::size_t bytes_read_ = 0;
};

} // namespace carve::trace
