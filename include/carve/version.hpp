/// @file carve/version.hpp
/// The library's version, kept in step with the project() version in CMakeLists.txt.
///
/// Before 1.0 a minor version may break the API, so only the same major.minor is compatible (as
/// find_package(carve) checks).
#pragma once

namespace carve {
inline constexpr int version_major = 0; ///< 0 until the API is stable
inline constexpr int version_minor = 1; ///< may break the API while version_major is 0
inline constexpr int version_patch = 0; ///< fixes within one major.minor
} // namespace carve
