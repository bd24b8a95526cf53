/// @file carve/slot/policy/run_time_predictor.hpp
/// Run times learned online per kernel type: the hint a release-aligned placement needs, without an oracle.
///
/// ReleaseAlignedFit wants to know when a workgroup will be released. A scheduler does not know a
/// workgroup's run time, but every workgroup of one kernel does similar work, so the run times of
/// the kernel's workgroups that already finished predict the next one's. RunTimePredictor keeps,
/// for each of `Kernels` kernel types, one small running estimate, updated from each completion
/// and from nothing else:
/// - RunTimeEstimate::mean: an exponentially weighted mean (the newest run time weighs `weight`;
///   the first 1/weight completions are averaged evenly, so early estimates are not pulled to 0);
/// - RunTimeEstimate::quantile: a running `quantile` of the run times (stochastic approximation:
///   each completion above the estimate raises it by `quantile` steps, each one below lowers it by
///   1 - `quantile` steps, a step being `weight` times twice the running mean absolute deviation).
///
/// Memory is fixed: three 32-bit words per kernel type, no allocation, usable in a kernel
/// (`__host__ __device__`). Kernel ids at or above `Kernels` share the entry of their remainder. One
/// owner updates it (a dispatcher, one thread of a scheduling block); it is not synchronised.
///
/// @code
/// carve::RunTimePredictor<64> runs;                       // the exponentially weighted mean
/// runs.observe(kernel, finished_at - dispatched_at);      // at each completion
/// if (const auto t = runs.predict(kernel)) {
///   slots.allocate(m, carve::ExpectedRelease{now + *t});  // hinted placement
/// }
/// @endcode
#pragma once

#include <carve/core/config.hpp>
#include <carve/core/errc.hpp>
#include <carve/core/error.hpp>

#include <nv/target>

#include <cuda/std/cstdint>
#include <cuda/std/expected>
#include <cuda/std/optional>

namespace carve {

/// Which running summary of a kernel's run times a RunTimePredictor keeps.
enum class RunTimeEstimate : std::uint8_t {
  mean,    ///< exponentially weighted mean
  quantile ///< running quantile (stochastic approximation)
};

/// How a RunTimePredictor learns.
struct RunTimePredictorSettings {
  RunTimeEstimate estimate = RunTimeEstimate::mean; ///< the summary kept
  float weight = 0.125f;                            ///< weight of the newest completion, in (0, 1]
  float quantile = 0.5f;                            ///< for RunTimeEstimate::quantile, in (0, 1)
};

/// Per kernel type, a running estimate of its workgroups' run time, learned from completions.
template <std::uint32_t Kernels>
class RunTimePredictor {
  static_assert(Kernels >= 1, "RunTimePredictor needs room for at least one kernel type");

public:
  /// Kernel types with an entry of their own.
  static constexpr std::uint32_t kernels = Kernels;

  /// Nothing observed; learns as `settings` say. Settings outside their domain (weight not in
  /// (0, 1], quantile not in (0, 1), an unknown estimate; NaN included) throw carve::Exception
  /// (invalid_argument) on the host. Device code cannot throw: there status() reports
  /// invalid_argument, observe() learns nothing and predict() has nothing to say.
  CARVE_HOST_DEVICE constexpr explicit RunTimePredictor(RunTimePredictorSettings settings = {}) : settings_(settings) {
    if (!valid(settings)) {
      NV_IF_TARGET(NV_IS_HOST,
                   (throw Exception(Errc::invalid_argument, "carve::RunTimePredictor: weight must lie in (0, 1] and "
                                                            "quantile in (0, 1), with a known estimate");));
    }
  }

  /// invalid_argument for a predictor built from bad settings in device code (on the host such a
  /// predictor is never built: the constructor throws); success otherwise.
  [[nodiscard]] CARVE_HOST_DEVICE constexpr cuda::std::expected<void, Errc> status() const noexcept {
    if (!valid(settings_)) {
      return cuda::std::unexpected(Errc::invalid_argument);
    }
    return {};
  }

  /// The settings it learns with.
  CARVE_HOST_DEVICE constexpr RunTimePredictorSettings settings() const noexcept { return settings_; }

  /// A workgroup of `kernel` finished after `run_time` ticks.
  CARVE_HOST_DEVICE constexpr void observe(std::uint32_t kernel, std::uint32_t run_time) noexcept {
    if (!valid(settings_)) { // kept rather than a status word: the size stays three words per kernel
      return;
    }
    Entry& e = entries_[kernel % Kernels];
    const auto x = static_cast<float>(run_time);
    if (e.count != 0xffff'ffffu) {
      ++e.count;
    }
    if (e.count == 1) {
      e.estimate = x;
      e.scale = 0.0f;
      return;
    }
    // Even averaging until 1/weight completions are in, then the fixed weight.
    const float inverse = 1.0f / static_cast<float>(e.count);
    const float a = inverse > settings_.weight ? inverse : settings_.weight;
    const float deviation = x > e.estimate ? x - e.estimate : e.estimate - x;
    if (settings_.estimate == RunTimeEstimate::mean) {
      e.estimate += a * (x - e.estimate);
      e.scale += a * (deviation - e.scale);
      return;
    }
    e.scale += a * (deviation - e.scale);
    const float step = 2.0f * a * e.scale;
    if (x > e.estimate) {
      e.estimate += settings_.quantile * step;
    } else if (x < e.estimate) {
      e.estimate -= (1.0f - settings_.quantile) * step;
    }
    if (e.estimate < 1.0f) {
      e.estimate = 1.0f;
    }
  }

  /// The predicted run time of a workgroup of `kernel` (rounded, at least 1); nullopt before
  /// any of its workgroups finished.
  CARVE_HOST_DEVICE constexpr cuda::std::optional<std::uint32_t> predict(std::uint32_t kernel) const noexcept {
    const Entry& e = entries_[kernel % Kernels];
    if (e.count == 0) {
      return cuda::std::nullopt;
    }
    const float rounded = e.estimate + 0.5f;
    if (rounded >= 4294967040.0f) { // the largest float below 2^32
      return 0xffff'ffffu;
    }
    const auto t = static_cast<std::uint32_t>(rounded);
    return t < 1u ? 1u : t;
  }

  /// The raw estimate for `kernel` (0 before any completion).
  CARVE_HOST_DEVICE constexpr float estimate(std::uint32_t kernel) const noexcept {
    return entries_[kernel % Kernels].estimate;
  }

  /// Completions observed for `kernel`'s entry (saturates at 2^32 - 1).
  CARVE_HOST_DEVICE constexpr std::uint32_t observed(std::uint32_t kernel) const noexcept {
    return entries_[kernel % Kernels].count;
  }

private:
  struct Entry {
    float estimate = 0.0f; // the mean or the quantile
    float scale = 0.0f;    // running mean absolute deviation from the estimate
    std::uint32_t count = 0;
  };

  /// Whether `s` lies in the documented domain; written so that NaN fails each comparison.
  CARVE_HOST_DEVICE static constexpr bool valid(const RunTimePredictorSettings& s) noexcept {
    return s.weight > 0.0f && s.weight <= 1.0f && s.quantile > 0.0f && s.quantile < 1.0f &&
           (s.estimate == RunTimeEstimate::mean || s.estimate == RunTimeEstimate::quantile);
  }

  RunTimePredictorSettings settings_;
  Entry entries_[Kernels]{};
};

} // namespace carve
