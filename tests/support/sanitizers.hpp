#pragma once
// What a test knows about the build it runs in.
#include <cstdint>

namespace carve::test {

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool under_asan = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool under_asan = true;
#else
inline constexpr bool under_asan = false;
#endif
#else
inline constexpr bool under_asan = false;
#endif

#if defined(__SANITIZE_THREAD__)
inline constexpr bool under_tsan = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
inline constexpr bool under_tsan = true;
#else
inline constexpr bool under_tsan = false;
#endif
#else
inline constexpr bool under_tsan = false;
#endif

/// How many slots the exhaustive enumerations cover: every bitmap of up to this many slots, every
/// pattern of this many slots around a word boundary. Under a sanitizer, which makes plain
/// computation about ten times slower, they stop at 10 (a quarter of the patterns, every
/// word-boundary case still among them) and look for memory and threading errors; the build
/// without sanitizers runs them to 12 and checks every answer there.
inline constexpr std::uint32_t exhaustive_slots = under_asan || under_tsan ? 10 : 12;

} // namespace carve::test
