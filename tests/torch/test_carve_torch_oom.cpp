// libcarve_torch_oom on the host backend, as PyTorch calls it: a request carve cannot serve under
// CARVE_TORCH_MAX_RESERVED (64M, set by ctest with the pool) throws PyTorch's own
// c10::OutOfMemoryError, whose text begins with PyTorch's sentence and says what carve holds; the
// blocks that existed are intact and later requests are served; a zero-byte request is no error;
// the cache goes back before a refusal, never memory a stream's queued work may still use.
#include <carve_torch.h>

#include <c10/util/Exception.h>
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace test_carve_torch_oom {

constexpr std::size_t MiB = std::size_t{1} << 20;

cudaStream_t stream(std::uintptr_t handle) { return reinterpret_cast<cudaStream_t>(handle); }

std::string refusal_of(std::size_t bytes, cudaStream_t on) {
  try {
    void* p = carve_torch_malloc_or_raise(static_cast<ssize_t>(bytes), 0, on);
    carve_torch_free(p, static_cast<ssize_t>(bytes), 0, on);
  } catch (const c10::OutOfMemoryError& e) {
    return e.msg();
  }
  return "";
}

// What a refused request throws when it is not out of memory: c10::Error's text, or
// "out of memory" when it was c10::OutOfMemoryError after all (or "" when it was served).
std::string error_of(std::size_t bytes, int device) {
  try {
    void* p = carve_torch_malloc_or_raise(static_cast<ssize_t>(bytes), device, stream(1));
    carve_torch_free(p, static_cast<ssize_t>(bytes), device, stream(1));
  } catch (const c10::OutOfMemoryError&) {
    return "out of memory";
  } catch (const c10::Error& e) {
    return e.msg();
  }
  return "";
}

TEST_CASE("a request carve cannot serve throws c10::OutOfMemoryError, saying what carve holds") {
  REQUIRE(carve_torch_config_error() == nullptr);
  void* kept = carve_torch_malloc_or_raise(16 * MiB, 0, stream(1));
  REQUIRE(kept != nullptr);
  std::memset(kept, 7, 16 * MiB);

  const std::string why = refusal_of(256 * MiB, stream(1));
  CAPTURE(why);
  CHECK(why.rfind("CUDA out of memory. Tried to allocate 256.00 MiB. GPU 0: carve's ", 0) == 0);
  CHECK(why.find("16.00 MiB of it in 1 live blocks") != std::string::npos);
  CHECK(why.find("under its cap of 64.00 MiB (max_reserved)") != std::string::npos);
  CHECK(why.find("gave back") != std::string::npos);
  CHECK(why.find(" out of memory.") != std::string::npos); // what batch-size finders look for
  CHECK(std::string(carve_torch_last_refusal()) == why);

  // What existed is intact; what fits is served.
  const auto* bytes = static_cast<const unsigned char*>(kept);
  CHECK((bytes[0] == 7 && bytes[16 * MiB - 1] == 7));
  void* later = carve_torch_malloc_or_raise(32 * MiB, 0, stream(1));
  REQUIRE(later != nullptr);
  carve_torch_free(later, 32 * MiB, 0, stream(1));
  carve_torch_free(kept, 16 * MiB, 0, stream(1));
}

TEST_CASE("a broken device's refusal is c10::Error with the device's error, never out-of-memory") {
  // A request the pool refuses (on a broken GPU every request is; the host twin's memory is fine).
  struct Broken { // healthy again at the end of the case, however it ends
    Broken() { carve_torch_host_device_fault("CUDA error: an illegal memory access was encountered"); }
    ~Broken() { carve_torch_host_device_fault(nullptr); }
    Broken(const Broken&) = delete;
    Broken& operator=(const Broken&) = delete;
  };
  std::string why;
  {
    const Broken broken;
    why = error_of(256 * MiB, 0);
  }
  CAPTURE(why);
  CHECK(why.rfind("CUDA error: an illegal memory access was encountered. libcarve_torch could not serve 256.00 MiB "
                  "on GPU 0",
                  0) == 0);
  CHECK(why.find("out of memory") == std::string::npos);      // batch-size finders must not retry
  void* now = carve_torch_malloc_or_raise(MiB, 0, stream(1)); // healthy again: served
  CHECK(now != nullptr);
  carve_torch_free(now, MiB, 0, stream(1));
}

TEST_CASE("a device carve has no pool for refuses with c10::Error, never out-of-memory") {
  const std::string why = error_of(MiB, -1);
  CAPTURE(why);
  CHECK(why.rfind("libcarve_torch: no device -1 (asked for 1.00 MiB)", 0) == 0);
}

TEST_CASE("a zero-byte request is no error") {
  CHECK(carve_torch_malloc_or_raise(0, 0, stream(1)) == nullptr);
  CHECK(carve_torch_malloc_or_raise(-1, 0, stream(1)) == nullptr);
}

TEST_CASE("a batch-size search that halves on out-of-memory ends, served, under the cap") {
  std::size_t batch = 1024 * MiB;
  int refusals = 0;
  for (;;) {
    try {
      void* p = carve_torch_malloc_or_raise(static_cast<ssize_t>(batch), 0, stream(2));
      std::memset(p, 1, batch);
      carve_torch_free(p, static_cast<ssize_t>(batch), 0, stream(2));
      break;
    } catch (const c10::OutOfMemoryError&) {
      ++refusals;
      batch /= 2;
      REQUIRE(batch >= MiB);
    }
  }
  CHECK(batch <= 64 * MiB); // the cap, or half of it where the pool needs room beside the block
  CHECK(batch >= 32 * MiB);
  CHECK(refusals >= 4);
}

TEST_CASE("the cache goes back before a refusal, never memory a stream's queued work may use") {
  carve_torch_empty_cache();
  void* cached = carve_torch_malloc_or_raise(40 * MiB, 0, stream(3));
  carve_torch_free(cached, 40 * MiB, 0, stream(3));
  void* big = carve_torch_malloc_or_raise(48 * MiB, 0, stream(3)); // fits only once the 40 go back
  REQUIRE(big != nullptr);

  carve_torch_host_stream_enqueue(stream(3)); // a kernel still uses `big`
  carve_torch_free(big, 48 * MiB, 0, stream(3));
  const std::string why = refusal_of(40 * MiB, stream(4));
  CHECK(why.rfind("CUDA out of memory. Tried to allocate 40.00 MiB.", 0) == 0);
  carve_torch_host_stream_complete(stream(3));
  void* now = carve_torch_malloc_or_raise(40 * MiB, 0, stream(4));
  CHECK(now != nullptr);
  carve_torch_free(now, 40 * MiB, 0, stream(4));
}

} // namespace test_carve_torch_oom
