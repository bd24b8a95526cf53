// What carve's GPU benchmarks share: the "no CUDA device" rule (a clear message and exit code
// 77, ctest's skip code), CUDA error checks, medians and percentiles, and the one line per
// target that `bash cmake/dev.sh gpu` turns into its CSV:
//
//   <name>: <number> <unit> (target <op> <value> <unit>, source: <where it comes from>) met|MISSED
//
// A target whose checks failed (an overlap, a request popped twice, bytes that differ) is
// MISSED whatever its number: a fast wrong answer does not count. A target that was not measured
// (a time budget ran out) is MISSED with "skipped" for its number.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace carve::bench {

// Exits with 77 after saying so when the CUDA runtime sees no device.
inline int require_devices(const char* program) {
  int devices = 0;
  // Without a GPU, or with a driver too old for this toolkit, the count fails: the reason is printed.
  if (const cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess || devices == 0) {
    std::printf("%s: no CUDA device here (%s); nothing measured\n", program,
                e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    std::exit(77);
  }
  return devices;
}

inline void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// The p-th fraction (0.5: median) of `v`, reordering it; 0 for no values.
inline double percentile(std::vector<double> v, double p) {
  if (v.empty()) {
    return 0.0;
  }
  const auto k = static_cast<std::size_t>(p * static_cast<double>(v.size() - 1));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

// Whether a smaller or a larger number is better.
enum class Aim { at_most, at_least };

// Prints one target line and returns whether it was met. `checked`: the run's results were
// correct (a run whose checks failed misses every target it was measured for).
inline bool target(const std::string& name, double value, const char* unit, Aim aim, double goal, const char* source,
                   bool checked = true) {
  const bool met = checked && (aim == Aim::at_most ? value <= goal : value >= goal);
  if (!checked) {
    std::printf("(the next line's run failed its checks: MISSED whatever its number)\n");
  }
  std::printf("%s: %.4g %s (target %s %.4g %s, source: %s) %s\n", name.c_str(), value, unit,
              aim == Aim::at_most ? "<=" : ">=", goal, unit, source, met ? "met" : "MISSED");
  return met;
}

// Prints the line of a target that was not measured (`why`: a time budget ran out, say), MISSED
// with "skipped" for its number, so that the report still lists it.
inline void not_measured(const std::string& name, const char* unit, Aim aim, double goal, const char* source,
                         const char* why) {
  std::printf("(the next line was not measured: %s)\n", why);
  std::printf("%s: skipped %s (target %s %.4g %s, source: %s) MISSED\n", name.c_str(), unit,
              aim == Aim::at_most ? "<=" : ">=", goal, unit, source);
}

// Prints a number that has no target (context for the ones that do).
inline void figure(const std::string& name, double value, const char* unit) {
  std::printf("  %s: %.4g %s\n", name.c_str(), value, unit);
}

// Counts failed checks and says which.
// The checks that failed in this process, every part's together: a program that ran them exits
// non-zero, so a part that stopped before printing its targets still reads FAILED in a report.
inline int& failed_checks() {
  static int failed = 0;
  return failed;
}

struct Checks {
  int failed = 0;
  bool expect(bool ok, const std::string& what) {
    if (!ok) {
      std::printf("FAILED: %s\n", what.c_str());
      ++failed;
      ++failed_checks();
    }
    return ok;
  }
  bool ok() const { return failed == 0; }
};

#ifdef __CUDACC__ // what only device code needs
// The card's clock in nanoseconds (%globaltimer): for deadlines inside kernels.
__device__ inline std::uint64_t device_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Keeps the card busy for `ns` nanoseconds, spinning on %globaltimer (static: a kernel cannot be
// inline, and each benchmark is one .cu).
static __global__ void hold_card(std::uint64_t ns) {
  const std::uint64_t until = device_ns() + ns;
  while (device_ns() < until) {
  }
}

// Kernel time in microseconds between two CUDA events on the default stream, which the timed
// launches use. Create it after cudaSetDevice: events belong to the current device.
//
// The start event is recorded behind a short spin (hold_card), so that it and the timed launch
// wait in the queue together: on an idle card the start event would be stamped at once, and the
// interval would include the host's launch latency (microseconds, as long as a 100k-allocation
// kernel takes).
class KernelTimer {
public:
  KernelTimer() {
    cuda_check(cudaEventCreate(&start_), "event");
    cuda_check(cudaEventCreate(&stop_), "event");
  }
  ~KernelTimer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  KernelTimer(const KernelTimer&) = delete;
  KernelTimer& operator=(const KernelTimer&) = delete;

  // Runs `launch` (kernel launches on the default stream) and waits for it; `what` names it in
  // an error.
  template <class Launch>
  double us(Launch&& launch, const char* what = "kernel") {
    hold_card<<<1, 1>>>(hold_ns);
    cuda_check(cudaEventRecord(start_), "event");
    launch();
    cuda_check(cudaGetLastError(), "launch");
    cuda_check(cudaEventRecord(stop_), "event");
    cuda_check(cudaEventSynchronize(stop_), what);
    float ms = 0;
    cuda_check(cudaEventElapsedTime(&ms, start_, stop_), "elapsed");
    return static_cast<double>(ms) * 1000.0;
  }

private:
  // Far longer than recording an event and launching a kernel takes the host.
  static constexpr std::uint64_t hold_ns = 100'000;
  cudaEvent_t start_{};
  cudaEvent_t stop_{};
};
#endif

} // namespace carve::bench
