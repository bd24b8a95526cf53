/// @file carve/core/errc.hpp
/// The error values every carve operation reports.
///
/// Paths that can run on a device return `cuda::std::expected<T, carve::Errc>`; host-only layers
/// may turn an Errc into a std::error_code (or throw a std::system_error carrying it).
#pragma once

#include <carve/core/config.hpp>

#include <string>
#include <system_error>

namespace carve {

/// Why a carve operation failed.
///
/// The numeric values travel in the allocation service's wire protocol (carve/service/): add new
/// values at the end only.
enum class Errc {
  no_space = 1,       ///< this resource cannot serve the request: full, larger than it could ever hold, or
                      ///< an alignment coarser than it gives (another resource might: FallbackResource asks it)
  invalid_size,       ///< no resource could serve it: 0 bytes, an alignment that is not a power of two, a
                      ///< size that overflows when rounded up (or a free whose size is not the allocation's)
  out_of_range,       ///< a range that ends past the resource or wraps around
  not_allocated,      ///< releasing something that is (partly) free already
  invalid_placement,  ///< a fit policy proposed a run that is not free: a bug in that policy
  invalid_thresholds, ///< tier thresholds that are empty, unsorted, repeated or too many
  full,               ///< a bounded queue (or the tier a request belongs to) has no room
  empty,              ///< nothing to take from a queue
  closed,             ///< the queue was closed: no more pushes; pops end once it has drained
  timed_out,          ///< a blocking call's deadline passed first
  invalid_argument,   ///< a parameter outside its documented domain (a zero capacity, a wrong-length weight list)
  device_error,       ///< a device (or its copy engine) failed an operation

  // Talking to a server (carve/service/).
  permission_denied,   ///< the thing named belongs to another client
  bad_message,         ///< a message that does not decode: malformed, truncated, oversized or unknown
  unsupported_version, ///< the other side speaks a protocol version (or needs a feature) this build lacks
  disconnected,        ///< the connection is gone (the server stopped, restarted or timed out)

  unsupported, ///< the system or this build lacks what the call needs (NUMA, a GPU, a kernel feature)
  io_error,    ///< reading or writing a file or device failed
};

/// The highest value, for decoders that check a number they were sent.
inline constexpr Errc last_errc = Errc::io_error;

/// A short, stable, lowercase description; never null.
CARVE_HOST_DEVICE constexpr const char* to_string(Errc e) noexcept {
  switch (e) {
  case Errc::no_space:
    return "no space";
  case Errc::invalid_size:
    return "invalid size";
  case Errc::out_of_range:
    return "out of range";
  case Errc::not_allocated:
    return "not allocated";
  case Errc::invalid_placement:
    return "fit policy proposed a run that is not free";
  case Errc::invalid_thresholds:
    return "invalid tier thresholds";
  case Errc::full:
    return "full";
  case Errc::empty:
    return "empty";
  case Errc::closed:
    return "closed";
  case Errc::timed_out:
    return "timed out";
  case Errc::invalid_argument:
    return "invalid argument";
  case Errc::device_error:
    return "device error";
  case Errc::permission_denied:
    return "permission denied";
  case Errc::bad_message:
    return "bad message";
  case Errc::unsupported_version:
    return "unsupported protocol version";
  case Errc::disconnected:
    return "disconnected";
  case Errc::unsupported:
    return "unsupported";
  case Errc::io_error:
    return "input/output error";
  }
  return "unknown carve error";
}

namespace detail {
class ErrcCategory final : public std::error_category {
public:
  const char* name() const noexcept override { return "carve"; }
  std::string message(int value) const override { return to_string(static_cast<Errc>(value)); }
};
} // namespace detail

/// The std::error_category of carve's Errc values (named "carve"; messages from to_string).
inline const std::error_category& error_category() noexcept {
  static const detail::ErrcCategory category;
  return category;
}

/// `e` as a std::error_code; found by argument-dependent lookup, so `std::error_code ec = e;` works.
inline std::error_code make_error_code(Errc e) noexcept { return {static_cast<int>(e), error_category()}; }

} // namespace carve

/// @cond
template <>
struct std::is_error_code_enum<carve::Errc> : std::true_type {};
/// @endcond
