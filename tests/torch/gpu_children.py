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


def run_children(script, names, library, timeout):
    """Runs `script --child NAME [--library L]` for each name; {name: its JSON, or {"error": why}}."""
    results = {}
    for name in names:
        argv = [sys.executable, os.path.abspath(script), "--child", name]
        if library:
            argv += ["--library", library]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        if out.returncode == 0 and out.stdout.strip():
            results[name] = json.loads(out.stdout.strip().splitlines()[-1])
        else:
            results[name] = {"error": f"the process ended with {out.returncode}: {(out.stderr or out.stdout)[-1500:]!r}"}
    return results


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
        print(json.dumps(run_child(args.child, args.library)))
        return 0
    return orchestrate(args)
