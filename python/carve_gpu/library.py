"""Finding, configuring and calling libcarve_torch.so (standard library only: ctypes).

The library reads its CARVE_TORCH_* environment variables once, at its first call, so load() sets
them before that and refuses to load it a second time in one process with other settings.
"""

import ctypes
import glob
import json
import os
import re
import threading

POOLS = ("expandable", "stream-ordered", "caching")
BACKENDS = ("cuda", "host")
LIBRARY_NAME = "libcarve_torch.so"
OOM_LIBRARY_NAME = "libcarve_torch_oom.so"  # carve_torch_malloc_or_raise, for PyTorch (carve_torch.h)
_HERE = os.path.dirname(os.path.abspath(__file__))

_lock = threading.Lock()
_loaded = {}  # realpath -> (CarveLibrary, settings)


def find_library(path=None):
    """The path of libcarve_torch.so: `path` if given, else $CARVE_TORCH_LIBRARY, else one next to
    this package, else the most recently built one under <checkout>/build/*/src/torch/. Raises
    FileNotFoundError saying where it looked."""
    looked = []
    for candidate, why in ((path, "the library argument"),
                           (os.environ.get("CARVE_TORCH_LIBRARY"), "CARVE_TORCH_LIBRARY")):
        if candidate:
            if os.path.isfile(candidate):
                return candidate
            raise FileNotFoundError(f"carve_gpu: {why} names {candidate!r}, which is not a file")
    beside = os.path.join(_HERE, LIBRARY_NAME)
    looked.append(beside)
    if os.path.isfile(beside):
        return beside
    pattern = os.path.join(os.path.dirname(os.path.dirname(_HERE)), "build", "*", "src", "torch", LIBRARY_NAME)
    looked.append(pattern)
    built = sorted(glob.glob(pattern), key=os.path.getmtime)
    if built:
        return built[-1]
    raise FileNotFoundError("carve_gpu: no " + LIBRARY_NAME + " (build the CMake target carve_torch, or set "
                            "CARVE_TORCH_LIBRARY); looked at " + ", ".join(looked))


def find_oom_library(library_path):
    """libcarve_torch_oom.so beside `library_path` (the libcarve_torch.so in use), or None when it was
    not built (no PyTorch c10 where carve was built)."""
    beside = os.path.join(os.path.dirname(library_path), OOM_LIBRARY_NAME)
    return beside if os.path.isfile(beside) else None


# The sizes libcarve_torch reads: digits, then K, M, G or T (alone, or with B or iB), or B.
_SIZE = re.compile(r"([0-9]+)(?:([KMGT])(?:i?B)?|B)?")
_SHIFTS = {None: 0, "K": 10, "M": 20, "G": 30, "T": 40}


def _size_setting(name, value):
    """`value` as the library reads it, checked here by the library's own rules: the library reads
    its settings once per process, so a size it would refuse must never reach it."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(f"carve_gpu: {name} must be a byte count (int) or a size such as '8G', not {value!r}")
    if isinstance(value, int) and value < 0:
        raise ValueError(f"carve_gpu: {name} must not be negative, not {value}")
    match = _SIZE.fullmatch(str(value))
    if not match or int(match.group(1)) << _SHIFTS[match.group(2)] >= 1 << 64:
        raise ValueError(f"carve_gpu: {name} must be a byte count below 2**64, or a size such as '8G' or '512MiB', "
                         f"not {value!r}")
    return str(value)


def settings_for(pool="expandable", backend=None, max_reserved=None, idle_threshold=None):
    """The CARVE_TORCH_* variables for these options (checked here, so that a typo is a Python
    error with the choices, not a message from the library)."""
    if pool not in POOLS:
        raise ValueError(f"carve_gpu: unknown pool {pool!r}: choose one of {', '.join(POOLS)}")
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"carve_gpu: unknown backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    settings = {"CARVE_TORCH_POOL": pool,
                "CARVE_TORCH_BACKEND": backend,
                "CARVE_TORCH_MAX_RESERVED": _size_setting("max_reserved", max_reserved),
                "CARVE_TORCH_IDLE_THRESHOLD": _size_setting("idle_threshold", idle_threshold)}
    return {k: v for k, v in settings.items() if v is not None}


def parse_stats(text):
    """The dict of carve_torch_stats_json's text (keys as docs/torch.md lists them)."""
    if isinstance(text, bytes):
        text = text.decode()
    stats = json.loads(text)
    if not isinstance(stats, dict) or "reserved_bytes" not in stats:
        raise ValueError(f"carve_gpu: not libcarve_torch statistics: {text!r}")
    return stats


class CarveLibrary:
    """libcarve_torch.so loaded with ctypes: the C functions with their types."""

    def __init__(self, path):
        self.path = path
        lib = ctypes.CDLL(path)
        lib.carve_torch_malloc.restype = ctypes.c_void_p
        lib.carve_torch_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        lib.carve_torch_free.restype = None
        lib.carve_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        lib.carve_torch_record_stream.restype = None
        lib.carve_torch_record_stream.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        lib.carve_torch_empty_cache.restype = None
        lib.carve_torch_empty_cache.argtypes = []
        lib.carve_torch_stats_json.restype = ctypes.c_char_p
        lib.carve_torch_stats_json.argtypes = [ctypes.c_int]
        lib.carve_torch_base_allocation.restype = ctypes.c_void_p
        lib.carve_torch_base_allocation.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
        lib.carve_torch_peer_access.restype = ctypes.c_int
        lib.carve_torch_peer_access.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
        lib.carve_torch_reset_peak.restype = None
        lib.carve_torch_reset_peak.argtypes = [ctypes.c_int]
        lib.carve_torch_config_error.restype = ctypes.c_char_p
        lib.carve_torch_config_error.argtypes = []
        lib.carve_torch_last_refusal.restype = ctypes.c_char_p
        lib.carve_torch_last_refusal.argtypes = []
        for hook in ("carve_torch_host_stream_enqueue", "carve_torch_host_stream_complete"):
            getattr(lib, hook).restype = None
            getattr(lib, hook).argtypes = [ctypes.c_void_p]
        lib.carve_torch_host_stream_capturing.restype = None
        lib.carve_torch_host_stream_capturing.argtypes = [ctypes.c_void_p, ctypes.c_int]
        lib.carve_torch_guard_captures.restype = None
        lib.carve_torch_guard_captures.argtypes = [ctypes.c_int]
        ull, ullp = ctypes.c_ulonglong, ctypes.POINTER(ctypes.c_ulonglong)
        lib.carve_torch_captures_begun.restype = ull
        lib.carve_torch_captures_begun.argtypes = [ctypes.POINTER(ctypes.c_int), ullp, ullp, ullp]
        lib.carve_torch_stream_in_capture.restype = ctypes.c_int
        lib.carve_torch_stream_in_capture.argtypes = [ctypes.c_void_p]
        lib.carve_torch_end_failed_capture.restype = ctypes.c_int
        lib.carve_torch_end_failed_capture.argtypes = [ctypes.c_int, ull]
        lib.carve_torch_watch_release.restype = None
        lib.carve_torch_watch_release.argtypes = [ctypes.c_int, ull, ull]
        lib.carve_torch_watched_release.restype = ctypes.c_int
        lib.carve_torch_watched_release.argtypes = []
        lib.carve_torch_release_failed_capture.restype = None
        lib.carve_torch_release_failed_capture.argtypes = [ctypes.c_int, ull, ull]
        self.lib = lib

    def address(self, name):
        """The address of the library's function `name` (an int), for PyTorch's hook setters."""
        return ctypes.cast(getattr(self.lib, name), ctypes.c_void_p).value

    def guard_captures(self, on=True):
        """Every request asks the driver whether its stream captures a CUDA graph, and refuses one
        that does: for a PyTorch that cannot forward the graph pool hooks."""
        self.lib.carve_torch_guard_captures(1 if on else 0)

    def captures_begun(self):
        """(count, device, pool, number): how many CUDA graph captures this thread has begun
        through carve's pool hooks, and the last one's device, pool id (a pair of ints) and number
        in its device's pool."""
        device = ctypes.c_int(0)
        first, second, number = (ctypes.c_ulonglong(0) for _ in range(3))
        count = self.lib.carve_torch_captures_begun(*(ctypes.byref(v) for v in (device, first, second, number)))
        return count, device.value, (first.value, second.value), number.value

    def stream_in_capture(self, stream):
        """Whether `stream` (a handle; None is the null stream) is in a CUDA graph capture the
        driver has not ended: under way, or invalidated by an error."""
        return self.lib.carve_torch_stream_in_capture(stream) == 1

    def end_failed_capture(self, device, number):
        """Ends the capture numbered `number` on `device` as PyTorch's end would have. True when it
        was under way; False when it had ended."""
        return self.lib.carve_torch_end_failed_capture(device, number) == 1

    def watch_release(self, device, pool):
        """Watches this thread for a release of `pool` on `device`; watched_release() says whether
        one came."""
        self.lib.carve_torch_watch_release(device, pool[0], pool[1])

    def watched_release(self):
        return self.lib.carve_torch_watched_release() == 1

    def release_failed_capture(self, device, pool):
        """One user less of a failed capture's `pool` on `device`, as PyTorch's release would be."""
        self.lib.carve_torch_release_failed_capture(device, pool[0], pool[1])

    def malloc(self, size, device=0, stream=0):
        """A block's address (int), or None when the device is full."""
        return self.lib.carve_torch_malloc(size, device, stream)

    def free(self, ptr, size, device=0, stream=0):
        self.lib.carve_torch_free(ptr, size, device, stream)

    def record_stream(self, ptr, stream):
        """`ptr` is used by work on `stream` too: its free waits for that work (Tensor.record_stream)."""
        self.lib.carve_torch_record_stream(ptr, stream)

    def last_refusal(self):
        """Why this thread's last malloc returned None ("CUDA out of memory. Tried to allocate ..."),
        or None when none has."""
        message = self.lib.carve_torch_last_refusal()
        return message.decode(errors="backslashreplace") if message else None

    def empty_cache(self):
        self.lib.carve_torch_empty_cache()

    def stats(self, device=0):
        return parse_stats(self.lib.carve_torch_stats_json(device))

    def base_allocation(self, ptr):
        """(start, size) of the cudaMalloc segment holding `ptr` (the caching and stream-ordered
        pools), or None where carve took none (expandable memory, an address it never gave out)."""
        size = ctypes.c_size_t(0)
        base = self.lib.carve_torch_base_allocation(ptr, ctypes.byref(size))
        return (base, size.value) if size.value else None

    def peer_access(self, ptr, device, peer):
        """What device `peer` may do with `device`'s memory at `ptr`: "read_write", "read", "none",
        or None where carve cannot say (cudaMalloc memory: the caching and stream-ordered pools)."""
        right = self.lib.carve_torch_peer_access(ptr, device, peer)
        return {2: "read_write", 1: "read", 0: "none"}.get(right)

    def reset_peak(self, device=0):
        self.lib.carve_torch_reset_peak(device)

    def config_error(self):
        """None, or what is wrong with the CARVE_TORCH_* variables the library read."""
        message = self.lib.carve_torch_config_error()
        return message.decode(errors="backslashreplace") if message else None

    def host_stream_enqueue(self, stream):
        """Host backend test hook: one piece of work queued on `stream`."""
        self.lib.carve_torch_host_stream_enqueue(stream)

    def host_stream_complete(self, stream):
        """Host backend test hook: all work queued on `stream` has run."""
        self.lib.carve_torch_host_stream_complete(stream)

    def host_stream_capturing(self, stream, capturing=True):
        """Host backend test hook: `stream` captures a CUDA graph (True), no longer does (False), or
        is in a capture an error invalidated and nobody ended yet ("invalidated")."""
        self.lib.carve_torch_host_stream_capturing(stream, 2 if capturing == "invalidated" else 1 if capturing else 0)


def loaded(library=None):
    """The library as this process loaded it, whatever its settings; loaded with the default
    settings first if it is not loaded yet. For figures and empty_cache, which every setting has."""
    path = os.path.realpath(find_library(library))
    with _lock:
        if path in _loaded:
            return _loaded[path][0]
    return load(library)


def load(library=None, pool="expandable", backend=None, max_reserved=None, idle_threshold=None):
    """libcarve_torch.so, configured: sets the CARVE_TORCH_* variables for these options and loads
    the library (once per process; loading it again with other settings raises RuntimeError, since
    the library has read its settings already). Raises ValueError for a bad option."""
    settings = settings_for(pool, backend, max_reserved, idle_threshold)
    path = os.path.realpath(find_library(library))
    with _lock:
        if path in _loaded:
            lib, before = _loaded[path]
            if before != settings:
                raise RuntimeError(f"carve_gpu: {path} is already loaded in this process with {before}; its "
                                   f"settings are read once, so {settings} cannot take effect (start a new process)")
            return lib
        before_load = {k: os.environ.get(k) for k in settings}
        os.environ.update(settings)  # options not given keep what the environment says
        lib = CarveLibrary(path)
        error = lib.config_error()
        if error:  # a variable set outside these options: the process keeps it, its children need not
            for k, v in before_load.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            raise ValueError(error)
        _loaded[path] = (lib, settings)
        return lib
