/// @file carve/mirror/device_info.hpp
/// What a mirror backend says about each of its devices.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace carve {

/// One device behind a mirror, as its backend describes it.
struct DeviceInfo {
  std::string name{};              ///< for reports: "GPU0 (NVIDIA H100)", "card 2"
  std::size_t capacity = 0;        ///< bytes the mirror may use on this device
  std::uint32_t compute_units = 0; ///< SMs (or CUs) the dispatcher may hand out; 0 for none
  /// false: known but not usable (prohibited, failed); the mirror gives it no pages and no work.
  bool available = true;
};

} // namespace carve
