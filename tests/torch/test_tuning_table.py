#!/usr/bin/env python3
"""The host side of dev.sh gpu's training-step check (gpu_training_step.py) against a real
carve_replay: the table kept beside each model's snapshot (write_tuning_table) holds a row for
every allocator it names and the headroom sweep; and the prediction is asked for the pool the card
ran: `expandable-pool`, or `expandable-pool:partial-maps=0` where the driver maps whole allocations
only (the stats' lending_refused), each read back from its own row and said in the report.

    test_tuning_table.py CARVE_REPLAY SNAPSHOT
"""

import os
import sys
import tempfile

sys.dont_write_bytecode = True  # leaves no __pycache__ beside the scripts
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_training_step as step  # noqa: E402


def main():
    replay, snapshot = sys.argv[1:3]
    with tempfile.TemporaryDirectory(prefix="carve_tuning_") as work:
        path = os.path.join(work, "replay-model.txt")
        step.write_tuning_table(replay, snapshot, path)
        with open(path) as f:
            text = f.read()
    rows = [line.split()[0] for line in text.splitlines() if line.strip()]
    missing = [name for name in step.TUNING.split(",") if name not in rows]
    if missing or "expandable-pool's headroom" not in text:
        print(f"FAILED: rows missing {missing} or no headroom sweep in:\n{text}")
        return 1
    print(f"the tuning table has a row for each of {len(step.TUNING.split(','))} allocators and the headroom sweep")

    for refused in (False, True):
        carve = {"lending_refused": refused, "peak_reserved": 1, "peak_allocated": 1, "step_ms": 1.0, "loss": 1.0,
                 "batch": 1}
        allocator = step.replayed_as(carve)
        if allocator != ("expandable-pool:partial-maps=0" if refused else "expandable-pool"):
            print(f"FAILED: a run with lending_refused={refused} is replayed as {allocator}")
            return 1
        predicted, error = step.predicted_by_replay(replay, snapshot, allocator)
        if error or not predicted:
            print(f"FAILED: carve_replay's prediction as {allocator}: {error}")
            return 1
        carve["predicted"] = carve["peak_reserved"] = predicted
        other = dict(carve, lending_refused=False, predicted=None)
        _, goals, _ = step.judge([("m", {"pytorch": other, "expandable_segments": other, "carve": carve})])
        line = next((g for g in goals if "prediction" in g), "")
        if not line.endswith(": met") or (refused != ("replayed as expandable-pool:partial-maps=0" in line)):
            print(f"FAILED: the prediction's goal line for lending_refused={refused}: {line!r}")
            return 1
        print(f"lending_refused={refused}: predicted as {allocator}, {predicted} bytes")

    # Where the driver maps whole allocations only, the run with cut chunks is replayed as such a
    # pool with max-chunk, reported beside the goals, its loss compared with the others'.
    cut, error = step.predicted_by_replay(replay, snapshot, step.replayed_cut())
    if error or not cut:
        print(f"FAILED: carve_replay's prediction as {step.replayed_cut()}: {error}")
        return 1
    carve = {"lending_refused": True, "peak_reserved": 10, "peak_allocated": 10, "step_ms": 1.0, "loss": 1.0,
             "batch": 1, "predicted": 10}
    base = dict(carve, lending_refused=False, peak_reserved=20, predicted=None)
    run = dict(carve, peak_reserved=cut, peak_allocated=cut, predicted=cut, device_calls=7, loss=1.5,
               later_device_calls=3.0, later_stream_waits=1.0)
    timed = dict(carve, later_device_calls=12.0, later_stream_waits=None)  # stats without the waits
    table, goals, failed = step.judge([("m", {"pytorch": base, "expandable_segments": base, "carve": timed,
                                              step.CUT: run})])
    line = next((g for g in goals if "CARVE_TORCH_MAX_CHUNK=8M" in g), "")
    later = "(each step after the first: 3 driver calls, 1 host waits for a stream)"
    if (not any(f"| {step.CUT} |" in row for row in table) or f"7 device calls {later}" not in line
            or not line.endswith(f"predicted {cut} bytes (met)") or not any(step.CUT in f for f in failed)):
        print(f"FAILED: the cut run's row, line or loss check: {table}, {line!r}, {failed}")
        return 1
    timing = next((g for g in goals if "step time" in g and "CARVE_TORCH" not in g), "")
    if "(each step after the first: 12 driver calls, 0 host waits for a stream): met" not in timing:
        print(f"FAILED: the step time's line does not say what later steps cost: {timing!r}")
        return 1
    print(f"a driver that maps whole allocations only: the cut run is predicted as {step.replayed_cut()}, "
          f"{cut} bytes, and its loss is checked")
    _, error = step.predicted_by_replay(replay, snapshot, "no-such-allocator")
    if error is None:
        print("FAILED: an allocator carve_replay does not know gave a prediction")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
