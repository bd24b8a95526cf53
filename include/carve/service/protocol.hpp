/// @file carve/service/protocol.hpp
/// The encoding of carve's service protocol (version 2): the header, encode() and the strict
/// decoders. The messages are in protocol_messages.hpp, their field layouts in
/// protocol_layout.hpp; this header includes both.
///
/// Transport: a Unix-domain SOCK_SEQPACKET connection, so one send is one message. A message is
/// a 16-byte header and a payload, every integer little-endian:
///
/// @code{.unparsed}
///   offset 0  u32 magic     0x45565243 ("CRVE" in byte order)
///          4  u16 version   protocol_version; anything else is refused
///          6  u16 type      MessageType
///          8  u32 length    payload bytes; must equal the message size - 16
///         12  u32 sequence  chosen by the client (never 0); a reply repeats its request's
/// @endcode
///
/// Requests are at most max_request_size bytes, replies at most max_message_size.
///
/// Decoding is strict: a wrong magic, version or length, a truncated or oversized message, an
/// unknown enum value, a flag other than 0 or 1, a list or text beyond its limit, or trailing
/// bytes are errors (DecodeError), never undefined behaviour. decode(encode(m)) == m, and a
/// message that decodes re-encodes to the same bytes (the fuzz target checks both).
#pragma once

#include <carve/core/error.hpp>
#include <carve/service/protocol_layout.hpp>
#include <carve/service/protocol_messages.hpp>
#include <carve/service/wire.hpp>

#include <cuda/std/expected>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

namespace carve::service {

/// The header type of message type M.
template <class M>
constexpr MessageType message_type() noexcept {
  return std::remove_cvref_t<M>::type;
}

/// Why a message does not decode (an Error: bad_message, or unsupported_version for another
/// protocol version), and what the reply to it needs.
struct DecodeError : Error {
  /// The byte stream cannot be trusted any more (bad header, malformed payload), so the receiver
  /// answers once and closes the connection; an unknown but well-framed message type is not fatal.
  bool fatal = true;
  std::uint32_t sequence = 0; ///< the header's, when the header was readable (for the error reply)
};

/// A message that decoded: its header's sequence and its body (a Request or a Reply).
template <class Body>
struct Decoded {
  std::uint32_t sequence = 0; ///< 0 for the server's notices
  Body body;                  ///< the message
};

namespace detail {

template <class M>
void encode_into(std::vector<std::uint8_t>& out, const M& message, std::uint32_t sequence) {
  out.clear();
  WireWriter w(out);
  w(protocol_magic, protocol_version, static_cast<std::uint16_t>(message_type<M>()), std::uint32_t{0}, sequence);
  fields(w, message);
  const auto length = static_cast<std::uint32_t>(out.size() - header_size);
  for (std::size_t i = 0; i < 4; ++i) {
    out[8 + i] = static_cast<std::uint8_t>(length >> (8 * i));
  }
}

// Tries every alternative of the variant whose message type is `type`.
template <class Variant, std::size_t I = 0>
bool decode_body(std::uint16_t type, WireReader& r, Variant& out) {
  if constexpr (I == std::variant_size_v<Variant>) {
    return false;
  } else {
    using M = std::variant_alternative_t<I, Variant>;
    if (type == static_cast<std::uint16_t>(message_type<M>())) {
      M m;
      fields(r, m);
      out = std::move(m);
      return true;
    }
    return decode_body<Variant, I + 1>(type, r, out);
  }
}

template <class Variant>
[[nodiscard]] cuda::std::expected<Decoded<Variant>, DecodeError> decode(std::span<const std::uint8_t> bytes,
                                                                        std::size_t max_size) {
  using Result = cuda::std::expected<Decoded<Variant>, DecodeError>;
  std::uint32_t sequence = 0;
  const auto fail = [&sequence](Errc code, std::string reason, bool fatal = true) {
    return Result(cuda::std::unexpect, DecodeError{{code, std::move(reason)}, fatal, sequence});
  };
  if (bytes.size() > max_size) {
    return fail(Errc::bad_message, "message of " + std::to_string(bytes.size()) + " bytes exceeds the limit of " +
                                       std::to_string(max_size));
  }
  if (bytes.size() < header_size) {
    return fail(Errc::bad_message, "truncated header (" + std::to_string(bytes.size()) + " bytes)");
  }
  WireReader r(bytes);
  std::uint32_t magic = 0;
  std::uint16_t version = 0;
  std::uint16_t type = 0;
  std::uint32_t length = 0;
  r(magic, version, type, length, sequence);
  if (magic != protocol_magic) {
    sequence = 0;
    return fail(Errc::bad_message, "not a carve message (bad magic)");
  }
  if (version != protocol_version) {
    return fail(Errc::unsupported_version, "protocol version " + std::to_string(version) +
                                               " is not supported (this side speaks " +
                                               std::to_string(protocol_version) + ")");
  }
  if (length != bytes.size() - header_size) {
    return fail(Errc::bad_message, "header announces " + std::to_string(length) + " payload bytes but " +
                                       std::to_string(bytes.size() - header_size) + " arrived");
  }
  Decoded<Variant> d;
  d.sequence = sequence;
  if (!decode_body(type, r, d.body)) {
    return fail(Errc::bad_message, "unknown message type " + std::to_string(type), false);
  }
  if (!r.finished()) {
    return fail(Errc::bad_message, std::string("malformed payload: ") + (r.ok() ? "trailing bytes" : r.error()));
  }
  return d;
}

} // namespace detail

/// The request's bytes, header included, with `sequence` in the header. Text and lists beyond
/// their limits are cut to them (see WireWriter).
inline std::vector<std::uint8_t> encode(const Request& request, std::uint32_t sequence) {
  std::vector<std::uint8_t> out;
  std::visit([&](const auto& m) { detail::encode_into(out, m, sequence); }, request);
  return out;
}
/// The reply's bytes, header included, as for a request.
inline std::vector<std::uint8_t> encode(const Reply& reply, std::uint32_t sequence) {
  std::vector<std::uint8_t> out;
  std::visit([&](const auto& m) { detail::encode_into(out, m, sequence); }, reply);
  return out;
}

/// One request of at most max_request_size bytes, decoded strictly (see the file's description).
[[nodiscard]] inline cuda::std::expected<Decoded<Request>, DecodeError>
decode_request(std::span<const std::uint8_t> bytes) {
  return detail::decode<Request>(bytes, max_request_size);
}
/// One reply of at most max_message_size bytes, decoded strictly.
[[nodiscard]] inline cuda::std::expected<Decoded<Reply>, DecodeError>
decode_reply(std::span<const std::uint8_t> bytes) {
  return detail::decode<Reply>(bytes, max_message_size);
}

} // namespace carve::service
