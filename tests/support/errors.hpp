// Checking that a call refuses with the right carve::Errc.
//
//   CHECK_THROWS_ERRC(carve::Errc::invalid_argument, TopologyBuilder({0.0, 24.0, 10.0}));
#pragma once

#include <carve/core/error.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <optional>
#include <string>

namespace carve::test {

// The code of the carve::Exception `f` throws; nullopt when it throws nothing or something else.
template <class F>
std::optional<Errc> thrown_code(F&& f) {
  try {
    f();
  } catch (const Exception& e) {
    return e.code();
  } catch (...) {
    return std::nullopt;
  }
  return std::nullopt;
}

// The message of the carve::Exception `f` throws; "" when it throws none.
template <class F>
std::string thrown_message(F&& f) {
  try {
    f();
  } catch (const Exception& e) {
    return e.what();
  }
  return "";
}

// The line a parse error names ("line 7: ..."); 0 when its message names none.
inline std::size_t message_line(const Exception& e) {
  const std::string m = e.what();
  return m.rfind("line ", 0) == 0 ? static_cast<std::size_t>(std::stoul(m.substr(5))) : 0;
}

} // namespace carve::test

#define CHECK_THROWS_ERRC(code, ...)                                                                                   \
  CHECK(::carve::test::thrown_code([&] { (void)(__VA_ARGS__); }) == std::optional<::carve::Errc>(code))
