/// @file carve/sim/kernel_mix.hpp
/// Kernel-structured workloads: kernel types (every workgroup of a launch asks for the same
/// slots, and its run time scatters around the kernel's mean), the mixes of them a workload
/// draws launches from, and the built-in mixes.
#pragma once

#include <carve/sim/distribution.hpp>
#include <carve/sim/input_error.hpp>
#include <carve/sim/random.hpp>
#include <carve/sim/text_words.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace carve::sim {

/// A kernel type of a KernelMix: every workgroup of one launch asks for the same slots, and its
/// run time scatters around the kernel's mean.
///
/// Text form (words in any order after the name; DIST in the colon form, e.g. uniform:64:256):
/// @code{.unparsed}
/// NAME size=SLOTS launch=DIST mean=CYCLES spread=CV weight=W
/// @endcode
struct KernelType {
  std::string name = "kernel";                   ///< shown in reports
  std::uint32_t size = 1;                        ///< slots per workgroup
  Distribution launch = Distribution::fixed(64); ///< workgroups per launch
  double mean = 100;                             ///< mean run time in cycles
  double spread = 0.1;                           ///< coefficient of variation of the run time (log-normal)
  double weight = 1;                             ///< relative share of the launches

  /// Parses the text form; bad text throws input_error naming `where` and `line`.
  static KernelType parse(std::string_view text, const std::string& where, std::size_t line = 0);
  /// The text form parse reads back.
  std::string to_string() const;
  /// A run time drawn with `rng`: log-normal with this mean and spread, rounded, at least 1.
  std::uint32_t draw_run_time(Rng& rng) const {
    if (spread <= 0.0) {
      return static_cast<std::uint32_t>(std::clamp(std::round(mean), 1.0, 4.0e9));
    }
    const double s2 = std::log1p(spread * spread);
    const double t = std::exp(std::log(mean) - s2 / 2 + std::sqrt(s2) * rng.normal());
    return static_cast<std::uint32_t>(std::clamp(std::round(t), 1.0, 4.0e9));
  }
  /// Equal when every field is.
  friend bool operator==(const KernelType&, const KernelType&) = default;
};

/// Kernel-structured workloads: launches of kernel types issued round-robin from `streams`
/// streams. Each launch picks its kernel type at random by weight. With `stream_waits` a stream's
/// next launch arrives only when its previous launch's last workgroup finished (as on a CUDA
/// stream), else launches arrive as WorkloadSpec::arrivals says (per launch).
struct KernelMix {
  std::string name;                ///< a built-in mix's name, empty for one given kernel by kernel
  std::vector<KernelType> kernels; ///< empty: not kernel-structured
  std::uint32_t streams = 8;       ///< streams launches are issued from
  bool stream_waits = true;        ///< a stream's launch waits for its previous one

  /// Whether there are kernels at all.
  bool empty() const { return kernels.empty(); }
  /// Equal when every field is.
  friend bool operator==(const KernelMix&, const KernelMix&) = default;
};

/// The names of the built-in mixes: "inference", "long-tail", "training".
inline const std::vector<std::string>& builtin_mix_names() {
  static const std::vector<std::string> names = {"inference", "long-tail", "training"};
  return names;
}

/// A built-in mix for compute units of 128 slots of 0.5 KiB (64 KiB); throws input_error naming
/// `where` for an unknown name.
///
/// Workgroups per launch are the share of a launch's grid that lands on this compute unit (a
/// grid of a few hundred workgroups over ~100 compute units gives a few each).
///
/// - **inference**: one transformer decoder layer at inference (prefill): GEMMs (QKV, MLP and
///   smaller projections; fp16 tiles in pipelined stages of 12, 24 and 32 KiB = 24, 48 and 64
///   slots), attention (a FlashAttention-style forward tile, 40 KiB = 80 slots, its run time
///   spread by sequence length), RMSNorm and softmax-style reductions (1-4 KiB) and element-wise
///   kernels (a scratch slot). Shared-memory sizes follow common tile configurations; run times
///   are relative (cycles of this simulator), not measured on hardware.
/// - **long-tail**: many short kernels of 4..20 slots and two rare kernels of 28 and 40 slots
///   that run 20-40 times longer (a few long kernels among many short ones).
/// - **training**: forward, backward and weight-gradient GEMMs, the attention backward pass
///   (48 KiB, long, widely spread), normalisation backward, optimizer and element-wise kernels.
KernelMix builtin_mix(std::string_view name, const std::string& where, std::size_t line = 0);

inline KernelType KernelType::parse(std::string_view text, const std::string& where, std::size_t line) {
  const std::string form = "'NAME size=SLOTS launch=DIST mean=CYCLES spread=CV weight=W'";
  const std::vector<std::string_view> words = detail::split_words(text, " \t");
  if (words.empty() || words[0].find('=') != std::string_view::npos) {
    throw input_error(where, line, "'" + std::string(text) + "': expected " + form);
  }
  KernelType k;
  k.name = std::string(words[0]);
  bool has_size = false;
  bool has_mean = false;
  for (std::size_t i = 1; i < words.size(); ++i) {
    const std::size_t eq = words[i].find('=');
    const std::string_view key = words[i].substr(0, eq);
    const std::string_view value = eq == std::string_view::npos ? std::string_view{} : words[i].substr(eq + 1);
    if (key == "size") {
      k.size = detail::parse_count(value, "size", where, line);
      if (k.size == 0) {
        throw input_error(where, line, "kernel " + k.name + ": size must be at least 1");
      }
      has_size = true;
    } else if (key == "launch") {
      k.launch = Distribution::parse(value, where, line);
    } else if (key == "mean") {
      k.mean = detail::parse_real(value, "mean", where, line);
      if (k.mean < 1) {
        throw input_error(where, line, "kernel " + k.name + ": mean must be at least 1 cycle");
      }
      has_mean = true;
    } else if (key == "spread") {
      k.spread = detail::parse_real(value, "spread", where, line);
      if (k.spread < 0 || k.spread > 10) {
        throw input_error(where, line, "kernel " + k.name + ": spread must lie in [0, 10]");
      }
    } else if (key == "weight") {
      k.weight = detail::parse_real(value, "weight", where, line);
      if (k.weight <= 0 || k.weight > 1e12) { // kernels' weights are summed: bounded, the sum stays finite
        throw input_error(where, line, "kernel " + k.name + ": weight must be positive and at most 1e12");
      }
    } else {
      throw input_error(where, line,
                        "kernel " + k.name + ": unknown word '" + std::string(words[i]) + "'; expected " + form);
    }
  }
  if (!has_size || !has_mean) {
    throw input_error(where, line, "kernel " + k.name + ": size= and mean= are required; expected " + form);
  }
  return k;
}

inline std::string KernelType::to_string() const {
  std::string dist = launch.to_string();
  std::replace(dist.begin(), dist.end(), ' ', ':');
  std::string out = name;
  out += " size=" + std::to_string(size);
  out += " launch=" + dist;
  out += " mean=" + detail::format_real(mean);
  out += " spread=" + detail::format_real(spread);
  out += " weight=" + detail::format_real(weight);
  return out;
}

inline KernelMix builtin_mix(std::string_view name, const std::string& where, std::size_t line) {
  KernelMix mix;
  mix.name = std::string(name);
  const auto k = [&mix](const char* text) { mix.kernels.push_back(KernelType::parse(text, "builtin_mix")); };
  if (name == "inference") {
    k("gemm-qkv size=48 launch=uniform:2:8 mean=400 spread=0.1 weight=2");
    k("gemm-mlp size=64 launch=uniform:2:8 mean=600 spread=0.1 weight=2");
    k("gemm-small size=24 launch=uniform:2:8 mean=250 spread=0.1 weight=1");
    k("attention size=80 launch=uniform:1:4 mean=900 spread=0.35 weight=1");
    k("rmsnorm size=2 launch=uniform:2:8 mean=60 spread=0.1 weight=2");
    k("softmax size=8 launch=uniform:2:8 mean=90 spread=0.2 weight=1");
    k("elementwise size=1 launch=uniform:4:16 mean=30 spread=0.1 weight=2");
  } else if (name == "long-tail") {
    k("short-a size=4 launch=uniform:2:8 mean=40 spread=0.2 weight=4");
    k("short-b size=12 launch=uniform:2:8 mean=60 spread=0.2 weight=4");
    k("short-c size=20 launch=uniform:2:8 mean=80 spread=0.3 weight=3");
    k("long-a size=28 launch=uniform:1:4 mean=1600 spread=0.2 weight=0.5");
    k("long-b size=40 launch=uniform:1:4 mean=2400 spread=0.3 weight=0.3");
  } else if (name == "training") {
    k("gemm-fwd size=48 launch=uniform:2:8 mean=400 spread=0.1 weight=3");
    k("gemm-bwd size=64 launch=uniform:2:8 mean=700 spread=0.15 weight=3");
    k("gemm-wgrad size=32 launch=uniform:2:8 mean=500 spread=0.15 weight=2");
    k("attention-bwd size=96 launch=uniform:1:4 mean=1500 spread=0.4 weight=1");
    k("layernorm-bwd size=6 launch=uniform:2:8 mean=90 spread=0.2 weight=2");
    k("optimizer size=2 launch=uniform:4:16 mean=50 spread=0.3 weight=1");
    k("elementwise size=1 launch=uniform:4:16 mean=30 spread=0.2 weight=2");
  } else {
    std::string list;
    for (const std::string& n : builtin_mix_names()) {
      list += (list.empty() ? "" : ", ") + n;
    }
    throw input_error(where, line, "unknown kernel mix '" + std::string(name) + "' (built in: " + list + ")");
  }
  return mix;
}

} // namespace carve::sim
