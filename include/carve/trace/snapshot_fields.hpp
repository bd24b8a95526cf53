/// @file carve/trace/snapshot_fields.hpp
/// The typed fields of a PyTorch memory snapshot's dicts (the root, an event, a segment, a
/// segment's block), as carve/trace/memory_snapshot.hpp reads them: each looked up by its str key,
/// checked for its type, and every failure a message naming the event (or the start state), the
/// dict and the key. Kept apart from the reader, which decides what the fields mean; here is only
/// how a field is found, cheaply, and when it is refused.
///
/// Keys the reader does not name are walked past, whatever their values: every PyTorch version
/// adds some (frames, compile_context, user_metadata, segment_pool_id, allocator_settings, ...),
/// and none of them changes a field carve reads.
///
/// A whole number (count) is an int from 0 to 2^63 - 1. An int beyond 64-bit signed reads as a
/// big_integer (carve/trace/pickle_document.hpp), whose value is not kept: where the reader needs
/// it (an address, a size, a stream, a time), it is refused with its own message, "is 2^63 or
/// more, beyond the integers carve reads", since no device, address or size of a real snapshot
/// is that large and a wrapped or clipped value would be a wrong answer, not an error.
#pragma once

#include <carve/core/error.hpp>
#include <carve/trace/allocation_trace.hpp>
#include <carve/trace/pickle_document.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace carve::trace::detail {

/// The str keys the snapshot reader looks up, in every dict it reads: the root, an event, a
/// segment, a segment's block. snapshot_key_names holds them as text, in this order.
// clang-format off
enum class SnapshotKey : std::uint8_t {
  segments, device_traces,                                          // the root
  action, addr, size, stream, time_us,                              // an event (size, stream: others too)
  device, address, total_size, blocks, segment_type, is_expandable, // a segment
  state, requested_size,                                            // a segment's block
};
inline constexpr std::array<std::string_view, 15> snapshot_key_names = {
  "segments", "device_traces",
  "action", "addr", "size", "stream", "time_us",
  "device", "address", "total_size", "blocks", "segment_type", "is_expandable",
  "state", "requested_size",
};
// clang-format on
static_assert(static_cast<std::size_t>(SnapshotKey::requested_size) + 1 == snapshot_key_names.size());

/// Reads typed fields out of the snapshot's dicts, each failure a message with its place.
///
/// A dict's entries are walked once, the first time any of its keys is asked for, and every
/// SnapshotKey found on the way kept (the later of a key set twice, as PickleDocument::find
/// answers). So a dict costs its size once however many of its keys are read and however many
/// references to it the pickle holds: a hostile snapshot whose events all refer to one dict of a
/// million keys reads in time linear in its size, not a million times a million.
class SnapshotFields {
public:
  using Id = PickleDocument::Id;
  using Key = SnapshotKey;

  SnapshotFields(const PickleDocument& doc, const TraceBuilder& builder) : doc_(doc), builder_(builder) {}

  /// The value of `dict`'s key `key`; nullopt when it has none or is not a dict.
  std::optional<Id> find(Id dict, Key key) {
    if (doc_.kind(dict) != PickleDocument::Kind::dict) {
      return std::nullopt;
    }
    if (walked_.empty()) {
      walked_.assign(doc_.size(), not_walked);
    }
    std::uint32_t& at = walked_[dict];
    if (at == not_walked) { // fewer dicts than values, and those fewer than 2^32 - 1
      at = static_cast<std::uint32_t>(found_.size());
      found_.emplace_back().fill(absent);
      for (const auto& [k, v] : doc_.entries(dict)) {
        const auto name = doc_.kind(k) == PickleDocument::Kind::string ? doc_.text(k) : std::string_view();
        for (std::size_t i = 0; i < snapshot_key_names.size() && !name.empty(); ++i) {
          if (name == snapshot_key_names[i]) { // a length compared first: O(1) for another key
            found_[at][i] = v;
            break;
          }
        }
      }
    }
    const Id v = found_[at][static_cast<std::size_t>(key)];
    return v == absent ? std::nullopt : std::optional<Id>(v);
  }

  /// The value of `dict`'s key `key`. Errors: `dict` is not a dict, or has no such key.
  [[nodiscard]] Result<Id> field(Id dict, Key key, std::optional<std::uint64_t> event, const char* where) {
    if (doc_.kind(dict) != PickleDocument::Kind::dict) {
      return builder_.failure(std::string(where) + " is not a dict", event);
    }
    const auto id = find(dict, key);
    if (!id) {
      return builder_.failure(std::string(where) + " has no '" + name(key) + "'", event);
    }
    return *id;
  }

  /// `dict`'s key `key` as a whole number. Errors: as field(), or the value is not an int of 0 to
  /// 2^63 - 1.
  [[nodiscard]] Result<std::uint64_t> count(Id dict, Key key, std::optional<std::uint64_t> event, const char* where) {
    auto id = field(dict, key, event, where);
    if (!id) {
      return cuda::std::unexpected(id.error());
    }
    return whole(*id, key, event, where);
  }

  /// Value `v`, found as `where`'s key `key`, as a whole number. Errors: it is not an int of 0 to
  /// 2^63 - 1 (a big_integer above that with a message of its own).
  [[nodiscard]] Result<std::uint64_t> whole(Id v, Key key, std::optional<std::uint64_t> event, const char* where) {
    if (doc_.kind(v) == PickleDocument::Kind::big_integer && !doc_.big_negative(v)) {
      return builder_.failure(
          std::string(where) + "'s '" + name(key) + "' is 2^63 or more, beyond the integers carve reads", event);
    }
    if (doc_.kind(v) != PickleDocument::Kind::integer || doc_.integer(v) < 0) {
      return builder_.failure(std::string(where) + "'s '" + name(key) + "' is not a whole number", event);
    }
    return static_cast<std::uint64_t>(doc_.integer(v));
  }

  /// `dict`'s key `key` as a str. Errors: as field(), or the value is not a str.
  [[nodiscard]] Result<std::string_view> text(Id dict, Key key, std::optional<std::uint64_t> event, const char* where) {
    auto id = field(dict, key, event, where);
    if (!id) {
      return cuda::std::unexpected(id.error());
    }
    if (doc_.kind(*id) != PickleDocument::Kind::string) {
      return builder_.failure(std::string(where) + "'s '" + name(key) + "' is not a string", event);
    }
    return doc_.text(*id);
  }

  /// `dict`'s key `key` as a list's (or tuple's) items. Errors: as field(), or not a list.
  [[nodiscard]] Result<std::span<const Id>> list(Id dict, Key key, std::optional<std::uint64_t> event,
                                                 const char* where) {
    auto id = field(dict, key, event, where);
    if (!id) {
      return cuda::std::unexpected(id.error());
    }
    if (doc_.kind(*id) != PickleDocument::Kind::list && doc_.kind(*id) != PickleDocument::Kind::tuple) {
      return builder_.failure(std::string(where) + "'s '" + name(key) + "' is not a list", event);
    }
    return doc_.items(*id);
  }

private:
  static constexpr std::uint32_t not_walked = UINT32_MAX;
  static constexpr Id absent = UINT32_MAX; // no value's Id: the arena holds fewer than 2^32 - 1

  static std::string name(Key key) { return std::string(snapshot_key_names[static_cast<std::size_t>(key)]); }

  const PickleDocument& doc_;
  const TraceBuilder& builder_;
  std::vector<std::uint32_t> walked_;                            ///< by Id: index in found_, or not_walked
  std::vector<std::array<Id, snapshot_key_names.size()>> found_; ///< by SnapshotKey: the value, or absent
};

} // namespace carve::trace::detail
