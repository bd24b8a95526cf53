#include <carve/fmt.hpp>

#include <doctest/doctest.h>

#include <string>

TEST_CASE("a bitmap prints slot 0 first, in groups of four") {
  auto b = carve::SlotBitmap<16>::all_taken();
  b.release({1, 4});
  b.release({7, 7});
  CHECK(fmt::format("{}", b) == "0111_1001_1111_1100");
  CHECK(fmt::format("{}", carve::SlotBitmap<6>{}) == "1111_11");
  CHECK(fmt::format("{}", carve::SlotBitmap<1>::all_taken()) == "0");
}

TEST_CASE("ranges and errors print readably") {
  CHECK(fmt::format("{}", carve::SlotRange{7, 4}) == "[7, 11)");
  CHECK(fmt::format("{}", carve::Errc::no_space) == "no space");
  CHECK(fmt::format("{:>10}", carve::Errc::no_space) == "  no space");
}

TEST_CASE("format specs apply to the whole value") {
  CHECK(fmt::format("{:>8}", carve::SlotRange{1, 2}) == "  [1, 3)");
  CHECK(fmt::format("{:*<8}", carve::SlotBitmap<4>{}) == "1111****");
}
