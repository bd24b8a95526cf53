"""carve's pools as CuPy's GPU allocator.

    import carve_gpu.cupy
    carve_gpu.cupy.use()
    x = cupy.zeros(1 << 20)      # served by carve
"""

import threading

from . import library as _library

# cudaStreamPerThread: CuPy's per-thread default stream (cupy.cuda.Stream.ptds, or every thread's
# current stream under CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1).
_PER_THREAD_STREAM = 2


def _stream_of(ptr):
    """The stream handle carve is given for CuPy's current stream `ptr`. carve keeps a freed block
    for its stream (the one it was allocated on), and hands it to that stream's next request at once; the
    per-thread default stream is one handle for a different stream in every thread, so a block
    freed by one thread would go to another's stream while the first's kernels may still use it:
    refused, with what to use instead."""
    if ptr == _PER_THREAD_STREAM:
        raise RuntimeError("carve_gpu.cupy: CuPy's per-thread default stream (cupy.cuda.Stream.ptds, "
                           "CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1) names another stream in every thread, so carve "
                           "cannot tell which stream may reuse a freed block; use cupy.cuda.Stream() streams, or "
                           "unset CUPY_CUDA_PER_THREAD_DEFAULT_STREAM")
    return ptr


def _refusal(cupy, lib, size, device):
    """The error for a request carve refused: CuPy's own cupy.cuda.memory.OutOfMemoryError (what
    CuPy's pool raises, so code that catches it keeps working), carrying carve's reason as its
    message; a RuntimeError with carve's reason when that is no shortage of memory (a device that
    fails every call since a kernel faulted, a graph capture carve cannot serve)."""
    why = lib.last_refusal()
    if why and not why.startswith("CUDA out of memory"):
        return RuntimeError(why)
    stats = lib.stats(device)
    limit = stats.get("max_reserved_bytes") or 0
    error = cupy.cuda.memory.OutOfMemoryError(size, stats.get("reserved_bytes", 0), limit)
    error.args = (why or f"carve: out of memory allocating {size} bytes on device {device}",)
    return error


def use(pool="expandable", *, library=None, max_reserved=None, idle_threshold=None):
    """Makes carve's `pool` CuPy's allocator (cupy.cuda.set_allocator) for every device. Blocks are
    allocated and freed on the stream current at the allocation (CuPy names none to free())."""
    _library.settings_for(pool, None, max_reserved, idle_threshold)
    try:
        import cupy  # the framework, not this module: absolute import
    except ImportError as e:
        raise ImportError("carve_gpu.cupy needs CuPy (import cupy failed: " + str(e) + ")") from e
    lib = _library.load(library, pool=pool, max_reserved=max_reserved, idle_threshold=idle_threshold)
    blocks = {}  # address -> (size, stream): what free() must pass back
    lock = threading.Lock()

    def malloc(size, device):
        stream = _stream_of(cupy.cuda.get_current_stream().ptr)
        ptr = lib.malloc(size, device, stream)
        if not ptr:
            raise _refusal(cupy, lib, size, device)
        with lock:
            blocks[ptr] = (size, stream)
        return ptr

    def free(ptr, device):
        with lock:
            size, stream = blocks.pop(ptr)
        lib.free(ptr, size, device, stream)

    allocator = cupy.cuda.PythonFunctionAllocator(malloc, free)
    cupy.cuda.set_allocator(allocator.malloc)
    return allocator


def memory_stats(device=0, *, library=None):
    """carve's figures for `device` as a dict (see carve_gpu.torch.memory_stats)."""
    return _library.loaded(library).stats(device)
