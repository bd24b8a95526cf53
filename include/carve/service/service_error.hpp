// carve/service/service_error.hpp — how the allocation service reports a failure: an Errc for
// programs to act on and a sentence for people to read.
#pragma once

#include <carve/core/errc.hpp>

#include <cuda/std/expected>

#include <stdexcept>
#include <string>

namespace carve::service {

struct ServiceError {
  Errc code = Errc::bad_message;
  std::string message;
};

template <class T>
using ServiceResult = cuda::std::expected<T, ServiceError>;

inline cuda::std::unexpected<ServiceError> service_error(Errc code, std::string message) {
  return cuda::std::unexpected(ServiceError{code, std::move(message)});
}

// A server that cannot start: its socket directory is unsafe, another server owns the socket,
// the configuration is wrong. Thrown by AllocationServer's constructor and the config readers.
class ServerSetupError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

} // namespace carve::service
