// carve/version.hpp — library version, kept in step with the project() version in CMakeLists.txt.
#pragma once

namespace carve {
inline constexpr int version_major = 0;
inline constexpr int version_minor = 1;
inline constexpr int version_patch = 0;
} // namespace carve
