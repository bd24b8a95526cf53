"""carve's pools as PyTorch's CUDA allocator.

    import carve_gpu.torch
    carve_gpu.torch.use()            # first thing, before any CUDA tensor
    model = build_model().cuda()     # every CUDA allocation now goes through carve

or, for one region of code while PyTorch's own allocator serves the rest:

    pool = carve_gpu.torch.mem_pool()
    with torch.cuda.use_mem_pool(pool):
        buffers = torch.empty(n, device="cuda")
"""

from . import library as _library

_installed = {}  # "allocator": the CUDAPluggableAllocator use() installed; "library": its CarveLibrary


def _import_torch():
    try:
        import torch  # the framework, not this module: absolute import
    except ImportError as e:
        raise ImportError("carve_gpu.torch needs PyTorch (import torch failed: " + str(e) + ")") from e
    return torch


def pluggable_allocator(pool="expandable", *, library=None, max_reserved=None, idle_threshold=None):
    """A torch.cuda.memory.CUDAPluggableAllocator over libcarve_torch.so configured with these
    options (see carve_gpu.library.load), not installed. Its malloc is libcarve_torch_oom.so's,
    whose refusals PyTorch raises as torch.OutOfMemoryError; PyTorch does not check the pointer a
    pluggable malloc returns, so without that library (carve built where PyTorch's c10 was not
    found) a refusal would reach a kernel as a null pointer: RuntimeError then."""
    lib = _library.load(library, pool=pool, max_reserved=max_reserved, idle_threshold=idle_threshold)
    oom = _library.find_oom_library(lib.path)
    if oom is None:
        raise RuntimeError(f"carve_gpu.torch: no {_library.OOM_LIBRARY_NAME} beside {lib.path}: build carve where "
                           "PyTorch is installed (its CMake finds c10 through python3, or set CARVE_TORCH_PREFIX to "
                           "torch's package directory), so that a request carve refuses raises "
                           "torch.OutOfMemoryError instead of handing PyTorch a null pointer")
    torch = _import_torch()
    return torch.cuda.memory.CUDAPluggableAllocator(oom, "carve_torch_malloc_or_raise", "carve_torch_free"), lib


def use(pool="expandable", *, library=None, max_reserved=None, idle_threshold=None):
    """Makes carve's `pool` (expandable, stream-ordered or caching) PyTorch's CUDA allocator for the
    rest of the process. max_reserved caps the device memory carve holds per device and
    idle_threshold is the free memory it keeps (bytes, or sizes such as "8G"). Must run before
    PyTorch initialises CUDA: RuntimeError otherwise. Returns the installed allocator."""
    _library.settings_for(pool, None, max_reserved, idle_threshold)  # bad options fail before torch is imported
    torch = _import_torch()
    if "allocator" in _installed:
        _library.load(library, pool=pool, max_reserved=max_reserved, idle_threshold=idle_threshold)
        return _installed["allocator"]
    if torch.cuda.is_initialized():
        raise RuntimeError("carve_gpu.torch.use(): CUDA was already initialised by PyTorch's own allocator (a "
                           "tensor, stream or torch.cuda call came first), and PyTorch cannot swap an allocator "
                           "that is in use; call use() at the start of the program, before anything touches the "
                           "GPU, or use carve_gpu.torch.mem_pool() for a region of code")
    allocator, lib = pluggable_allocator(pool, library=library, max_reserved=max_reserved,
                                         idle_threshold=idle_threshold)
    try:
        torch.cuda.memory.change_current_allocator(allocator)
    except RuntimeError as e:
        raise RuntimeError("carve_gpu.torch.use(): PyTorch refused to install carve's allocator: " + str(e)) from e
    _installed.update(allocator=allocator, library=lib)
    return allocator


def mem_pool(pool="expandable", *, library=None, max_reserved=None, idle_threshold=None):
    """A torch.cuda.MemPool whose memory carve serves, for `with torch.cuda.use_mem_pool(...)`."""
    torch = _import_torch()
    allocator = _installed.get("allocator")
    if allocator is None:
        allocator, _ = pluggable_allocator(pool, library=library, max_reserved=max_reserved,
                                           idle_threshold=idle_threshold)
    return torch.cuda.MemPool(allocator.allocator())


def _library_in_use(library=None):
    return _installed.get("library") or _library.load(library)


def memory_stats(device=0, *, library=None):
    """carve's figures for `device` as a dict: reserved_bytes, peak_reserved_bytes, live_bytes,
    peak_live_bytes, live_blocks, mallocs, frees, device_calls, device_failures, failures, ..."""
    return _library_in_use(library).stats(device)


def reset_peak_memory_stats(device=0, *, library=None):
    """Starts carve's peaks of `device` again from what is held now."""
    _library_in_use(library).reset_peak(device)


def empty_cache(*, library=None):
    """Gives every device the memory carve holds and no tensor uses."""
    _library_in_use(library).empty_cache()
