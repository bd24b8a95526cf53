#!/usr/bin/env python3
"""Finds stores below the device-heap blocks kernels allocate, in PTX, without a GPU.

usage: check_heap_writes.py --include DIR --canary CANARY_PTX PTX...

In each function of each PTX file, the register that receives a `malloc` result holds a block's
start; registers derived from it by a constant (add, sub, mov, cvta, with the constant in the
instruction or in a register set by mov) keep track of their offset. A store, atomic or reduction
through such a register below the block's start writes out of bounds: nvcc 13.0 emits one for
`new T[n]` in device code when T is trivially destructible (it stores the element count 8 bytes
before the block; see carve/core/heap_array.hpp). Writes past a block's end are not looked for:
the size is not always a constant.

Fails on any such write in a PTX file; on a block passed to a function other than `free` (the
scan does not follow calls, so it could not vouch for it); on a PTX file with no malloc at all
(the probe would prove nothing); when the scan misses one of the handwritten cases below (it
would be blind); and on any array new or delete in DIR (the headers) outside heap_array.hpp,
since device code must not use them. CANARY_PTX, a kernel that uses `new T[n]` on purpose, is
reported: whether this nvcc still stores the count before the block.
"""

import argparse
import pathlib
import re
import sys

REG = r"%rd\d+"
CALLEE = re.compile(r"^\s*(\w+),\s*$")  # the callee's line inside a `call.uni (retval0), malloc, (...)`
RETVAL = re.compile(rf"ld\.param\.b64\s+({REG}),\s*\[retval0(?:\+0)?\];")
PARAM_STORE = re.compile(rf"st\.param\.b64\s+\[\w+(?:\+\d+)?\],\s*({REG});")
CONSTANT = re.compile(rf"^(?:mov|cvt)\.[\w.]*64\s+({REG}),\s*(-?\d+);")
DERIVED = re.compile(rf"^(add|sub|mov|cvta\.to\.global|cvta\.global|cvta)\.[\w.]*?([us]64|b64)\s+({REG}),\s*({REG})"
                     rf"(?:,\s*(-?\d+|{REG}))?;")
WRITE = re.compile(rf"^(?:st|red|atom)\.[\w.]*\s+(?:%\w+\s*,\s*)?\[({REG})\s*(?:([+-])\s*(-?\d+))?\]")
DEST = re.compile(r"^[a-z][\w.]*\s+(%\w+)\s*,")
PREDICATE = re.compile(r"^@!?%\w+\s+")

# The scan's self-test: each must be found (a write below its block), and CLEAN must not.
CASES = {
    "a store at a negative offset": "st.u64 [%rd2+-8], %rd3;",
    "a vector store": "st.v2.u32 [%rd2+-8], {%r1, %r2};",
    "an atomic with a result": "atom.global.add.u64 %rd9, [%rd2+-8], 1;",
    "a reduction": "red.global.add.u64 [%rd2+-16], 1;",
    "through add": "add.s64 %rd4, %rd2, -8;\n\tst.u64 [%rd4], %rd3;",
    "through sub": "sub.s64 %rd4, %rd2, 8;\n\tst.u64 [%rd4], %rd3;",
    "through cvta": "cvta.to.global.u64 %rd4, %rd2;\n\tst.global.u64 [%rd4+-8], %rd3;",
    "through a constant in a register": "mov.u64 %rd7, -8;\n\tadd.s64 %rd4, %rd2, %rd7;\n\tst.u64 [%rd4], %rd3;",
    "through a predicated add": "@%p1 add.s64 %rd4, %rd2, -8;\n\tst.u64 [%rd4], %rd3;",
    "in the other offset spelling": "st.u64 [%rd2-8], %rd3;",
}
CLEAN = "st.u64 [%rd2], %rd3;\n\tadd.s64 %rd4, %rd2, -8;\n\tst.u64 [%rd4+8], %rd3;\n\tmov.u64 %rd2, 0;\n\tst.u64 [%rd2+-8], %rd3;"


def as_function(body):
    return (".visible .entry probe()\n{\n\t{ // callseq 0, 0\n\tcall.uni (retval0),\n\tmalloc,\n\t(\n\tparam0\n\t);\n"
            "\tld.param.b64 %rd2, [retval0+0];\n\t} // callseq 0\n\t" + body + "\n\tret;\n}\n")


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


def scan_body(body):
    """(blocks malloc returned, [(line, offset) of writes below one], [lines where one escapes])."""
    offsets, constants, found, escapes = {}, {}, [], []
    mallocs, callee, passed = 0, None, []
    for raw in body.splitlines():
        line = PREDICATE.sub("", raw.strip())
        if line.startswith("{ // callseq") or line.startswith("call"):
            callee, passed = None, [] if line.startswith("{") else passed
            continue
        if (m := CALLEE.match(line)) and callee is None:
            callee = m.group(1)
            if callee != "free" and passed:
                escapes.append(f"a block passed to {callee}")
            continue
        if m := PARAM_STORE.search(line):
            if m.group(1) in offsets:
                passed.append(m.group(1))
            continue
        if m := RETVAL.search(line):
            if callee == "malloc":
                offsets[m.group(1)] = 0
                mallocs += 1
            else:
                offsets.pop(m.group(1), None)
            continue
        if m := CONSTANT.match(line):
            constants[m.group(1)] = int(m.group(2))
            offsets.pop(m.group(1), None)
            continue
        if (m := DERIVED.match(line)) and m.group(4) in offsets:
            op, dest, source, operand = m.group(1), m.group(3), m.group(4), m.group(5)
            if operand is None:
                delta = 0
            elif operand.startswith("%"):
                delta = constants.get(operand)
            else:
                delta = int(operand)
            if delta is None:
                offsets.pop(dest, None)  # a register offset whose value the scan does not know
            else:
                offsets[dest] = offsets[source] + (-delta if op == "sub" else delta)
            constants.pop(dest, None)
            continue
        if m := WRITE.match(line):
            base = offsets.get(m.group(1))
            offset = int(m.group(3) or 0) * (-1 if m.group(2) == "-" else 1)
            if base is not None and base + offset < 0:
                found.append((line, base + offset))
            continue
        if m := DEST.match(line):
            offsets.pop(m.group(1), None)  # the register now holds something else
            constants.pop(m.group(1), None)
    return mallocs, found, escapes


def scan(text, name):
    """(blocks, problems) for the PTX `text` of the file `name`."""
    mallocs, problems = 0, []
    for function, body in functions(text):
        n, found, escapes = scan_body(body)
        mallocs += n
        problems += [f"{name}: {function}: `{line}` writes {-off} bytes before a malloc'd block" for line, off in found]
        problems += [f"{name}: {function}: {e}: the scan does not follow calls" for e in escapes]
    return mallocs, problems


def self_test():
    problems = [f"the scan misses {what}" for what, body in CASES.items() if not scan(as_function(body), "case")[1]]
    if scan(as_function(CLEAN), "clean")[1]:
        problems.append("the scan flags writes inside a block")
    return problems


def array_new_in_headers(include):
    pattern = re.compile(r"\bnew\b\s*(?:\([^()]*(?:\([^()]*\)[^()]*)*\)\s*)?[\w:<>, ]+\[|\bdelete\s*\[\s*\]")
    found = []
    for header in sorted(p for p in include.rglob("*") if p.suffix in (".hpp", ".cuh", ".h")):
        if header.name == "heap_array.hpp":
            continue
        code = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), header.read_text(), flags=re.S)
        for number, line in enumerate(code.splitlines(), 1):
            if pattern.search(line.split("//")[0]):
                found.append(f"{header.relative_to(include)}:{number}: array new or delete; use carve/core/heap_array.hpp")
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--include", type=pathlib.Path, required=True)
    parser.add_argument("--canary", type=pathlib.Path, required=True)
    parser.add_argument("ptx", type=pathlib.Path, nargs="+")
    args = parser.parse_args()
    problems = self_test() + array_new_in_headers(args.include)
    print(f"self-test: {len(CASES)} handwritten writes below a block, {len(CASES) - len(problems)} found")
    for ptx in args.ptx:
        mallocs, found = scan(ptx.read_text(), ptx.name)
        if mallocs == 0:
            problems.append(f"{ptx.name}: no malloc in the PTX: the probe allocates nothing from the device heap")
        problems += found
        print(f"{ptx.name}: {mallocs} device-heap allocations, {len(found)} problems")
    _, canary = scan(args.canary.read_text(), args.canary.name)
    print(f"canary {args.canary.name}: this nvcc's `new T[n]` "
          + ("still stores the count before the block" if canary else "no longer stores anything before the block"))
    for p in problems:
        print("FAIL:", p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
