// What carve's device tests share: error checks, copies to and from the device, and the rule
// that a test without a GPU reports itself skipped (exit code 77, ctest's SKIP_RETURN_CODE).
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

namespace carve::test {

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

template <class T>
T* to_device(const std::vector<T>& v) {
  T* p = nullptr;
  check(cudaMalloc(&p, v.size() * sizeof(T)), "cudaMalloc");
  check(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), "copy to device");
  return p;
}

template <class T>
std::vector<T> to_host(const T* p, std::size_t n) {
  std::vector<T> v(n);
  check(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), "copy to host");
  return v;
}

// Checks that do not stop the test: each failure is printed and counted; main returns
// `failures == 0 ? 0 : 1`.
inline int failures = 0;
inline void expect(bool ok, const char* what) {
  if (!ok) {
    std::printf("FAILED: %s\n", what);
    ++failures;
  }
}

// Whether compute-sanitizer runs this test (dev.sh gpu sets CARVE_COMPUTE_SANITIZER to the tool's
// name): a test that hammers shared memory then runs fewer rounds, since racecheck instruments
// every access and the full run would not end within the sanitizer stage's time.
inline bool under_compute_sanitizer() {
  const char* tool = std::getenv("CARVE_COMPUTE_SANITIZER");
  return tool != nullptr && *tool != '\0';
}

// Exits with 77 after saying so when there is no usable GPU.
inline void skip_without_device() {
  int devices = 0;
  // A machine without a GPU answers cudaErrorNoDevice or, without a driver, another error; one
  // with a driver too old for this toolkit answers the same way, so the reason is printed.
  if (const cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess || devices == 0) {
    std::printf("SKIP: no CUDA device (%s); the device code was compiled but not run\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    std::exit(77);
  }
}

} // namespace carve::test
