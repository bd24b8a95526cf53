#!/usr/bin/env python3
"""CUDA graphs under carve on a GPU, for each pool (expandable, stream-ordered, caching) beside
PyTorch's own allocator, each in a process of its own:

- torch.cuda.graph captures a whole training step of a small MLP (forward, backward, SGD step, as
  PyTorch's documentation captures one) after three warm-up steps on a side stream; the graph is
  replayed on 20 batches copied into its static input. The losses must equal those of the same
  steps under PyTorch's allocator (to 1e-5, relative).
- torch.compile(mode="reduce-overhead") trains a small model for 10 steps. Under PyTorch's
  allocator Inductor records the step's graphs as cudagraph trees; under carve, use() compiles
  that mode without CUDA graphs (trees checkpoint allocator state a pluggable allocator cannot
  forward) and warns once. The check: the same losses as PyTorch's allocator gives in that mode,
  and the warning given. Beside it, for the reader: every allocator's losses compiled without
  CUDA graphs, and PyTorch's in eager mode and its count of graphs Inductor skipped.
- trees asked for directly (Inductor's triton.cudagraphs option, and torch.compile's
  backend="cudagraphs") are refused under carve at their first run with carve's message
  (carve_gpu.torch.TREES_REFUSED), and the process goes on.
- after the graph is deleted (its private pool released) every block comes home: carve's live
  bytes return to what they were before the capture, but for what PyTorch's own allocator also
  still counts there (the cuBLAS workspaces some PyTorch builds keep).
- first of all, under carve, a capture the driver invalidates (a device synchronisation inside it):
  PyTorch raises at its end, before (up to 2.11) or after telling the allocator that the capture
  ended; either way the capture must end in carve: 68 MiB of tensors freed after it go back to the
  device at empty_cache (they would wait for the end of the capture for good otherwise), and when
  carve ended it, the 4 MiB the failed capture made too (its pool released); the report says who
  ended it, and the captures above still run.

    gpu_graphs.py [--library build/gpu/src/torch/libcarve_torch.so] [--report build/gpu/gpu-report.md]

Exit status 0 when every check passed. Appends its section to --report.
"""

import os
import sys

sys.dont_write_bytecode = True  # gpu_children, beside this file, leaves no __pycache__ there
import gpu_children  # noqa: E402

POOLS = ("expandable", "stream-ordered", "caching")
CHILDREN = ("pytorch",) + POOLS
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS = 20
MiB = 1 << 20  # slack for rounding when comparing live bytes with PyTorch's count


def mlp(torch):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                               torch.nn.ReLU(), torch.nn.Linear(1024, 10)).cuda()


def batches(torch, n):
    g = torch.Generator(device="cpu").manual_seed(1)
    return [(torch.randn(64, 512, generator=g), torch.randint(0, 10, (64,), generator=g)) for _ in range(n)]


def captured_losses(torch):
    """A whole training step captured once, replayed on every batch."""
    model = mlp(torch)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    data = batches(torch, STEPS + 3)
    static_x = torch.zeros(64, 512, device="cuda")
    static_y = torch.zeros(64, dtype=torch.long, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the graph, as PyTorch's recipe does
        for x, y in data[:3]:
            static_x.copy_(x)
            static_y.copy_(y)
            opt.zero_grad(set_to_none=True)
            loss_fn(model(static_x), static_y).backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_loss = loss_fn(model(static_x), static_y)
        static_loss.backward()
        opt.step()
    losses = []
    for x, y in data[3:]:
        static_x.copy_(x)
        static_y.copy_(y)
        graph.replay()
        losses.append(float(static_loss.item()))
    del graph, static_loss
    return losses


def training_losses(torch, compile_step):
    """10 SGD steps of the MLP, the loss through `compile_step(fn)` (eager: fn itself)."""
    model = mlp(torch)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    step = compile_step(lambda x, y: loss_fn(model(x), y))
    losses = []
    for x, y in batches(torch, 10):
        opt.zero_grad(set_to_none=True)
        loss = step(x.cuda(), y.cuda())
        loss.backward()
        opt.step()
        losses.append(float(loss.item()))
    return losses


def compiled_losses(torch, **options):
    """torch.compile(mode="reduce-overhead"): Inductor captures the step's graphs itself; with
    `options`, Inductor's options instead of the mode (triton.cudagraphs=False: no graphs)."""
    torch._dynamo.reset()  # each run compiles afresh, in the Inductor mode set now
    if options:
        return training_losses(torch, lambda fn: torch.compile(fn, options=options))
    return training_losses(torch, lambda fn: torch.compile(fn, mode="reduce-overhead"))


def failed_capture(torch, carve):
    """A capture invalidated by a device synchronisation inside it: what PyTorch raised, whether
    carve or PyTorch ended the capture in the allocator (PyTorch does itself from its PR 180395 on),
    and the bytes empty_cache gave back for the 64 MiB and 4 MiB tensors freed after it and the
    4 MiB one the failed capture made (its pool released)."""
    lib = carve._installed["library"]
    ended = []
    end_failed_capture = lib.end_failed_capture

    def recording(*args):
        ended.append(end_failed_capture(*args))
        return ended[-1]
    lib.end_failed_capture = recording
    big = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
    x = torch.ones(1 << 20, device="cuda")
    graph = torch.cuda.CUDAGraph()
    error = None
    try:
        with torch.cuda.graph(graph):
            y = x * 2
            torch.cuda.synchronize()  # not permitted while a stream captures: the driver invalidates it
    except RuntimeError as e:  # torch.AcceleratorError too: a RuntimeError
        error = f"{type(e).__name__}: {str(e)[:200]}"
    finally:
        lib.end_failed_capture = end_failed_capture
    torch.cuda.set_stream(torch.cuda.default_stream())  # torch.cuda.graph left its stream current
    del graph
    y = None  # noqa: F841 - the failed capture's tensor, dropped
    torch.cuda.synchronize()
    reserved = carve.memory_stats()["reserved_bytes"]
    del big, x  # x shares big's last granule under the expandable pool
    carve.empty_cache()
    return {"error": error, "gave_back": reserved - carve.memory_stats()["reserved_bytes"],
            "ended_by": "carve" if any(ended) else "PyTorch" if ended else "nobody", "torch": torch.__version__}


def cudagraph_skips(torch):
    """How often Inductor ran a graph's kernels eagerly instead of capturing them (it says so only
    in its log): equal losses prove nothing about capture unless this is 0."""
    from torch._dynamo.utils import counters
    return int(counters["inductor"]["cudagraph_skips"])


def compiled_under_carve(torch):
    """torch.compile(mode="reduce-overhead") under carve: its losses, the warnings it gave."""
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        losses = guarded(lambda: compiled_losses(torch))
    return losses, [str(w.message)[:300] for w in caught if "carve_gpu.torch" in str(w.message)]


def trees_refused(torch, backend=None):
    """Cudagraph trees asked for through Inductor's own option (or, with `backend`, through
    torch.compile's backend of that name): what the first run raised, and whether CUDA still
    serves a kernel afterwards."""
    if backend is None:
        error = guarded(lambda: compiled_losses(torch, **{"triton.cudagraphs": True}))
    else:
        torch._dynamo.reset()
        try:  # what the refused run before this one left in the trees' manager
            from torch._inductor.cudagraph_trees import reset_cudagraph_trees
            reset_cudagraph_trees()
        except Exception:  # noqa: BLE001 - a PyTorch without it: the check runs as it is
            pass
        error = guarded(lambda: training_losses(torch, lambda fn: torch.compile(fn, backend=backend)))
    alive = guarded(lambda: float(torch.ones(1024, device="cuda").sum().item()) == 1024.0)
    return {"error": error if isinstance(error, str) else f"no error: {error}", "alive": alive}


def run_child(pool, library):
    import torch
    carve = None
    if pool != "pytorch":
        sys.path.insert(0, os.path.join(ROOT, "python"))
        import carve_gpu.torch as carve
        carve.use(pool, library=library)
    out = {}

    def live():  # the bytes handed out, as the allocator in use counts them
        return torch.cuda.memory_allocated() if carve is None else carve.memory_stats()["live_bytes"]
    torch.zeros(1, device="cuda")  # CUDA initialised, under whichever allocator
    if carve is not None:
        try:
            out["failed_capture"] = failed_capture(torch, carve)
        except Exception as e:  # noqa: BLE001
            out["failed_capture"] = f"{type(e).__name__}: {e}"

    def captures():  # the graph captures begun on this thread through carve's pool hooks
        return carve._installed["library"].captures_begun()[0] if carve is not None else 0
    before, begun = live(), captures()
    try:
        out["captured"] = captured_losses(torch)
    except Exception as e:  # noqa: BLE001 - reported, not hidden
        out["captured"] = f"{type(e).__name__}: {e}"
    out["captured_captures"] = captures() - begun
    torch.cuda.synchronize()
    import gc
    gc.collect()
    if hasattr(torch._C, "_cuda_clearCublasWorkspaces"):  # cuBLAS keeps a workspace per stream
        torch._C._cuda_clearCublasWorkspaces()
    out["live_after_graph"] = live() - before  # PyTorch's own: what its build keeps (workspaces)
    out["eager"] = guarded(lambda: training_losses(torch, lambda fn: fn))
    out["compiled_no_graphs"] = guarded(lambda: compiled_losses(torch, **{"triton.cudagraphs": False}))
    begun, skipped = captures(), cudagraph_skips(torch)
    if carve is None:
        out["compiled"] = guarded(lambda: compiled_losses(torch))
    else:
        out["compiled"], out["compiled_warnings"] = compiled_under_carve(torch)
    out["compiled_skips"] = cudagraph_skips(torch) - skipped
    out["compiled_captures"] = captures() - begun
    if carve is not None:  # last: the trees' manager stays behind in this process
        out["trees_refused"] = trees_refused(torch)
        out["backend_refused"] = trees_refused(torch, backend="cudagraphs")
    return out


def guarded(run):
    try:
        return run()
    except Exception as e:  # noqa: BLE001 - reported, not hidden
        return f"{type(e).__name__}: {e}"


def same(a, b):
    return (isinstance(a, list) and isinstance(b, list) and len(a) == len(b)
            and all(abs(x - y) <= 1e-5 * max(1.0, abs(y)) for x, y in zip(a, b)))


def orchestrate(args):
    lines = ["## CUDA graphs under carve (tests/torch/gpu_graphs.py)", ""]
    results = gpu_children.run_children(__file__, CHILDREN, args.library, 240)
    failed = 0
    reference = results["pytorch"]
    for what in ("captured", "compiled"):
        ok = isinstance(reference.get(what), list)
        failed += not ok
        lines.append(f"- PyTorch's allocator, {what}: {'ran' if ok else 'FAILED: ' + str(reference)[:600]}")
    # For the reader, not a check: what Inductor's graphs change under PyTorch's own allocator.
    lines.append(f"- PyTorch's allocator, reduce-overhead (cudagraph trees, cudagraph_skips "
                 f"{reference.get('compiled_skips')}): "
                 f"{'the same losses as' if same(reference.get('compiled'), reference.get('compiled_no_graphs')) else 'losses other than'}"
                 f" the same code compiled without CUDA graphs ({str(reference.get('compiled'))[:300]}; without "
                 f"graphs {str(reference.get('compiled_no_graphs'))[:300]}; eager {str(reference.get('eager'))[:300]})")
    kept = reference.get("live_after_graph")  # what PyTorch's own allocator still counts (its workspaces)
    for pool in POOLS:
        r = results[pool]
        f = r.get("failed_capture")
        # 68 MiB: the tensors freed after the failure; 72: and the failed capture's own (y), which
        # comes home only once its pool is released (by carve when carve ended the capture)
        need = 72 * MiB if isinstance(f, dict) and f["ended_by"] == "carve" else 68 * MiB
        ok = (isinstance(f, dict) and f["error"] is not None and "capture" in f["error"]
              and f["gave_back"] >= need and f["ended_by"] != "nobody")
        failed += not ok
        if isinstance(f, dict):
            lines.append(f"- {pool}: a capture the driver invalidated raised ({f['error']}); {f['ended_by']} ended it "
                         f"in the allocator (torch {f['torch']}); the tensors freed after it went back at empty_cache "
                         f"({f['gave_back']} bytes, {need >> 20} MiB needed): {'passed' if ok else 'FAILED'}")
        else:
            lines.append(f"- {pool}: a capture the driver invalidated: FAILED: {str(f)[:600]}")
        # Equal losses prove nothing about carve unless the graph was captured through it.
        begun = r.get("captured_captures")
        ok = same(r.get("captured"), reference.get("captured")) and isinstance(begun, int) and begun > 0
        failed += not ok
        lines.append(f"- {pool}: torch.cuda.graph of a training step: same losses as PyTorch's allocator, {begun} "
                     f"captures begun through carve's pool hooks: {'passed' if ok else 'FAILED: ' + str(r.get('captured', r))[:600]}")
        warned = r.get("compiled_warnings") or []
        ok = (same(r.get("compiled"), reference.get("compiled")) and len(warned) == 1
              and "without CUDA graphs" in warned[0])
        failed += not ok
        lines.append(f"- {pool}: torch.compile(mode=\"reduce-overhead\"): same losses as PyTorch's allocator in that "
                     f"mode (cudagraph trees), compiled without CUDA graphs under carve ({r.get('compiled_captures')} "
                     f"captures, warned: {warned[:1]}): {'passed' if ok else 'FAILED: ' + str(r.get('compiled', r))[:600]}")
        for key, how in (("trees_refused", "Inductor's option"), ("backend_refused", "backend=\"cudagraphs\"")):
            refused = r.get(key) or {}
            ok = "carve_gpu.torch: CUDA graph trees" in str(refused.get("error")) and refused.get("alive") is True
            failed += not ok
            lines.append(f"- {pool}: cudagraph trees asked for through {how}: refused with carve's message, CUDA "
                         f"served on: {'passed' if ok else 'FAILED: ' + str(refused)[:600]}")
        lines.append(f"- {pool}: compiled without CUDA graphs, same losses as PyTorch's allocator: "
                     f"{'yes' if same(r.get('compiled_no_graphs'), reference.get('compiled_no_graphs')) else 'no'} "
                     f"(for the reader: {str(r.get('compiled_no_graphs'))[:300]})")
        left = r.get("live_after_graph")
        ok = isinstance(left, int) and isinstance(kept, int) and left <= max(kept, 0) + MiB
        failed += not ok
        lines.append(f"- {pool}: the graph deleted, its blocks came home ({left} bytes still live, against "
                     f"{kept} under PyTorch's allocator): {'passed' if ok else 'FAILED: ' + str(r)[:300]}")
    for name, r in results.items():  # printed its result, then crashed (at exit, say)
        if "exit" in r:
            failed += 1
            lines.append(f"- {name}: FAILED: {r['exit']}")
    return gpu_children.report(lines, args.report, failed)


if __name__ == "__main__":
    sys.exit(gpu_children.main(__doc__, CHILDREN, run_child, orchestrate))
