// The automatic tracking's fault path: faults it does not own go to the handler installed before
// it, a store outside every allocation is the program's usual crash, and a dirty pattern that
// splits the mapping past vm.max_map_count still works. Each scenario that installs handlers runs
// in a child process, so handlers installed here never leak into another test.
#include "mirror_helpers.hpp"

#include <doctest/doctest.h>

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <vector>

// In a namespace of its own: the area's test files compile as one translation unit.
namespace test_mirror_faults {

using carve::PagedMirror;
using carve::WriteTracking;
using namespace carve::test;

namespace {

// Runs `body` in a child process and returns its wait status.
template <class Body>
int in_child(Body body) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    body();
    std::_Exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

// The handler a program had before carve's: it owns one page of its own.
std::byte* foreign_page = nullptr;
std::atomic<int> foreign_faults{0}; // lock-free: fine in a signal handler

void foreign_handler(int, siginfo_t* info, void*) {
  auto* a = static_cast<std::byte*>(info->si_addr);
  if (a >= foreign_page && a < foreign_page + carve::os_page_size()) {
    foreign_faults.fetch_add(1);
    ::mprotect(foreign_page, carve::os_page_size(), PROT_READ | PROT_WRITE);
    return;
  }
  std::_Exit(3);
}

} // namespace

TEST_CASE("faults outside the mirror go to the handler installed before carve's") {
  const int status = in_child([] {
    foreign_page =
        static_cast<std::byte*>(::mmap(nullptr, carve::os_page_size(), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    struct sigaction action {};
    action.sa_sigaction = foreign_handler;
    action.sa_flags = SA_SIGINFO;
    ::sigemptyset(&action.sa_mask);
    ::sigaction(SIGSEGV, &action, nullptr);

    HostBackend devices;
    add_cards(devices, {{1 * MiB, 1}});
    PagedMirror mirror(devices, {.page_size = 4 * KiB, .tracking = WriteTracking::automatic_mprotect});
    auto* p = static_cast<unsigned char*>(*mirror.try_allocate(64 * KiB, 1));
    p[5 * 4 * KiB] = 1;                                 // carve's fault: resolved by carve
    *reinterpret_cast<volatile int*>(foreign_page) = 7; // the program's own: passed on
    if (foreign_faults != 1 || mirror.dirty_pages() != 1 || mirror.sync()->pages != 1) {
      std::_Exit(4);
    }
    p[5 * 4 * KiB] = 2; // protected again after the sync: tracked again
    if (mirror.dirty_pages() != 1 || foreign_faults != 1) {
      std::_Exit(5);
    }
  });
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("a store outside every allocation is the program's usual fault") {
  for (const WriteTracking mode : tracking_modes()) {
    if (mode == WriteTracking::explicit_calls) {
      continue;
    }
    CAPTURE(static_cast<int>(mode));
    const int status = in_child([mode] {
      ::signal(SIGSEGV, SIG_DFL); // no test framework's crash report: the plain default
      HostBackend devices;
      add_cards(devices, {{1 * MiB, 1}});
      PagedMirror mirror(devices, {.page_size = 4 * KiB, .tracking = mode});
      auto* p = static_cast<unsigned char*>(*mirror.try_allocate(8 * KiB, 1));
      p[0] = 1;                                                     // fine
      *reinterpret_cast<volatile unsigned char*>(p + 64 * KiB) = 1; // inside the mirror, not allocated
    });
    REQUIRE(WIFSIGNALED(status));
    CHECK(WTERMSIG(status) == SIGSEGV);
  }
}

TEST_CASE("mprotect tracking survives a dirty pattern that exhausts the process's mappings") {
  std::ifstream limit_file("/proc/sys/vm/max_map_count");
  std::size_t limit = 0;
  limit_file >> limit;
  if (under_asan) {
    MESSAGE("skipped under AddressSanitizer: it needs new mappings itself and aborts once they run out");
    return;
  }
  if (limit == 0 || limit > 200000) {
    MESSAGE("vm.max_map_count is " << limit << ": too large to exhaust in a test, skipped");
    return;
  }
  // Every other page written splits the mirror's mapping into one piece per page.
  const std::size_t pages = 2 * limit + 4096;
  HostBackend devices;
  add_cards(devices, {{pages * 4 * KiB, 1}});
  PagedMirror mirror(devices, {.page_size = 4 * KiB, .tracking = WriteTracking::automatic_mprotect});
  auto* p = static_cast<unsigned char*>(*mirror.try_allocate(pages * 4 * KiB, 1));
  for (std::size_t page = 0; page < pages; page += 2) {
    p[page * 4 * KiB] = static_cast<unsigned char>(page / 2 + 1);
  }
  for (std::size_t page = 0; page < pages; page += 2) {
    REQUIRE(p[page * 4 * KiB] == static_cast<unsigned char>(page / 2 + 1));
  }
  const std::uint64_t dirty = mirror.dirty_pages();
  MESSAGE((pages / 2) << " pages written, " << dirty
                      << " marked dirty (the excess: pages made writable together once the mappings ran out)");
  CHECK(dirty >= pages / 2);
  const auto r = mirror.sync();
  REQUIRE(r);
  CHECK(r->pages == dirty);
  std::vector<unsigned char> host(p, p + pages * 4 * KiB);
  CHECK(device_mismatches(mirror, devices, p, host) == 0);
  // Everything is protected again and merged back into few mappings: tracking goes on.
  p[1 * 4 * KiB] = 9;
  CHECK(mirror.dirty_pages() == 1);
}

} // namespace test_mirror_faults
