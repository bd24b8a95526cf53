#!/usr/bin/env python3
"""Finds stores outside the device-heap blocks kernels allocate, in PTX, without a GPU.

usage: check_heap_writes.py --include DIR --canary CANARY_PTX PTX...

In each function of each PTX file, the register that receives a `malloc` result is a block's
start; registers derived from it by adding a constant keep track of their offset. A store, atomic
or reduction through such a register below the block's start is a write out of bounds: nvcc 13.0
emits one for `new T[n]` in device code when T is trivially destructible (it stores the element
count 8 bytes before the block; see carve/core/heap_array.hpp). Fails on any such write in a
PTX file; on a PTX file with no malloc at all (the probe then proves nothing); when CANARY_PTX,
a kernel that uses `new T[n]` on purpose, shows no such write (the scan would be blind, or nvcc
changed: then drop the canary and, where no compiler needs it any more, the workaround); and on
any array new or delete in DIR (the headers) outside heap_array.hpp, since device code must not
use them.
"""

import argparse
import pathlib
import re
import sys

REG = r"%rd\d+"
CALLEE = re.compile(r"^\s*malloc,\s*$")  # the callee's line of a `call.uni (retval0), malloc, (...)`
RETVAL = re.compile(rf"ld\.param\.b64\s+({REG}),\s*\[retval0(?:\+0)?\];")
ADD = re.compile(rf"^\s*add\.s64\s+({REG}),\s*({REG}),\s*(-?\d+);")
MOV = re.compile(rf"^\s*mov\.[bu]64\s+({REG}),\s*({REG});")
WRITE = re.compile(rf"^\s*(?:st|atom|red)\.[\w.]*\s+\[({REG})(?:\+(-?\d+))?\]")
DEST = re.compile(r"^\s*[a-z][\w.]*\s+(%\w+)\s*,")


def functions(text):
    """(name, body) for every .entry and .func with a body (declarations end with `;` first)."""
    for m in re.finditer(r"\.(?:entry|func)\s+(?:\([^)]*\)\s*)?(\w+)\s*\(", text):
        start = text.find("{", m.end())
        end_of_declaration = text.find(";", m.end())
        if start < 0 or 0 <= end_of_declaration < start:
            continue
        depth, at = 0, start
        while at < len(text):
            depth += {"{": 1, "}": -1}.get(text[at], 0)
            if depth == 0:
                break
            at += 1
        yield m.group(1), text[start:at]


def writes_below_blocks(body):
    """How many blocks `body` takes from malloc, and (line, offset) of each write below one."""
    offsets, found, mallocs, calling_malloc = {}, [], 0, False
    for line in body.splitlines():
        if CALLEE.match(line):
            calling_malloc = True
            continue
        if calling_malloc and (m := RETVAL.search(line)):
            offsets[m.group(1)] = 0
            mallocs += 1
            calling_malloc = False
            continue
        if (m := ADD.match(line)) and m.group(2) in offsets:
            offsets[m.group(1)] = offsets[m.group(2)] + int(m.group(3))
            continue
        if (m := MOV.match(line)) and m.group(2) in offsets:
            offsets[m.group(1)] = offsets[m.group(2)]
            continue
        if m := WRITE.match(line):
            base = offsets.get(m.group(1))
            if base is not None and base + int(m.group(2) or 0) < 0:
                found.append((line.strip(), base + int(m.group(2) or 0)))
            continue
        if (m := DEST.match(line)) and m.group(1) in offsets:
            del offsets[m.group(1)]  # the register now holds something else
    return mallocs, found


def scan(ptx):
    text = ptx.read_text()
    mallocs, problems = 0, []
    for name, body in functions(text):
        n, found = writes_below_blocks(body)
        mallocs += n
        problems += [f"{ptx.name}: {name}: `{line}` writes {-off} bytes before a malloc'd block" for line, off in found]
    return mallocs, problems


def array_new_in_headers(include):
    pattern = re.compile(r"\bnew\s+[\w:<>, ]+\[|\bdelete\s*\[\s*\]")
    found = []
    for header in sorted(include.rglob("*.hpp")):
        if header.name == "heap_array.hpp":
            continue
        for number, line in enumerate(header.read_text().splitlines(), 1):
            code = line.split("//")[0]
            if pattern.search(code):
                found.append(f"{header.relative_to(include)}:{number}: array new or delete; use carve/core/heap_array.hpp")
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--include", type=pathlib.Path, required=True)
    parser.add_argument("--canary", type=pathlib.Path, required=True)
    parser.add_argument("ptx", type=pathlib.Path, nargs="+")
    args = parser.parse_args()
    problems = array_new_in_headers(args.include)
    _, canary = scan(args.canary)
    if not canary:
        problems.append(
            f"{args.canary.name}: `new T[n]` of a trivially destructible T shows no write before its block: "
            "either the scan no longer sees it or nvcc stopped emitting it (see this script's description)"
        )
    for ptx in args.ptx:
        mallocs, found = scan(ptx)
        if mallocs == 0:
            problems.append(f"{ptx.name}: no malloc in the PTX: the probe allocates nothing from the device heap")
        problems += found
        print(f"{ptx.name}: {mallocs} device-heap allocations, {len(found)} writes outside them")
    print(f"canary {args.canary.name}: {len(canary)} writes outside its block, as expected of `new T[n]`")
    for p in problems:
        print("FAIL:", p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
