#!/usr/bin/env python3
"""carve's refusals under PyTorch on a GPU, for each pool (expandable, stream-ordered, caching),
each in a process of its own under carve_gpu.torch.use(pool, max_reserved="2G"):

- out of memory is torch.OutOfMemoryError: a 256 MiB tensor, then 3 GiB asked for; the error's
  message begins "CUDA out of memory. Tried to allocate 3.00 GiB.", says carve gave back its cache
  and tried again, and passes Lightning's and accelerate's checks; the 256 MiB tensor is intact;
  a reduction whose temporary does not fit raises the same; a zero-element tensor is no error;
- a batch-size search that halves on that error (as those tools do) ends with a batch served, and
  later work runs;
- no memory goes back, or to another stream, while a kernel may use it: a kernel queued behind a
  long sleep reads a tensor that is then deleted, and a tensor of its size is made on another
  stream at once (before any other stream has allocated in the process); the same with
  empty_cache() (PyTorch's and carve's) called at once; the kernel's result is right and nothing
  faults. The same through Tensor.record_stream: a tensor
  read on a side stream, freed on its own, is not handed to the next tensor of its size.

Under CuPy (where it is installed), for each pool in a process of its own under
carve_gpu.cupy.use(pool, max_reserved="2G"): 3 GiB asked for beside a 256 MiB array raises CuPy's
own cupy.cuda.memory.OutOfMemoryError with carve's message; the array is intact; a zero-size
array is no error; a 1 GiB array is served afterwards.

    gpu_out_of_memory.py [--library build/gpu/src/torch/libcarve_torch.so] [--report build/gpu/gpu-report.md]

Exit status 0 when every check passed. Appends its section to --report.
"""

import os
import sys

sys.dont_write_bytecode = True  # oom_checks, beside this file, leaves no __pycache__ there
import gpu_children  # noqa: E402
from oom_checks import accelerate_should_reduce, lightning_is_oom  # noqa: E402

POOLS = ("expandable", "stream-ordered", "caching")
CUPY_CHILDREN = tuple("cupy-" + pool for pool in POOLS)
MiB, GiB = 1 << 20, 1 << 30
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def results(checks):
    """A child's JSON: each check's name mapped to True (passed) or to why it failed, as text."""
    return {name: (value if value is True else str(value)) for name, value in checks.items()}


def run_cupy_child(pool, library):
    import cupy
    import carve_gpu.cupy as carve

    carve.use(pool, library=library, max_reserved="2G")
    checks = {}
    kept = cupy.full(256 * MiB, 7, dtype=cupy.uint8)
    refused = "3 GiB under a 2 GiB cap raises cupy.cuda.memory.OutOfMemoryError"
    try:
        cupy.empty(3 * GiB, dtype=cupy.uint8)
        checks[refused] = "nothing was raised"
    except cupy.cuda.memory.OutOfMemoryError as e:
        message = str(e.args[0]) if e.args else ""
        checks[refused] = True if message.startswith("CUDA out of memory. Tried to allocate 3.00 GiB.") else message
    cupy.cuda.Device().synchronize()
    checks["the 256 MiB array is intact after the refusal"] = bool((kept == 7).all())
    checks["a zero-size array is no error"] = cupy.empty(0, dtype=cupy.uint8).size == 0
    later = cupy.ones(GiB, dtype=cupy.uint8)
    checks["a 1 GiB array is served afterwards"] = int(later[::MiB].sum()) == GiB // MiB
    return results(checks)


def run_child(pool, library):
    sys.path.insert(0, os.path.join(ROOT, "python"))
    if pool.startswith("cupy-"):
        return run_cupy_child(pool[len("cupy-"):], library)
    import torch
    import carve_gpu.torch as carve

    carve.use(pool, library=library, max_reserved="2G")
    oom_types = tuple(t for t in (getattr(torch, "OutOfMemoryError", None), torch.cuda.OutOfMemoryError) if t)
    checks = {}

    kept = torch.full((256 * MiB,), 7, dtype=torch.uint8, device="cuda")
    try:
        torch.empty(3 * GiB, dtype=torch.uint8, device="cuda")
        checks["3 GiB under a 2 GiB cap raises torch.OutOfMemoryError"] = "nothing was raised"
    except oom_types as e:
        message = e.args[0]
        ok = (message.startswith("CUDA out of memory. Tried to allocate 3.00 GiB.") and "gave back" in message
              and lightning_is_oom(e) and accelerate_should_reduce(e))
        checks["3 GiB under a 2 GiB cap raises torch.OutOfMemoryError"] = True if ok else message
    torch.cuda.synchronize()
    checks["the 256 MiB tensor is intact after the refusal"] = bool((kept == 7).all().item())

    temporary = "a temporary that does not fit raises torch.OutOfMemoryError"
    try:
        big = torch.full((1536 * MiB,), 1, dtype=torch.uint8, device="cuda")  # fits beside `kept`
    except oom_types as e:
        big, checks[temporary] = None, f"the 1.5 GiB operand itself was refused: {e.args[0][:300]}"
    if big is not None:
        try:
            big.to(torch.int16)  # a 3 GiB temporary under what is left of the cap
            checks[temporary] = "nothing was raised"
        except oom_types:
            checks[temporary] = True
    big = None
    checks["a zero-element tensor is no error"] = torch.empty(0, device="cuda").numel() == 0

    batch, refusals = 4 * GiB, 0
    while True:
        try:
            x = torch.ones(batch, dtype=torch.uint8, device="cuda")
            served = int(x[::MiB].sum().item())
            x = None
            break
        except RuntimeError as e:
            if not accelerate_should_reduce(e) or batch <= MiB:
                raise
            refusals += 1
            batch //= 2
    checks["a batch-size search that halves on out of memory ends served"] = (
        True if refusals > 0 and served == batch // MiB else f"served {batch} bytes after {refusals} refusals")

    # A kernel queued behind ~1 s of sleep reads `x`, which is freed at once; a tensor of its size
    # on another stream, whose work is not ordered behind the sleep, must not take its memory
    # meanwhile. This comes before any other stream allocates here: the stream-ordered pool records
    # no event at a free while one stream is all it has seen, and one when another stream asks.
    n = 64 * MiB
    x = torch.ones(n, dtype=torch.float32, device="cuda")
    torch.cuda._sleep(2_000_000_000)
    total = x.sum()
    x = None
    with torch.cuda.stream(torch.cuda.Stream()):
        overwrite = torch.full((n,), 3.0, device="cuda")
    checks["a tensor freed while a kernel reads it is not handed to another stream"] = (
        True if float(total.item()) == n else f"the kernel's sum is {float(total.item())}, not {n}")
    overwrite = None

    # A kernel queued behind ~1 s of sleep reads `x`; x is deleted and every cache emptied before
    # the kernel runs. Memory given back under it would fault or change its sum; memory handed to
    # another stream (whose work is not ordered behind the sleep) would change it too.
    x = torch.ones(n, dtype=torch.float32, device="cuda")
    torch.cuda._sleep(2_000_000_000)
    total = x.sum()
    x = None
    torch.cuda.empty_cache()
    carve.empty_cache()
    with torch.cuda.stream(torch.cuda.Stream()):
        overwrite = torch.full((n,), 3.0, device="cuda")  # may take any memory carve gave back
    checks["a kernel still reading a freed tensor sees its bytes through empty_cache"] = float(total.item()) == n
    overwrite = None

    # Tensor.record_stream: x is read on a side stream behind a long sleep and freed on its own
    # stream at once; the next tensor of its size on that stream must not take x's memory meanwhile.
    side = torch.cuda.Stream()
    x = torch.ones(n, dtype=torch.float32, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(2_000_000_000)
        total = x.sum()
    x.record_stream(side)
    x = None
    overwrite = torch.full((n,), 3.0, device="cuda")  # x's own stream, x's size
    side.synchronize()
    checks["a tensor read on a side stream (record_stream) is not handed out again under it"] = (
        True if float(total.item()) == n else f"the side stream's sum is {float(total.item())}, not {n}")
    overwrite = None
    return results(checks)


def orchestrate(args):
    lines = ["## Out of memory under PyTorch and CuPy through carve (tests/torch/gpu_out_of_memory.py)", ""]
    import importlib.util
    with_cupy = importlib.util.find_spec("cupy") is not None
    children = POOLS + (CUPY_CHILDREN if with_cupy else ())
    checks, failed = gpu_children.check_lines(gpu_children.run_children(__file__, children, args.library, 300))
    if not with_cupy:
        checks.append("- CuPy: not installed here (import cupy fails), its checks skipped")
    return gpu_children.report(lines + checks, args.report, failed)


if __name__ == "__main__":
    sys.exit(gpu_children.main(__doc__, POOLS + CUPY_CHILDREN, run_child, orchestrate))
