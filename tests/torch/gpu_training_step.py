#!/usr/bin/env python3
"""A real training step under three allocators, on a GPU: what `bash cmake/dev.sh gpu` runs for
libcarve_torch.

Three models, a few steps each at a batch that fills a good part of the card: a GPT-2-small-sized
transformer from `transformers` (random weights), `timm`'s ResNet-50, and the same transformer
trained on a sequence length that changes every step (drawn from 128 to 1024 tokens, the same
draws in every run), whose requests change size from step to step. Each runs three times, in a
process of its own: PyTorch's default caching allocator, PyTorch with
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, and carve's expandable pool through
carve_gpu.torch.use(). Same seed, PyTorch's deterministic algorithms, TF32 off: the same
arithmetic on different memory, so the loss after the last step must agree to 1e-6 relative.
Recorded per run: peak reserved (PyTorch's max_memory_reserved; carve's from its stats), peak
allocated, the median step time after the first step, the final loss. A fourth run, under the
default allocator, records its allocations (torch.cuda.memory._record_memory_history) and dumps
the snapshot, which carve_replay replays: its prediction of carve's peak reserved must equal
what carve reserved on the card. Where carve's stats say the driver maps whole allocations only
(lending_refused), carve runs once more with CARVE_TORCH_MAX_CHUNK=8M, reported beside the
goals. Finally, carve_gpu.torch.use() after CUDA was initialised must
refuse with a clear message.

    gpu_training_step.py --library build/gpu/src/torch/libcarve_torch.so \\
        --replay build/gpu/examples/carve_replay --report build/gpu/gpu-report.md

Appends a markdown section to --report (and prints it); exits non-zero when a run failed, the
losses disagree or the late install was not refused. The goals, per model (carve's peak reserved
at most 1.01x its peak allocated and below both PyTorch modes, step time within 2% of the default
allocator, carve_replay's prediction equal to what the card reserved), are reported met or MISSED
without failing the run.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True  # gpu_children, beside this file, leaves no __pycache__ there
import gpu_children  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODES = ("pytorch", "expandable_segments", "carve")
# Where the driver maps whole allocations only (carve's stats say lending_refused), carve runs once
# more with its chunks cut into allocations of at most this size (ExpandablePoolOptions::
# max_chunk_bytes), the setting docs/replay.md offers such a card, reported beside the goals.
CUT = "carve-cut"
CUT_MAX_CHUNK = 8 << 20
MODELS = ("gpt2", "resnet50", "varlen")
RESERVED_PER_ALLOCATED = 1.01  # goal: carve's peak reserved over its peak allocated
SLOWER_THAN_DEFAULT = 1.02  # goal: carve's step time over PyTorch's default allocator's
GiB = float(1 << 30)


def make_model(name, batch, torch):
    """The model and a function that runs one forward pass and returns the loss."""
    generator = torch.Generator(device="cpu").manual_seed(1234)
    if name in ("gpt2", "varlen"):
        import transformers
        config = transformers.GPT2Config(n_layer=12, n_head=12, n_embd=768, n_positions=1024, vocab_size=50257)
        model = transformers.GPT2LMHeadModel(config).cuda()
        if name == "gpt2":
            tokens = torch.randint(0, config.vocab_size, (batch, 1024), generator=generator).cuda()
            return model, lambda: model(input_ids=tokens, labels=tokens).loss

        def forward():  # a new length each step: every activation changes size
            length = int(torch.randint(128, 1025, (1,), generator=generator))
            tokens = torch.randint(0, config.vocab_size, (batch, length), generator=generator).cuda()
            return model(input_ids=tokens, labels=tokens).loss
        return model, forward
    import timm
    model = timm.create_model("resnet50", pretrained=False, num_classes=1000).cuda()
    images = torch.randn(batch, 3, 224, 224, generator=generator).cuda()
    labels = torch.randint(0, 1000, (batch,), generator=generator).cuda()
    return model, lambda: torch.nn.functional.cross_entropy(model(images), labels)


def run_child(args):
    """One model under one allocator, in this process; prints one JSON line."""
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"  # deterministic cuBLAS
    carve = None
    if args.mode == "carve":
        sys.path.insert(0, os.path.join(ROOT, "python"))
        import carve_gpu.torch as carve
        carve.use("expandable", library=args.library)
    import torch
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    # With warn_only, the fused attention kernels' backward stays non-deterministic: the math one.
    torch.backends.cuda.enable_flash_sdp(False)
    torch.backends.cuda.enable_mem_efficient_sdp(False)
    if hasattr(torch.backends.cuda, "enable_cudnn_sdp"):
        torch.backends.cuda.enable_cudnn_sdp(False)
    if args.snapshot:
        # Python frames only: carve_replay reads no frames, and C++ ones take minutes to symbolise.
        torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="python")
    model, forward = make_model(args.model, args.batch, torch)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    times = []
    loss = None
    after_first = None  # carve's stats after the first step, which maps most of the memory
    for _ in range(args.steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        loss = forward()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        if carve is not None and after_first is None:
            after_first = carve.memory_stats(torch.cuda.current_device())
    result = {"model": args.model, "mode": args.mode, "batch": args.batch, "loss": float(loss.item()),
              "step_ms": 1e3 * statistics.median(times[1:] if len(times) > 1 else times)}
    if args.snapshot:
        torch.cuda.memory._dump_snapshot(args.snapshot)
        torch.cuda.memory._record_memory_history(enabled=None)
    if carve is not None:
        stats = carve.memory_stats(torch.cuda.current_device())
        result.update(peak_reserved=stats["peak_reserved_bytes"], peak_allocated=stats["peak_live_bytes"],
                      device_calls=stats["device_calls"], failures=stats["failures"],
                      device_failures=stats.get("device_failures", 0),
                      lending_refused=stats.get("lending_refused", False), lent_bytes=stats.get("lent_bytes"),
                      max_chunk_bytes=stats.get("max_chunk_bytes"), stream_waits=stats.get("stream_waits"))
        if args.steps > 1:  # what each later step costs: the driver calls and host syncs the median step pays
            result.update({f"later_{key}": (stats.get(key, 0) - after_first.get(key, 0)) / (args.steps - 1)
                           for key in ("device_calls", "stream_waits")})
    else:
        result.update(peak_reserved=torch.cuda.max_memory_reserved(), peak_allocated=torch.cuda.max_memory_allocated())
    print(json.dumps(result), flush=True)


def run_late_install(args):
    """carve_gpu.torch.use() after PyTorch's allocator initialised CUDA: must refuse, saying why."""
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import torch
    import carve_gpu.torch as carve
    torch.zeros(1, device="cuda")
    try:
        carve.use(library=args.library)
    except RuntimeError as e:
        print(json.dumps({"refused": "already initialised" in str(e), "message": str(e)}), flush=True)
        return
    print(json.dumps({"refused": False, "message": "use() succeeded after CUDA was initialised"}), flush=True)


def child(argv, env=None, timeout=300, label=None):
    """One run in a process of its own: (its JSON, None), (None, why not) or (its JSON, how it
    crashed after printing it); printed as it ends, under `label` (default: its arguments)."""
    result, error = gpu_children.run_child_process([sys.executable, os.path.abspath(__file__)] + argv, timeout, env)
    print(f"gpu_training_step {label or ' '.join(argv[1:6])}: "
          f"{json.dumps(result) if result is not None else error[-500:]}", flush=True)
    return result, error


def replayed_as(carve):
    """The carve_replay allocator that replays the pool the card ran (`carve`: the child's JSON).
    Where the driver maps whole allocations only (the pool asked it when it was made: CUDA documents
    that cuMemMap's offset must be 0), no hole is lent, and the replay's mapper says the same
    (partial-maps=0)."""
    return "expandable-pool:partial-maps=0" if carve.get("lending_refused") else "expandable-pool"


def replayed_cut():
    """The carve_replay allocator that replays the CUT run."""
    return f"expandable-pool:partial-maps=0:max-chunk={CUT_MAX_CHUNK}"


def predicted_by_replay(replay, snapshot, allocator="expandable-pool"):
    """carve_replay's peak reserved for `allocator` on `snapshot`: (bytes, None) or (None, why
    not). Any failure is this model's, never the end of the script (whose report would be lost)."""
    try:
        out = subprocess.run([replay, snapshot, "--allocators", allocator, "--json", "--no-smallest-card"],
                             capture_output=True, text=True, timeout=300)
        if out.returncode != 0:
            return None, f"exit {out.returncode}: {out.stderr[-1000:]}"
        for row in json.loads(out.stdout)["allocators"]:
            if row["name"] == allocator:
                return row["peak_reserved_bytes"], None
        return None, f"carve_replay printed no {allocator} row"
    except (OSError, subprocess.SubprocessError, ValueError, KeyError, TypeError) as e:
        return None, f"{type(e).__name__}: {e}"


# What the kept snapshots are for: expandable-pool's reserve beside the floor it could reach (each
# granule mapped only while a live block touches it: growth=0:release=0) and
# PyTorch's, at other chunk sizes (growth) and headrooms (printed by carve_replay after the rows).
TUNING = ("pytorch-expandable-model,expandable-pool,expandable-pool-exact,"
          "expandable-pool:growth=96,expandable-pool:growth=192,expandable-pool:growth=384,"
          "expandable-pool:min-chunk=20MiB:growth=0,expandable-pool:growth=0:release=0")


def write_tuning_table(replay, snapshot, path):
    """carve_replay's rows and headroom sweep on `snapshot` for the TUNING allocators, into `path`
    (its error instead, if it fails): the table comes back beside the report even where the
    snapshot itself is too large to."""
    try:
        out = subprocess.run([replay, snapshot, "--allocators", TUNING, "--no-smallest-card"],
                             capture_output=True, text=True, timeout=240)
        text = out.stdout if out.returncode == 0 else f"exit {out.returncode}: {out.stderr[-2000:]}"
    except (OSError, subprocess.SubprocessError) as e:
        text = f"{type(e).__name__}: {e}"
    with open(path, "w") as f:
        f.write(text)


def judge(rows):
    """The table, the goal lines and the failures (losses that disagree) for `rows`: a list of
    (model, {mode: the child's JSON, with "predicted" added to carve's where the replay ran})."""
    table = ["| model | allocator | peak reserved | peak allocated | reserved / allocated | step time | final loss |"
             " carve_replay's prediction |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    goals, failed = [], []
    for model, results in rows:
        base = results.get("pytorch")
        for mode in MODES + ((CUT,) if CUT in results else ()):
            r = results.get(mode)
            if not r or "loss" not in r:
                table.append(f"| {model} | {mode} | failed | | | | | |")
                continue
            predicted = r.get("predicted")
            prediction = (f"{predicted / GiB:.3f} GiB ({predicted / r['peak_reserved']:.3f}x actual)"
                          if predicted else "")
            table.append(f"| {model} (batch {r['batch']}) | {mode} | {r['peak_reserved'] / GiB:.3f} GiB | "
                         f"{r['peak_allocated'] / GiB:.3f} GiB | {r['peak_reserved'] / r['peak_allocated']:.3f}x | "
                         f"{r['step_ms']:.1f} ms | {r['loss']:.9g} | {prediction} |")
            if base and mode != "pytorch":
                relative = abs(r["loss"] - base["loss"]) / max(abs(base["loss"]), 1e-30)
                if relative > 1e-6:
                    failed.append(f"{model}: loss under {mode} {r['loss']!r} differs from PyTorch's {base['loss']!r} "
                                  f"by {relative:.3g} relative (limit 1e-6)")
        carve, expandable = results.get("carve"), results.get("expandable_segments")
        if not (base and carve and expandable and "loss" in carve):
            goals.append(f"- {model}: MISSED, not every allocator's run completed")
            continue
        ratio = carve["peak_reserved"] / carve["peak_allocated"]
        below = carve["peak_reserved"] < min(base["peak_reserved"], expandable["peak_reserved"])
        slower = carve["step_ms"] / base["step_ms"]
        goals += [f"- {model}: carve's peak reserved {ratio:.4f}x its peak allocated (target <= "
                  f"{RESERVED_PER_ALLOCATED}x): {met(ratio <= RESERVED_PER_ALLOCATED)}",
                  f"- {model}: carve's peak reserved {carve['peak_reserved'] / GiB:.3f} GiB below PyTorch's "
                  f"expandable_segments ({expandable['peak_reserved'] / GiB:.3f} GiB) and default "
                  f"({base['peak_reserved'] / GiB:.3f} GiB): {met(below)}",
                  f"- {model}: step time {slower:.3f}x PyTorch's default (target <= {SLOWER_THAN_DEFAULT}x)"
                  f"{later_step_costs(carve)}: {met(slower <= SLOWER_THAN_DEFAULT)}"]
        answer = ("maps whole allocations only (carve lent no holes)" if carve.get("lending_refused")
                  else f"maps part of an allocation ({carve.get('lent_bytes')} bytes lent at the end)")
        goals.append(f"- {model}: the driver {answer}")
        predicted = carve.get("predicted")
        if predicted is not None:
            refused = (" (the driver maps whole allocations only, so carve lent no holes: replayed as "
                       f"{replayed_as(carve)})" if carve.get("lending_refused") else "")
            if carve.get("device_failures"):  # a refusal the replay does not play explains a difference
                refused += f" ({carve['device_failures']} driver calls refused on the card)"
            goals.append(f"- {model}: carve_replay's prediction {predicted} bytes equals what the card reserved "
                         f"({carve['peak_reserved']} bytes){refused}: {met(predicted == carve['peak_reserved'])}")
        cut = results.get(CUT)
        if cut and "loss" in cut:
            line = (f"- {model}, a setting for this driver, not the default: with CARVE_TORCH_MAX_CHUNK="
                    f"{CUT_MAX_CHUNK >> 20}M carve reserves {cut['peak_reserved'] / cut['peak_allocated']:.4f}x its "
                    f"peak allocated ({met(cut['peak_reserved'] <= RESERVED_PER_ALLOCATED * cut['peak_allocated'])}), "
                    f"{cut['peak_reserved'] / GiB:.3f} GiB ("
                    f"{met(cut['peak_reserved'] < min(base['peak_reserved'], expandable['peak_reserved']))} below "
                    f"both PyTorch modes), step time {cut['step_ms'] / base['step_ms']:.3f}x the default's "
                    f"({met(cut['step_ms'] <= SLOWER_THAN_DEFAULT * base['step_ms'])}), {cut['device_calls']} "
                    f"device calls{later_step_costs(cut)}")
            if cut.get("predicted") is not None:
                line += (f"; carve_replay as {replayed_cut()} predicted {cut['predicted']} bytes "
                         f"({met(cut['predicted'] == cut['peak_reserved'])})")
            goals.append(line)
    return table, goals, failed


def later_step_costs(run):
    """What each step after the first cost carve (a run's later_* figures), where the run has them:
    the driver calls (each tens of microseconds) and the host syncs with a stream before an unmap
    (each lets the GPU run dry while the host catches up) that its step time pays for."""
    if run.get("later_device_calls") is None:
        return ""
    return (f" (each step after the first: {run['later_device_calls']:.0f} driver calls, "
            f"{run.get('later_stream_waits') or 0:.0f} host waits for a stream)")


def without_allocator_settings(environ):
    """The environment less PyTorch's allocator settings (PYTORCH_ALLOC_CONF is the newer name of
    PYTORCH_CUDA_ALLOC_CONF) and carve's pool settings (CARVE_TORCH_*, where the library is found
    kept), so that each run gets only the allocator it names, with the settings it names."""
    return {k: v for k, v in environ.items() if k not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
            and (not k.startswith("CARVE_TORCH_") or k == "CARVE_TORCH_LIBRARY")}


def met(ok):
    return "met" if ok else "MISSED"


def keep_snapshot(snapshot, kept):
    """Copies `snapshot`, gzip-compressed, to `kept` (a copy that fails is reported, not fatal)."""
    import gzip
    import shutil
    try:
        with open(snapshot, "rb") as src, gzip.open(kept, "wb") as dst:
            shutil.copyfileobj(src, dst)
    except OSError as e:
        print(f"gpu_training_step: could not keep {snapshot} as {kept}: {e}", file=sys.stderr)


def orchestrate(args):
    lines = ["## A real training step under PyTorch's allocators and carve (tests/torch/gpu_training_step.py)", ""]
    failed = []
    work = tempfile.mkdtemp(prefix="carve_gpu_step_")
    batches = {"gpt2": args.gpt2_batch, "resnet50": args.resnet_batch, "varlen": args.varlen_batch}
    library = ["--library", args.library] if args.library else []

    def step_argv(model, mode, *extra):  # one child's command line
        return ["--child", "--model", model, "--mode", mode, "--batch", str(batches[model]), "--steps",
                str(args.steps), *extra] + library
    rows = []
    for model in args.models.split(","):
        results = {}
        for mode in MODES:
            env = without_allocator_settings(os.environ)
            if mode == "expandable_segments":
                env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
            result, error = child(step_argv(model, mode), env)
            if error:  # no result, or a crash after it
                failed.append(f"{model} under {mode}: {error}")
            if result is None:
                continue
            results[mode] = result
        if results.get("carve", {}).get("lending_refused"):
            env = dict(without_allocator_settings(os.environ), CARVE_TORCH_MAX_CHUNK=str(CUT_MAX_CHUNK))
            result, error = child(step_argv(model, "carve"), env, label=f"--model {model} --mode {CUT}")
            if error:
                failed.append(f"{model} under {CUT}: {error}")
            if result is not None:
                results[CUT] = result
        if args.replay and "carve" in results:
            # The requests, recorded in a run of their own (recording slows the steps it records).
            snapshot = os.path.join(work, f"{model}.pickle")
            recorded, error = child(step_argv(model, "pytorch", "--snapshot", snapshot),
                                    without_allocator_settings(os.environ))
            predicted = None
            if error:
                failed.append(f"{model}, recording the snapshot: {error}")
            if recorded is not None:
                predicted, error = predicted_by_replay(args.replay, snapshot, replayed_as(results["carve"]))
                if error:
                    failed.append(f"carve_replay on {model}: {error}")
                if CUT in results:
                    cut, error = predicted_by_replay(args.replay, snapshot, replayed_cut())
                    results[CUT]["predicted"] = cut
                    if error:
                        failed.append(f"carve_replay on {model} as {replayed_cut()}: {error}")
                if args.keep_snapshots:  # the real snapshots the replay work tunes against
                    keep_snapshot(snapshot, os.path.join(args.keep_snapshots, f"snapshot-{model}.pickle.gz"))
                    write_tuning_table(args.replay, snapshot, os.path.join(args.keep_snapshots, f"replay-{model}.txt"))
            results["carve"]["predicted"] = predicted
        rows.append((model, results))
        if args.report:  # each model's results as it ends: a run cut short keeps what it measured
            with open(args.report, "a") as f:
                f.write(f"\ngpu_training_step {model}: {json.dumps(results)}\n")

    table, goals, disagree = judge(rows)
    lines += table
    failed += disagree
    late, error = child(["--late-install"] + library, dict(os.environ), timeout=300)
    if late is None or not late.get("refused"):
        failed.append("carve_gpu.torch.use() after CUDA was initialised: " + (error or str(late)))
    else:
        goals.append("- carve_gpu.torch.use() after CUDA was initialised refuses: " + late["message"])
        if error:
            failed.append("carve_gpu.torch.use() after CUDA was initialised: " + error)
    lines += ["", *goals, ""]
    lines += [f"- FAILED: {f}" for f in failed] or ["All runs completed and the final losses agree to 1e-6."]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.report:
        with open(args.report, "a") as f:
            f.write("\n" + text)
    return 1 if failed else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--library", default=os.environ.get("CARVE_TORCH_LIBRARY"),
                        help="libcarve_torch.so (default: carve_gpu's search)")
    parser.add_argument("--replay", help="the carve_replay program (no prediction without it)")
    parser.add_argument("--report", help="a markdown file to append the table to")
    parser.add_argument("--keep-snapshots", help="a folder to keep each model's recorded snapshot in (gzip)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--models", default=",".join(MODELS), help=f"a comma-separated subset of {','.join(MODELS)}")
    parser.add_argument("--gpt2-batch", type=int, default=8, help="sequences of 1024 tokens per step")
    parser.add_argument("--resnet-batch", type=int, default=256, help="224x224 images per step")
    parser.add_argument("--varlen-batch", type=int, default=8, help="sequences per step, 128 to 1024 tokens each")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--late-install", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", choices=MODELS, help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--snapshot", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.child and not all(m in MODELS for m in args.models.split(",")):
        parser.error(f"--models: {args.models!r} is not a comma-separated subset of {','.join(MODELS)}")
    if args.child:
        run_child(args)
    elif args.late_install:
        run_late_install(args)
    else:
        sys.exit(orchestrate(args))


if __name__ == "__main__":
    main()
