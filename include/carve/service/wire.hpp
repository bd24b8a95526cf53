/// @file carve/service/wire.hpp
/// The byte level of carve's service protocol: fixed-width little-endian integers, IEEE-754
/// doubles by their bits, length-prefixed text and lists.
///
/// Every message type lists its fields once, in a `fields(archive, message)` function; WireWriter
/// and WireReader are the two archives, so encoding and decoding cannot drift apart, and
/// WireSizer counts the fewest bytes a type takes (min_wire_size) from the same list. The reader
/// never reads past its input, never allocates more than the input could describe (a list's
/// count is checked against the bytes left before anything is reserved), and records the first
/// problem instead of throwing; callers check ok() once at the end.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace carve::service {

/// The encoding archive: appends fields to a byte vector. Encoding cannot fail.
class WireWriter {
public:
  /// Appends to `out`, which must outlive the writer.
  explicit WireWriter(std::vector<std::uint8_t>& out) : out_(out) {}

  /// Appends each value: integers little-endian in their own width, a bool as one byte (0 or 1),
  /// a double by its 8 bytes, a byte array as it is.
  template <class... T>
  void operator()(const T&... values) {
    (put(values), ...);
  }
  /// A u16 length, then the bytes. Text longer than `max_length` is cut to it, so that whatever
  /// is encoded decodes.
  void text(const std::string& s, std::size_t max_length) {
    const std::size_t n = std::min(s.size(), max_length);
    put(static_cast<std::uint16_t>(n));
    out_.insert(out_.end(), s.begin(), s.begin() + static_cast<std::ptrdiff_t>(n));
  }
  /// A u32 count, then each item (numbers as operator() writes them, structs by their fields()).
  /// A list longer than `max_count` is cut to it.
  template <class T>
  void list(const std::vector<T>& items, std::size_t max_count) {
    const std::size_t n = std::min(items.size(), max_count);
    put(static_cast<std::uint32_t>(n));
    for (std::size_t i = 0; i < n; ++i) {
      if constexpr (std::is_arithmetic_v<T>) {
        put(items[i]);
      } else {
        fields(*this, items[i]);
      }
    }
  }
  /// An enum as its underlying integer.
  template <class E>
  void enumeration(const E& e) {
    put(static_cast<std::underlying_type_t<E>>(e));
  }

private:
  template <class T>
  void put(T value) {
    if constexpr (std::is_same_v<T, bool>) {
      out_.push_back(value ? 1 : 0);
    } else if constexpr (std::is_floating_point_v<T>) {
      static_assert(sizeof(T) == 8);
      put(std::bit_cast<std::uint64_t>(value));
    } else if constexpr (std::is_integral_v<T>) {
      using U = std::make_unsigned_t<T>;
      const auto u = static_cast<U>(value);
      for (std::size_t i = 0; i < sizeof(T); ++i) {
        out_.push_back(static_cast<std::uint8_t>(u >> (8 * i)));
      }
    } else {
      static_assert(std::is_same_v<T, std::array<std::uint8_t, std::tuple_size_v<T>>>);
      out_.insert(out_.end(), value.begin(), value.end());
    }
  }

  std::vector<std::uint8_t>& out_;
};

/// The counting archive: the fewest bytes a type's fields() take on the wire (every text and list
/// empty), for min_wire_size. Counts what WireWriter writes: each value in its own width, a u16
/// length per text, a u32 count per list.
class WireSizer {
public:
  /// Each value's width: integers, a bool (1), a double (8), a byte array (its length).
  template <class... T>
  void operator()(const T&...) noexcept {
    (count<T>(), ...);
  }
  /// The u16 length; the text may be empty.
  void text(const std::string&, std::size_t) noexcept { bytes_ += sizeof(std::uint16_t); }
  /// The u32 count; the list may be empty.
  template <class T>
  void list(const std::vector<T>&, std::size_t) noexcept {
    bytes_ += sizeof(std::uint32_t);
  }
  /// The underlying integer's width.
  template <class E>
  void enumeration(const E&) noexcept {
    bytes_ += sizeof(std::underlying_type_t<E>);
  }
  /// The bytes counted so far.
  std::size_t bytes() const noexcept { return bytes_; }

private:
  template <class T>
  void count() noexcept {
    // A bool is one byte, a double its 8, an integer its width, a byte array its length.
    if constexpr (!std::is_arithmetic_v<T>) {
      static_assert(std::is_same_v<T, std::array<std::uint8_t, std::tuple_size_v<T>>>);
    }
    bytes_ += std::is_same_v<T, bool> ? 1 : sizeof(T);
  }

  std::size_t bytes_ = 0;
};

/// Bytes one element of a list takes at least on the wire, so that a count can be checked
/// against the input before the list is built: a number's width, and for a struct what its
/// fields() add up to (counted once, by WireSizer), so the figure cannot disagree with the layout.
template <class T>
std::size_t min_wire_size() {
  if constexpr (std::is_arithmetic_v<T>) {
    return sizeof(T);
  } else {
    static const std::size_t bytes = [] {
      WireSizer s;
      const T fewest{};
      fields(s, fewest);
      return s.bytes();
    }();
    return bytes;
  }
}

/// The decoding archive: reads fields from one message's bytes, never past them, and records the
/// first problem instead of throwing (check ok() or finished() at the end).
class WireReader {
public:
  /// Reads `in`, which must outlive the reader.
  explicit WireReader(std::span<const std::uint8_t> in) : in_(in) {}

  /// Reads each value as WireWriter::operator() wrote it; a bool other than 0 or 1 fails. After
  /// a failure the values read mean nothing.
  template <class... T>
  void operator()(T&... values) {
    (get(values), ...);
  }
  /// Fails for a length above `max_length` or past the end of the input.
  void text(std::string& s, std::size_t max_length) {
    std::uint16_t n = 0;
    get(n);
    if (n > max_length) {
      return fail("text longer than its limit");
    }
    if (!take(n)) {
      return;
    }
    s.assign(reinterpret_cast<const char*>(in_.data() + pos_ - n), n);
  }
  /// Fails for a count above `max_count`, or more items than the bytes left could hold
  /// (min_wire_size each), before anything is allocated.
  template <class T>
  void list(std::vector<T>& items, std::size_t max_count) {
    std::uint32_t n = 0;
    get(n);
    if (n > max_count) {
      return fail("list longer than its limit");
    }
    if (!ok_ || static_cast<std::size_t>(n) * min_wire_size<T>() > remaining()) {
      return fail("list count exceeds the message");
    }
    items.assign(n, T{});
    for (T& item : items) {
      if constexpr (std::is_arithmetic_v<T>) {
        get(item);
      } else {
        fields(*this, item);
      }
    }
  }
  /// The underlying integer, unchecked: the field's reader checks the range and calls fail().
  template <class E>
  void enumeration(E& e) {
    std::underlying_type_t<E> raw{};
    get(raw);
    e = static_cast<E>(raw);
  }

  /// Records `why` (a string literal) as the error, unless one is recorded already. For checks a
  /// field's reader does on the value (an enum's range, a bool's 0 or 1).
  void fail(const char* why) {
    if (ok_) {
      ok_ = false;
      error_ = why;
    }
  }
  /// Nothing has failed so far.
  bool ok() const noexcept { return ok_; }
  /// The whole input was used and nothing failed: a message must not carry trailing bytes.
  bool finished() const noexcept { return ok_ && pos_ == in_.size(); }
  /// The first failure's reason; "" while ok().
  const char* error() const noexcept { return error_; }
  /// Bytes not read yet.
  std::size_t remaining() const noexcept { return in_.size() - pos_; }

private:
  bool take(std::size_t n) {
    if (!ok_ || n > remaining()) {
      fail("message ends inside a field");
      return false;
    }
    pos_ += n;
    return true;
  }
  template <class T>
  void get(T& value) {
    if constexpr (std::is_same_v<T, bool>) {
      std::uint8_t b = 0;
      get(b);
      if (b > 1) {
        fail("a flag that is neither 0 nor 1");
      }
      value = b == 1;
    } else if constexpr (std::is_floating_point_v<T>) {
      std::uint64_t bits = 0;
      get(bits);
      value = std::bit_cast<T>(bits);
    } else if constexpr (std::is_integral_v<T>) {
      using U = std::make_unsigned_t<T>;
      if (!take(sizeof(T))) {
        return;
      }
      U u = 0;
      for (std::size_t i = 0; i < sizeof(T); ++i) {
        u = static_cast<U>(u | static_cast<U>(static_cast<U>(in_[pos_ - sizeof(T) + i]) << (8 * i)));
      }
      value = static_cast<T>(u);
    } else {
      if (take(value.size())) {
        for (std::size_t i = 0; i < value.size(); ++i) {
          value[i] = in_[pos_ - value.size() + i];
        }
      }
    }
  }

  std::span<const std::uint8_t> in_;
  std::size_t pos_ = 0;
  bool ok_ = true;
  const char* error_ = "";
};

} // namespace carve::service
