// A client built with the CUDA headers on its include path and CARVE_SERVICE_NO_CUDA defined:
// it links without the CUDA runtime (CMake links none here), and a segment of GPU memory is
// refused with the reason, whether the reply names its GPUs by UUID or not.
#define CARVE_SERVICE_NO_CUDA
#include <carve/service/segment_mapping.hpp>

#include <cstdio>

int main() {
  using namespace carve::service;
  Allocated a;
  a.kind = carve::ExportKind::cuda_vmm;
  a.segment_size = 1 << 21;
  a.device = 0;
  a.region.requester = 0;
  const auto by_number = map_segment(a, UniqueFd());
  a.device_uuid[0] = a.requester_uuid[0] = 1;
  const auto by_uuid = map_segment(a, UniqueFd());
  const bool ok = !by_number && by_number.error().code == carve::Errc::unsupported_version && !by_uuid &&
                  by_uuid.error().code == carve::Errc::unsupported_version;
  std::printf("%s\n%s\n%s\n", by_number ? "mapped" : by_number.error().message.c_str(),
              by_uuid ? "mapped" : by_uuid.error().message.c_str(), ok ? "passed" : "FAILED");
  return ok ? 0 : 1;
}
