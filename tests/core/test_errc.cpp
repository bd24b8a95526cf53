#include <carve/core/errc.hpp>

#include <doctest/doctest.h>

#include <ostream>
#include <string>
#include <system_error>

TEST_CASE("every error has a message and a std::error_code") {
  for (carve::Errc e : {carve::Errc::no_space, carve::Errc::invalid_size, carve::Errc::out_of_range,
                        carve::Errc::not_allocated, carve::Errc::invalid_placement, carve::Errc::invalid_thresholds,
                        carve::Errc::full, carve::Errc::empty, carve::Errc::closed, carve::Errc::timed_out,
                        carve::Errc::invalid_argument, carve::Errc::device_error, carve::Errc::permission_denied,
                        carve::Errc::bad_message, carve::Errc::unsupported_version, carve::Errc::disconnected}) {
    const std::error_code ec = e; // implicit, through is_error_code_enum
    CHECK(ec);
    CHECK(ec.category().name() == std::string("carve"));
    CHECK(ec.message() == carve::to_string(e));
    CHECK(ec == e);
  }
  CHECK(std::string(carve::to_string(carve::Errc::not_allocated)) == "not allocated");
  CHECK(std::string(carve::to_string(carve::Errc::unsupported_version)) == "unsupported protocol version");
}

TEST_CASE("a carve error travels in a std::system_error") {
  try {
    throw std::system_error(carve::Errc::no_space, "allocate(4)");
  } catch (const std::system_error& e) {
    CHECK(e.code() == carve::Errc::no_space);
    CHECK(std::string(e.what()).find("no space") != std::string::npos);
  }
}
