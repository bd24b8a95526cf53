"""carve's pools as PyTorch's CUDA allocator.

    import carve_gpu.torch
    carve_gpu.torch.use()            # first thing, before any CUDA tensor
    model = build_model().cuda()     # every CUDA allocation now goes through carve

or, for one region of code while PyTorch's own allocator serves the rest:

    pool = carve_gpu.torch.mem_pool()
    with torch.cuda.use_mem_pool(pool):
        buffers = torch.empty(n, device="cuda")
"""

import functools

from . import library as _library

_installed = {}  # "allocator": the CUDAPluggableAllocator use() installed; "library": its CarveLibrary
_warned = {}  # the warnings given once per process


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
    allocator = torch.cuda.memory.CUDAPluggableAllocator(oom, "carve_torch_malloc_or_raise", "carve_torch_free")
    install_hooks(allocator._allocator, lib)
    return allocator, lib


# The hooks of PyTorch's pluggable allocator carve fills, newest interface first: (setter, carve's
# function). PyTorch 2.2 and later open a graph's pool with a filter of the capturing streams;
# 2.1 names the capturing stream.
_POOL_HOOKS = (
    (("set_begin_allocate_to_pool", "carve_torch_begin_allocate_to_pool"),
     ("set_end_allocate_to_pool_fn", "carve_torch_end_allocate_to_pool"),
     ("set_release_pool", "carve_torch_release_pool")),
    (("set_begin_allocate_stream_to_pool", "carve_torch_begin_allocate_stream_to_pool"),
     ("set_end_allocate_stream_to_pool_fn", "carve_torch_end_allocate_stream_to_pool"),
     ("set_release_pool", "carve_torch_release_pool")),
)


def install_hooks(hooks, lib):
    """Fills `hooks` (a torch._C._cuda_CUDAAllocator of a CUDAPluggableAllocator: its setters take
    a function's address) with carve's: torch.cuda.empty_cache() reaches carve's cache,
    Tensor.record_stream makes a block's free wait for that stream's work, a tensor shared with
    another process is sent as its offset in the cudaMalloc segment that holds it (where PyTorch
    asks getBaseAllocation), and a CUDA graph
    captured under carve gets a private pool of carve's memory. Returns "pools" or "streams"
    (which form of the graph hooks), or None where this PyTorch has neither: then carve refuses any
    allocation from a capturing stream with a message saying so (carve_torch_guard_captures), since
    it could not keep the graph's memory from the next allocation. (The hooks' behaviour is checked
    on libcarve_torch's host backend, and under PyTorch on a GPU by tests/torch/gpu_graphs.py.)"""
    if hasattr(hooks, "set_reset_fn"):
        hooks.set_reset_fn(lib.address("carve_torch_empty_cache"))
    if hasattr(hooks, "set_record_stream_fn"):
        hooks.set_record_stream_fn(lib.address("carve_torch_record_stream"))
    if hasattr(hooks, "set_base_alloc_fn"):
        hooks.set_base_alloc_fn(lib.address("carve_torch_base_allocation"))
    for form, setters in zip(("pools", "streams"), _POOL_HOOKS):
        if all(hasattr(hooks, setter) for setter, _ in setters):
            for setter, function in setters:
                getattr(hooks, setter)(lib.address(function))
            return form
    lib.guard_captures(True)
    return None


def use(pool="expandable", *, library=None, max_reserved=None, idle_threshold=None):
    """Makes carve's `pool` (expandable, stream-ordered or caching) PyTorch's CUDA allocator for the
    rest of the process. max_reserved caps the device memory carve holds per device and
    idle_threshold is the free memory it keeps (bytes, or sizes such as "8G"). Must run before
    PyTorch initialises CUDA: RuntimeError otherwise. Returns the installed allocator. A process
    that receives CUDA tensors from another (torch.multiprocessing) must keep PyTorch's own
    allocator: a pluggable one cannot open them (docs/torch.md)."""
    _library.settings_for(pool, None, max_reserved, idle_threshold)  # bad options fail before torch is imported
    torch = _import_torch()
    if "allocator" in _installed:
        _library.load(library, pool=pool, max_reserved=max_reserved, idle_threshold=idle_threshold)
        _guard_graphs(torch, _installed["allocator"], _installed["library"])  # again, if the first use() failed there
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
    _guard_graphs(torch, allocator, lib)
    return allocator


def _guard_graphs(torch, allocator, lib):
    """Inductor compiles without CUDA graph trees, and a capture that fails is ended in carve's
    pools: both wrappers install once, so use() runs this again where an earlier call stopped."""
    try:
        import importlib
        importlib.import_module("torch._inductor.config")  # the wrapper reads torch._inductor.config
        inductor = importlib.import_module("torch._inductor")
    except ImportError:  # a build without Inductor compiles nothing
        inductor = None
    compile_without_cudagraph_trees(inductor, torch._C)
    # PyTorch 2.1 (the stream form of the pool hooks) resets a graph without clearing its flags.
    end_failed_captures(torch.cuda.CUDAGraph, lib, lambda: torch.cuda.current_stream().cuda_stream,
                        reset_releases=hasattr(allocator._allocator, "set_begin_allocate_to_pool"))


def end_failed_captures(graph_class, lib, current_stream, reset_releases=True):
    """Wraps graph_class's capture_begin and capture_end (torch.cuda.CUDAGraph's, which
    torch.cuda.graph and make_graphed_callables call) so that a capture that fails is ended in
    carve and its pool released once. PyTorch up to 2.11 tells its allocator that a capture ended
    only once the driver ended it well, and releases a graph's pool only for a capture that ended:
    when either method raised first (a synchronising call inside the capture invalidated it, say),
    carve would count the capture under way until the process ends, every other free waiting.
    From PyTorch's PR 180395 on the capture is ended before the error is raised, and from PR 190348
    on the graph's reset releases the pool.

    After an error, once the capture's stream is in no capture (capture_end called on another
    stream leaves a capture that may yet end well), and when PyTorch did not end the capture: carve
    ends it (that one capture, whatever others share its pool), resets the graph (PyTorch's own
    clean-up) and releases the pool unless that reset did. reset_releases=False (PyTorch 2.1, whose
    reset neither releases a failed capture's pool nor clears its flags) skips the reset. Nothing
    is reset on a graph whose own earlier capture is still open or whose capture ended well before
    (a keep_graph graph captured again): its pool is left to PyTorch. When PyTorch ended the
    capture, its pool is PyTorch's to release. The error is raised unchanged. current_stream()
    gives the handle of the stream a capture begins on. Wraps a class once."""
    if getattr(graph_class, "_carve_ends_failed_captures", False):
        return
    begin, end, reset = graph_class.capture_begin, graph_class.capture_end, getattr(graph_class, "reset", None)

    def finish(self, device, pool, number, may_reset=True):
        if not lib.end_failed_capture(device, number) or not may_reset:
            return  # PyTorch ended it, or its graph's pool is left to PyTorch
        lib.watch_release(device, pool)
        if reset_releases and reset is not None:
            try:
                reset(self)  # PyTorch's own clean-up; from PR 190348 on it releases the pool
            except Exception:  # noqa: BLE001 - the original error is what the caller must see
                pass
        if not lib.watched_release():
            lib.release_failed_capture(device, pool)

    @functools.wraps(begin)
    def capture_begin(self, *args, **kwargs):
        earlier = getattr(self, "_carve_capture", None)  # this graph's own capture, if still open
        stream = current_stream()
        nested = lib.stream_in_capture(stream)  # then the driver refuses to begin this one
        before = lib.captures_begun()[0]
        try:
            begin(self, *args, **kwargs)
        except BaseException:
            count, device, pool, number = lib.captures_begun()
            if count != before and (nested or not lib.stream_in_capture(stream)):
                # carve opened the graph's pool, but the driver's capture never began
                finish(self, device, pool, number,
                       may_reset=earlier is None and not getattr(self, "_carve_captured", False))
            raise
        count, device, pool, number = lib.captures_begun()
        self._carve_capture = (device, pool, number, stream) if count != before else None

    @functools.wraps(end)
    def capture_end(self):
        try:
            end(self)
        except BaseException:
            capture = getattr(self, "_carve_capture", None)
            if capture is not None and not lib.stream_in_capture(capture[3]):
                self._carve_capture = None
                finish(self, *capture[:3], may_reset=not getattr(self, "_carve_captured", False))
            raise
        self._carve_capture = None
        self._carve_captured = True

    graph_class.capture_begin = capture_begin
    graph_class.capture_end = capture_end
    graph_class._carve_ends_failed_captures = True


TREES_REFUSED = ("carve_gpu.torch: CUDA graph trees (torch.compile with Inductor's triton.cudagraphs and "
                 "cudagraph_trees on, or backend=\"cudagraphs\") checkpoint and restore the allocator's state, which "
                 "PyTorch's pluggable allocator cannot forward, so carve cannot serve them. Capture with "
                 "torch.cuda.graph or torch.cuda.make_graphed_callables, which carve serves, or compile with "
                 "mode=\"reduce-overhead\", which under carve runs the compiled kernels without CUDA graphs")
_CHECKPOINT_CALLS = ("_cuda_getCheckpointState", "_cuda_setCheckpointPoolState", "_cuda_checkPoolLiveAllocations")


def compile_without_cudagraph_trees(inductor, torch_c):
    """Under carve, torch.compile's modes that ask for CUDA graphs (reduce-overhead, max-autotune)
    compile as their modes without graphs, with a warning, instead of failing. Inductor records
    those graphs as cudagraph trees, whose checkpoints of the allocator's state (torch_c's
    _cuda_getCheckpointState, _cuda_setCheckpointPoolState, _cuda_checkPoolLiveAllocations)
    PyTorch's pluggable allocator cannot forward. Inductor's other way, trees off, captures through
    carve's pool hooks, but on an H200 it gave other training losses than trees on under PyTorch's
    own allocator too; without graphs the losses are those of PyTorch's default mode, whose trees
    run the same kernels. A user who turns trees off (torch._inductor.config.triton.cudagraph_trees)
    keeps the graphs. Trees asked for some other way (the option itself, backend="cudagraphs") are
    refused where they first check or checkpoint the pool (their warm-up or first recording) with
    TREES_REFUSED instead of PyTorch's message. inductor: the torch._inductor module (None: nothing
    to compile). Wraps each function once. Checked here on stand-ins for both modules; on a GPU
    by tests/torch/gpu_graphs.py."""
    mode_options = getattr(inductor, "list_mode_options", None)
    if mode_options is not None and not getattr(mode_options, "_carve_without_trees", False):

        def trees_on():
            triton = getattr(getattr(inductor, "config", None), "triton", None)
            return bool(getattr(triton, "cudagraph_trees", True))

        @functools.wraps(mode_options)
        def list_mode_options(mode=None, *args, **kwargs):
            options = mode_options(mode, *args, **kwargs)
            if not mode or not isinstance(options, dict) or not options.get("triton.cudagraphs") or not trees_on():
                return options
            if not _warned.get("trees"):
                _warned["trees"] = True
                import warnings
                warnings.warn(f"carve_gpu.torch: torch.compile(mode=\"{mode}\") runs without CUDA graphs under carve, as "
                              "does every mode that asks for them: Inductor records them as cudagraph trees, which "
                              "checkpoint the allocator's state, and PyTorch's pluggable allocator cannot forward that. "
                              "The compiled kernels and their results are the mode's own; for CUDA graphs under carve "
                              "capture with torch.cuda.graph (docs/torch.md)", stacklevel=5)
            return {key: value for key, value in options.items() if key != "triton.cudagraphs"}

        list_mode_options._carve_without_trees = True
        inductor.list_mode_options = list_mode_options

    def refuse(*args, **kwargs):
        raise RuntimeError(TREES_REFUSED)
    refuse._carve_without_trees = True
    for name in _CHECKPOINT_CALLS:
        if hasattr(torch_c, name) and not getattr(getattr(torch_c, name), "_carve_without_trees", False):
            setattr(torch_c, name, refuse)


def mem_pool(pool="expandable", *, library=None, max_reserved=None, idle_threshold=None):
    """A torch.cuda.MemPool whose memory carve serves, for `with torch.cuda.use_mem_pool(...)` while
    PyTorch's own allocator serves the rest. PyTorch cuts the region's tensors out of segments it
    asks carve for; carve answers a request it cannot serve with a null pointer, which PyTorch
    takes as it takes a failed cudaMalloc (it frees its cache, tries again, then raises
    torch.OutOfMemoryError). Not after use(): PyTorch's pluggable allocator holds no MemPool."""
    if _installed.get("allocator") is not None:
        raise RuntimeError("carve_gpu.torch.mem_pool(): carve is already PyTorch's allocator (use()), and PyTorch's "
                           "pluggable allocator holds no torch.cuda.MemPool; every tensor is carve's already (a CUDA "
                           "graph's memory too, in a private pool of carve's)")
    lib = _library.load(library, pool=pool, max_reserved=max_reserved, idle_threshold=idle_threshold)
    torch = _import_torch()
    allocator = torch.cuda.memory.CUDAPluggableAllocator(lib.path, "carve_torch_malloc", "carve_torch_free")
    return torch.cuda.MemPool(allocator.allocator())


def _library_in_use(library=None):
    return _installed.get("library") or _library.loaded(library)


def _device_index(device):
    """`device` as PyTorch's memory functions take it (an index, "cuda:1", a torch.device, or None
    for the current device) as an index."""
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    if device is not None and not isinstance(device, str) and not hasattr(device, "type"):
        raise TypeError(f"carve_gpu: a device is an index, 'cuda:N' or a torch.device, not {device!r}")
    torch = _import_torch()
    device = torch.device("cuda") if device is None else torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"carve_gpu: {device} is not a CUDA device")
    return torch.cuda.current_device() if device.index is None else device.index


def memory_stats(device=0, *, library=None):
    """carve's figures for `device` (as PyTorch's memory functions take it; None: the current
    device) as a dict: reserved_bytes, peak_reserved_bytes, live_bytes, peak_live_bytes,
    live_blocks, mallocs, frees, device_calls, device_failures, failures, lending_refused,
    lent_bytes, stream_waits (the expandable pool's host syncs with a stream before it unmapped
    memory that stream's work used), refusals_served (requests the device or the cap refused that
    the expandable pool's retry served: the card was full), ..."""
    return _library_in_use(library).stats(_device_index(device))


def reset_peak_memory_stats(device=0, *, library=None):
    """Starts carve's peaks of `device` (as memory_stats takes it) again from what is held now."""
    _library_in_use(library).reset_peak(_device_index(device))


def empty_cache(*, library=None):
    """Gives every device the memory carve holds and no tensor uses."""
    _library_in_use(library).empty_cache()


def peer_access(tensor, peer, *, library=None):
    """What GPU `peer` may do with the memory of `tensor` (a CUDA tensor carve allocated):
    "read_write", "read", "none", or None where carve cannot say (the caching and stream-ordered
    pools hand out cudaMalloc memory, which the peer access PyTorch enables opens). The expandable
    pool opens each GPU's memory to every other GPU the process allocates on (checked on the host
    backend only, not yet on two GPUs)."""
    return _library_in_use(library).peer_access(tensor.data_ptr(), tensor.device.index, peer)
