/// @file carve/core/error.hpp
/// How carve fails: one error value, one exception, one rule for constructors.
///
/// @code
/// device paths      cuda::std::expected<T, carve::Errc>     (no strings, no exceptions)
/// host, explained   carve::Result<T> = cuda::std::expected<T, carve::Error>   {code, message}
/// host, throwing    carve::Exception (what() is the message; error() the Error)
/// @endcode
///
/// Constructors: a constructor given bad input throws carve::Exception with the code and a
/// message saying what was wrong, and builds nothing. Device code cannot throw, so the few types
/// a kernel constructs check the same input there and, instead of throwing, leave the object
/// refusing every call with the code (their status() tells it). The throwing spellings
/// (`allocate`, `allocate_sync`, a std::pmr adaptor's allocations) throw carve::Exception too,
/// with Errc::no_space when the resource is out of memory.
#pragma once

#include <carve/core/errc.hpp>

#include <cuda/std/expected>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <utility>

namespace carve {

/// A failure explained: the code a program acts on and a sentence a person reads.
struct Error {
  Errc code = Errc::invalid_argument; ///< what a program acts on
  std::string message;                ///< what a person reads; may be empty

  /// The message, or the code's description when there is none.
  std::string describe() const { return message.empty() ? std::string(to_string(code)) : message; }

  /// Equal when code and message are.
  friend bool operator==(const Error&, const Error&) = default;
};

/// A host result: a `T`, or the Error explaining why there is none.
template <class T>
using Result = cuda::std::expected<T, Error>;

/// A success on the device-path kind, to return by copy from a hot host path: a function that
/// returns `{}` builds its answer in pieces on the stack, and GCC reads it back whole before those
/// stores land (a stall per call).
inline constexpr cuda::std::expected<void, Errc> succeeded{};

namespace detail {
// A hot path's answer built where it is returned, from plain values that leave a callee in
// registers: success for `why` == Errc{} (no reason), else the error.
inline cuda::std::expected<void, Errc> answered(Errc why) noexcept {
  return why == Errc{} ? succeeded : cuda::std::unexpected(why);
}
// The same for an allocation: the block, or (null) the reason there is none. `why` by reference,
// so that `allocation_answer(take(..., why), why)` reads it once take() has set it.
inline cuda::std::expected<void*, Errc> allocation_answer(void* p, const Errc& why) noexcept {
  return p != nullptr ? cuda::std::expected<void*, Errc>(p) : cuda::std::unexpected(why);
}
} // namespace detail

/// The failed Result for `code` and `message`: `return carve::fail(Errc::invalid_argument, "...");`.
inline cuda::std::unexpected<Error> fail(Errc code, std::string message) {
  return cuda::std::unexpected(Error{code, std::move(message)});
}

/// The one exception carve throws. A std::runtime_error, so existing handlers catch it; what()
/// is the message alone, so it prints as the sentence it is.
class Exception : public std::runtime_error {
public:
  /// Carries `error`; what() is its Error::describe().
  explicit Exception(Error error) : std::runtime_error(error.describe()), error_(std::move(error)) {}
  /// Carries Error{code, message}.
  Exception(Errc code, std::string message) : Exception(Error{code, std::move(message)}) {}

  /// The error carried.
  const Error& error() const noexcept { return error_; }
  /// The error's code.
  Errc code() const noexcept { return error_.code; }

private:
  Error error_;
};

namespace detail {
// What every throwing spelling throws for a refused request: carve::Exception with the Errc
// (no_space when the resource is out of memory) and a sentence naming the resource and request.
[[noreturn]] inline void throw_allocation_failure(const char* who, Errc error, std::size_t bytes,
                                                  std::size_t alignment) {
  throw Exception(error, std::string(who) + ": cannot allocate " + std::to_string(bytes) + " bytes aligned to " +
                             std::to_string(alignment) + ": " + to_string(error));
}
} // namespace detail

/// The value of `r`, or throws its error.
template <class T>
T value_or_throw(Result<T>&& r) {
  if (!r) {
    throw Exception(std::move(r.error()));
  }
  if constexpr (!std::is_void_v<T>) {
    return std::move(*r);
  }
}

} // namespace carve
