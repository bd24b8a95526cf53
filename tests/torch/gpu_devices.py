#!/usr/bin/env python3
"""Tensors moved between two GPUs of one process under carve, for each pool (expandable,
stream-ordered, caching), each in a process of its own; skipped on a machine with one GPU:

- a tensor made on cuda:0 is copied to cuda:1 whole (`.to`), into a tensor already there
  (`copy_`, non-blocking) and through a strided view (a copy kernel that reads the other GPU's
  memory where peer access is on); every copy's sum must equal the source's, and nothing faults;
- the same from cuda:1 to cuda:0, after cuda:0 has mapped more memory (a chunk mapped after the
  two devices first met must be open too);
- under the expandable pool, where the two GPUs reach each other directly, carve reports each
  device's memory open to the other (carve_torch_peer_access): it maps memory for its own device
  only until it sees a second device allocate.

    gpu_devices.py [--library build/gpu/src/torch/libcarve_torch.so] [--report build/gpu/gpu-report.md]

Exit status 0 when every check passed (or the machine has one GPU). Appends its section to --report.
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
    first = torch.arange(N, dtype=torch.float32, device="cuda:0")
    checks["cuda:0 to cuda:1: .to, copy_ and a strided view, the same sums"] = copies_agree(torch, first, "cuda:1")
    grown = torch.ones(8 * N, dtype=torch.float32, device="cuda:0")  # memory mapped after the devices met
    back = torch.arange(N, dtype=torch.float32, device="cuda:1") * 2
    checks["cuda:1 to cuda:0, after cuda:0 mapped more: the same sums"] = copies_agree(torch, back, "cuda:0")
    if pool == "expandable" and torch.cuda.can_device_access_peer(1, 0) and torch.cuda.can_device_access_peer(0, 1):
        rights = (carve.peer_access(first, 1), carve.peer_access(grown, 1), carve.peer_access(back, 0))
        checks["carve opened each device's expandable memory to the other"] = (
            True if rights == ("read_write",) * 3 else f"rights {rights}")
    return {name: (value if value is True else str(value)) for name, value in checks.items()}


def orchestrate(args):
    lines = ["## Tensors between two GPUs through carve (tests/torch/gpu_devices.py)", ""]
    import torch

    if torch.cuda.device_count() < 2:
        lines.append(f"skipped: two GPUs are needed, this machine has {torch.cuda.device_count()}")
        return gpu_children.report(lines, args.report, 0)
    checks, failed = gpu_children.check_lines(gpu_children.run_children(__file__, POOLS, args.library, 300))
    return gpu_children.report(lines + checks, args.report, failed)


if __name__ == "__main__":
    sys.exit(gpu_children.main(__doc__, POOLS, run_child, orchestrate))
