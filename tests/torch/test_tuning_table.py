#!/usr/bin/env python3
"""The table dev.sh gpu keeps beside each model's snapshot (gpu_training_step.write_tuning_table):
carve_replay accepts every allocator it names, and the table holds a row for each and the
headroom sweep.

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
    return 0


if __name__ == "__main__":
    sys.exit(main())
