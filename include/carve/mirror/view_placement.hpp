/// @file carve/mirror/view_placement.hpp
/// Pages for a device view, placed for the device that runs the kernel: its own memory first,
/// then its peers in the order of the bandwidth its loads get from them.
///
/// @code
/// carve::ViewPlacement placement(topology);                        // GpuRelay::never paths
/// carve::PagedMirror mirror(devices, {.page_size = 2 << 20, .device_view = true}, placement);
/// void* x = *mirror.try_allocate_placed(bytes, 1, {.near = 3});   // GPU3 runs the kernel
/// const carve::ViewReadEstimate e = mirror.placement().explain(3, *mirror.segments(x, bytes));
/// std::puts(e.text.c_str());  // "GPU3 reads 96.0 MiB: 64.0 MiB local, 32.0 MiB from GPU1 at 150.0 GB/s; ..."
/// @endcode
///
/// A kernel reading through a device view loads each page from where it lies: local memory, or a
/// peer's over the path its loads take. Loads are never relayed by another GPU, so each pair is
/// scored by the topology's path with GpuRelay::never (the rule BandwidthWeightedPicker scores
/// borrowed blocks by). The reading device is the request's `near` (MirrorHint::near), else
/// `home`. Its free pages are filled first, then each peer's in decreasing load bandwidth (ties to
/// the lower device); devices it cannot reach (no path, or `mappable` says no) get nothing, so the
/// view is valid on the reader. Filling the fastest source first minimises the time to read the
/// whole allocation once (each byte from a device costs 1 / bandwidth; capacities bound each
/// device), which is the figure explain() reports.
#pragma once

#include <carve/core/format_bytes.hpp>
#include <carve/mirror/device_segments.hpp>
#include <carve/mirror/placement.hpp>
#include <carve/topology/topology.hpp>

#include <cuda/std/expected>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace carve {

/// One device's share of what a reader reads, and the bandwidth its loads get from it.
struct ViewShare {
  std::uint32_t device = 0; ///< where the bytes lie
  std::size_t bytes = 0;    ///< how many
  double gbps = 0;          ///< the reader's load bandwidth from there; +infinity for local memory
};

/// What reading a whole range once costs the reader (ViewPlacement::explain).
struct ViewReadEstimate {
  std::uint32_t reader = 0;      ///< the device that reads
  std::vector<ViewShare> shares; ///< by device, in the placement's order of preference
  /// Bytes over the time to read them all, GB/s: local bytes at `local_gbps` (infinite by default,
  /// so only the links count); +infinity when every byte is local and local_gbps is.
  double expected_gbps = 0;
  std::string text; ///< the same, for people
};

/// A PagePlacement for device views (see the file's description).
class ViewPlacement {
public:
  static constexpr const char* name = "view"; ///< for reports

  /// For the GPUs of `topology` (device d is GPU d). `home`: the reader when a request names no
  /// `near`; `local_gbps`: a device's own memory bandwidth, for explain() (infinite: links only);
  /// `mappable(reader, owner)`: false for pairs that cannot map each other's memory.
  explicit ViewPlacement(const Topology& topology, std::uint32_t home = 0,
                         double local_gbps = std::numeric_limits<double>::infinity(),
                         std::function<bool(int, int)> mappable = {})
      : devices_(static_cast<std::uint32_t>(topology.gpu_count())), home_(home), local_gbps_(local_gbps) {
    const Topology loads = topology.with_options({topology.options().max_hops, GpuRelay::never});
    gbps_.resize(std::size_t{devices_} * devices_);
    for (std::uint32_t r = 0; r < devices_; ++r) {
      for (std::uint32_t o = 0; o < devices_; ++o) {
        const bool can = r == o || !mappable || mappable(static_cast<int>(r), static_cast<int>(o));
        gbps_[std::size_t{r} * devices_ + o] =
            r == o ? std::numeric_limits<double>::infinity()
                   : (can ? loads.path_bandwidth(loads.gpu(static_cast<int>(r)), loads.gpu(static_cast<int>(o))) : 0.0);
      }
    }
  }

  /// The plan: the reader's pages first, then its peers' by load bandwidth. Errors: out_of_range
  /// when the devices are not the topology's GPUs or the reader is not one; no_space when the
  /// devices the reader reaches have too few free pages.
  [[nodiscard]] cuda::std::expected<PlacementPlan, Errc> place(const PlacementRequest& r,
                                                               std::span<const DevicePageState> devices) const {
    const std::uint32_t reader = r.near.value_or(home_);
    if (devices.size() != devices_ || reader >= devices_) {
      return cuda::std::unexpected(Errc::out_of_range);
    }
    PlacementPlan plan;
    std::uint32_t left = r.pages;
    for (const std::uint32_t d : preference(reader)) {
      if (left == 0) {
        break;
      }
      const std::uint32_t take = devices[d].available ? std::min(left, devices[d].free_pages) : 0;
      if (take != 0) {
        detail::append(plan, d, take);
        left -= take;
      }
    }
    if (left != 0) {
      return cuda::std::unexpected(Errc::no_space);
    }
    return plan;
  }

  /// The devices `reader` reads from, best first: itself, then the peers it reaches by decreasing
  /// load bandwidth (ties to the lower device). Empty for an unknown reader.
  std::vector<std::uint32_t> preference(std::uint32_t reader) const {
    std::vector<std::uint32_t> out;
    if (reader >= devices_) {
      return out;
    }
    out.push_back(reader);
    for (std::uint32_t d = 0; d < devices_; ++d) {
      if (d != reader && load_gbps(reader, d) > 0.0) {
        out.push_back(d);
      }
    }
    std::stable_sort(out.begin() + 1, out.end(),
                     [&](std::uint32_t a, std::uint32_t b) { return load_gbps(reader, a) > load_gbps(reader, b); });
    return out;
  }

  /// GB/s of `reader`'s loads from `owner`'s memory: +infinity for its own, 0 where it cannot reach.
  double load_gbps(std::uint32_t reader, std::uint32_t owner) const noexcept {
    return reader < devices_ && owner < devices_ ? gbps_[std::size_t{reader} * devices_ + owner] : 0.0;
  }

  /// What reading `segments` (a range of mirror memory: PagedMirror::segments) once costs
  /// `reader`: bytes per device and the expected bandwidth of the whole range.
  ViewReadEstimate explain(std::uint32_t reader, std::span<const MirrorSegment> segments) const {
    ViewReadEstimate e;
    e.reader = reader;
    std::vector<std::size_t> bytes(devices_, 0);
    std::size_t total = 0;
    for (const MirrorSegment& s : segments) {
      if (s.device < devices_) {
        bytes[s.device] += s.bytes;
        total += s.bytes;
      }
    }
    double seconds_per_gb = 0; // sum of bytes / bandwidth, in GB / (GB/s)
    for (const std::uint32_t d : order_for_report(reader)) {
      if (bytes[d] == 0) {
        continue;
      }
      const double gbps = d == reader ? local_gbps_ : load_gbps(reader, d);
      e.shares.push_back({d, bytes[d], d == reader ? std::numeric_limits<double>::infinity() : gbps});
      seconds_per_gb +=
          gbps > 0.0 ? static_cast<double>(bytes[d]) / 1e9 / gbps : std::numeric_limits<double>::infinity();
    }
    e.expected_gbps = seconds_per_gb > 0.0 ? static_cast<double>(total) / 1e9 / seconds_per_gb
                                           : std::numeric_limits<double>::infinity();
    e.text = "GPU" + std::to_string(reader) + " reads " + format_bytes(total) + ":";
    for (const ViewShare& s : e.shares) {
      e.text += (&s == &e.shares.front() ? " " : ", ") + format_bytes(s.bytes) +
                (s.device == reader ? std::string(" local")
                                    : " from GPU" + std::to_string(s.device) + " at " + gbps_text(s.gbps));
    }
    e.text += "; expected " + gbps_text(e.expected_gbps) + " over the whole range" +
              (std::isinf(local_gbps_) ? " (links only: local memory not counted)" : "");
    return e;
  }

  /// The reader for requests without a `near` device.
  std::uint32_t home() const noexcept { return home_; }

private:
  // preference(), then any device the reader cannot reach (bytes there make the estimate 0).
  std::vector<std::uint32_t> order_for_report(std::uint32_t reader) const {
    std::vector<std::uint32_t> out = preference(reader);
    for (std::uint32_t d = 0; d < devices_; ++d) {
      if (std::find(out.begin(), out.end(), d) == out.end()) {
        out.push_back(d);
      }
    }
    return out;
  }
  static std::string gbps_text(double gbps) {
    if (std::isinf(gbps)) {
      return "unbounded";
    }
    char buffer[32];
    std::snprintf(buffer, sizeof buffer, "%.1f GB/s", gbps);
    return buffer;
  }

  std::uint32_t devices_;
  std::uint32_t home_;
  double local_gbps_;
  std::vector<double> gbps_; // [reader][owner]
};

static_assert(PagePlacement<ViewPlacement>);

} // namespace carve
