/// @file carve/core/cpu_pause.hpp
/// The spin-wait hint for a host thread waiting on another's progress.
///
/// x86 `pause` (and Arm `yield`) tells the core that the loop is a spin-wait: it does not pile up
/// speculative loads of the polled line (which cost a pipeline flush once another core writes
/// it), it saves power, and it leaves the core's shared resources to a sibling hyperthread.
/// Elsewhere it does nothing.
#pragma once

namespace carve {

/// One spin-wait hint (`pause` on x86, `yield` on Arm, nothing elsewhere); host only.
inline void cpu_pause() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

} // namespace carve
