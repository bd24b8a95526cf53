#!/usr/bin/env python3
"""Tensors moved between two GPUs of one process under carve, for each pool (expandable,
stream-ordered, caching), each in a process of its own; skipped unless the machine has two GPUs
that reach each other directly (peer access: otherwise no copy touches the other GPU's memory):

- tensors made on cuda:0 before cuda:1 allocated anything (memory mapped before the two met), a
  first tensor on cuda:1, then more on cuda:0 (mapped after);
- each way, a copy whole (`.to`), into a tensor already there (`copy_`, non-blocking) and of a
  strided view (a copy kernel on one GPU that reads or writes the other's memory), and a strided
  copy from cuda:1 into the cuda:0 tensor mapped before the two met; every sum must be right and
  nothing may fault;
- under the expandable pool, carve reports each of those tensors' memory open to the other GPU
  (carve_torch_peer_access): it maps memory for its own device only until a second device
  allocates.

    gpu_devices.py [--library build/gpu/src/torch/libcarve_torch.so] [--report build/gpu/gpu-report.md]

Exit status 0 when every check passed, 77 when skipped (dev.sh reports it so). Appends its
section to --report.
"""

import os
import sys

sys.dont_write_bytecode = True  # gpu_children, beside this file, leaves no __pycache__ there
import gpu_children  # noqa: E402

POOLS = ("expandable", "stream-ordered", "caching")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
N = 16 << 20  # float32 elements: 64 MiB per tensor


def copies_agree(torch, source, target_device):
    """Copies `source` to `target_device` three ways; True, or what differed."""
    want = float(source.double().sum().item())
    whole = source.to(target_device)
    into = torch.empty_like(source, device=target_device)
    into.copy_(source, non_blocking=True)
    strided = source[::2].to(target_device)
    torch.cuda.synchronize(source.device)
    torch.cuda.synchronize(target_device)
    got = (float(whole.double().sum().item()), float(into.double().sum().item()))
    want_strided = float(source[::2].double().sum().item())
    if got != (want, want) or float(strided.double().sum().item()) != want_strided:
        return f"sums {got} and {float(strided.double().sum().item())}, not {want} and {want_strided}"
    return True


def run_child(pool, library):
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import torch
    import carve_gpu.torch as carve

    carve.use(pool, library=library)
    checks = {}
    early = torch.arange(N, dtype=torch.float32, device="cuda:0")  # before cuda:1 allocated anything
    landing = torch.zeros(N // 2, dtype=torch.float32, device="cuda:0")
    other = torch.arange(N, dtype=torch.float32, device="cuda:1") * 2  # cuda:1's first allocations
    grown = torch.ones(8 * N, dtype=torch.float32, device="cuda:0")  # mapped after the two met
    checks["cuda:0 to cuda:1: .to, copy_ and a strided view, the same sums"] = copies_agree(torch, early, "cuda:1")
    checks["cuda:1 to cuda:0: .to, copy_ and a strided view, the same sums"] = copies_agree(torch, other, "cuda:0")
    landing.copy_(other[::2])
    torch.cuda.synchronize("cuda:0")
    torch.cuda.synchronize("cuda:1")
    want, got = float(other[::2].double().sum().item()), float(landing.double().sum().item())
    checks["a strided copy from cuda:1 into cuda:0 memory mapped before they met"] = (
        True if got == want else f"sum {got}, not {want}")
    checks["cuda:0 memory mapped after they met is intact"] = float(grown.double().sum().item()) == 8 * N
    if pool == "expandable":
        rights = tuple(carve.peer_access(t, peer) for t, peer in ((early, 1), (landing, 1), (grown, 1), (other, 0)))
        checks["carve opened each device's expandable memory to the other"] = (
            True if rights == ("read_write",) * 4 else f"rights {rights}")
    return {name: (value if value is True else str(value)) for name, value in checks.items()}


def orchestrate(args):
    lines = ["## Tensors between two GPUs through carve (tests/torch/gpu_devices.py)", ""]
    import torch

    if torch.cuda.device_count() < 2:
        lines.append(f"skipped: two GPUs are needed, this machine has {torch.cuda.device_count()}")
        return gpu_children.report(lines, args.report, 0) or gpu_children.SKIPPED
    if not (torch.cuda.can_device_access_peer(0, 1) and torch.cuda.can_device_access_peer(1, 0)):
        lines.append("skipped: cuda:0 and cuda:1 cannot reach each other directly (no peer access), so no copy "
                     "between them touches the other's memory")
        return gpu_children.report(lines, args.report, 0) or gpu_children.SKIPPED
    checks, failed = gpu_children.check_lines(gpu_children.run_children(__file__, POOLS, args.library, 300))
    return gpu_children.report(lines + checks, args.report, failed)


if __name__ == "__main__":
    sys.exit(gpu_children.main(__doc__, POOLS, run_child, orchestrate))
