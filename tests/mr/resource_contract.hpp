// The contract of carve/mr/memory_resource.hpp as checks, written once as __host__ __device__ code
// so that doctest runs them on the host and a kernel runs the very same ones on a GPU: errors as
// documented and changing nothing, alignment honoured, no two live blocks overlapping, every
// byte back after the frees, and a double free refused. Each check a resource's capabilities
// allow runs (OwnsMemory, ReportsFreeBytes, ChecksDeallocation); what differs between resources
// is said in a ResourceShape, not in special cases. A run returns a ContractResult: how many
// checks failed and the name of the first, which a test case or a kernel reports.
//
// The bookkeeping of the batch lives in memory the caller hands in (a std::array on the host,
// device memory in a kernel), so a kernel running the contract keeps its stack small.
#pragma once

#include <carve/core/config.hpp>
#include <carve/core/errc.hpp>
#include <carve/mr/memory_resource.hpp>

#include <cuda/std/cstddef>
#include <cuda/std/cstdint>
#include <cuda/std/expected>
#include <cuda/std/span>

namespace carve::test {

/// What a contract run found.
struct ContractResult {
  unsigned checks = 0;                 ///< checks made
  unsigned failures = 0;               ///< checks that failed
  const char* first_failure = nullptr; ///< the first failed check's name

  /// Counts one check; false when it failed.
  CARVE_HOST_DEVICE bool expect(bool ok, const char* check) noexcept {
    ++checks;
    if (!ok && failures++ == 0) {
      first_failure = check;
    }
    return ok;
  }
  /// No check failed.
  CARVE_HOST_DEVICE bool passed() const noexcept { return failures == 0; }
  /// The failed check's name, or "" when every check passed.
  CARVE_HOST_DEVICE const char* what() const noexcept { return first_failure != nullptr ? first_failure : ""; }
};

/// What one resource can serve, so that the same contract fits an 8 KiB arena in shared memory
/// and a 4 MiB pool: the batch it must hold at once, and the requests it refuses by design.
struct ResourceShape {
  cuda::std::size_t largest_request = 0; ///< batch requests are 1 to this many bytes
  cuda::std::size_t batch = 0;           ///< that many requests held at once, at most max_batch
  cuda::std::size_t max_alignment = 0;   ///< the coarsest alignment the batch asks for (a power of two)
  /// Whether an alignment above max_alignment is refused with no_space (the slot alignment of an
  /// arena, a pool's granularity, the OS page of a memfd) rather than possibly served.
  bool refuses_coarser_alignment = true;
  cuda::std::size_t never_fits = 0; ///< a request it can never serve (no_space); 0: none to try
  /// Whether its bytes can be written where the contract runs (false: addresses only, as an
  /// AddressOnlyCard's, or device memory checked from the host).
  bool bytes_addressable = true;
  /// Whether free_bytes is its own figure, so that it must come back exactly (false: a device's
  /// free memory, which other users change: a hint, memory_resource.hpp says).
  bool free_bytes_exact = true;
};

/// The most requests a batch holds.
inline constexpr cuda::std::size_t max_batch = 24;

/// One block of a batch.
struct ContractBlock {
  void* p = nullptr;
  cuda::std::size_t bytes = 0;
  cuda::std::size_t alignment = 0;
};

namespace contract_detail {

CARVE_HOST_DEVICE constexpr cuda::std::size_t smaller(cuda::std::size_t a, cuda::std::size_t b) noexcept {
  return a < b ? a : b;
}

// Request i of a batch: sizes from 1 byte to the largest, alignments from 1 to the coarsest, in
// an order that puts small and large, loose and strict, next to each other. Switches, not
// tables: a table indexed at run time would sit in a kernel's stack frame.
CARVE_HOST_DEVICE constexpr cuda::std::size_t request_bytes(cuda::std::size_t largest, cuda::std::size_t i) noexcept {
  switch (i % 8) {
  case 0:
    return largest;
  case 1:
    return 1;
  case 2:
    return smaller(largest / 2 + 1, largest);
  case 3:
    return smaller(3, largest);
  case 4:
    return smaller(largest / 3 + 1, largest);
  case 5:
    return largest - largest / 4;
  case 6:
    return smaller(64, largest);
  default:
    return smaller(17, largest);
  }
}
CARVE_HOST_DEVICE constexpr cuda::std::size_t request_alignment(cuda::std::size_t coarsest,
                                                                cuda::std::size_t i) noexcept {
  switch ((i / 2 + i) % 8) {
  case 0:
    return coarsest;
  case 1:
    return 1;
  case 2:
    return smaller(8, coarsest);
  case 3:
    return smaller(2, coarsest);
  case 4:
    return smaller(64, coarsest);
  case 5:
    return smaller(16, coarsest);
  case 6:
    return smaller(4, coarsest);
  default:
    return smaller(256, coarsest);
  }
}
CARVE_HOST_DEVICE constexpr ContractBlock request(const ResourceShape& shape, cuda::std::size_t i) noexcept {
  return {nullptr, request_bytes(shape.largest_request, i), request_alignment(shape.max_alignment, i)};
}

// The byte at offset j of block i: different in neighbouring blocks and along each block.
CARVE_HOST_DEVICE constexpr unsigned char pattern(cuda::std::size_t i, cuda::std::size_t j) noexcept {
  return static_cast<unsigned char>(0x5a ^ (i * 29 + 1) ^ (j * 7));
}

CARVE_HOST_DEVICE inline cuda::std::uintptr_t address(const void* p) noexcept {
  return reinterpret_cast<cuda::std::uintptr_t>(p);
}

CARVE_EXEC_CHECK_DISABLE
template <class R>
CARVE_HOST_DEVICE cuda::std::size_t free_now(const R& r) {
  if constexpr (ReportsFreeBytes<R>) {
    return r.free_bytes();
  } else {
    return 0;
  }
}

// A refused request: the error `want` (or either of invalid_size and no_space when `want` is
// Errc{}), and the resource's free bytes as they were.
CARVE_EXEC_CHECK_DISABLE
template <class R>
CARVE_HOST_DEVICE void expect_refused(R& r, const ResourceShape& shape, cuda::std::size_t bytes,
                                      cuda::std::size_t alignment, Errc want, const char* check, const char* unchanged,
                                      ContractResult& result) {
  const cuda::std::size_t before = free_now(r);
  const cuda::std::expected<void*, Errc> p = r.try_allocate(bytes, alignment);
  const bool refused =
      !p && (want != Errc{} ? p.error() == want : p.error() == Errc::invalid_size || p.error() == Errc::no_space);
  result.expect(refused, check);
  if (p) {
    r.deallocate(*p, bytes, alignment);
  }
  if constexpr (ReportsFreeBytes<R>) {
    result.expect(!shape.free_bytes_exact || free_now(r) == before, unchanged);
  }
}

} // namespace contract_detail

/// Requests no resource could serve are invalid_size; the largest sizes, which overflow any
/// rounding, are refused one way or the other; none changes the resource.
CARVE_EXEC_CHECK_DISABLE
template <MemoryResource R>
CARVE_HOST_DEVICE __attribute__((noinline)) void check_invalid_requests(R& r, const ResourceShape& shape,
                                                                        ContractResult& result) {
  using contract_detail::expect_refused;
  const char* unchanged = "a refused request changes nothing";
  expect_refused(r, shape, 0, 8, Errc::invalid_size, "0 bytes: invalid_size", unchanged, result);
  expect_refused(r, shape, 64, 0, Errc::invalid_size, "alignment 0: invalid_size", unchanged, result);
  expect_refused(r, shape, 64, 3, Errc::invalid_size, "alignment 3: invalid_size", unchanged, result);
  expect_refused(r, shape, 64, 48, Errc::invalid_size, "alignment 48: invalid_size", unchanged, result);
  expect_refused(r, shape, 0, 3, Errc::invalid_size, "0 bytes at alignment 3: invalid_size", unchanged, result);
  const auto most = static_cast<cuda::std::size_t>(-1);
  expect_refused(r, shape, most, 1, Errc{}, "SIZE_MAX bytes: refused", unchanged, result);
  expect_refused(r, shape, most - 1, shape.max_alignment, Errc{}, "SIZE_MAX - 1 bytes, coarsely aligned: refused",
                 unchanged, result);
}

/// A request larger than the resource could ever hold, or aligned more coarsely than it can
/// give, is no_space (so that a FallbackResource passes it on), and changes nothing.
CARVE_EXEC_CHECK_DISABLE
template <MemoryResource R>
CARVE_HOST_DEVICE __attribute__((noinline)) void check_unservable_requests(R& r, const ResourceShape& shape,
                                                                           ContractResult& result) {
  using contract_detail::expect_refused;
  const char* unchanged = "a request it could never serve changes nothing";
  if (shape.never_fits != 0) {
    expect_refused(r, shape, shape.never_fits, 1, Errc::no_space, "more than it could ever hold: no_space", unchanged,
                   result);
  }
  if (shape.refuses_coarser_alignment) {
    expect_refused(r, shape, 1, 2 * shape.max_alignment, Errc::no_space, "an alignment it cannot give: no_space",
                   unchanged, result);
  }
}

/// Allocates the shape's batch into `blocks` (each must succeed) and checks each block alone:
/// aligned, owned where the resource knows what it owns, and (where the bytes can be written
/// here) filled with its own pattern. Returns how many blocks it holds.
CARVE_EXEC_CHECK_DISABLE
template <MemoryResource R>
CARVE_HOST_DEVICE __attribute__((noinline)) cuda::std::size_t
allocate_batch(R& r, const ResourceShape& shape, cuda::std::span<ContractBlock> blocks, ContractResult& result) {
  const cuda::std::size_t n = contract_detail::smaller(contract_detail::smaller(shape.batch, blocks.size()), max_batch);
  cuda::std::size_t held = 0;
  for (cuda::std::size_t i = 0; i < n; ++i) {
    ContractBlock b = contract_detail::request(shape, i);
    const cuda::std::expected<void*, Errc> p = r.try_allocate(b.bytes, b.alignment);
    if (!result.expect(p.has_value(), "a batch that fits is served")) {
      continue;
    }
    b.p = *p;
    result.expect(contract_detail::address(b.p) % b.alignment == 0, "every block is aligned as asked");
    if constexpr (OwnsMemory<R>) {
      const auto* last = static_cast<const unsigned char*>(b.p) + (b.bytes - 1);
      result.expect(r.owns(b.p) && r.owns(last), "owns() every byte of a live block");
    }
    if (shape.bytes_addressable) {
      auto* bytes = static_cast<unsigned char*>(b.p);
      for (cuda::std::size_t j = 0; j < b.bytes; ++j) {
        bytes[j] = contract_detail::pattern(held, j);
      }
    }
    blocks[held++] = b;
  }
  return held;
}

/// No two live blocks share a byte: their address ranges are disjoint, and (where the bytes can
/// be written here) each still holds the pattern written into it after all the others were.
CARVE_HOST_DEVICE __attribute__((noinline)) inline void
check_no_overlap(const ResourceShape& shape, cuda::std::span<const ContractBlock> blocks, ContractResult& result) {
  using contract_detail::address;
  bool disjoint = true;
  for (cuda::std::size_t i = 0; i < blocks.size(); ++i) {
    for (cuda::std::size_t k = i + 1; k < blocks.size(); ++k) {
      const bool apart = address(blocks[i].p) + blocks[i].bytes <= address(blocks[k].p) ||
                         address(blocks[k].p) + blocks[k].bytes <= address(blocks[i].p);
      disjoint = disjoint && apart;
    }
  }
  result.expect(disjoint, "no two live blocks overlap");
  if (!shape.bytes_addressable) {
    return;
  }
  bool intact = true;
  for (cuda::std::size_t i = 0; i < blocks.size(); ++i) {
    const auto* bytes = static_cast<const unsigned char*>(blocks[i].p);
    for (cuda::std::size_t j = 0; j < blocks[i].bytes; ++j) {
      intact = intact && bytes[j] == contract_detail::pattern(i, j);
    }
  }
  result.expect(intact, "every block keeps what was written into it");
}

/// Frees the batch, odd blocks first, then the even ones from the last: frees that leave holes
/// and frees that join them.
CARVE_EXEC_CHECK_DISABLE
template <MemoryResource R>
CARVE_HOST_DEVICE __attribute__((noinline)) void free_batch(R& r, cuda::std::span<const ContractBlock> blocks) {
  for (cuda::std::size_t i = 1; i < blocks.size(); i += 2) {
    r.deallocate(blocks[i].p, blocks[i].bytes, blocks[i].alignment);
  }
  for (cuda::std::size_t i = blocks.size(); i > 0; --i) {
    if ((i - 1) % 2 == 0) {
      r.deallocate(blocks[i - 1].p, blocks[i - 1].bytes, blocks[i - 1].alignment);
    }
  }
}

/// A batch held, checked and freed twice over: the second time the resource must serve again
/// what it served before, and after each round free_bytes is where it started ("every byte comes
/// back"); while the batch is held, free_bytes is down by at least the bytes handed out.
CARVE_EXEC_CHECK_DISABLE
template <MemoryResource R>
CARVE_HOST_DEVICE __attribute__((noinline)) void
check_batches(R& r, const ResourceShape& shape, cuda::std::span<ContractBlock> blocks, ContractResult& result) {
  const cuda::std::size_t start = contract_detail::free_now(r);
  for (int round = 0; round < 2; ++round) {
    const cuda::std::size_t held = allocate_batch(r, shape, blocks, result);
    const cuda::std::span<const ContractBlock> live(blocks.data(), held);
    check_no_overlap(shape, live, result);
    if constexpr (ReportsFreeBytes<R>) {
      cuda::std::size_t handed_out = 0;
      for (const ContractBlock& b : live) {
        handed_out += b.bytes;
      }
      const cuda::std::size_t now = contract_detail::free_now(r);
      result.expect(!shape.free_bytes_exact || (now <= start && start - now >= handed_out),
                    "free_bytes is down by at least the bytes handed out");
    }
    free_batch(r, live);
    if constexpr (ReportsFreeBytes<R>) {
      result.expect(!shape.free_bytes_exact || contract_detail::free_now(r) == start,
                    "every byte comes back: free_bytes as it started");
    }
  }
}

/// try_deallocate refuses, and changes nothing for, a block freed already, an address inside a
/// live block, and an address the resource never gave: not_allocated each time.
CARVE_EXEC_CHECK_DISABLE
template <MemoryResource R>
CARVE_HOST_DEVICE __attribute__((noinline)) void check_refused_frees(R& r, const ResourceShape& shape,
                                                                     ContractResult& result) {
  if constexpr (ChecksDeallocation<R>) {
    const ContractBlock b = contract_detail::request(shape, 0);
    const cuda::std::expected<void*, Errc> p = r.try_allocate(b.bytes, b.alignment);
    if (!result.expect(p.has_value(), "a block for the refused frees")) {
      return;
    }
    const cuda::std::size_t held = contract_detail::free_now(r);
    if (b.bytes > 1) {
      void* inside = static_cast<unsigned char*>(*p) + 1;
      const auto r1 = r.try_deallocate(inside, b.bytes - 1, 1);
      result.expect(!r1 && r1.error() == Errc::not_allocated, "an address inside a block: not_allocated");
    }
    unsigned char never_given = 0;
    const auto r2 = r.try_deallocate(&never_given, 1, 1);
    result.expect(!r2 && r2.error() == Errc::not_allocated, "an address it never gave: not_allocated");
    if constexpr (ReportsFreeBytes<R>) {
      result.expect(!shape.free_bytes_exact || contract_detail::free_now(r) == held, "a refused free changes nothing");
    }
    result.expect(r.try_deallocate(*p, b.bytes, b.alignment).has_value(), "try_deallocate frees a live block");
    const cuda::std::size_t freed = contract_detail::free_now(r);
    const auto again = r.try_deallocate(*p, b.bytes, b.alignment);
    result.expect(!again && again.error() == Errc::not_allocated, "a double free: not_allocated");
    if constexpr (ReportsFreeBytes<R>) {
      result.expect(!shape.free_bytes_exact || contract_detail::free_now(r) == freed, "a double free changes nothing");
    }
  }
}

/// The whole contract for one thread that has the resource to itself. `blocks`: room for the
/// batch (at least shape.batch blocks).
CARVE_EXEC_CHECK_DISABLE
template <MemoryResource R>
CARVE_HOST_DEVICE __attribute__((noinline)) ContractResult run_contract(R& r, const ResourceShape& shape,
                                                                        cuda::std::span<ContractBlock> blocks) {
  ContractResult result;
  result.expect(shape.batch <= blocks.size() && shape.batch <= max_batch && shape.largest_request > 0 &&
                    shape.max_alignment != 0 && (shape.max_alignment & (shape.max_alignment - 1)) == 0,
                "the shape describes a batch the contract can make");
  check_invalid_requests(r, shape, result);
  check_unservable_requests(r, shape, result);
  check_batches(r, shape, blocks, result);
  check_refused_frees(r, shape, result);
  // The failures changed nothing: what was served before is served again.
  const cuda::std::size_t held = allocate_batch(r, shape, blocks, result);
  free_batch(r, cuda::std::span<const ContractBlock>(blocks.data(), held));
  return result;
}

/// The contract for many threads sharing one thread-safe resource: each allocates `rounds` blocks
/// of 1 to `largest` bytes one at a time, writes its number into every byte, checks that no other
/// thread changed them, and frees it. no_space is retried (other threads hold the room) up to
/// `retries` times; any other error is a failure. Call it from every thread.
CARVE_EXEC_CHECK_DISABLE
template <MemoryResource R>
CARVE_HOST_DEVICE ContractResult run_shared_contract(R& r, unsigned thread, unsigned rounds, cuda::std::size_t largest,
                                                     cuda::std::size_t alignment, unsigned retries = 1u << 20) {
  ContractResult result;
  for (unsigned round = 0; round < rounds; ++round) {
    const cuda::std::size_t bytes = 1 + (static_cast<cuda::std::size_t>(thread) * 131 + round * 977) % largest;
    cuda::std::expected<void*, Errc> p = r.try_allocate(bytes, alignment);
    for (unsigned tries = 0; !p && p.error() == Errc::no_space && tries < retries; ++tries) {
      p = r.try_allocate(bytes, alignment);
    }
    if (!result.expect(p.has_value(), "every thread is served (no_space only while others hold the room)")) {
      continue;
    }
    result.expect(contract_detail::address(*p) % alignment == 0, "every thread's block is aligned as asked");
    const auto mark = static_cast<unsigned char>(thread * 7 + round);
    auto* b = static_cast<unsigned char*>(*p);
    for (cuda::std::size_t i = 0; i < bytes; ++i) {
      b[i] = mark;
    }
    bool intact = true;
    for (cuda::std::size_t i = 0; i < bytes; ++i) {
      intact = intact && b[i] == mark;
    }
    result.expect(intact, "no other thread was handed the same bytes");
    r.deallocate(*p, bytes, alignment);
  }
  return result;
}

} // namespace carve::test
