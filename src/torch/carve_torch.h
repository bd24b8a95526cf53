/* carve_torch.h — the C interface of libcarve_torch.so: carve's pools as PyTorch's (or CuPy's)
 * GPU allocator.
 *
 * PyTorch loads carve_torch_malloc and carve_torch_free through
 * torch.cuda.memory.CUDAPluggableAllocator(path, "carve_torch_malloc", "carve_torch_free");
 * python/carve_gpu does that for you. Each device gets one carve pool, built on its first use and
 * kept until the process ends, chosen by environment variables read once, at the first call:
 *
 *   CARVE_TORCH_POOL            expandable (default) | stream-ordered | caching
 *   CARVE_TORCH_MAX_RESERVED    the most device memory the pool may hold per device, in bytes, with
 *                               an optional K, M, G or T suffix (binary units: 8G is 8 GiB); default
 *                               no cap beyond the device's own memory
 *   CARVE_TORCH_IDLE_THRESHOLD  free memory a pool keeps before giving some back (same units);
 *                               default: keep it all until carve_torch_empty_cache()
 *   CARVE_TORCH_MAX_CHUNK       the expandable pool: the most one physical allocation holds (same
 *                               units; ExpandablePoolOptions::max_chunk_bytes), for a driver that
 *                               maps whole allocations only; default no limit
 *   CARVE_TORCH_HOLES_HOME      the expandable pool: 1 brings lent holes home
 *                               (ExpandablePoolOptions::bring_holes_home), for long runs; default 0
 *   CARVE_TORCH_LEND_MIN        the expandable pool: the least size of a block that borrows holes
 *                               past the headroom line (same units; lend_min_bytes); default 512M.
 *                               With CARVE_TORCH_HOLES_HOME=1, 64M holds long runs lowest
 *   CARVE_TORCH_BACKEND         cuda (default) | host: the host twin (see the test hooks below)
 *
 * Bad values end the process at the first call with a message saying which; call
 * carve_torch_config_error() first to check them without that. Every function is thread-safe.
 */
#ifndef CARVE_TORCH_H
#define CARVE_TORCH_H

#include <stddef.h>
#include <sys/types.h>

#if defined(__has_include)
#if __has_include(<cuda_runtime_api.h>)
#include <cuda_runtime_api.h>
#define CARVE_TORCH_STREAM_DECLARED 1
#endif
#endif
#ifndef CARVE_TORCH_STREAM_DECLARED
typedef struct CUstream_st* cudaStream_t;
#endif

/* The functions below are the library's only exported symbols. */
#if defined(__GNUC__)
#define CARVE_TORCH_API __attribute__((visibility("default")))
#else
#define CARVE_TORCH_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* A block of `size` bytes on `device` for work queued on `stream`, aligned to 512 bytes; NULL
 * when the device (or CARVE_TORCH_MAX_RESERVED) cannot hold it even after the pool gave back what
 * it caches (carve_torch_last_refusal says why). NULL for a size of 0 or below, which is not
 * counted as a failure. CuPy's hook calls this; PyTorch's calls carve_torch_malloc_or_raise. */
CARVE_TORCH_API void* carve_torch_malloc(ssize_t size, int device, cudaStream_t stream);

/* Why the calling thread's last carve_torch_malloc of a positive size returned NULL, or NULL when
 * none has. Out of memory: PyTorch's own first sentence ("CUDA out of memory. Tried to allocate
 * 3.00 GiB."), then what the pool holds (reserved, live, the cap) and that it gave back its cache
 * and tried again before refusing. Anything else begins otherwise: a device that fails every call
 * with "CUDA error: " and the device's error; a capture carve cannot serve, and a device with no
 * pool (none such, or its pool could not be built), with "libcarve_torch: ". The text stays valid
 * until the thread's next refused call. */
CARVE_TORCH_API const char* carve_torch_last_refusal(void);

/* carve_torch_malloc for PyTorch, from libcarve_torch_oom.so (built where PyTorch's c10 library
 * is found): the same block, but a refusal throws c10::OutOfMemoryError with
 * carve_torch_last_refusal()'s text, which PyTorch raises in Python as torch.OutOfMemoryError
 * (torch.cuda.OutOfMemoryError). PyTorch's CUDAPluggableAllocator does not check the pointer its
 * malloc returns, so a NULL from carve_torch_malloc would reach a kernel; carve_gpu.torch installs
 * this one. A size of 0 or below returns NULL and throws nothing. (Checked on the host backend
 * through PyTorch's own error translation with a CPU-only PyTorch; not yet under CUDA.) */
CARVE_TORCH_API void* carve_torch_malloc_or_raise(ssize_t size, int device, cudaStream_t stream);

/* Frees `ptr` (from carve_torch_malloc with this `size` and `device`) for work queued on `stream`
 * after the work that used it: reused on `stream` at once, on another stream only once `stream`
 * has run that work. NULL is ignored. A pointer this library did not hand out, or a wrong size,
 * ends the process with a message naming the pointer, as free() does. */
CARVE_TORCH_API void carve_torch_free(void* ptr, ssize_t size, int device, cudaStream_t stream);

/* Tensor.record_stream: `ptr`, a live block, is used by work on `stream` too (not the stream it was
 * allocated for). Its free then waits until the work queued on `stream` by the time of the free has
 * run (an event recorded at the free) before the block serves another request or goes back to the
 * device. PyTorch's set_record_stream_fn takes this; carve_gpu.torch installs it. Without it,
 * record_stream does nothing under a pluggable allocator, and such a block could be handed out
 * again while a kernel on `stream` still reads it. (Checked on the host backend.) */
CARVE_TORCH_API void carve_torch_record_stream(void* ptr, cudaStream_t stream);

/* Gives every device the memory its pool holds and no block uses (after the work queued so far
 * has run, as torch.cuda.empty_cache() does). */
CARVE_TORCH_API void carve_torch_empty_cache(void);

/* The figures of `device`'s pool as one JSON object: backend, pool, reserved_bytes,
 * peak_reserved_bytes, live_bytes, peak_live_bytes (live counts round each block to 512 bytes),
 * live_blocks, mallocs, frees, device_calls (physical memory created, mapped and unmapped, or
 * cudaMalloc/cudaFree calls), device_failures (such calls refused), failures (carve_torch_malloc
 * calls that returned NULL), lending_refused (true when the expandable pool's driver maps whole
 * allocations only, so it lends no holes: carve_replay predicts such a run with
 * expandable-pool:partial-maps=0, exactly where the driver said so before any lend; checked on the
 * host twin only, not yet on a card), max_reserved_bytes, idle_threshold_bytes and max_chunk_bytes
 * (null when unset), and, when the pool could not be built, error. The text belongs to the library and stays valid
 * until the calling thread calls this again; the caller frees nothing. */
CARVE_TORCH_API const char* carve_torch_stats_json(int device);

/* PyTorch's getBaseAllocation (set_base_alloc_fn): the start of the device allocation that holds
 * `ptr`, with its size in `*size`. Under the caching and stream-ordered pools that is the
 * cudaMalloc segment the block was cut from: sharing a CUDA tensor with another process
 * (torch.multiprocessing) exports that whole allocation (cudaIpcGetMemHandle) with the block's
 * offset in it (PyTorch 2.1 to 2.4), so without this hook PyTorch would send the segment's start
 * as the tensor's. Anywhere else (expandable memory, which cudaIpcGetMemHandle refuses), `ptr`
 * itself and a size of 0. From PyTorch 2.5 the allocator is asked for a shareable handle instead
 * (shareIpcHandle), which its pluggable allocator refuses with an error. */
CARVE_TORCH_API void* carve_torch_base_allocation(void* ptr, size_t* size);

/* What device `peer` may do with `device`'s memory at `ptr`: 2 read and write, 1 read, 0 nothing;
 * -1 where carve cannot say (no expandable mapping of `device` there: the caching and
 * stream-ordered pools hand out cudaMalloc memory, which the peer access PyTorch enables opens).
 * The expandable pool opens each device's memory to every other device this process allocates on
 * that can reach it directly (cudaDeviceCanAccessPeer), from the first allocation on the second
 * device, for memory mapped before and after: a copy between two GPUs, or a kernel on one that
 * reads the other's tensor, then finds it open. (Checked on the host backend; not yet on two
 * GPUs.) */
CARVE_TORCH_API int carve_torch_peer_access(const void* ptr, int device, int peer);

/* With `on`, every request first asks the driver whether its stream is capturing a CUDA graph, and
 * refuses one that is (carve_torch_last_refusal says why): for a PyTorch whose allocator cannot
 * forward the graph hooks below, where a capture would otherwise be served memory that the next
 * allocation could take from under the graph. carve_gpu.torch turns it on when it cannot install
 * the hooks. Off by default (a driver call per request). */
CARVE_TORCH_API void carve_torch_guard_captures(int on);

/* Starts both peaks (reserved and live) again from the bytes held now. */
CARVE_TORCH_API void carve_torch_reset_peak(int device);

/* NULL when the CARVE_TORCH_* variables are good (or a message saying what is wrong with them).
 * Reads them, as the first call of any function here does; later changes to them are not seen. */
CARVE_TORCH_API const char* carve_torch_config_error(void);

/* Test hooks of the host backend (CARVE_TORCH_BACKEND=host), where a stream is any handle the
 * caller picks and its work is what these say: enqueue queues one piece of work on `stream` (a
 * kernel that uses the blocks), complete runs all of it. A block freed on a stream with queued
 * work is reused on another stream only after complete(). They do nothing on the CUDA backend. */
CARVE_TORCH_API void carve_torch_host_stream_enqueue(cudaStream_t stream);
CARVE_TORCH_API void carve_torch_host_stream_complete(cudaStream_t stream);
/* Marks `stream` as capturing a CUDA graph (1), not (0), or in a capture an error invalidated and
 * nobody ended yet (2): what cudaStreamIsCapturing says on a GPU. */
CARVE_TORCH_API void carve_torch_host_stream_capturing(cudaStream_t stream, int capturing);
/* Makes every device of the host backend broken, as a GPU is after a kernel faulted (every CUDA
 * call then fails with `message`, e.g. "CUDA error: an illegal memory access was encountered");
 * NULL makes them healthy again. */
CARVE_TORCH_API void carve_torch_host_device_fault(const char* message);

#ifdef __cplusplus
}

#include <functional>
#include <utility>

/* CUDA graphs: the allocate-to-pool hooks of PyTorch's CUDAPluggableAllocator, C++ functions of
 * the types its setters take (set_begin_allocate_to_pool, set_end_allocate_to_pool_fn and
 * set_release_pool from PyTorch 2.2; PyTorch 2.1's stream forms). carve_gpu.torch installs them.
 * While PyTorch captures a graph, the blocks the capturing streams (those `filter` accepts)
 * allocate belong to the graph's private pool `pool` until release_pool: freed, they serve only
 * that pool; nothing goes back to the device and no event lands on a capturing stream meanwhile;
 * other frees wait for the end of the capture. A stream that captures while no pool is open for
 * it is refused: carve_torch_malloc returns NULL and carve_torch_last_refusal says why
 * (carve_torch_malloc_or_raise raises it as a RuntimeError). Names with C linkage, so that
 * ctypes finds them; the pool is PyTorch's MempoolId_t. (Checked on the host backend, with the
 * signatures taken from PyTorch's source; not yet under CUDA with a real PyTorch capture.) */
typedef std::pair<unsigned long long, unsigned long long> carve_torch_pool_id;
extern "C" {
CARVE_TORCH_API void carve_torch_begin_allocate_to_pool(int device, carve_torch_pool_id pool,
                                                        std::function<bool(cudaStream_t)> filter);
CARVE_TORCH_API void carve_torch_end_allocate_to_pool(int device, carve_torch_pool_id pool);
CARVE_TORCH_API void carve_torch_release_pool(int device, carve_torch_pool_id pool);
CARVE_TORCH_API void carve_torch_begin_allocate_stream_to_pool(int device, cudaStream_t stream,
                                                               carve_torch_pool_id pool);
CARVE_TORCH_API void carve_torch_end_allocate_stream_to_pool(int device, cudaStream_t stream);
}
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Captures that fail. PyTorch up to 2.11 tells the allocator that a capture ended only once the
 * driver ended it well, and releases a graph's pool only for a capture that ended: when
 * CUDAGraph.capture_begin or capture_end raises first (the driver invalidated the capture, say),
 * carve would count the capture under way for good (every other free waiting, nothing going back
 * to the device) and never release its pool. From PyTorch's PR 180395 on, the capture is ended
 * before the error is raised, and from PR 190348 on the graph's reset releases the pool.
 * carve_gpu.torch.use() wraps both methods and, after such an error, once the capture's stream is
 * in no capture: when PyTorch did not end the capture, carve ends it (carve_torch_end_failed_capture),
 * resets the graph while watching for the release of its pool (carve_torch_watch_release), and
 * releases the pool only when that reset did not, so that no version's pool is released twice.
 * (Checked on the host backend against each order; not yet under CUDA.)
 *
 * carve_torch_captures_begun: how many captures the calling thread has begun through
 * carve_torch_begin_allocate_to_pool (or its stream form), and, when any, the last one's device,
 * pool and number in its device's pool (any pointer may be NULL). */
CARVE_TORCH_API unsigned long long carve_torch_captures_begun(int* device, unsigned long long* pool_first,
                                                              unsigned long long* pool_second,
                                                              unsigned long long* number);
/* 1 when `stream` is in a capture the driver has not ended: under way, or invalidated by an error
 * (0 for NULL, which cannot capture). */
CARVE_TORCH_API int carve_torch_stream_in_capture(cudaStream_t stream);
/* Ends the capture numbered `number` on `device` (carve_torch_captures_begun) as
 * carve_torch_end_allocate_to_pool would, whatever other captures share its pool: 1 when it was
 * under way, 0 when it had ended. */
CARVE_TORCH_API int carve_torch_end_failed_capture(int device, unsigned long long number);
/* Watches, on the calling thread, for a release of pool {pool_first, pool_second} on `device`
 * (carve_torch_release_pool); carve_torch_watched_release says whether one came since, and stops
 * watching. */
CARVE_TORCH_API void carve_torch_watch_release(int device, unsigned long long pool_first,
                                               unsigned long long pool_second);
CARVE_TORCH_API int carve_torch_watched_release(void);
/* carve_torch_release_pool with the pool's id as two integers, for a failed capture's pool. */
CARVE_TORCH_API void carve_torch_release_failed_capture(int device, unsigned long long pool_first,
                                                        unsigned long long pool_second);

#ifdef __cplusplus
}
#endif

#endif /* CARVE_TORCH_H */
