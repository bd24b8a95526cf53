/// @file carve/vmm/cuda_memory_mapper.hpp
/// The VMM protocol on CUDA devices: cuMemCreate, POSIX-descriptor export and import, cuMemMap and
/// cuMemSetAccess per device.
///
/// @code
/// carve::CudaMemoryMapper gpus;
/// auto g = *gpus.granularity(0);
/// auto h = *gpus.create(0, 4 * g);
/// auto placed = *carve::place_physical(gpus, h, 4 * g, 0, carve::Access::read_write);
/// gpus.set_access(placed.base, placed.bytes, 1, carve::Access::read);   // a peer may read it
/// @endcode
///
/// No link to libcuda: the driver's entry points are obtained through the runtime
/// (cudaGetDriverEntryPointByVersion, asking for the CUDA 12.0 ABI of each; cudaGetDriverEntryPoint
/// with runtimes before 12.5), as CCCL does, so a
/// program that uses carve starts on a machine without a driver and every call then fails with
/// Errc::unsupported. The table is loaded once per process, on first use, after the runtime has
/// initialised the driver (cudaFree(nullptr)). Errors carry the driver's error name
/// ("cuMemCreate: CUDA_ERROR_OUT_OF_MEMORY") and map to carve::Errc as
/// carve/vmm/physical_memory_mapper.hpp describes: CUDA_ERROR_OUT_OF_MEMORY is no_space,
/// CUDA_ERROR_INVALID_DEVICE out_of_range, CUDA_ERROR_NOT_SUPPORTED unsupported,
/// CUDA_ERROR_INVALID_VALUE invalid_argument (the driver does not tell a bad size from a bad
/// address; create checks sizes itself and says invalid_size), CUDA_ERROR_NOT_MAPPED not_allocated,
/// anything else device_error.
///
/// Physical allocations are pinned device memory (CU_MEM_ALLOCATION_TYPE_PINNED) that may be
/// exported as a POSIX file descriptor; the granularity is the driver's recommended one (2 MiB on
/// current GPUs). Calls naming a device make it current for their duration and put the caller's
/// back. Copies are interchangeable (they carry only their options); thread-safe as the driver is.
///
/// Across nodes: with CudaMapperOptions::fabric, allocations can also be exported as fabric
/// handles (export_fabric / import_fabric, CU_MEM_HANDLE_TYPE_FABRIC), 64 bytes that a process on
/// another node of the same multi-node NVLink domain imports and maps like any physical
/// allocation. The exchange of rights between the nodes is the driver's IMEX service; carve only
/// carries the bytes (SegmentExport, ExportKind::cuda_fabric). Compiles here; never run (no GPU,
/// no NVLink domain).
///
/// Needs the CUDA headers: declared only where both `<cuda.h>` and `<cuda_runtime_api.h>` are on
/// the include path (link CUDA::cudart or cudart_static, never CUDA::cuda_driver), so
/// `<carve/carve.hpp>` compiles with a plain host compiler. It runs on a GPU in
/// tests/vmm/test_vmm_cuda.cpp, and the same protocol on the host twin in the host tests.
#pragma once

#if __has_include(<cuda.h>) && __has_include(<cuda_runtime_api.h>)
#include <carve/core/error.hpp>
#include <carve/mr/cuda_current_device.hpp>
#include <carve/mr/device_uuid.hpp>
#include <carve/mr/segment_export.hpp>
#include <carve/vmm/detail/partial_map_probe.hpp>
#include <carve/vmm/physical_memory_mapper.hpp>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <fcntl.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>

namespace carve {

namespace detail {

// The driver's VMM entry points, found through the runtime.
struct CudaVmmDriver {
  decltype(&::cuGetErrorName) get_error_name = nullptr;
  decltype(&::cuMemGetAllocationGranularity) granularity = nullptr;
  decltype(&::cuMemCreate) create = nullptr;
  decltype(&::cuMemRelease) release = nullptr;
  decltype(&::cuMemExportToShareableHandle) export_handle = nullptr;
  decltype(&::cuMemImportFromShareableHandle) import_handle = nullptr;
  decltype(&::cuMemAddressReserve) reserve = nullptr;
  decltype(&::cuMemAddressFree) free_reservation = nullptr;
  decltype(&::cuMemMap) map = nullptr;
  decltype(&::cuMemUnmap) unmap = nullptr;
  decltype(&::cuMemSetAccess) set_access = nullptr;
  decltype(&::cuMemGetAccess) get_access = nullptr;
  std::string missing; // why the table is unusable; empty when every entry point was found

  static constexpr unsigned abi_version = 12000; // every call here has had this ABI since CUDA 12.0

  template <class F>
  void find(F& fn, const char* symbol) {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
    const cudaError_t e = cudaGetDriverEntryPointByVersion(symbol, &p, abi_version, cudaEnableDefault, &status);
#else // before 12.5 the runtime has only the unversioned query (deprecated since)
    const cudaError_t e = cudaGetDriverEntryPoint(symbol, &p, cudaEnableDefault, &status);
#endif
    if (e != cudaSuccess || status != cudaDriverEntryPointSuccess || p == nullptr) {
      cudaGetLastError();
      if (missing.empty()) {
        missing = std::string("no usable CUDA driver: cannot find ") + symbol + " (" +
                  (e != cudaSuccess ? cudaGetErrorName(e) : "not in this driver, or it is older than 12.0") + ")";
      }
      return;
    }
    fn = reinterpret_cast<F>(p);
  }

  CudaVmmDriver() {
    if (cudaFree(nullptr) != cudaSuccess) { // initialises the runtime and with it the driver
      cudaGetLastError();
    }
    find(get_error_name, "cuGetErrorName");
    find(granularity, "cuMemGetAllocationGranularity");
    find(create, "cuMemCreate");
    find(release, "cuMemRelease");
    find(export_handle, "cuMemExportToShareableHandle");
    find(import_handle, "cuMemImportFromShareableHandle");
    find(reserve, "cuMemAddressReserve");
    find(free_reservation, "cuMemAddressFree");
    find(map, "cuMemMap");
    find(unmap, "cuMemUnmap");
    find(set_access, "cuMemSetAccess");
    find(get_access, "cuMemGetAccess");
  }

  static const CudaVmmDriver& get() {
    static const CudaVmmDriver driver; // thread-safe initialisation, once per process
    return driver;
  }
};

} // namespace detail

/// Whether this build's CUDA headers know fabric handles (CU_MEM_HANDLE_TYPE_FABRIC, CUDA 12.3+).
#if CUDA_VERSION >= 12030
inline constexpr bool cuda_fabric_handles = true;
#else
inline constexpr bool cuda_fabric_handles = false;
#endif

/// A CUDA fabric handle's bytes (CUmemFabricHandle): what crosses nodes inside a message.
using CudaFabricHandle = std::array<std::uint8_t, 64>;

/// How a CudaMemoryMapper creates memory.
struct CudaMapperOptions {
  /// Also exportable as a fabric handle (CU_MEM_HANDLE_TYPE_FABRIC), which a process on another
  /// node of the same NVLink domain imports; needs the driver's IMEX service running on the nodes
  /// (else cuMemCreate refuses: unsupported or invalid_argument) and a build whose headers have
  /// fabric handles (cuda_fabric_handles).
  bool fabric = false;
};

/// The VMM protocol over the CUDA driver (see the file's description): a PhysicalMemoryMapper.
class CudaMemoryMapper {
public:
  /// A mapper whose allocations export as POSIX descriptors only.
  CudaMemoryMapper() = default;
  /// A mapper with `options` (fabric handles as well).
  explicit CudaMemoryMapper(CudaMapperOptions options) noexcept : options_(options) {}

  /// The driver's CUmemGenericAllocationHandle.
  using physical_handle = CUmemGenericAllocationHandle;
  /// Segments of a VmmCard over this mapper leave the process as cuda_vmm.
  static constexpr ExportKind export_kind = ExportKind::cuda_vmm;

  /// `device`'s UUID, which names it in other processes too (cuda_device_uuid's errors).
  [[nodiscard]] Result<DeviceUuid> device_uuid(int device) const { return cuda_device_uuid(device); }

  /// The recommended granularity of exportable pinned memory on `device` (out_of_range for an
  /// unknown device).
  [[nodiscard]] Result<std::size_t> granularity(int device) const {
    const auto& d = driver();
    if (!d.missing.empty()) {
      return fail(Errc::unsupported, d.missing);
    }
    const CUmemAllocationProp prop = properties(device);
    std::size_t g = 0;
    if (auto ok =
            check(d, "cuMemGetAllocationGranularity", d.granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
        !ok) {
      return cuda::std::unexpected(ok.error());
    }
    return g;
  }

  /// cuMemCreate of `bytes` (a multiple of granularity(device)) on `device`, exportable as a POSIX
  /// descriptor.
  [[nodiscard]] Result<physical_handle> create(int device, std::size_t bytes) {
    const detail::CudaCurrentDevice current(device); // before driver() binds any context
    const auto g = granularity(device);
    if (!g) {
      return cuda::std::unexpected(g.error());
    }
    if (bytes == 0 || bytes % *g != 0) {
      return fail(Errc::invalid_size, "cuMemCreate: " + std::to_string(bytes) +
                                          " bytes is not a non-zero multiple of the granularity " + std::to_string(*g));
    }
    const auto& d = driver();
    const CUmemAllocationProp prop = properties(device);
    physical_handle h{};
    if (auto ok = check(d, "cuMemCreate", d.create(&h, bytes, &prop, 0)); !ok) {
      return cuda::std::unexpected(ok.error());
    }
    return h;
  }

  /// cuMemExportToShareableHandle as a POSIX descriptor (made close-on-exec), owned by the caller.
  [[nodiscard]] Result<int> export_fd(physical_handle h) {
    const auto& d = driver();
    if (!d.missing.empty()) {
      return fail(Errc::unsupported, d.missing);
    }
    int fd = -1;
    if (auto ok = check(d, "cuMemExportToShareableHandle",
                        d.export_handle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
        !ok) {
      return cuda::std::unexpected(ok.error());
    }
    ::fcntl(fd, F_SETFD, FD_CLOEXEC);
    return fd;
  }

  /// cuMemExportToShareableHandle as a fabric handle, for a process on this or another node of the
  /// NVLink domain. Errors: unsupported without fabric handles in this build, or for memory not
  /// created with CudaMapperOptions::fabric (the driver's message says which).
  [[nodiscard]] Result<CudaFabricHandle> export_fabric(physical_handle h) {
#if CUDA_VERSION >= 12030
    const auto& d = driver();
    if (!d.missing.empty()) {
      return fail(Errc::unsupported, d.missing);
    }
    CUmemFabricHandle fabric{};
    if (auto ok =
            check(d, "cuMemExportToShareableHandle(FABRIC)", d.export_handle(&fabric, h, CU_MEM_HANDLE_TYPE_FABRIC, 0));
        !ok) {
      return cuda::std::unexpected(ok.error());
    }
    CudaFabricHandle out{};
    static_assert(sizeof fabric.data == std::tuple_size_v<CudaFabricHandle>);
    std::memcpy(out.data(), fabric.data, out.size());
    return out;
#else
    (void)h;
    return fail(Errc::unsupported, "cuMemExportToShareableHandle: this CUDA has no fabric handles (before 12.3)");
#endif
  }

  /// cuMemImportFromShareableHandle of a fabric handle exported here or on another node (through
  /// the IMEX service). Errors: unsupported without fabric handles; the driver's otherwise.
  [[nodiscard]] Result<physical_handle> import_fabric(const CudaFabricHandle& handle) {
#if CUDA_VERSION >= 12030
    const auto& d = driver();
    if (!d.missing.empty()) {
      return fail(Errc::unsupported, d.missing);
    }
    CUmemFabricHandle fabric{};
    std::memcpy(fabric.data, handle.data(), handle.size());
    physical_handle h{};
    if (auto ok =
            check(d, "cuMemImportFromShareableHandle(FABRIC)", d.import_handle(&h, &fabric, CU_MEM_HANDLE_TYPE_FABRIC));
        !ok) {
      return cuda::std::unexpected(ok.error());
    }
    return h;
#else
    (void)handle;
    return fail(Errc::unsupported, "cuMemImportFromShareableHandle: this CUDA has no fabric handles (before 12.3)");
#endif
  }

  /// cuMemImportFromShareableHandle of a descriptor another process exported; `fd` stays the
  /// caller's.
  [[nodiscard]] Result<physical_handle> import_fd(int fd) {
    const auto& d = driver();
    if (!d.missing.empty()) {
      return fail(Errc::unsupported, d.missing);
    }
    physical_handle h{};
    void* os_handle = reinterpret_cast<void*>(static_cast<std::uintptr_t>(fd)); // the descriptor, by value
    if (auto ok = check(d, "cuMemImportFromShareableHandle",
                        d.import_handle(&h, os_handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
        !ok) {
      return cuda::std::unexpected(ok.error());
    }
    return h;
  }

  /// cuMemRelease: the memory lives on while mapped.
  [[nodiscard]] Result<void> release(physical_handle h) {
    const auto& d = driver();
    return d.missing.empty() ? check(d, "cuMemRelease", d.release(h)) : fail(Errc::unsupported, d.missing);
  }

  /// cuMemAddressReserve of `bytes` aligned to `alignment` (0: the driver's choice).
  [[nodiscard]] Result<void*> reserve(std::size_t bytes, std::size_t alignment) {
    const auto& d = driver();
    if (!d.missing.empty()) {
      return fail(Errc::unsupported, d.missing);
    }
    CUdeviceptr va = 0;
    if (auto ok = check(d, "cuMemAddressReserve", d.reserve(&va, bytes, alignment, 0, 0)); !ok) {
      return cuda::std::unexpected(ok.error());
    }
    return reinterpret_cast<void*>(static_cast<std::uintptr_t>(va));
  }

  /// cuMemAddressFree of a whole reservation.
  [[nodiscard]] Result<void> free_reservation(void* va, std::size_t bytes) {
    const auto& d = driver();
    return d.missing.empty() ? check(d, "cuMemAddressFree", d.free_reservation(pointer(va), bytes))
                             : fail(Errc::unsupported, d.missing);
  }

  /// cuMemMap of `bytes` of the allocation, from `offset`, at `va`. Part of an allocation (an
  /// ExpandablePool lending a hole) only where maps_partial_allocations says the driver takes it.
  [[nodiscard]] Result<void> map(void* va, std::size_t bytes, physical_handle h, std::size_t offset = 0) {
    const auto& d = driver();
    return d.missing.empty() ? check(d, "cuMemMap", d.map(pointer(va), bytes, offset, h, 0))
                             : fail(Errc::unsupported, d.missing);
  }

  /// Whether cuMemMap places part of an allocation on `device` (TellsPartialMaps): the answer of
  /// partial_map_answer(device). Errors: as there.
  [[nodiscard]] Result<bool> maps_partial_allocations(int device) {
    return partial_map_answer(device).transform([](const detail::PartialMapAnswer& a) { return a.maps; });
  }

  /// What the driver says about mapping part of an allocation on `device`, asked once per device
  /// (the first 64), kind of memory (fabric or not) and process, the way ExpandablePool lends a
  /// hole (detail::probe_partial_maps: about twenty calls, and a check through the parts of what
  /// was written through the whole; CUDA documents that cuMemMap's offset "currently must be
  /// zero"). For a no, `why` names the call the driver refused, or what the part showed. Errors
  /// (nothing kept, asked again next time): the driver's where the question could not be put.
  /// Compiled here and checked over host mappers; no card has answered it yet
  /// (test_expandable_pool_cuda asks it on a GPU).
  [[nodiscard]] Result<detail::PartialMapAnswer> partial_map_answer(int device) {
    static std::mutex asking;
    static std::array<std::array<std::optional<detail::PartialMapAnswer>, 64>, 2> known;
    const bool kept = device >= 0 && device < static_cast<int>(known[0].size());
    const std::lock_guard lock(asking);
    auto& answer = known[options_.fabric ? 1 : 0][kept ? static_cast<std::size_t>(device) : 0];
    if (kept && answer) {
      return *answer;
    }
    const detail::CudaCurrentDevice current(device); // the runtime's fills and reads run on the device's context
    const auto runtime = [](const char* call, cudaError_t e) -> Result<void> {
      if (e == cudaSuccess) {
        return Result<void>();
      }
      cudaGetLastError(); // not sticky: later calls need not see it
      return fail(Errc::device_error, std::string(call) + ": " + cudaGetErrorName(e));
    };
    auto asked = detail::probe_partial_maps(
        *this, device,
        [&](void* va, std::uint8_t byte, std::size_t bytes) {
          return runtime("cudaMemset", cudaMemset(va, byte, bytes)).and_then([&] {
            return runtime("cudaDeviceSynchronize", cudaDeviceSynchronize());
          });
        },
        [&](const void* va, std::uint8_t* out, std::size_t bytes) {
          return runtime("cudaMemcpy", cudaMemcpy(out, va, bytes, cudaMemcpyDeviceToHost));
        });
    if (asked && kept) {
      answer = *asked;
    }
    return asked;
  }

  /// cuMemUnmap of whole mappings.
  [[nodiscard]] Result<void> unmap(void* va, std::size_t bytes) {
    const auto& d = driver();
    return d.missing.empty() ? check(d, "cuMemUnmap", d.unmap(pointer(va), bytes)) : fail(Errc::unsupported, d.missing);
  }

  /// cuMemSetAccess for one device.
  [[nodiscard]] Result<void> set_access(void* va, std::size_t bytes, int device, Access access) {
    const auto& d = driver();
    if (!d.missing.empty()) {
      return fail(Errc::unsupported, d.missing);
    }
    CUmemAccessDesc desc{};
    desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc.location.id = device;
    desc.flags = access == Access::read_write ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE
                 : access == Access::read     ? CU_MEM_ACCESS_FLAGS_PROT_READ
                                              : CU_MEM_ACCESS_FLAGS_PROT_NONE;
    return check(d, "cuMemSetAccess", d.set_access(pointer(va), bytes, &desc, 1));
  }

  /// cuMemGetAccess for one device.
  [[nodiscard]] Result<Access> access(void* va, int device) const {
    const auto& d = driver();
    if (!d.missing.empty()) {
      return fail(Errc::unsupported, d.missing);
    }
    CUmemLocation location{};
    location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    location.id = device;
    unsigned long long flags = 0;
    if (auto ok = check(d, "cuMemGetAccess", d.get_access(&flags, &location, pointer(va))); !ok) {
      return cuda::std::unexpected(ok.error());
    }
    return flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? Access::read_write
           : flags == CU_MEM_ACCESS_FLAGS_PROT_READ    ? Access::read
                                                       : Access::none;
  }

  /// Whether the driver's entry points were found (false on a machine without a driver).
  static bool driver_available() { return driver().missing.empty(); }

private:
  // The table, after making sure this thread has a context current: the driver's calls act on the
  // calling thread's context, and a thread that has made no runtime call has none, nor one whose
  // context a CudaCurrentDevice scope gave back as none. cudaFree(nullptr) binds the runtime's.
  static const detail::CudaVmmDriver& driver() {
    const detail::CudaVmmDriver& d = detail::CudaVmmDriver::get();
    const detail::CudaContextCalls& calls = detail::CudaContextCalls::instance();
    detail::CudaContextCalls::Context current = nullptr;
    if ((!calls.usable() || calls.get(&current) != 0 || current == nullptr) && cudaFree(nullptr) != cudaSuccess) {
      cudaGetLastError();
    }
    return d;
  }

  static CUdeviceptr pointer(void* va) noexcept {
    return static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(va));
  }

  CUmemAllocationProp properties(int device) const noexcept {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
#if CUDA_VERSION >= 12030
    if (options_.fabric) {
      prop.requestedHandleTypes =
          static_cast<CUmemAllocationHandleType>(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR | CU_MEM_HANDLE_TYPE_FABRIC);
    }
#endif
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    return prop;
  }

  [[nodiscard]] static Result<void> check(const detail::CudaVmmDriver& d, const char* call, CUresult r) {
    if (r == CUDA_SUCCESS) {
      return {};
    }
    const char* name = nullptr;
    if (d.get_error_name == nullptr || d.get_error_name(r, &name) != CUDA_SUCCESS || name == nullptr) {
      name = "an unknown CUDA error";
    }
    Errc code = Errc::device_error;
    switch (r) {
    case CUDA_ERROR_OUT_OF_MEMORY:
      code = Errc::no_space;
      break;
    case CUDA_ERROR_INVALID_DEVICE:
      code = Errc::out_of_range;
      break;
    case CUDA_ERROR_NOT_SUPPORTED:
      code = Errc::unsupported;
      break;
    case CUDA_ERROR_INVALID_VALUE:
      code = Errc::invalid_argument;
      break;
    case CUDA_ERROR_NOT_MAPPED:
      code = Errc::not_allocated;
      break;
    default:
      break;
    }
    return fail(code, std::string(call) + ": " + name + " (" + std::to_string(static_cast<int>(r)) + ")");
  }

  CudaMapperOptions options_{};
};

static_assert(PhysicalMemoryMapper<CudaMemoryMapper> && TellsPartialMaps<CudaMemoryMapper>);

} // namespace carve
#endif
