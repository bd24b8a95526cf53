#!/usr/bin/env python3
"""The forms tests/trace/pickle_writer.hpp writes are pickles Python's own unpickler reads, each to
the same document, and Python's form is byte for byte what Python's pickle writes for that
document (FRAME, MEMOIZE, SHORT_BINUNICODE, the short ints, LONG1 of minimal length, BINGET and
LONG_BINGET, containers batched as the C pickler batches them), at 64 KiB frames and at 64 bytes.

    check_pickle_forms.py WRITE_PICKLE_FORMS
"""

import os
import pickle
import pickletools
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True

PYTHON_OPCODES = {"FRAME", "MEMOIZE", "SHORT_BINUNICODE", "BININT1", "BININT2", "BININT", "LONG1", "BINGET",
                  "LONG_BINGET", "TUPLE2", "NEWTRUE", "BINFLOAT"}


def python_dumps(obj, protocol, frame_bytes=None):
    """pickle.dumps, with frames of `frame_bytes` where given (the pure-Python pickler's target)."""
    if frame_bytes is None:
        return pickle.dumps(obj, protocol)
    target = pickle._Framer._FRAME_SIZE_TARGET
    pickle._Framer._FRAME_SIZE_TARGET = frame_bytes
    try:
        return pickle._dumps(obj, protocol)
    finally:
        pickle._Framer._FRAME_SIZE_TARGET = target


def main():
    with tempfile.TemporaryDirectory(prefix="carve_pickle_forms_") as work:
        subprocess.run([sys.argv[1], work], check=True)
        names = sorted(f for f in os.listdir(work) if f.endswith(".pickle"))
        data = {name: open(os.path.join(work, name), "rb").read() for name in names}
    if len(names) != 6:
        print(f"FAILED: expected 6 pickles, got {names}")
        return 1
    docs = {name: pickle.loads(blob) for name, blob in data.items()}
    first = docs["python-4.pickle"]
    small = {k: v for k, v in first.items() if k not in ("1001", "1000 pairs")}
    for name, doc in docs.items():
        if doc != (small if name == "python-4-frames-64.pickle" else first):
            print(f"FAILED: {name} reads to another document than python-4.pickle")
            return 1
    if first["1001"] != [3 * i for i in range(1001)] or len(first["1000 pairs"]) != 1000 or first["one"] != [7]:
        print("FAILED: the large and one-item containers read wrong")
        return 1
    segments = first["segments"]
    if (segments[299]["frames"] != [{"filename": "train.py", "line": 42}, "??"] or segments[299]["line"] != 2**64 - 1
            or segments[9]["frames"] != segments[0]["frames"] or segments[10]["frames"] != []):
        print(f"FAILED: unexpected values {segments[299]}")
        return 1
    # Python's form is what Python itself writes for the document it reads back (equal strs read
    # as one object, as PyTorch's keys are): the C pickler (pickle.dumps, what _dump_snapshot
    # runs) at 64 KiB frames, the pure-Python one at 64 bytes.
    for name, protocol, frame in (("python-4.pickle", 4, None), ("python-5.pickle", 5, None),
                                  ("python-4-frames-64.pickle", 4, 64)):
        again = python_dumps(pickle.loads(data[name]), protocol, frame)
        if again != data[name]:
            at = next((i for i, (a, b) in enumerate(zip(again, data[name])) if a != b), min(len(again), len(data[name])))
            print(f"FAILED: {name} differs from Python's own pickle of the same document at byte {at} "
                  f"(Python {again[at:at + 16].hex()}, ours {data[name][at:at + 16].hex()})")
            return 1
    for name in ("python-4.pickle", "python-5.pickle", "python-4-frames-64.pickle"):
        ops = {op.name for op, _, _ in pickletools.genops(data[name])}
        if PYTHON_OPCODES - ops:
            print(f"FAILED: {name} lacks {sorted(PYTHON_OPCODES - ops)}")
            return 1
        shared = pickle.loads(data[name])["segments"]
        if shared[280]["frames"] is not shared[299]["frames"]:
            print(f"FAILED: {name}: the frames list is copied, not shared through the memo")
            return 1
    frames = sum(1 for op, _, _ in pickletools.genops(data["python-4-frames-64.pickle"]) if op.name == "FRAME")
    if frames < 100:
        print(f"FAILED: {frames} frames where a frame every 64 bytes gives more than 100")
        return 1
    blob = data["python-4.pickle"]
    for op, value, pos in pickletools.genops(blob):
        # Python's shortest forms: BININT1/BININT2/BININT where the int fits, else LONG1 of as few
        # bytes as pickle.encode_long gives.
        if op.name == "LONG1" and (-2**31 <= value < 2**31 or blob[pos + 1] != len(pickle.encode_long(value))):
            print(f"FAILED: {value} as LONG1 of {blob[pos + 1]} bytes at byte {pos}")
            return 1
    print(f"{len(names)} forms read alike by Python's unpickler; Python's form has {sorted(PYTHON_OPCODES)}, "
          f"{frames} frames at 64 bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
