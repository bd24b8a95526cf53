#!/usr/bin/env python3
"""A refusal of carve's, as a PyTorch user meets it: carve_torch_errors (torch_errors_module.cpp)
allocates through libcarve_torch_oom inside PyTorch's own error translation, on the host backend
under CARVE_TORCH_MAX_RESERVED=64M (set by ctest, with the pool).

- the refusal is torch.cuda.OutOfMemoryError (and torch.OutOfMemoryError where this PyTorch has
  it), a RuntimeError with one argument that begins "CUDA out of memory. Tried to allocate 3.00 GiB."
  and says what carve holds; the checks by which Lightning and accelerate decide to shrink a batch
  accept it;
- the blocks that existed are intact, later requests are served, and a batch-size search that
  halves on such errors (as both tools do) ends under the cap;
- a zero-byte request is no error;
- a device that fails every call (after a kernel faulted) refuses with a RuntimeError that is not
  out-of-memory and that neither tool takes for one.

    test_torch_oom.py <directory of carve_torch_errors>
"""

import ctypes
import sys

sys.path.insert(0, sys.argv[1])
sys.dont_write_bytecode = True

import torch  # noqa: E402  (after the path: the module links PyTorch's libraries)
import carve_torch_errors as carve  # noqa: E402

from oom_checks import accelerate_should_reduce, lightning_is_oom  # noqa: E402  (beside this file)

MiB = 1 << 20
STREAM = 7


def check(condition, message):
    if not condition:
        raise AssertionError(message)


def main():
    kept = carve.malloc(16 * MiB, 0, STREAM)
    ctypes.memset(kept, 0x5A, 16 * MiB)
    try:
        carve.malloc(3 << 30, 0, STREAM)
        raise AssertionError("3 GiB under a 64 MiB cap was served")
    except torch.cuda.OutOfMemoryError as e:
        refusal = e
    message = refusal.args[0]
    print("refusal:", type(refusal).__module__ + "." + type(refusal).__name__, "-", message)
    check(message.startswith("CUDA out of memory. Tried to allocate 3.00 GiB. GPU 0: carve's "), message)
    check("16.00 MiB of it in 1 live blocks" in message and "cap of 64.00 MiB" in message, message)
    check("gave back" in message, message)
    if hasattr(torch, "OutOfMemoryError"):
        check(isinstance(refusal, torch.OutOfMemoryError), "not a torch.OutOfMemoryError")
    check(lightning_is_oom(refusal), "Lightning's check refuses it")
    check(accelerate_should_reduce(refusal), "accelerate's check refuses it")

    check(ctypes.string_at(kept, 1) == b"\x5a" and ctypes.string_at(kept + 16 * MiB - 1, 1) == b"\x5a",
          "a block that existed before the refusal changed")
    later = carve.malloc(32 * MiB, 0, STREAM)
    check(later != 0, "a request that fits was not served after a refusal")
    carve.free(later, 32 * MiB, 0, STREAM)
    carve.free(kept, 16 * MiB, 0, STREAM)

    batch, refusals = 1 << 30, 0
    while True:
        try:
            block = carve.malloc(batch, 0, STREAM)
            ctypes.memset(block, 1, batch)
            carve.free(block, batch, 0, STREAM)
            break
        except RuntimeError as e:
            check(accelerate_should_reduce(e) and lightning_is_oom(e), f"not an out-of-memory error: {e!r}")
            refusals += 1
            batch //= 2
            check(batch >= MiB, "the search ran out of batch sizes")
    check(32 * MiB <= batch <= 64 * MiB and refusals >= 4, f"served {batch} bytes after {refusals} refusals")
    print(f"batch-size search: served {batch // MiB} MiB after {refusals} refusals")

    check(carve.malloc(0, 0, STREAM) == 0, "a zero-byte request")

    # A request the pool refuses (on a broken GPU every request is; the host twin's memory is fine).
    carve.set_fault("CUDA error: an illegal memory access was encountered")
    try:
        carve.malloc(3 << 30, 0, STREAM)
        raise AssertionError("a broken device served a request")
    except RuntimeError as e:
        fault = e
    finally:
        carve.set_fault(None)
    print("broken device:", type(fault).__module__ + "." + type(fault).__name__, "-", fault.args[0])
    check(not isinstance(fault, torch.cuda.OutOfMemoryError), "a broken device's refusal is out-of-memory")
    check(fault.args[0].startswith("CUDA error: an illegal memory access was encountered."), fault.args[0])
    check(not lightning_is_oom(fault) and not accelerate_should_reduce(fault),
          "a batch-size finder would retry on a broken device")
    print("every check passed")


if __name__ == "__main__":
    main()
