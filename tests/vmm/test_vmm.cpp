// The VMM mapping layer on the host twin: the protocol's rules (each refusal leaves nothing
// changed), two processes sharing a physical allocation passed with SCM_RIGHTS, memory without
// access that cannot be touched, VmmCard as an exportable card, and HostMirrorBackend taking its
// devices' memory through VmmCard.
#include "support/errors.hpp"

#include <carve/borrow/lending_peers.hpp>
#include <carve/mirror.hpp>
#include <carve/service/segment_mapping.hpp>
#include <carve/service/unix_socket.hpp>
#include <carve/vmm.hpp>

#include <doctest/doctest.h>

#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <vector>

namespace {

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t granule = 64 * KiB;

using carve::Access;
using carve::Errc;
using carve::HostMemoryMapper;

static_assert(carve::PhysicalMemoryMapper<HostMemoryMapper>);
static_assert(carve::ExportableResource<carve::VmmCard<HostMemoryMapper>>);
static_assert(carve::HandsOverDescriptors<carve::VmmCard<HostMemoryMapper>>);
static_assert(carve::OwnsMemory<carve::VmmCard<HostMemoryMapper>>);
static_assert(carve::SynchronousResource<carve::VmmCard<HostMemoryMapper>>);

HostMemoryMapper two_devices(int cpu_device = 0) {
  return HostMemoryMapper({.granularity = granule, .device_count = 2, .cpu_device = cpu_device});
}

template <class T>
Errc code_of(const carve::Result<T>& r) {
  REQUIRE_FALSE(r);
  return r.error().code;
}

// Runs `child` in a forked process and returns its wait status.
template <class F>
int in_child(F&& child) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::_exit(child());
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  return status;
}

// The address the child's SIGSEGV handler expects, and what it exits with.
void* volatile expected_fault = nullptr;
constexpr int faulted_where_expected = 42;
constexpr int faulted_elsewhere = 43;
constexpr int did_not_fault = 44;

void on_fault(int, siginfo_t* info, void*) {
  ::_exit(info->si_addr == expected_fault ? faulted_where_expected : faulted_elsewhere);
}

// In a child: touches `p` (a write when `write`, else a read) and reports whether exactly that
// touch faulted.
int touch_expecting_fault(void* p, bool write) {
  struct sigaction sa {};
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGSEGV, &sa, nullptr);
  ::sigaction(SIGBUS, &sa, nullptr);
  expected_fault = p;
  auto* byte = static_cast<volatile unsigned char*>(p);
  if (write) {
    *byte = 1;
  } else {
    (void)*byte;
  }
  return did_not_fault;
}

} // namespace

TEST_CASE("HostMemoryMapper: options it refuses") {
  CHECK(carve::test::thrown_code([] { HostMemoryMapper({.granularity = 0}); }) == Errc::invalid_argument);
  CHECK(carve::test::thrown_code([] { HostMemoryMapper({.granularity = 1000}); }) == Errc::invalid_argument);
  // Three pages: a multiple of the page, but reservations align to it, so it must be a power of two.
  CHECK(carve::test::thrown_code([] { HostMemoryMapper({.granularity = 3 * carve::os_page_size()}); }) ==
        Errc::invalid_argument);
  CHECK(carve::test::thrown_code([] { HostMemoryMapper({.granularity = granule, .device_count = 0}); }) ==
        Errc::invalid_argument);
  CHECK(carve::test::thrown_code([] {
          HostMemoryMapper({.granularity = granule, .device_count = 2, .cpu_device = 2});
        }) == Errc::invalid_argument);
  CHECK(carve::test::thrown_code([] {
          HostMemoryMapper({.granularity = granule, .device_count = 2, .cpu_device = -2});
        }) == Errc::invalid_argument);
}

TEST_CASE("HostMemoryMapper: the protocol, and every refusal leaves nothing changed") {
  HostMemoryMapper m = two_devices();
  CHECK(*m.granularity(1) == granule);
  CHECK(code_of(m.granularity(2)) == Errc::out_of_range);

  // create: whole granules on a known device
  CHECK(code_of(m.create(0, granule + 4 * KiB)) == Errc::invalid_size);
  CHECK(code_of(m.create(0, 0)) == Errc::invalid_size);
  CHECK(code_of(m.create(5, granule)) == Errc::out_of_range);
  CHECK(m.physical_count() == 0);
  const auto h = m.create(0, 2 * granule);
  REQUIRE(h);
  CHECK(code_of(m.export_fd(*h + 100)) == Errc::not_allocated);

  // reserve: whole granules, aligned as asked
  CHECK(code_of(m.reserve(granule / 2, 0)) == Errc::invalid_size);
  CHECK(code_of(m.reserve(granule, 3 * granule)) == Errc::invalid_argument);
  const auto va = m.reserve(4 * granule, 4 * granule);
  REQUIRE(va);
  CHECK(reinterpret_cast<std::uintptr_t>(*va) % (4 * granule) == 0);
  auto* base = static_cast<std::byte*>(*va);

  // map: aligned, whole granules, inside the reservation, not over another mapping, not beyond
  // the allocation
  CHECK(code_of(m.map(base + 4 * KiB, granule, *h)) == Errc::invalid_argument);
  CHECK(code_of(m.map(base, granule + 4 * KiB, *h)) == Errc::invalid_size);
  CHECK(code_of(m.map(base + 3 * granule, 2 * granule, *h)) == Errc::invalid_argument); // past its end
  CHECK(code_of(m.map(base, 3 * granule, *h)) == Errc::invalid_size);                   // beyond the allocation
  CHECK(code_of(m.map(base, granule, *h + 100)) == Errc::not_allocated);
  CHECK(m.mapping_count() == 0);
  REQUIRE(m.map(base + granule, 2 * granule, *h));
  CHECK(code_of(m.map(base + granule, 2 * granule, *h)) == Errc::invalid_argument); // double map
  CHECK(code_of(m.map(base, 2 * granule, *h)) == Errc::invalid_argument);           // overlaps its start
  CHECK(code_of(m.map(base + 2 * granule, 2 * granule, *h)) == Errc::invalid_argument);
  CHECK(m.mapping_count() == 1);

  // rights: none for every device until set; only on whole mappings of known devices
  CHECK(*m.access(base + granule, 0) == Access::none);
  CHECK(*m.access(base + 2 * granule + 5, 1) == Access::none);
  CHECK(code_of(m.access(base, 0)) == Errc::not_allocated);
  CHECK(code_of(m.access(base + granule, 2)) == Errc::out_of_range);
  CHECK(code_of(m.set_access(base, 3 * granule, 0, Access::read_write)) == Errc::not_allocated);
  CHECK(code_of(m.set_access(base + granule, granule, 0, Access::read_write)) == Errc::not_allocated); // cuts it
  CHECK(code_of(m.set_access(base + granule, 2 * granule, 2, Access::read_write)) == Errc::out_of_range);
  CHECK(*m.access(base + granule, 0) == Access::none);
  REQUIRE(m.set_access(base + granule, 2 * granule, 0, Access::read_write));
  REQUIRE(m.set_access(base + granule, 2 * granule, 1, Access::read));
  CHECK(*m.access(base + granule, 0) == Access::read_write);
  CHECK(*m.access(base + granule, 1) == Access::read);
  std::memset(base + granule, 0x5a, 2 * granule); // device 0 is this CPU: it may write

  // A second mapping of the same allocation (exported and imported here) sees the same bytes.
  const auto fd = m.export_fd(*h);
  REQUIRE(fd);
  const auto again = m.import_fd(*fd);
  ::close(*fd);
  REQUIRE(again);
  CHECK(code_of(m.import_fd(-1)) == Errc::invalid_argument);
  const auto placed = carve::place_physical(m, *again, 2 * granule, 0, Access::read);
  REQUIRE(placed);
  REQUIRE(m.release(*again));
  const auto* view = static_cast<const unsigned char*>(placed->base);
  CHECK(view[0] == 0x5a);
  CHECK(view[2 * granule - 1] == 0x5a);
  base[granule + 7] = std::byte{0x11};
  CHECK(view[7] == 0x11);

  // release while mapped: the mapping keeps the memory (the CUDA rule)
  REQUIRE(m.release(*h));
  CHECK(code_of(m.release(*h)) == Errc::not_allocated);
  CHECK(m.physical_count() == 0);
  CHECK(static_cast<unsigned char>(base[granule + 7]) == 0x11);

  // unmap: whole mappings only; free_reservation: the whole reservation, nothing mapped
  CHECK(code_of(m.unmap(base + granule, granule)) == Errc::not_allocated);
  CHECK(code_of(m.unmap(base, 3 * granule)) == Errc::not_allocated);
  CHECK(code_of(m.free_reservation(base, 4 * granule)) == Errc::invalid_argument); // still mapped
  CHECK(code_of(m.free_reservation(base, 2 * granule)) == Errc::invalid_size);
  CHECK(code_of(m.free_reservation(base + granule, 4 * granule)) == Errc::not_allocated);
  REQUIRE(m.unmap(base + granule, 2 * granule));
  CHECK(code_of(m.access(base + granule, 0)) == Errc::not_allocated);
  CHECK(code_of(m.unmap(base + granule, 2 * granule)) == Errc::not_allocated);
  CHECK(view[7] == 0x11); // the other mapping still holds the memory
  REQUIRE(m.free_reservation(base, 4 * granule));
  REQUIRE(carve::unplace_physical(m, *placed));
  CHECK(m.physical_count() == 0);
  CHECK(m.reservation_count() == 0);
  CHECK(m.mapping_count() == 0);
}

TEST_CASE("HostMemoryMapper: two mappings in one reservation, and copies share the tables") {
  HostMemoryMapper m = two_devices();
  const HostMemoryMapper copy = m;
  const auto a = m.create(1, granule);
  const auto b = m.create(1, granule);
  const auto va = m.reserve(2 * granule, 0);
  REQUIRE((a && b && va));
  auto* base = static_cast<std::byte*>(*va);
  REQUIRE(m.map(base, granule, *a));
  REQUIRE(m.map(base + granule, granule, *b));
  // set_access may name a run of whole mappings
  REQUIRE(m.set_access(base, 2 * granule, 0, Access::read_write));
  std::memset(base, 1, 2 * granule);
  CHECK(copy.mapping_count() == 2);
  REQUIRE(m.unmap(base, 2 * granule));
  REQUIRE(m.release(*a));
  REQUIRE(m.release(*b));
  REQUIRE(m.free_reservation(base, 2 * granule));
  CHECK(copy.physical_count() == 0);
}

TEST_CASE("HostMemoryMapper: memory mapped at two addresses is one memory; offsets are checked") {
  HostMemoryMapper m = two_devices();
  const auto h = m.create(1, 2 * granule);
  const auto va = m.reserve(3 * granule, 0);
  REQUIRE((h && va));
  auto* base = static_cast<unsigned char*>(*va);
  REQUIRE(m.map(base, 2 * granule, *h));
  CHECK(code_of(m.map(base + 2 * granule, granule, *h, granule / 2)) == Errc::invalid_argument);
  CHECK(code_of(m.map(base + 2 * granule, granule, *h, 2 * granule)) == Errc::invalid_size);
  CHECK(code_of(m.map(base + 2 * granule, 2 * granule, *h, 0)) == Errc::invalid_argument); // past the reservation
  CHECK(m.mapping_count() == 1);
  REQUIRE(m.map(base + 2 * granule, granule, *h, granule)); // the allocation's second granule, again
  REQUIRE(m.set_access(base, 3 * granule, 0, Access::read_write));
  std::memset(base + granule, 7, granule);
  CHECK(base[2 * granule + 5] == 7);
  base[2 * granule] = 9;
  CHECK(base[granule] == 9);
  REQUIRE(m.release(*h)); // the mappings keep the memory
  REQUIRE(m.unmap(base, 2 * granule));
  CHECK(base[2 * granule + 5] == 7);
  REQUIRE(m.unmap(base + 2 * granule, granule));
  REQUIRE(m.free_reservation(base, 3 * granule));
  CHECK(m.physical_count() == 0);
  CHECK(m.mapping_count() == 0);
}

TEST_CASE("HostMemoryMapper: two processes share a physical allocation passed with SCM_RIGHTS") {
  int sockets[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sockets) == 0);
  carve::service::UniqueFd parent_end(sockets[0]);
  carve::service::UniqueFd child_end(sockets[1]);
  HostMemoryMapper m = two_devices();
  const auto h = m.create(0, 2 * granule);
  REQUIRE(h);
  const auto mine = carve::place_physical(m, *h, 2 * granule, 0, Access::read_write);
  REQUIRE(mine);
  auto* bytes = static_cast<unsigned char*>(mine->base);
  for (std::size_t i = 0; i < 2 * granule; ++i) {
    bytes[i] = static_cast<unsigned char>(i * 7);
  }
  const auto fd = m.export_fd(*h);
  REQUIRE(fd);
  const std::array<std::uint8_t, 1> hello{1};
  REQUIRE(carve::service::send_message(parent_end.get(), hello, *fd) == 0);
  ::close(*fd);

  const int status = in_child([&] {
    // A fresh mapper of the child's own, as another process would have.
    HostMemoryMapper other = two_devices();
    std::array<std::uint8_t, 8> buffer{};
    std::vector<carve::service::UniqueFd> fds;
    const auto r = carve::service::receive_message(child_end.get(), buffer, fds);
    if (r.error != 0 || fds.size() != 1) {
      return 10;
    }
    const auto imported = other.import_fd(fds.front().get());
    fds.clear();
    if (!imported) {
      return 11;
    }
    const auto view = carve::place_physical(other, *imported, 2 * granule, 0, Access::read_write);
    if (!view || !other.release(*imported)) {
      return 12;
    }
    auto* seen = static_cast<unsigned char*>(view->base);
    for (std::size_t i = 0; i < 2 * granule; ++i) {
      if (seen[i] != static_cast<unsigned char>(i * 7)) {
        return 13;
      }
    }
    std::memset(seen + granule, 0xc3, granule); // for the parent to see
    return carve::unplace_physical(other, *view) ? 0 : 14;
  });
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(bytes[granule] == 0xc3);
  CHECK(bytes[2 * granule - 1] == 0xc3);
  CHECK(bytes[granule - 1] == static_cast<unsigned char>((granule - 1) * 7));
  REQUIRE(carve::unplace_physical(m, *mine));
  REQUIRE(m.release(*h));
}

TEST_CASE("HostMemoryMapper: memory this CPU has no right to cannot be touched") {
  HostMemoryMapper m = two_devices(); // the CPU plays device 0
  const auto h = m.create(0, granule);
  REQUIRE(h);
  // Device 1 may write, device 0 (this CPU) may nothing.
  const auto placed = carve::place_physical(m, *h, granule, 1, Access::read_write);
  REQUIRE(placed);
  REQUIRE(m.release(*h));
  auto* p = static_cast<std::byte*>(placed->base);
  const auto faults = [&](void* where, bool write) {
    const int status = in_child([&] { return touch_expecting_fault(where, write); });
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  };
  CHECK(faults(p + 100, false) == faulted_where_expected);
  REQUIRE(m.set_access(p, granule, 0, Access::read));
  CHECK(static_cast<int>(p[100]) == 0); // now it may read
  CHECK(faults(p + 200, true) == faulted_where_expected);
  REQUIRE(m.set_access(p, granule, 0, Access::read_write));
  CHECK(faults(p + 300, true) == did_not_fault);
  REQUIRE(carve::unplace_physical(m, *placed));
  // and a reservation with nothing mapped is no memory at all
  const auto va = m.reserve(granule, 0);
  REQUIRE(va);
  CHECK(faults(*va, false) == faulted_where_expected);
  REQUIRE(m.free_reservation(*va, granule));
}

TEST_CASE("HostMemoryMapper: address_only keeps the protocol's rules in its tables and maps no memory") {
  HostMemoryMapper m({.granularity = granule, .device_count = 2, .address_only = true});
  const auto descriptors = [] { // a memfd per allocation would show here
    std::size_t n = 0;
    for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
      ++n;
    }
    return n;
  };
  const std::size_t before = descriptors();
  const auto h = m.create(0, 4 * granule);
  REQUIRE(h);
  CHECK(descriptors() == before);
  CHECK(code_of(m.export_fd(*h)) == Errc::unsupported);
  CHECK(code_of(m.import_fd(0)) == Errc::unsupported);
  const auto va = m.reserve(8 * granule, 0);
  REQUIRE(va);
  auto* p = static_cast<std::byte*>(*va);
  REQUIRE(m.map(p, 2 * granule, *h));
  REQUIRE(m.map(p + 2 * granule, 2 * granule, *h));
  // The rules are the twin's: over a mapping, a range that cuts one, a misaligned address.
  CHECK(code_of(m.map(p + granule, granule, *h)) == Errc::invalid_argument);
  CHECK(code_of(m.unmap(p, granule)) == Errc::not_allocated);
  CHECK(code_of(m.map(p + 4 * granule + 512, granule, *h)) == Errc::invalid_argument);
  CHECK(code_of(m.free_reservation(p, 8 * granule)) == Errc::invalid_argument);
  REQUIRE(m.set_access(p, 4 * granule, 1, Access::read_write)); // two whole mappings at once
  CHECK(*m.access(p + 3 * granule, 1) == Access::read_write);
  CHECK(*m.access(p, 0) == Access::none);
  REQUIRE(m.set_access(p, 2 * granule, 0, Access::read_write));
  // A right recorded, no memory behind it: the CPU's touch still faults.
  const int status = in_child([&] { return touch_expecting_fault(p + 100, true); });
  CHECK((WIFEXITED(status) ? WEXITSTATUS(status) : -1) == faulted_where_expected);
  REQUIRE(m.release(*h));
  REQUIRE(m.unmap(p, 4 * granule));
  REQUIRE(m.free_reservation(p, 8 * granule));
  CHECK(descriptors() == before);
}

TEST_CASE("HostMemoryMapper: every_device gives the CPU the widest right any device holds") {
  HostMemoryMapper m = two_devices(HostMemoryMapper::every_device);
  const auto h = m.create(1, granule);
  REQUIRE(h);
  const auto placed = carve::place_physical(m, *h, granule, 1, Access::read_write);
  REQUIRE(placed);
  std::memset(placed->base, 9, granule);
  REQUIRE(carve::unplace_physical(m, *placed));
  REQUIRE(m.release(*h));
}

TEST_CASE("HostMemoryMapper: three devices' memory in one reservation, rights per device, the CPU playing each") {
  HostMemoryMapper m({.granularity = granule, .device_count = 3, .cpu_device = HostMemoryMapper::every_device});
  const auto va = m.reserve(3 * granule, 0);
  REQUIRE(va);
  auto* base = static_cast<std::byte*>(*va);
  for (int d = 0; d < 3; ++d) {
    const auto h = m.create(d, granule);
    REQUIRE(h);
    REQUIRE(m.map(base + static_cast<std::size_t>(d) * granule, granule, *h));
    REQUIRE(m.release(*h)); // the mapping keeps it
  }
  for (int d = 0; d < 3; ++d) {
    CHECK(*m.owner(base + static_cast<std::size_t>(d) * granule + 5) == d);
  }
  CHECK(code_of(m.owner(base + 3 * granule)) == Errc::not_allocated);
  // Devices 0 and 1 reach everything; device 2 only its own granule (no peer access to the others).
  REQUIRE(m.set_access(base, 3 * granule, 0, Access::read_write));
  REQUIRE(m.set_access(base, 3 * granule, 1, Access::read_write));
  REQUIRE(m.set_access(base + 2 * granule, granule, 2, Access::read_write));
  CHECK(*m.access(base, 2) == Access::none);
  CHECK(code_of(m.play_device(3)) == Errc::out_of_range);
  CHECK(m.cpu_device() == HostMemoryMapper::every_device); // the refusal changed nothing
  std::memset(base, 3, 3 * granule);                       // every_device: the widest right
  const auto status_of = [](int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : -1; };
  // A child playing device 2 faults exactly where device 2 has no right, and nowhere else.
  CHECK(status_of(in_child([&] { return m.play_device(2) ? touch_expecting_fault(base + granule + 64, false) : 1; })) ==
        faulted_where_expected);
  CHECK(status_of(in_child([&] {
          return m.play_device(2) ? touch_expecting_fault(base + 2 * granule + 64, true) : 1;
        })) == did_not_fault);
  CHECK(status_of(in_child([&] { return m.play_device(1) ? touch_expecting_fault(base + 64, true) : 1; })) ==
        did_not_fault);
  REQUIRE(m.unmap(base, 3 * granule));
  REQUIRE(m.free_reservation(base, 3 * granule));
}

TEST_CASE("DeviceGranules: granules of a power-of-two multiple of the device's, as views align to them") {
  HostMemoryMapper m({.granularity = granule});
  CHECK(carve::test::thrown_code([&] { carve::DeviceGranules<HostMemoryMapper>(m, 0, 12 * granule, 3 * granule); }) ==
        Errc::invalid_argument);
  const carve::DeviceGranules<HostMemoryMapper> pairs(m, 0, 12 * granule, 2 * granule);
  CHECK(m.physical_count() == 6);
}

TEST_CASE("VmmCard: allocations of whole granules, exported as descriptors another mapping shares") {
  HostMemoryMapper m = two_devices(HostMemoryMapper::every_device);
  CHECK(carve::test::thrown_code([&] { carve::VmmCard<HostMemoryMapper>(m, 0, granule / 2); }) ==
        Errc::invalid_argument);
  CHECK(carve::test::thrown_code([&] { carve::VmmCard<HostMemoryMapper>(m, 7, 4 * granule); }) == Errc::out_of_range);
  carve::VmmCard<HostMemoryMapper> card(m, 1, 4 * granule);
  CHECK(card.granularity() == granule);
  CHECK(card.device() == 1);
  CHECK(card.try_allocate(0, 8).error() == Errc::invalid_size);
  CHECK(card.try_allocate(100, 2 * granule).error() == Errc::no_space); // beyond the granularity's alignment
  const auto p = card.try_allocate(granule + 1, 256);
  REQUIRE(p);
  CHECK(card.used_bytes() == 2 * granule);
  CHECK(card.owns(static_cast<std::byte*>(*p) + 2 * granule - 1));
  CHECK_FALSE(card.owns(static_cast<std::byte*>(*p) + 2 * granule));
  CHECK(*m.access(*p, 1) == Access::read_write);
  CHECK(*m.access(*p, 0) == Access::none);
  std::memset(*p, 0x42, granule + 1);

  CHECK_FALSE(card.export_segment(*p, 3 * granule));
  CHECK_FALSE(card.export_segment(static_cast<std::byte*>(*p) + 64, 8));
  const auto e = card.export_segment(*p, granule + 1);
  REQUIRE(e);
  CHECK(e->kind == carve::ExportKind::host_vmm);
  CHECK(e->size == granule + 1);
  CHECK(e->device == 1);
  CHECK(card.export_segment(*p, granule + 1)->fd == e->fd); // lent, made once

  // An importer that rounds to its own (finer) granularity maps it through map_segment.
  const int taken = *card.release_descriptor(*p);
  CHECK(taken == e->fd);
  CHECK_FALSE(card.release_descriptor(*p));
  auto mapped = carve::service::map_segment(carve::ExportKind::host_vmm, e->size, {e->device, e->device}, {},
                                            carve::service::UniqueFd(taken));
  REQUIRE(mapped);
  CHECK(mapped->mapped_bytes == granule + carve::os_page_size());
  auto* seen = static_cast<unsigned char*>(mapped->base);
  CHECK(seen[granule] == 0x42);
  seen[0] = 0x24;
  CHECK(*static_cast<unsigned char*>(*p) == 0x24);

  // The card frees it while the importer maps it: the importer keeps the memory.
  card.deallocate(*p, granule + 1, 256);
  CHECK(card.used_bytes() == 0);
  CHECK(m.physical_count() == 0);
  CHECK(seen[granule] == 0x42);
  carve::service::unmap_segment(*mapped);
  CHECK(carve::service::host_vmm_mapper().mapping_count() == 0);

  // Full: no_space, nothing taken.
  const auto all = card.try_allocate(4 * granule, 8);
  REQUIRE(all);
  CHECK(card.try_allocate(1, 8).error() == Errc::no_space);
  CHECK(card.allocation_count() == 1);
  card.deallocate(*all, 4 * granule, 8);
  CHECK(m.reservation_count() == 0);
}

TEST_CASE("VmmCard: a card dropped with live allocations gives them back, descriptors included") {
  HostMemoryMapper m = two_devices();
  {
    carve::VmmCard<HostMemoryMapper> card(m, 0, 4 * granule);
    const auto p = card.try_allocate(10, 8);
    REQUIRE(p);
    REQUIRE(card.export_segment(*p, 10));
    CHECK(m.physical_count() == 1);
  }
  CHECK(m.physical_count() == 0);
  CHECK(m.reservation_count() == 0);
}

// A card over the host twin names no GPU (its segments cross processes by the server's numbers);
// over CUDA it names its device by UUID.
// A server lends host-twin memory between any two cards, CUDA memory only between GPUs the driver
// lets map each other.
static_assert(!carve::KnowsItsDevice<carve::VmmCard<HostMemoryMapper>>);
static_assert(std::same_as<carve::LendingPeers<carve::VmmCard<HostMemoryMapper>>, carve::AlwaysMapped>);
// (The CUDA cards' side: tests/vmm/test_vmm_cuda.cpp, built with the CUDA runtime.)

TEST_CASE("map_segment: a VMM segment without its descriptor, or of a device the process lacks") {
  using carve::service::map_segment;
  CHECK(map_segment(carve::ExportKind::host_vmm, 4096, {0, 0}, {}, {}).error().code == Errc::bad_message);
  HostMemoryMapper m = two_devices();
  const auto h = m.create(0, granule);
  REQUIRE(h);
  const auto fd = m.export_fd(*h);
  REQUIRE(fd);
  const auto far = map_segment(carve::ExportKind::host_vmm, 4096, {1000, 1000}, {}, carve::service::UniqueFd(*fd));
  REQUIRE_FALSE(far);
  CHECK(far.error().code == Errc::out_of_range);
  if (!carve::service::cuda_ipc_available) {
    const auto gpu = map_segment(carve::ExportKind::cuda_vmm, 4096, {0, 0}, {}, carve::service::UniqueFd(::dup(0)));
    REQUIRE_FALSE(gpu);
    CHECK(gpu.error().code == Errc::unsupported_version);
  }
  REQUIRE(m.release(*h));
}

namespace {

// Refuses every right given to device `refused`, as the driver refuses a pair without peer access.
struct NoPeerMapper : HostMemoryMapper {
  using HostMemoryMapper::HostMemoryMapper;
  int refused = 1;
  carve::Result<void> set_access(void* va, std::size_t bytes, int device, carve::Access access) {
    if (device == refused && access != carve::Access::none) {
      return carve::fail(Errc::out_of_range, "cuMemSetAccess: CUDA_ERROR_INVALID_DEVICE (simulated)");
    }
    return HostMemoryMapper::set_access(va, bytes, device, access);
  }
};

// Device 1 maps at twice the granularity of device 0, as two GPU models may.
struct CoarseDeviceOne : HostMemoryMapper {
  using HostMemoryMapper::HostMemoryMapper;
  carve::Result<std::size_t> granularity(int device) const {
    auto g = HostMemoryMapper::granularity(device);
    return g && device == 1 ? carve::Result<std::size_t>(2 * *g) : g;
  }
};

// A process that sees one GPU, `mine`, as its device `as`.
struct OneGpu {
  carve::DeviceUuid mine;
  int as = 0;
  carve::Result<int> ordinal_of(const carve::DeviceUuid& u) const {
    return u == mine ? carve::Result<int>(as) : carve::fail(Errc::out_of_range, carve::to_string(u) + " is not here");
  }
};

carve::DeviceUuid uuid_of_gpu(std::uint8_t g) {
  carve::DeviceUuid u{};
  u[15] = static_cast<std::uint8_t>(g + 1);
  return u;
}

} // namespace

TEST_CASE("map_vmm_segment: a borrowed segment is mapped for both GPUs, or, refused one, not at all") {
  using carve::service::SegmentDevices;
  using carve::service::UniqueFd;
  HostMemoryMapper lender = two_devices();
  const auto h = lender.create(1, granule);
  REQUIRE(h);
  const carve::HostMapperOptions both{
      .granularity = granule, .device_count = 2, .cpu_device = HostMemoryMapper::every_device};

  HostMemoryMapper importer(both);
  auto mapped =
      carve::service::map_vmm_segment(importer, granule, SegmentDevices{1, 0}, UniqueFd(*lender.export_fd(*h)));
  REQUIRE(mapped);
  CHECK(mapped->device == 0); // the requester's
  CHECK(*importer.access(mapped->base, 0) == carve::Access::read_write);
  CHECK(*importer.access(mapped->base, 1) == carve::Access::read_write);
  carve::service::unmap_vmm_segment(importer, *mapped);

  NoPeerMapper refusing(both);
  const auto refused =
      carve::service::map_vmm_segment(refusing, granule, SegmentDevices{1, 0}, UniqueFd(*lender.export_fd(*h)));
  REQUIRE_FALSE(refused);
  CHECK(refused.error().code == Errc::out_of_range);
  CHECK(refusing.mapping_count() == 0);
  CHECK(refusing.reservation_count() == 0);
  CHECK(refusing.physical_count() == 0);
  REQUIRE(lender.release(*h));

  // Memory made on a device of coarser granularity is mapped at that granularity, whichever
  // device it is mapped for.
  const auto coarse = lender.create(1, 2 * granule);
  REQUIRE(coarse);
  CoarseDeviceOne mixed(both);
  auto placed =
      carve::service::map_vmm_segment(mixed, granule + 1, SegmentDevices{1, 0}, UniqueFd(*lender.export_fd(*coarse)));
  REQUIRE(placed);
  CHECK(placed->mapped_bytes == 2 * granule);
  CHECK(reinterpret_cast<std::uintptr_t>(placed->base) % (2 * granule) == 0);
  carve::service::unmap_vmm_segment(mixed, *placed);
  CHECK(mixed.reservation_count() == 0);
  REQUIRE(lender.release(*coarse));
  // The other way round: memory of the finer device keeps its size, placed for the coarser one.
  const auto fine = lender.create(0, granule);
  REQUIRE(fine);
  placed = carve::service::map_vmm_segment(mixed, granule, SegmentDevices{0, 1}, UniqueFd(*lender.export_fd(*fine)));
  REQUIRE(placed);
  CHECK(placed->mapped_bytes == granule);
  CHECK(reinterpret_cast<std::uintptr_t>(placed->base) % (2 * granule) == 0);
  CHECK(*mixed.access(placed->base, 1) == carve::Access::read_write);
  carve::service::unmap_vmm_segment(mixed, *placed);
  REQUIRE(lender.release(*fine));
}

TEST_CASE("map_segment maps for the devices the UUIDs name in this process, not the server's numbers") {
  using namespace carve::service;
  HostMemoryMapper lender = two_devices();
  const auto h = lender.create(1, granule);
  REQUIRE(h);
  // The server's GPU 5 lent to its GPU 3; this process sees GPU 3 alone, as its device 1.
  Allocated a;
  a.kind = carve::ExportKind::host_vmm;
  a.segment_size = granule;
  a.device = 5;
  a.region.requester = 3;
  a.device_uuid = uuid_of_gpu(5);
  a.requester_uuid = uuid_of_gpu(3);
  const auto mapped = map_segment(a, UniqueFd(*lender.export_fd(*h)), OneGpu{uuid_of_gpu(3), 1});
  REQUIRE(mapped);
  CHECK(mapped->device == 1);
  CHECK(*host_vmm_mapper().access(mapped->base, 1) == carve::Access::read_write);
  for (const int other : {0, 3, 5}) {
    CHECK(*host_vmm_mapper().access(mapped->base, other) == carve::Access::none);
  }
  unmap_segment(*mapped);
  // Seeing neither GPU: refused before anything is imported.
  const auto fd = lender.export_fd(*h);
  REQUIRE(fd);
  const auto neither = map_segment(a, UniqueFd(*fd), OneGpu{uuid_of_gpu(7), 0});
  REQUIRE_FALSE(neither);
  CHECK(neither.error().code == Errc::out_of_range);
  CHECK(host_vmm_mapper().mapping_count() == 0);
  CHECK(host_vmm_mapper().reservation_count() == 0);
  REQUIRE(lender.release(*h));
}

TEST_CASE("HostMirrorBackend takes its devices' memory through the mapping layer (VmmCard)") {
  constexpr std::size_t MiB = std::size_t{1} << 20;
  HostMemoryMapper m({.granularity = 2 * MiB, .device_count = 2, .cpu_device = HostMemoryMapper::every_device});
  {
    carve::HostMirrorBackend<carve::VmmCard<HostMemoryMapper>> devices;
    devices.register_device(carve::VmmCard<HostMemoryMapper>(m, 0, 4 * MiB), {.bytes = 4 * MiB});
    devices.register_device(carve::VmmCard<HostMemoryMapper>(m, 1, 4 * MiB), {.bytes = 4 * MiB});
    CHECK(m.mapping_count() == 2);
    carve::PagedMirror mirror(devices, {.page_size = 64 * KiB, .tracking = carve::WriteTracking::explicit_calls},
                              carve::StripePlacement{.stripe_pages = 1});
    auto* p = static_cast<unsigned char*>(*mirror.try_allocate(256 * KiB, 1));
    REQUIRE(mirror.sync_all());
    std::memset(p, 0x77, 256 * KiB);
    REQUIRE(mirror.mark_dirty(p, 256 * KiB));
    REQUIRE(mirror.sync());
    for (std::size_t d = 0; d < 2; ++d) { // two pages of the four on each device, in its mapped memory
      REQUIRE(devices.wait(d));
      const auto memory = devices.device_memory(d);
      CHECK(*m.access(const_cast<std::byte*>(memory.data()), static_cast<int>(d)) == Access::read_write);
      CHECK(std::count(memory.begin(), memory.end(), std::byte{0x77}) == static_cast<std::ptrdiff_t>(128 * KiB));
    }
    REQUIRE(mirror.try_deallocate(p));
  }
  CHECK(m.mapping_count() == 0);
  CHECK(m.physical_count() == 0);
}

namespace {

// A kernel written for one device and one pointer: it knows nothing of pages or devices.
void scale_and_shift(float* x, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    x[i] = 2.0f * x[i] + 1.0f;
  }
}

HostMemoryMapper three_devices() {
  return HostMemoryMapper({.granularity = granule, .device_count = 3, .cpu_device = HostMemoryMapper::every_device});
}

using ViewBackend = carve::VmmMirrorBackend<HostMemoryMapper, carve::SimulatedPeerAccess>;

// Devices 0 and 1 reach each other; device 2 reaches only itself.
carve::SimulatedPeerAccess island_two() {
  return carve::SimulatedPeerAccess({{false, true, false}, {true, false, false}, {false, false, false}});
}

} // namespace

TEST_CASE("device view: an unchanged kernel runs over one pointer across three devices' pages") {
  HostMemoryMapper m = three_devices();
  carve::VmmMirrorBackend<> devices(m);
  for (int d = 0; d < 3; ++d) {
    devices.register_device(d, 8 * granule);
  }
  carve::PagedMirror mirror(devices, {.page_size = granule, .device_view = true},
                            carve::StripePlacement{.stripe_pages = 2});
  constexpr std::size_t n = 20 * granule / sizeof(float) - 100; // 20 pages, the last one partly used
  auto* x = static_cast<float*>(*mirror.try_allocate(n * sizeof(float), 1));
  for (std::size_t i = 0; i < n; ++i) {
    x[i] = static_cast<float>(i); // plain stores, tracked
  }
  REQUIRE(mirror.sync());
  auto* dx = static_cast<float*>(*mirror.device_pointer(x));
  CHECK(static_cast<void*>(dx) != static_cast<void*>(x));
  std::array<int, 3> pages_on{};
  for (std::size_t page = 0; page < 20; ++page) { // each page of the view holds its owner's memory
    const auto* host = reinterpret_cast<const std::byte*>(x) + page * granule;
    auto* device = reinterpret_cast<std::byte*>(dx) + page * granule;
    const auto at = mirror.locate(host);
    REQUIRE(at);
    CHECK(*m.owner(device) == static_cast<int>(at->device));
    ++pages_on[at->device];
    for (int d = 0; d < 3; ++d) {
      CHECK(*m.access(device, d) == Access::read_write);
    }
  }
  CHECK(pages_on == std::array<int, 3>{8, 6, 6});
  scale_and_shift(dx, n); // "device code": one pointer, one launch
  CHECK(x[7] == 7.0f);    // the host copy is untouched until fetched
  const auto fetched = mirror.fetch(x, n * sizeof(float));
  REQUIRE(fetched);
  CHECK(fetched->discarded_dirty_pages == 0);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < n; ++i) {
    wrong += x[i] != 2.0f * static_cast<float>(i) + 1.0f ? 1 : 0;
  }
  CHECK(wrong == 0);
  const std::size_t mappings = m.mapping_count();
  REQUIRE(mirror.try_deallocate(x));
  CHECK(m.mapping_count() == mappings - 20); // the view went with its allocation
}

TEST_CASE("device view: both sides wrote one page between transfers: the last transfer wins the page") {
  HostMemoryMapper m = three_devices();
  carve::VmmMirrorBackend<> devices(m);
  for (int d = 0; d < 3; ++d) {
    devices.register_device(d, 2 * granule);
  }
  carve::PagedMirror mirror(devices, {.page_size = granule, .device_view = true});
  auto* x = static_cast<int*>(*mirror.try_allocate(granule, 1));
  auto* dx = static_cast<int*>(*mirror.device_pointer(x));
  x[0] = 1;               // host
  dx[1] = 2;              // device, same page
  REQUIRE(mirror.sync()); // the host's page replaces the device's
  CHECK(dx[0] == 1);
  CHECK(dx[1] == 0);
  x[0] = 3;
  dx[1] = 4;
  const auto fetched = mirror.fetch(x, granule); // the device's page replaces the host's
  REQUIRE(fetched);
  CHECK(fetched->discarded_dirty_pages == 1);
  CHECK(x[0] == 1);
  CHECK(x[1] == 4);
  CHECK_FALSE(mirror.is_dirty(x));
  REQUIRE(mirror.try_deallocate(x));
}

TEST_CASE("device view: unreachable pairs, foreign pointers, bad page sizes and backends change nothing") {
  HostMemoryMapper m = three_devices();
  ViewBackend devices(m, island_two());
  for (int d = 0; d < 3; ++d) {
    devices.register_device(d, 4 * granule);
  }
  carve::PagedMirror mirror(devices, {.page_size = granule, .device_view = true});
  auto* spread = static_cast<std::byte*>(*mirror.try_allocate(8 * granule, 1)); // 4 + 4 pages: devices 0, 1
  auto* local = static_cast<std::byte*>(*mirror.try_allocate(2 * granule, 1));  // device 2's pages
  const auto view = mirror.device_pointer(spread + 5, 1);
  REQUIRE(view);
  auto* dspread = static_cast<std::byte*>(*view) - 5;
  // Devices 0 and 1 reach every owner of `spread`; device 2 reaches neither.
  CHECK(*m.access(dspread, 0) == Access::read_write);
  CHECK(*m.access(dspread, 1) == Access::read_write);
  CHECK(*m.access(dspread, 2) == Access::none);
  const auto refused = mirror.device_pointer(spread, 2);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().code == Errc::unsupported);
  CHECK(refused.error().message.find("device 2 cannot reach device 0") != std::string::npos);
  // `local` lies on device 2 alone: only device 2 may use its view.
  auto* dlocal = static_cast<std::byte*>(*mirror.device_pointer(local, 2));
  CHECK(*m.access(dlocal, 2) == Access::read_write);
  CHECK(*m.access(dlocal, 0) == Access::none);
  CHECK(devices.peer().enable_calls(0, 1) == 1); // switched on once per pair
  CHECK(devices.peer().enable_calls(1, 0) == 1);
  // A child playing device 2 faults exactly where it touches the spread view.
  const auto status_of = [](int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : -1; };
  CHECK(status_of(in_child([&] {
          return m.play_device(2) ? touch_expecting_fault(dspread + 3 * granule + 8, false) : 1;
        })) == faulted_where_expected);
  CHECK(status_of(in_child([&] { return m.play_device(2) ? touch_expecting_fault(dlocal + 8, true) : 1; })) ==
        did_not_fault);
  // Bad input: the documented Errc, and nothing changes.
  const std::size_t mappings = m.mapping_count();
  int foreign = 0;
  CHECK(mirror.device_pointer(&foreign).error() == Errc::out_of_range);
  CHECK(mirror.device_pointer(local + 2 * granule).error() == Errc::out_of_range); // past the last allocation
  CHECK(mirror.device_pointer(spread, 3).error().code == Errc::out_of_range);      // no device 3
  CHECK(m.mapping_count() == mappings);
  REQUIRE(mirror.try_deallocate(local));
  REQUIRE(mirror.try_deallocate(spread));
  CHECK(carve::test::thrown_code([&] {
          carve::PagedMirror bad(devices, {.page_size = carve::os_page_size(), .device_view = true});
        }) == Errc::invalid_argument); // pages smaller than a granule
  carve::HostMirrorBackend<> plain;
  plain.register_device(carve::SimulatedCard(4 * granule));
  CHECK(carve::test::thrown_code([&] { carve::PagedMirror bad(plain, {.page_size = granule, .device_view = true}); }) ==
        Errc::unsupported);
  carve::PagedMirror no_view(plain, {.page_size = granule});
  auto* p = *no_view.try_allocate(granule, 1);
  CHECK(no_view.device_pointer(p).error() == Errc::unsupported);
  REQUIRE(no_view.try_deallocate(p));
}

namespace {
// Every pair can map each other, but switching device 1 onto device 0's memory fails (a driver
// out of peer slots, say).
struct RefusesOneToZero {
  int calls = 0;
  bool can_access(int, int) const noexcept { return true; }
  carve::Result<void> enable(int requester, int lender) {
    ++calls;
    if (requester == 1 && lender == 0) {
      return carve::fail(Errc::unsupported, "no peer slot left");
    }
    return {};
  }
};
} // namespace

TEST_CASE("device view: a device whose peer switch-on was refused is never told it can use a view") {
  HostMemoryMapper m = three_devices();
  carve::VmmMirrorBackend<HostMemoryMapper, RefusesOneToZero> devices(m);
  for (int d = 0; d < 3; ++d) {
    devices.register_device(d, 4 * granule);
  }
  carve::PagedMirror mirror(devices, {.page_size = granule, .device_view = true});
  auto* first = static_cast<std::byte*>(*mirror.try_allocate(2 * granule, 1)); // device 0's pages
  auto* d0 = static_cast<std::byte*>(*mirror.device_pointer(first, 0));
  CHECK(*m.access(d0, 1) == Access::none); // the view was not opened to device 1
  CHECK(*m.access(d0, 2) == Access::read_write);
  const auto refused = mirror.device_pointer(first, 1);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().code == Errc::unsupported);
  CHECK(mirror.device_pointer(first, 2));
  const int asked = devices.peer().calls;
  auto* second = static_cast<std::byte*>(*mirror.try_allocate(2 * granule, 1)); // device 0 again
  CHECK(devices.peer().calls == asked); // the refused pair is not asked again, nor the enabled one
  CHECK(*m.access(*mirror.device_pointer(second, 0), 1) == Access::none);
  CHECK_FALSE(mirror.device_pointer(second, 1));
  REQUIRE(mirror.try_deallocate(second));
  REQUIRE(mirror.try_deallocate(first));
}

TEST_CASE("device view: memory another process exported is registered as a device and used through the view") {
  // The exporter (another process, or another node with fabric handles on CUDA) and this process
  // have mappers of their own; only descriptors pass between them.
  HostMemoryMapper exporter({.granularity = granule, .device_count = 2, .cpu_device = HostMemoryMapper::every_device});
  std::vector<HostMemoryMapper::physical_handle> theirs;
  std::vector<HostMemoryMapper::physical_handle> imported;
  HostMemoryMapper m({.granularity = granule, .device_count = 2, .cpu_device = HostMemoryMapper::every_device});
  for (int i = 0; i < 4; ++i) {
    theirs.push_back(*exporter.create(1, granule));
    const int fd = *exporter.export_fd(theirs.back());
    imported.push_back(*m.import_fd(fd));
    ::close(fd);
  }
  carve::VmmMirrorBackend<> devices(m);
  devices.register_device(0, 4 * granule);
  CHECK(devices.register_imported_device(1, imported, granule, "remote") == 1);
  CHECK(carve::test::thrown_code([&] { devices.register_imported_device(1, {}, granule); }) == Errc::invalid_argument);
  CHECK(devices.devices().size() == 2);
  {
    carve::PagedMirror mirror(devices, {.page_size = granule, .device_view = true});
    auto* x = static_cast<std::uint32_t*>(*mirror.try_allocate(8 * granule, 1)); // 4 local, 4 remote pages
    for (std::size_t i = 0; i < 8 * granule / 4; ++i) {
      x[i] = static_cast<std::uint32_t>(i);
    }
    REQUIRE(mirror.sync());
    // The exporter sees the remote half in its own memory.
    const auto placed = carve::place_physical(exporter, theirs[1], granule, 1, Access::read_write);
    REQUIRE(placed);
    CHECK(static_cast<const std::uint32_t*>(placed->base)[3] == static_cast<std::uint32_t>(5 * granule / 4 + 3));
    REQUIRE(carve::unplace_physical(exporter, *placed));
    const auto* dx = static_cast<const std::uint32_t*>(*mirror.device_pointer(x));
    CHECK(dx[5 * granule / 4 + 3] == static_cast<std::uint32_t>(5 * granule / 4 + 3));
    REQUIRE(mirror.try_deallocate(x));
  }
  for (const auto h : theirs) {
    REQUIRE(exporter.release(h));
  }
}

TEST_CASE("OnDemandReservation: more than it can ever hold is no_space, a size that overflows is invalid_size") {
  using Reservation = carve::OnDemandReservation<HostMemoryMapper>;
  const std::size_t too_many = (std::size_t{1} << 32) * granule; // 2^32 granules: past the 32-bit chunk index
  const auto big = Reservation::reserve(two_devices(), 0, too_many);
  REQUIRE_FALSE(big);
  CHECK(big.error().code == Errc::no_space);
  const auto wraps = Reservation::reserve(two_devices(), 0, SIZE_MAX);
  REQUIRE_FALSE(wraps);
  CHECK(wraps.error().code == Errc::invalid_size);
  CHECK(Reservation::reserve(two_devices(), 0, 0).error().code == Errc::invalid_size);
}

TEST_CASE("OnDemandReservation: lend maps a chunk's unused granules again elsewhere, and hands them back") {
  using Reservation = carve::OnDemandReservation<HostMemoryMapper>;
  HostMemoryMapper m = two_devices(); // copies share the tables
  {
    auto r = Reservation::reserve(m, 0, 16 * granule);
    REQUIRE(r);
    const std::uintptr_t base = r->base();
    REQUIRE(r->back(base, 4 * granule, [] { return carve::ChunkRule{}; }) == 4 * granule);
    CHECK(m.physical_count() == 1); // a chunk keeps its handle while it is mapped
    auto* home = reinterpret_cast<unsigned char*>(base);
    std::memset(home + granule, 5, 2 * granule);
    const auto maps = r->counts().maps;

    // Refused, nothing changed: over mapped granules, from granules of no chunk, misaligned.
    CHECK(code_of(r->lend(base + 2 * granule, base + granule, granule)) == Errc::invalid_argument);
    CHECK(code_of(r->lend(base + 8 * granule, base + 6 * granule, granule)) == Errc::invalid_argument);
    CHECK(code_of(r->lend(base + 8 * granule, base + granule + 512, granule)) == Errc::invalid_argument);
    CHECK(code_of(r->lend(base + 8 * granule, base + 3 * granule, 2 * granule)) ==
          Errc::invalid_argument); // past the chunk
    CHECK(r->counts().maps == maps);
    CHECK(r->consistent());

    REQUIRE(r->lend(base + 8 * granule, base + granule, 2 * granule));
    CHECK(r->counts().maps == maps + 1);
    CHECK(r->mapped_bytes() == 4 * granule); // no memory of its own
    CHECK(r->chunk_count() == 2);
    CHECK(r->lent_at(base + 8 * granule));
    CHECK_FALSE(r->lent_at(base));
    CHECK(r->backed(base + 8 * granule, 2 * granule));
    CHECK(r->unbacked_bytes(base + 8 * granule, 3 * granule) == granule);
    auto* lent = reinterpret_cast<unsigned char*>(base + 8 * granule);
    CHECK(lent[granule + 17] == 5);
    lent[0] = 6;
    CHECK(home[granule] == 6); // one memory
    CHECK(r->consistent());
    CHECK_FALSE(r->next_returned());

    CHECK(r->release_within(base + 8 * granule, 2 * granule) == 0); // unmapped, and no memory freed
    const auto back = r->next_returned();
    REQUIRE(back);
    CHECK(*back == std::pair{base + granule, 2 * granule});
    CHECK_FALSE(r->next_returned());
    CHECK(r->chunk_count() == 1);
    CHECK(r->consistent());

    // Dropping the reservation unmaps a second mapping with the first, and the memory goes.
    REQUIRE(r->lend(base + 8 * granule, base, granule));
    CHECK(m.mapping_count() == 2);
  }
  CHECK(m.mapping_count() == 0);
  CHECK(m.physical_count() == 0);
}
