/// @file carve/mirror/fault_handler.hpp
/// The SIGSEGV handler behind mprotect-based write tracking.
///
/// A mirror in TrackingMechanism::mprotect keeps clean pages read-only and registers a FaultTarget
/// here. The first store to such a page raises SIGSEGV; the handler finds the target whose range
/// holds the address, makes the page writable, marks it dirty and returns, and the store is retried
/// and succeeds. Any other fault — outside every target, or on a page of a target that is not
/// allocated — goes to the handler that was installed before carve's (sigaction with SA_SIGINFO or
/// a plain handler), or, when there was none, gets the default action: the program's usual crash.
/// The handler is installed by the first target and stays: a handler installed after it may chain
/// to it, so taking it away could break that one. Code that later replaces the SIGSEGV action
/// without chaining (a test framework between test cases, say) takes carve's out of the way: every
/// new target puts carve's handler back in front, chaining to the one it displaces. Up to
/// max_fault_targets targets at a time.
///
/// What runs inside the handler, and why each is safe there:
///   - atomic loads, fetch_or and fetch_add on lock-free 64-bit atomics (AtomicPageBits, the
///     registry below): C++ allows lock-free atomic operations in a signal handler;
///   - mprotect(2): not on POSIX's list of async-signal-safe functions, but on Linux it is a bare
///     system call that takes no user-space lock (glibc's wrapper only sets errno, which the
///     handler saves and restores); garbage collectors rely on exactly this;
///   - sigaction(2), raise(3), write(2), abort(3): on POSIX's list.
/// Nothing allocates, locks, or touches a C++ object that could be half-updated: the registry holds
/// plain atomics, and a target is never destroyed while a handler may be reading it (unregister
/// waits for handlers in flight).
///
/// When mprotect on one page fails (ENOMEM: the process reached vm.max_map_count, as a scattered
/// dirty pattern splits the mapping into many pieces), the handler makes writable the whole run of
/// clean allocated pages around the address and marks all of them dirty. That run is bounded by
/// pages whose protection differs, so the change merges mappings instead of splitting them and
/// cannot fail for that reason; the price is copying those pages at the next sync.
#pragma once

#include <carve/core/error.hpp>
#include <carve/mirror/atomic_page_bits.hpp>

#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <thread>

namespace carve {

/// What the handler needs to know about one mirror.
struct FaultTarget {
  std::byte* base = nullptr;           ///< the mirror's first address
  std::size_t bytes = 0;               ///< its size
  std::size_t page_size = 0;           ///< the unit `allocated` and `dirty` count in
  AtomicPageBits* allocated = nullptr; ///< pages the program may write
  AtomicPageBits* dirty = nullptr;     ///< pages written since their last sync
};

/// The most targets registered at a time.
inline constexpr std::size_t max_fault_targets = 64;

namespace detail {

struct FaultSlot {
  std::atomic<const FaultTarget*> target{nullptr};
  std::atomic<int> readers{0}; // handlers currently looking at `target`
};

struct FaultRegistry {
  std::array<FaultSlot, max_fault_targets> slots;
  // The handler carve's displaced, double-buffered: installing again writes the other entry and
  // then flips `current`, so a handler chaining at that moment reads a complete one.
  std::array<struct sigaction, 2> previous{};
  std::atomic<int> current{0};
  std::mutex installing;
  std::atomic<std::uint64_t> faults_resolved{0};
};

inline FaultRegistry& fault_registry() noexcept {
  static FaultRegistry registry;
  return registry;
}

inline void fault_message(const char* text) noexcept {
  std::size_t n = 0;
  while (text[n] != '\0') {
    ++n;
  }
  [[maybe_unused]] const ssize_t written = ::write(STDERR_FILENO, text, n);
}

// Makes the page at `page` writable; true when the fault is resolved.
inline bool resolve_fault(const FaultTarget& t, std::uint32_t page) noexcept {
  if (!t.allocated->test(page)) {
    return false; // not memory the program was given: its own fault
  }
  if (::mprotect(t.base + std::size_t{page} * t.page_size, t.page_size, PROT_READ | PROT_WRITE) == 0) {
    t.dirty->set({page, 1});
    return true;
  }
  // Out of mappings: widen to the run of clean allocated pages around the page (see above).
  std::uint32_t first = page;
  std::uint32_t end = page + 1;
  while (first > 0 && t.allocated->test(first - 1) && !t.dirty->test(first - 1)) {
    --first;
  }
  while (end < t.allocated->size() && t.allocated->test(end) && !t.dirty->test(end)) {
    ++end;
  }
  if (::mprotect(t.base + std::size_t{first} * t.page_size, std::size_t{end - first} * t.page_size,
                 PROT_READ | PROT_WRITE) != 0) {
    fault_message("carve: cannot make a mirror page writable (mprotect failed); aborting\n");
    std::abort();
  }
  t.dirty->set({first, end - first});
  return true;
}

inline void chain_fault(int sig, siginfo_t* info, void* context) noexcept {
  const FaultRegistry& r = fault_registry();
  const struct sigaction& prev = r.previous[static_cast<std::size_t>(r.current.load(std::memory_order_acquire))];
  if ((prev.sa_flags & SA_SIGINFO) != 0 && prev.sa_sigaction != nullptr) {
    prev.sa_sigaction(sig, info, context);
    return;
  }
  if (prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN && prev.sa_handler != nullptr) {
    prev.sa_handler(sig);
    return;
  }
  // No handler before ours: the default action. Returning re-executes the faulting access, which
  // faults again, now fatally; a SIGSEGV sent by kill() is raised again instead.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  ::sigemptyset(&dfl.sa_mask);
  ::sigaction(sig, &dfl, nullptr);
  if (info == nullptr || info->si_code <= 0) {
    ::raise(sig);
  }
}

inline void on_fault(int sig, siginfo_t* info, void* context) noexcept {
  const int saved_errno = errno;
  const auto address = reinterpret_cast<std::uintptr_t>(info != nullptr ? info->si_addr : nullptr);
  bool resolved = false;
  if (info != nullptr && info->si_code > 0) { // a fault, not a signal someone sent
    for (FaultSlot& slot : fault_registry().slots) {
      slot.readers.fetch_add(1, std::memory_order_seq_cst);
      const FaultTarget* t = slot.target.load(std::memory_order_seq_cst);
      if (t != nullptr) {
        const auto base = reinterpret_cast<std::uintptr_t>(t->base);
        if (address >= base && address - base < t->bytes) {
          resolved = resolve_fault(*t, static_cast<std::uint32_t>((address - base) / t->page_size));
          slot.readers.fetch_sub(1, std::memory_order_seq_cst);
          break;
        }
      }
      slot.readers.fetch_sub(1, std::memory_order_seq_cst);
    }
  }
  if (resolved) {
    fault_registry().faults_resolved.fetch_add(1, std::memory_order_relaxed);
  }
  errno = saved_errno;
  if (!resolved) {
    chain_fault(sig, info, context);
  }
}

// Puts carve's handler in front unless it is there already, chaining to whatever it displaces.
inline void install_fault_handler() {
  FaultRegistry& r = fault_registry();
  const std::lock_guard lock(r.installing);
  struct sigaction now {};
  if (::sigaction(SIGSEGV, nullptr, &now) != 0) {
    throw Exception(Errc::unsupported, "carve: cannot read the SIGSEGV handler");
  }
  if ((now.sa_flags & SA_SIGINFO) != 0 && now.sa_sigaction == on_fault) {
    return;
  }
  const int next = 1 - r.current.load(std::memory_order_relaxed);
  r.previous[static_cast<std::size_t>(next)] = now;
  r.current.store(next, std::memory_order_release);
  struct sigaction action {};
  action.sa_sigaction = on_fault;
  action.sa_flags = SA_SIGINFO | SA_ONSTACK;
  ::sigemptyset(&action.sa_mask);
  if (::sigaction(SIGSEGV, &action, nullptr) != 0) {
    throw Exception(Errc::unsupported, "carve: cannot install the SIGSEGV handler for write tracking");
  }
}

} // namespace detail

/// Registers `target` (which must stay valid and unchanged until unregister_fault_target), putting
/// carve's handler in front first. Throws carve::Exception (unsupported) when max_fault_targets
/// are registered already or the handler cannot be installed. Thread-safe.
inline void register_fault_target(const FaultTarget* target) {
  detail::install_fault_handler();
  for (detail::FaultSlot& slot : detail::fault_registry().slots) {
    const FaultTarget* expected = nullptr;
    if (slot.target.compare_exchange_strong(expected, target, std::memory_order_seq_cst)) {
      return;
    }
  }
  throw Exception(Errc::unsupported, "carve: too many mirrors with mprotect write tracking at once");
}

/// After this returns no handler is using `target`, so it may be destroyed. Thread-safe; an
/// unknown target is ignored.
inline void unregister_fault_target(const FaultTarget* target) noexcept {
  for (detail::FaultSlot& slot : detail::fault_registry().slots) {
    const FaultTarget* expected = target;
    if (slot.target.compare_exchange_strong(expected, nullptr, std::memory_order_seq_cst)) {
      while (slot.readers.load(std::memory_order_seq_cst) != 0) {
        std::this_thread::yield(); // a handler in flight finishes within microseconds
      }
      return;
    }
  }
}

/// Faults the handler has resolved in this process (for measurements).
inline std::uint64_t resolved_fault_count() noexcept {
  return detail::fault_registry().faults_resolved.load(std::memory_order_relaxed);
}

} // namespace carve
