// CudaMemoryMapper, host code linked with the CUDA runtime only (never libcuda). Without a driver
// (this machine) every call must fail cleanly with Errc::unsupported and the program must start at
// all; with a driver but no device the test is skipped (77); on a GPU the VMM protocol runs: create,
// export as a descriptor, import it again, map both, and the two mappings hold the same bytes;
// rights per device; VmmCard over it; errors carry the driver's error name.
#include "support/device_test.hpp"

#include <carve/borrow/lending_peers.hpp>
#include <carve/mr/cuda_device_resource.hpp>
#include <carve/vmm.hpp>

#include <unistd.h>

#include <algorithm>
#include <concepts>
#include <cstdio>
#include <string>
#include <vector>

// Cards over CUDA name their GPU by UUID, and a server lends between them only where the driver
// lets the two GPUs map each other (the host twin's side: tests/vmm/test_vmm.cpp).
static_assert(carve::KnowsItsDevice<carve::VmmCard<carve::CudaMemoryMapper>>);
static_assert(carve::KnowsItsDevice<carve::CudaDeviceResource>);
static_assert(std::same_as<carve::LendingPeers<carve::VmmCard<carve::CudaMemoryMapper>>, carve::CudaPeerCapability>);
static_assert(std::same_as<carve::LendingPeers<carve::CudaDeviceResource>, carve::CudaPeerCapability>);

namespace {

using carve::test::expect;
using carve::test::failures;

bool unsupported(const carve::Error& e) {
  return e.code == carve::Errc::unsupported && e.message.find("CUDA driver") != std::string::npos;
}

// Without a driver: every call reports unsupported and names what is missing.
void without_driver() {
  carve::CudaMemoryMapper gpus;
  expect(!carve::CudaMemoryMapper::driver_available(), "no driver here");
  const auto g = gpus.granularity(0);
  expect(!g && unsupported(g.error()), "granularity: unsupported");
  if (!g) {
    std::printf("(as expected) %s\n", g.error().message.c_str());
  }
  const auto h = gpus.create(0, std::size_t{2} << 20);
  expect(!h && unsupported(h.error()), "create: unsupported");
  const auto va = gpus.reserve(std::size_t{2} << 20, 0);
  expect(!va && unsupported(va.error()), "reserve: unsupported");
  expect(!gpus.import_fd(0), "import_fd: unsupported");
  expect(!gpus.map(nullptr, std::size_t{2} << 20, 1), "map: unsupported");
  bool threw = false;
  try {
    carve::VmmCard<carve::CudaMemoryMapper> card(gpus, 0, std::size_t{64} << 20);
  } catch (const carve::Exception& e) {
    threw = e.code() == carve::Errc::unsupported;
  }
  expect(threw, "a VmmCard cannot be made without a driver");
}

void on_gpu() {
  carve::CudaMemoryMapper gpus;
  int devices = 0;
  carve::test::check(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
  const auto g = gpus.granularity(0);
  expect(g.has_value() && *g >= 4096, "a granularity");
  if (!g) {
    return;
  }
  std::printf("granularity of device 0: %zu bytes\n", *g);
  const auto bad = gpus.create(0, *g + 1);
  expect(!bad && bad.error().code == carve::Errc::invalid_size, "create refuses a size of no whole granules");
  const auto h = gpus.create(0, 2 * *g);
  expect(h.has_value(), "cuMemCreate");
  if (!h) {
    std::printf("%s\n", h.error().message.c_str());
    return;
  }
  const auto fd = gpus.export_fd(*h);
  expect(fd.has_value(), "export as a POSIX descriptor");
  carve::Result<carve::CudaMemoryMapper::physical_handle> again = carve::fail(carve::Errc::io_error, "not exported");
  if (fd) {
    again = gpus.import_fd(*fd);
  }
  expect(again.has_value(), "import the descriptor");
  if (fd) {
    ::close(*fd);
  }
  const auto a = carve::place_physical(gpus, *h, 2 * *g, 0, carve::Access::read_write);
  expect(a.has_value(), "place the allocation");
  expect(gpus.release(*h).has_value(), "release while mapped");
  if (!a || !again) {
    return;
  }
  const auto b = carve::place_physical(gpus, *again, 2 * *g, 0, carve::Access::read_write);
  expect(b.has_value() && gpus.release(*again).has_value(), "place the imported allocation");
  expect(gpus.access(a->base, 0).value_or(carve::Access::none) == carve::Access::read_write, "device 0 may write");
  if (devices > 1) {
    expect(gpus.set_access(a->base, a->bytes, 1, carve::Access::read).has_value(), "device 1 may read");
    expect(gpus.access(a->base, 1).value_or(carve::Access::none) == carve::Access::read, "and says so");
  }
  if (b) {
    std::vector<unsigned char> bytes(2 * *g, 0x5d);
    carve::test::check(cudaMemcpy(a->base, bytes.data(), bytes.size(), cudaMemcpyHostToDevice), "copy in");
    const auto seen = carve::test::to_host(static_cast<const unsigned char*>(b->base), bytes.size());
    expect(std::all_of(seen.begin(), seen.end(), [](unsigned char c) { return c == 0x5d; }),
           "both mappings hold the same bytes");
    expect(carve::unplace_physical(gpus, *b).has_value(), "unmap the imported one");
  }
  expect(carve::unplace_physical(gpus, *a).has_value(), "unmap and free the reservation");
  const auto unmapped = gpus.unmap(a->base, a->bytes);
  expect(!unmapped && !unmapped.error().message.empty(), "a second unmap fails with the driver's error name");

  carve::VmmCard<carve::CudaMemoryMapper> card(gpus, 0, 4 * *g);
  const auto p = card.try_allocate(1000, 256);
  expect(p.has_value() && card.used_bytes() == *g, "VmmCard rounds to the granularity");
  const auto e = p ? card.export_segment(*p, 1000) : std::nullopt;
  expect(e && e->kind == carve::ExportKind::cuda_vmm && e->fd >= 0, "VmmCard exports a descriptor");
  if (p) {
    card.deallocate(*p, 1000, 256);
  }
  expect(card.used_bytes() == 0, "and gives it back");
}

} // namespace

int main() {
  if (!carve::CudaMemoryMapper::driver_available()) {
    // Where the runtime sees a GPU, the driver's memory calls must be reachable: without them
    // nothing below would test the card.
    int devices = 0;
    expect(cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0, "a machine with a GPU reaches its driver");
    without_driver();
  } else {
    carve::test::skip_without_device();
    on_gpu();
  }
  std::printf("%s\n", failures == 0 ? "all passed" : "FAILED");
  return failures == 0 ? 0 : 1;
}
