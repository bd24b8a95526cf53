"""What the GPU scripts of tests/torch share: each check runs in a child process of its own (the
allocator is chosen once per process), prints one JSON object as its last line, and the parent
appends a markdown section to the report.

    import gpu_children
    gpu_children.main(__doc__, ("expandable", "caching"), run_child, orchestrate)
"""

import argparse
import json
import os
import subprocess
import sys

SKIPPED = 77  # the exit status of a script that could not run here (dev.sh reports "skipped")


def run_child_process(argv, timeout, env=None):
    """Runs one child; (its last JSON line as a dict, None), (None, why not), or, for a child that
    printed its JSON and then ended badly (a crash at exit, say), (the JSON, what went wrong). A
    child that hangs or ends badly is an error of that child, never the end of the whole script
    (whose report would then be lost)."""
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout} s"
    ended = f"the process ended with {out.returncode}: {(out.stderr or out.stdout)[-1500:]!r}"
    for line in reversed(out.stdout.splitlines()):
        if line.startswith("{"):
            try:
                result = json.loads(line)
            except json.JSONDecodeError:
                break
            return result, None if out.returncode == 0 else "after printing its result, " + ended
    return None, ended


def run_children(script, names, library, timeout):
    """Runs `script --child NAME [--library L]` for each name; {name: its JSON, or {"error": why}}.
    Prints a line as each ends, so that a run cut short still shows how far it got."""
    results = {}
    for name in names:
        argv = [sys.executable, os.path.abspath(script), "--child", name]
        if library:
            argv += ["--library", library]
        result, error = run_child_process(argv, timeout)
        if result is None:
            result = {"error": error}
        elif error:  # a crash at exit is a failure too: one more check, which fails
            result["exit"] = error
        results[name] = result
        print(f"{os.path.basename(script)} {name}: {json.dumps(results[name])[:2000]}", flush=True)
    return results


def check_lines(results):
    """One report line per check of each child whose JSON maps a check's name to True (passed) or
    to why it failed; (the lines, how many failed). A child that gave no JSON is one failure."""
    lines, failed = [], 0
    for name, result in results.items():
        if "error" in result:
            failed += 1
            lines.append(f"- {name}: FAILED, {result['error']}")
            continue
        for check, value in result.items():
            failed += value is not True
            lines.append(f"- {name}: {check}: {'passed' if value is True else 'FAILED: ' + value}")
    return lines, failed


def report(lines, path, failed):
    """Prints the section and appends it to `path` (when given); the exit status for `failed`."""
    text = "\n".join(lines) + "\n"
    print(text)
    if path:
        with open(path, "a") as f:
            f.write("\n" + text)
    return 1 if failed else 0


def main(doc, children, run_child, orchestrate):
    """--child NAME runs one check and prints its JSON; otherwise orchestrate(args) runs them all."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--library", default=os.environ.get("CARVE_TORCH_LIBRARY"))
    parser.add_argument("--report")
    parser.add_argument("--child", choices=children, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_child(args.child, args.library)), flush=True)  # kept if exit then crashes
        return 0
    return orchestrate(args)
