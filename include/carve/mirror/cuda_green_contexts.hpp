/// @file carve/mirror/cuda_green_contexts.hpp
/// Compute grants that really partition a GPU's SMs: `CudaGreenContexts`, an SmPartitioner that
/// backs each grant with a CUDA green context holding exactly the granted SMs, and a stream in it.
///
/// @code
/// carve::CudaMirrorBackend gpus;
/// carve::PagedMirror mirror(gpus, {}, carve::FillPlacement{}, carve::CudaGreenContexts{});
/// (void)mirror.submit({.bytes = 64 << 20, .priority = 9, .compute_units = 16});
/// for (const carve::ResourceGrant& g : mirror.dispatch()) {
///   mirror.run(g, [&](cudaStream_t s) { kernel<<<grid, block, 0, s>>>(...); });  // on g.compute.units only
/// }                                                // each grant's SMs and memory return once its kernel has run
/// @endcode
///
/// How: when built, each device is split once (cuDeviceGetDevResource, then
/// cuDevSmResourceSplitByCount into groups of the driver's minimum partition size rounded to its
/// co-scheduling alignment: 2 SMs on compute capability 6.x/7.x, 4 on 8.x, 8 on 9.0+). A grant is
/// a run of those groups: cuDevResourceGenerateDesc takes several SM resources provided they come
/// from the same split call, which they do, so one descriptor holds the whole run; cuGreenCtxCreate
/// makes the context and cuGreenCtxStreamCreate its (non-blocking) stream. Splitting once is what
/// keeps grants disjoint: a split per grant would hand out overlapping groups. SMs left in the
/// split's remainder (132 SMs in groups of 8 leave 4) are never granted; the ledger counts only
/// the groups.
///
/// Where green contexts are missing (a driver before 12.5, which lacks cuGreenCtxStreamCreate; a
/// GPU before compute capability 6.0; a split that fails) the device is advisory: grants there
/// get a plain non-blocking stream on the device, `enforced` is false, and advisory_reason(d)
/// says why. Even enforced, the driver documents limits: green contexts with disjoint SMs may
/// still wait on each other (shared hardware queues), under MPS with an active-thread percentage
/// work may spread over the client's SMs, and on 9.x with dynamic parallelism two extra SMs may be
/// shared. On an H200 the grants of tests/mirror/test_cuda_mirror.cu were enforced.
///
/// Needs the CUDA runtime and cuda.h: declared only where both `<cuda.h>` and
/// `<cuda_runtime_api.h>` are on the include path. It does not link libcuda: the driver's green
/// context calls are looked up at construction through the runtime
/// (cudaGetDriverEntryPointByVersion), so a program that never builds one starts without a
/// driver. Construction throws carve::Exception (device_error) when there is no CUDA device or an
/// ordinal is unknown. Not synchronised itself (PriorityDispatcher calls it under its owner's
/// lock); no green context is ever made current, so the caller's current context is untouched.
#pragma once

#include <carve/core/error.hpp>
#if __has_include(<cuda.h>) && __has_include(<cuda_runtime_api.h>)
#include <carve/mirror/sm_partitioner.hpp>
#include <carve/mr/cuda_current_device.hpp>
#include <carve/slot/storage/slot_range.hpp>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <bit>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace carve {

/// Green contexts over the CUDA devices, one device per dispatcher index (see the file's
/// description). Movable; the partitions it creates belong to the dispatcher.
class CudaGreenContexts {
public:
  /// A stream inside the grant's green context (on advisory devices, a plain stream).
  using stream_type = cudaStream_t;
  /// A green context and its stream.
  struct partition_type {
    cudaStream_t stream = nullptr; ///< where the grant's work goes
    CUgreenCtx context = nullptr;  ///< null on an advisory device
  };

  /// The CUDA devices behind dispatcher indices 0, 1, ...: `ordinals` in that order, or every
  /// device when empty (as CudaMirrorBackend numbers them). Splits each device once. Throws
  /// carve::Exception (device_error) when there is no CUDA device or an ordinal is unknown.
  explicit CudaGreenContexts(std::vector<int> ordinals = {}) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
      cudaGetLastError();
      throw Exception(Errc::device_error, "carve::CudaGreenContexts: no CUDA device");
    }
    if (ordinals.empty()) {
      for (int d = 0; d < count; ++d) {
        ordinals.push_back(d);
      }
    }
    const bool driver = load_driver();
    for (const int ordinal : ordinals) {
      if (ordinal < 0 || ordinal >= count) {
        throw Exception(Errc::device_error, "carve::CudaGreenContexts: no CUDA device " + std::to_string(ordinal));
      }
      devices_.push_back(split(ordinal, driver));
    }
  }

  /// Device `device`'s split, at most `units` SMs of it: whole groups when enforced, single SMs
  /// when advisory. An index past the ordinals gets no groups.
  SmLayout layout(std::uint32_t device, std::uint32_t units) const {
    if (device >= devices_.size()) {
      return {1, 0, false};
    }
    const Device& d = devices_[device];
    if (!d.enforced()) {
      return {1, units < d.sm_count ? units : d.sm_count, false};
    }
    const auto groups = static_cast<std::uint32_t>(d.groups.size());
    return {d.granule, units / d.granule < groups ? units / d.granule : groups, true};
  }

  /// A green context holding `groups` of `device`'s split and a stream in it (a plain stream on an
  /// advisory device). Errors: out_of_range for groups past the split or an unknown device;
  /// device_error when the driver refuses (its CUresult in the message).
  [[nodiscard]] Result<partition_type> create(std::uint32_t device, SlotRange groups) {
    if (device >= devices_.size() || groups.count == 0) {
      return fail(Errc::out_of_range, "carve::CudaGreenContexts: no device " + std::to_string(device));
    }
    Device& d = devices_[device];
    if (!d.enforced()) {
      const detail::CudaCurrentDevice current(d.ordinal);
      cudaStream_t s = nullptr;
      if (!current.ok() || cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
        cudaGetLastError();
        return fail(Errc::device_error, "carve::CudaGreenContexts: no stream on device " + std::to_string(d.ordinal));
      }
      return partition_type{s, nullptr};
    }
    if (groups.end() > d.groups.size()) {
      return fail(Errc::out_of_range,
                  "carve::CudaGreenContexts: SM groups past device " + std::to_string(d.ordinal) + "'s split");
    }
    CUdevResourceDesc desc = nullptr;
    if (const CUresult r = driver_.generate_desc(&desc, &d.groups[groups.first], groups.count); r != CUDA_SUCCESS) {
      return refused("cuDevResourceGenerateDesc", r, d.ordinal);
    }
    CUgreenCtx context = nullptr;
    if (const CUresult r = driver_.green_ctx_create(&context, desc, d.device, CU_GREEN_CTX_DEFAULT_STREAM);
        r != CUDA_SUCCESS) {
      return refused("cuGreenCtxCreate", r, d.ordinal);
    }
    CUstream s = nullptr;
    if (const CUresult r = driver_.green_ctx_stream_create(&s, context, CU_STREAM_NON_BLOCKING, 0); r != CUDA_SUCCESS) {
      (void)driver_.green_ctx_destroy(context);
      return refused("cuGreenCtxStreamCreate", r, d.ordinal);
    }
    return partition_type{s, context};
  }

  /// The partition's stream.
  cudaStream_t stream(const partition_type& p) const noexcept { return p.stream; }
  /// Whether everything queued on the partition's stream has run (cudaStreamQuery, never waits;
  /// an error counts as not yet, so SMs are never handed on on the strength of a failed query).
  bool idle(const partition_type& p) const noexcept {
    const cudaError_t q = cudaStreamQuery(p.stream);
    if (q != cudaSuccess) {
      cudaGetLastError();
    }
    return q == cudaSuccess;
  }
  /// Waits for the partition's work, then destroys its stream and green context.
  void destroy(const partition_type& p) noexcept {
    if (cudaStreamSynchronize(p.stream) != cudaSuccess) {
      cudaGetLastError();
    }
    if (p.context == nullptr) {
      if (cudaStreamDestroy(p.stream) != cudaSuccess) {
        cudaGetLastError();
      }
      return;
    }
    (void)driver_.stream_destroy(p.stream); // before the context: it does not destroy its streams
    (void)driver_.green_ctx_destroy(p.context);
  }

  /// Whether grants on `device` get a green context.
  bool enforced(std::uint32_t device) const noexcept { return device < devices_.size() && devices_[device].enforced(); }
  /// Why `device` is advisory; empty when it is enforced. Throws carve::Exception (out_of_range)
  /// for an unknown device.
  const std::string& advisory_reason(std::uint32_t device) const {
    if (device >= devices_.size()) {
      throw Exception(Errc::out_of_range, "carve::CudaGreenContexts: no device " + std::to_string(device));
    }
    return devices_[device].advisory_reason;
  }

private:
  struct Driver {
    decltype(&::cuDeviceGet) device_get = nullptr;
    decltype(&::cuDeviceGetDevResource) get_dev_resource = nullptr;
    decltype(&::cuDevSmResourceSplitByCount) split_by_count = nullptr;
    decltype(&::cuDevResourceGenerateDesc) generate_desc = nullptr;
    decltype(&::cuGreenCtxCreate) green_ctx_create = nullptr;
    decltype(&::cuGreenCtxDestroy) green_ctx_destroy = nullptr;
    decltype(&::cuGreenCtxStreamCreate) green_ctx_stream_create = nullptr;
    decltype(&::cuStreamDestroy) stream_destroy = nullptr;
  };
  struct Device {
    int ordinal = 0;
    CUdevice device = 0;
    std::uint32_t sm_count = 0;
    std::uint32_t granule = 1;
    std::vector<CUdevResource> groups{}; // one split of the whole device: every group disjoint
    std::string advisory_reason{};
    bool enforced() const noexcept { return advisory_reason.empty(); }
  };

  // The driver entry points as of CUDA 12.5, the first driver with cuGreenCtxStreamCreate; an
  // older driver refuses that version and the devices are advisory.
  template <class F>
  static bool entry(const char* symbol, F& fn) noexcept {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
    const cudaError_t e = cudaGetDriverEntryPointByVersion(symbol, &p, 12050, cudaEnableDefault, &status);
#else
    const cudaError_t e = cudaGetDriverEntryPoint(symbol, &p, cudaEnableDefault, &status);
#endif
    if (e != cudaSuccess || status != cudaDriverEntryPointSuccess || p == nullptr) {
      cudaGetLastError();
      return false;
    }
    fn = std::bit_cast<F>(p);
    return true;
  }
  bool load_driver() noexcept {
    Driver d;
    const bool ok =
        entry("cuDeviceGet", d.device_get) && entry("cuDeviceGetDevResource", d.get_dev_resource) &&
        entry("cuDevSmResourceSplitByCount", d.split_by_count) && entry("cuDevResourceGenerateDesc", d.generate_desc) &&
        entry("cuGreenCtxCreate", d.green_ctx_create) && entry("cuGreenCtxDestroy", d.green_ctx_destroy) &&
        entry("cuGreenCtxStreamCreate", d.green_ctx_stream_create) && entry("cuStreamDestroy", d.stream_destroy);
    if (ok) {
      driver_ = d;
    }
    return ok;
  }

  static Device advisory(Device d, std::string why) {
    d.groups.clear();
    d.granule = 1;
    d.advisory_reason = std::move(why);
    return d;
  }
  static cuda::std::unexpected<Error> refused(const char* call, CUresult r, int ordinal) {
    return fail(Errc::device_error, std::string("carve::CudaGreenContexts: ") + call + " failed on device " +
                                        std::to_string(ordinal) + " (CUresult " + std::to_string(static_cast<int>(r)) +
                                        ")");
  }

  Device split(int ordinal, bool driver) const {
    Device d;
    d.ordinal = ordinal;
    int sms = 0;
    int major = 0;
    {
      // The primary context must be active before green contexts are made from it.
      const detail::CudaCurrentDevice current(ordinal);
      if (!current.ok() || cudaFree(nullptr) != cudaSuccess ||
          cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ordinal) != cudaSuccess ||
          cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ordinal) != cudaSuccess) {
        cudaGetLastError();
        throw Exception(Errc::device_error, "carve::CudaGreenContexts: cannot query device " + std::to_string(ordinal));
      }
    }
    d.sm_count = static_cast<std::uint32_t>(sms);
    if (!driver) {
      return advisory(std::move(d), "the CUDA driver has no green contexts (12.5 or later needed)");
    }
    if (major < 6) {
      return advisory(std::move(d), "green contexts need compute capability 6.0 or later");
    }
    CUdevResource all{};
    if (driver_.device_get(&d.device, ordinal) != CUDA_SUCCESS ||
        driver_.get_dev_resource(d.device, &all, CU_DEV_RESOURCE_TYPE_SM) != CUDA_SUCCESS) {
      return advisory(std::move(d), "cuDeviceGetDevResource failed");
    }
    const unsigned align = all.sm.smCoscheduledAlignment != 0 ? all.sm.smCoscheduledAlignment : 1;
    const unsigned min_count = (all.sm.minSmPartitionSize + align - 1) / align * align;
    unsigned groups = 0;
    if (min_count == 0 || driver_.split_by_count(nullptr, &groups, &all, nullptr, 0, min_count) != CUDA_SUCCESS ||
        groups == 0) {
      return advisory(std::move(d), "cuDevSmResourceSplitByCount found no group");
    }
    d.groups.resize(groups);
    CUdevResource remainder{};
    if (driver_.split_by_count(d.groups.data(), &groups, &all, &remainder, 0, min_count) != CUDA_SUCCESS ||
        groups == 0) {
      return advisory(std::move(d), "cuDevSmResourceSplitByCount failed");
    }
    d.groups.resize(groups);
    // The split promises symmetrical groups; the ledger counts on it, so check.
    d.granule = d.groups.front().sm.smCount;
    for (const CUdevResource& g : d.groups) {
      if (g.sm.smCount != d.granule || g.sm.smCount == 0) {
        return advisory(std::move(d), "cuDevSmResourceSplitByCount gave groups of different sizes");
      }
    }
    return d;
  }

  Driver driver_{};
  std::vector<Device> devices_;
};

static_assert(SmPartitioner<CudaGreenContexts>);

} // namespace carve
#endif
