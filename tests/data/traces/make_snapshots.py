#!/usr/bin/env python3
"""Writes the small PyTorch memory snapshots carve's tests replay, and the bad ones they refuse.

    python3 tests/data/traces/make_snapshots.py        (from the repository root; standard library only)

A snapshot is what torch.cuda.memory._dump_snapshot() writes: a pickled dict with `segments` (the
allocator's segments at the end, each with its blocks) and `device_traces` (per device, the events
recorded). Here a small caching allocator with PyTorch's rules (512-byte rounding, 2 MiB segments
for requests up to 1 MiB, 20 MiB below 10 MiB, larger ones rounded to 2 MiB, best fit per stream,
splits, merges) serves a made-up training loop on two streams. Recording starts after the first
operations, as it does in a real program, so some blocks freed in the trace were allocated before
it. The figures the tests check (`small_snapshot.expected`) are taken from the simulation itself,
not from the trace, so the reader's reconstruction of the start state is checked against the truth.

The files are committed; run this again only to change them (the output is deterministic).
"""
import os
import pickle
import random

MiB = 1 << 20
HERE = os.path.dirname(os.path.abspath(__file__))


class Allocator:
    """PyTorch's default caching allocator, small enough to read."""

    def __init__(self):
        self.next_address = 0x7F0000000000
        self.segments = []   # dicts: address, size, stream, blocks (list of [address, size, requested or None])
        self.live = {}       # address -> (segment, requested size, stream)
        self.events = []
        self.recording = False

    def record(self, action, addr, size, stream):
        if self.recording:
            self.events.append({"action": action, "addr": addr, "size": size, "stream": stream,
                                "time_us": len(self.events) * 10,
                                "frames": [{"filename": "train.py", "line": 42, "name": "step"}]})

    @staticmethod
    def rounded(n):
        return max(512, (n + 511) // 512 * 512)

    def allocate(self, requested, stream):
        size = self.rounded(requested)
        small = size <= MiB
        best = None
        for seg in self.segments:
            if seg["stream"] != stream or seg["small"] != small:
                continue
            for block in seg["blocks"]:
                if block[2] is None and block[1] >= size and (best is None or (block[1], block[0]) < (best[1][1], best[1][0])):
                    best = (seg, block)
        if best is None:
            total = 2 * MiB if small else (20 * MiB if size < 10 * MiB else (size + 2 * MiB - 1) // (2 * MiB) * 2 * MiB)
            seg = {"address": self.next_address, "size": total, "stream": stream, "small": small,
                   "blocks": [[self.next_address, total, None]]}
            self.next_address += total + 64 * MiB
            self.segments.append(seg)
            self.record("segment_alloc", seg["address"], total, stream)
            best = (seg, seg["blocks"][0])
        seg, block = best
        rest = block[1] - size
        if (small and rest >= 512) or (not small and rest > MiB):
            i = seg["blocks"].index(block)
            seg["blocks"].insert(i + 1, [block[0] + size, rest, None])
            block[1] = size
        block[2] = requested
        self.live[block[0]] = (seg, requested, stream)
        self.record("alloc", block[0], requested, stream)
        return block[0]

    def free(self, address):
        seg, requested, stream = self.live.pop(address)
        self.record("free_requested", address, requested, stream)
        self.record("free_completed", address, requested, stream)
        blocks = seg["blocks"]
        i = next(k for k, b in enumerate(blocks) if b[0] == address)
        blocks[i][2] = None
        if i + 1 < len(blocks) and blocks[i + 1][2] is None:
            blocks[i][1] += blocks.pop(i + 1)[1]
        if i > 0 and blocks[i - 1][2] is None:
            blocks[i - 1][1] += blocks.pop(i)[1]

    def snapshot(self):
        segments = []
        for seg in self.segments:
            blocks = [{"address": b[0], "size": b[1], "requested_size": b[2] if b[2] is not None else 0,
                       "state": "active_allocated" if b[2] is not None else "inactive", "frames": []}
                      for b in seg["blocks"]]
            allocated = sum(b[1] for b in seg["blocks"] if b[2] is not None)
            segments.append({"device": 0, "address": seg["address"], "total_size": seg["size"],
                             "allocated_size": allocated, "active_size": allocated, "requested_size": allocated,
                             "stream": seg["stream"], "segment_type": "small" if seg["small"] else "large",
                             "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": blocks})
        return {"segments": segments, "device_traces": [self.events, []]}


def training_loop(seed):
    """Weights live throughout; each step allocates activations layer by layer, frees them in
    reverse with gradients in between; a second stream copies small buffers."""
    rng = random.Random(seed)
    a = Allocator()
    weights = [a.allocate(rng.choice([4 * MiB, 12 * MiB + 4096, 800 * 1024]), 0) for _ in range(6)]
    figures = {}
    ops = 0
    for step in range(4):
        if step == 1:  # recording starts here: what is live now is the start state
            a.recording = True
            figures["start_live_bytes"] = sum(r for _, r, _ in a.live.values())
            figures["start_blocks"] = len(a.live)
            figures["start_segments"] = len(a.segments)
            figures["start_segment_bytes"] = sum(seg["size"] for seg in a.segments)
            live_bytes = figures["start_live_bytes"]
            peak = live_bytes
            allocations = 0
        activations = []
        for layer in range(8):
            # Activations grow with the step (a longer sequence each time), so that the recorded
            # steps need segments the first step did not make.
            size = rng.choice([300 * 1000, 2 * MiB + 1000, 6 * MiB, 9000, 15 * MiB + 123]) * (2 + step) // 2
            stream = 1 if layer % 4 == 3 else 0
            activations.append((a.allocate(size, stream), size))
            if step >= 1:
                allocations += 1
                live_bytes += size
                peak = max(peak, live_bytes)
            if layer % 3 == 2:
                scratch = a.allocate(rng.randrange(1, 70000), 0)
                if step >= 1:
                    allocations += 1
                    live_bytes += a.live[scratch][1]
                    peak = max(peak, live_bytes)
                    live_bytes -= a.live[scratch][1]
                a.free(scratch)
        for address, size in reversed(activations):
            a.free(address)
            if step >= 1:
                live_bytes -= size
        ops += 1
    figures["allocations"] = allocations
    figures["peak_live_bytes"] = peak
    reserved = sum(s["size"] for s in a.segments)
    figures["recorded_peak_bytes"] = reserved  # this allocator never frees a segment
    figures["recorded_device_calls"] = sum(1 for e in a.events if e["action"] == "segment_alloc")
    return a.snapshot(), figures


def write(name, data):
    with open(os.path.join(HERE, name), "wb") as f:
        f.write(data)


def main():
    snapshot, figures = training_loop(5)
    good = pickle.dumps(snapshot, protocol=4)
    write("small_snapshot.pickle", good)
    with open(os.path.join(HERE, "small_snapshot.expected"), "w") as f:
        f.write("# Figures of small_snapshot.pickle from the simulation that wrote it (make_snapshots.py)\n")
        for key in sorted(figures):
            f.write(f"{key} {figures[key]}\n")

    bad = os.path.join(HERE, "bad")
    os.makedirs(bad, exist_ok=True)

    def variant(name, edit):
        s = pickle.loads(good)  # the tests' own file: safe to load here
        edit(s["device_traces"][0])
        write(os.path.join("bad", name), pickle.dumps(s, protocol=4))

    # Expandable segments record maps and unmaps instead of segment allocations and frees.
    expandable = pickle.loads(good)
    events = expandable["device_traces"][0]
    for e in events:
        if e["action"] == "segment_alloc":
            e["action"] = "segment_map"
    events.append({"action": "segment_unmap", "addr": expandable["segments"][-1]["address"], "size": 2 * MiB,
                   "stream": 0, "time_us": 99999})
    expandable["segments"][-1]["total_size"] -= 2 * MiB
    write("expandable_snapshot.pickle", pickle.dumps(expandable, protocol=4))

    write("bad/truncated.pickle", good[: len(good) // 2])
    # A global naming code, then a call: what a malicious file does. The reader stops at the global.
    write("bad/global_call.pickle", b"\x80\x02cos\nsystem\nq\x00X\x1e\x00\x00\x00touch carve_replay_was_tricked\x85R.")
    # A call with no global: REDUCE applied to a string.
    write("bad/call.pickle", b"\x80\x02X\x04\x00\x00\x00evalX\x04\x00\x00\x00argsq\x00\x85R.")

    def wrong_type(events):
        first_alloc = next(e for e in events if e["action"] == "alloc")
        first_alloc["size"] = "4096"
    variant("wrong_type.pickle", wrong_type)

    def zero_size(events):
        events.insert(3, {"action": "alloc", "addr": 0x10000, "size": 0, "stream": 0})
    variant("zero_size.pickle", zero_size)

    def huge_size(events):
        events.insert(3, {"action": "alloc", "addr": 0x10000, "size": (1 << 62) + 1, "stream": 0})
        events.insert(4, {"action": "free_completed", "addr": 0x10000, "size": (1 << 62) + 1, "stream": 0})
    variant("huge_size.pickle", huge_size)

    def double_free(events):
        i = next(k for k, e in enumerate(events) if e["action"] == "free_completed")
        events.insert(i + 1, dict(events[i]))
    variant("double_free.pickle", double_free)

    # RMM's log and carve's CSV with a free of an address never allocated.
    with open(os.path.join(bad, "unknown_free.rmm.csv"), "w") as f:
        f.write("Thread,Time,Action,Pointer,Size,Stream\n")
        f.write("140573312345856,10:30:45.123456,allocate,0x7f8a40000000,1024,0x0\n")
        f.write("140573312345856,10:30:45.123460,free,0x7f8a40000400,1024,0x0\n")


if __name__ == "__main__":
    main()
