#!/usr/bin/env python3
"""Compares each device-capable type's layout on the host with its layout in nvcc's device code.

usage: check_layout.py --host LAYOUT_HOST --include DIR PTX...

LAYOUT_HOST (layout_host.cpp, built by the host compiler) prints sizeof, alignof and member
offsets of every entry of tests/layout/device_types.hpp; each PTX file (layout_probe.cu compiled
for one architecture) holds the same as nvcc's device side computed them, and the parameter of a
kernel that takes the type by value. Fails, naming the type, on any difference, and on any class
in DIR (the headers) that has __host__ __device__ or __device__ members, lies outside a detail
namespace and is neither an entry nor in device_types.hpp's not_listed, on any carve type (a
class or an alias) a kernel in DIR takes by value or through a pointer that is no entry, and on any
[[no_unique_address]] in DIR (what made the two differ: see carve/core/compressed_pair.hpp).
"""

import argparse
import pathlib
import re
import subprocess
import sys


def host_layouts(program):
    entries, exempt = {}, {}
    out = subprocess.run([program], check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        fields = line.split("\t")
        if fields[0] == "not listed":
            exempt[fields[1]] = fields[2]
            continue
        index, size, align, by_value, offsets, name = fields
        entries[int(index)] = {
            "name": name,
            "size": int(size),
            "align": int(align),
            "by_value": by_value == "1",
            "offsets": [int(o) for o in offsets.split(",")] if offsets else [],
        }
    return entries, exempt


def little_endian_words(initialiser, count):
    data = [int(b) for b in initialiser.split(",")] if initialiser.strip() else []
    data += [0] * (8 * count - len(data))  # PTX leaves trailing zero bytes out
    return [int.from_bytes(bytes(data[8 * k : 8 * k + 8]), "little") for k in range(count)]


def device_layouts(ptx):
    """Per entry index: sizeof and alignof in device code, member offsets, kernel parameter."""
    found = {}
    text = ptx.read_text()
    for m in re.finditer(r"device_layoutILm(\d+)E\w*\[16\](?: = \{([^}]*)\})?;", text):
        size, align = little_endian_words(m.group(2) or "", 2)
        found.setdefault(int(m.group(1)), {})["layout"] = (size, align)
    for m in re.finditer(r"\.u64 \w*member_offsetILm(\d+)ELm(\d+)E\w*(?: = (-?\d+))?;", text):
        found.setdefault(int(m.group(1)), {}).setdefault("offsets", {})[int(m.group(2))] = int(m.group(3) or 0)
    for m in re.finditer(r"\.entry \w*by_valueILm(\d+)E\w*\(\s*\.param \.align (\d+) \.b8 \w+\[(\d+)\]", text):
        found.setdefault(int(m.group(1)), {})["param"] = (int(m.group(3)), int(m.group(2)))
    for m in re.finditer(r"\.entry \w*by_pointerILm(\d+)E", text):
        found.setdefault(int(m.group(1)), {})["param"] = None
    return found


def compare(entries, ptx):
    problems = []
    device = device_layouts(ptx)
    arch = re.search(r"^\.target (\w+)", ptx.read_text(), re.M)
    where = f"{ptx.name} ({arch.group(1) if arch else 'unknown target'})"
    for index, host in sorted(entries.items()):
        name, d = host["name"], device.get(index)
        if d is None or "layout" not in d:
            problems.append(f"{where}: no device layout for entry {index}, {name}")
            continue
        if d["layout"] != (host["size"], host["align"]):
            problems.append(
                f"{where}: {name}: sizeof/alignof {host['size']}/{host['align']} on the host, "
                f"{d['layout'][0]}/{d['layout'][1]} in device code"
            )
        if host["by_value"]:
            if not d.get("param"):
                problems.append(f"{where}: {name}: no kernel taking it by value")
            elif d["param"] != (host["size"], host["align"]):
                problems.append(
                    f"{where}: {name}: {host['size']} bytes aligned to {host['align']} on the host, a kernel "
                    f"parameter of {d['param'][0]} bytes aligned to {d['param'][1]}"
                )
        offsets = [d.get("offsets", {}).get(k) for k in range(len(host["offsets"]))]
        if offsets != host["offsets"]:
            problems.append(f"{where}: {name}: member offsets {host['offsets']} on the host, {offsets} in device code")
    return problems


def headers(include):
    return sorted(p for p in include.rglob("*") if p.suffix in (".hpp", ".cuh"))


def code_of(header):
    """The header's text without its comments."""
    return re.sub(r"/\*.*?\*/", "", re.sub(r"//[^\n]*", "", header.read_text()), flags=re.S)


def closing(text, opening, pair="{}"):
    """The index just past the bracket that closes the one at `opening` (or the end of `text`)."""
    depth, i = 1, opening + 1
    while depth and i < len(text):
        depth += {pair[0]: 1, pair[1]: -1}.get(text[i], 0)
        i += 1
    return i


DETAIL = r"\bnamespace\s+[\w:]*detail\s*\{"


def device_capable_classes(include):
    """Classes and structs outside detail namespaces and outside other classes whose bodies
    declare __host__ __device__ (CARVE_HOST_DEVICE) or __device__ members: name -> header."""
    found = {}
    for header in headers(include):
        text = code_of(header)
        details = [(m.end() - 1, closing(text, m.end() - 1)) for m in re.finditer(DETAIL, text)]
        classes = []
        head = r"\b(?:class|struct)\s+(?:alignas\([^)]*\)\s+)?(\w+)(?:\s+final)?\s*(?::[^;{]*)?\{"
        for m in re.finditer(head, text):
            start, end = m.end() - 1, closing(text, m.end() - 1)
            classes.append((m.group(1), start, end, text[start:end]))
        for name, start, end, body in classes:
            nested = any(s < start and end <= e for _, s, e, _ in classes)
            in_detail = any(s < start < e for s, e in details)
            if not nested and not in_detail and re.search(r"\bCARVE_HOST_DEVICE\b|\b__device__\b", body):
                found.setdefault(name, str(header.relative_to(include)))
    return found


def listed_names(entries, types_header):
    # An entry names its class template first: "carve::SlotArena<carve::...>" lists SlotArena. An
    # alias of another library's template (BatchPlacement, a cuda::std::expected) is listed by the
    # name the entry is written with in device_types.hpp.
    names = set()
    for host in entries.values():
        m = re.match(r"carve::(\w+)", host["name"])
        if m:
            names.add(m.group(1))
    names.update(re.findall(r"\bProbe<carve::(\w+)", code_of(types_header)))
    return names


def without_detail(text):
    """`text` without the bodies of its detail namespaces (braces matched)."""
    out, at = [], 0
    for m in re.finditer(DETAIL, text):
        if m.start() < at:
            continue  # inside one removed already
        out.append(text[at : m.start()])
        at = closing(text, m.end() - 1)
    return "".join(out) + text[at:]


def carve_type_names(include):
    """Every class, struct and alias the headers declare outside detail namespaces (carve's types
    are capitalised; its lower-case aliases name integers, such as bits::word)."""
    names, template_parameters = set(), set()
    for header in headers(include):
        text = without_detail(code_of(header))
        names.update(
            re.findall(r"\b(?:class|struct)\s+(?:alignas\([^)]*\)\s+)?(\w+)\s*(?:final\s*)?(?::(?!:)|\{)", text)
        )
        names.update(re.findall(r"\busing\s+(\w+)\s*=", text))
        template_parameters.update(re.findall(r"\b(?:class|typename)\s+(\w+)\s*(?:[,>=]|\.\.\.)", text))
    # A kernel's template parameter (class U) is no carve type, whatever a header names U.
    return names - template_parameters


# What may stand between __global__ and a kernel's parameters besides its return type and name.
KERNEL_ATTRIBUTES = {"__launch_bounds__", "__maxnreg__", "__cluster_dims__", "__attribute__", "alignas", "__declspec"}


def kernel_parameter_lists(text):
    """The parameter list of every __global__ function in `text` (parentheses matched, so a
    sizeof(...) or a default argument inside is kept; attributes such as __launch_bounds__(...)
    before the name are passed over)."""
    lists = []
    for m in re.finditer(r"\b__global__\b", text):
        i = m.end()
        while True:
            open_paren = text.find("(", i)
            if open_paren < 0 or ";" in text[i:open_paren] or "{" in text[i:open_paren]:
                break
            j = closing(text, open_paren, "()")
            word = re.search(r"(\w+)\s*$", text[i:open_paren])
            if word and word.group(1) in KERNEL_ATTRIBUTES:
                i = j
                continue
            lists.append(text[open_paren + 1 : j - 1])
            break
    return lists


def kernel_parameter_types(include, known):
    """The carve types the headers' kernels take as parameters, by value or through a pointer
    (what a kernel writes for the host to read crosses too): name -> header."""
    found = {}
    for header in headers(include):
        for params in kernel_parameter_lists(code_of(header)):
            for name in re.findall(r"\b([A-Z]\w*)\b", params):
                if name in known:
                    found.setdefault(name, str(header.relative_to(include)))
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", required=True, help="layout_host, built by the host compiler")
    parser.add_argument("--include", required=True, type=pathlib.Path, help="carve's include directory")
    parser.add_argument("ptx", nargs="+", type=pathlib.Path, help="layout_probe.cu as PTX, one per architecture")
    args = parser.parse_args()

    entries, exempt = host_layouts(args.host)
    problems = []
    for ptx in args.ptx:
        problems += compare(entries, ptx)
    listed = listed_names(entries, pathlib.Path(__file__).with_name("device_types.hpp"))
    capable = device_capable_classes(args.include)
    for name, header in sorted(capable.items()):
        if name not in listed and name not in exempt:
            problems.append(
                f"{header}: {name} has device code but no entry in tests/layout/device_types.hpp: add the forms "
                "kernels use (or, if it can never cross a launch, its name and why to not_listed)"
            )
    for name, header in sorted(kernel_parameter_types(args.include, carve_type_names(args.include)).items()):
        if name not in listed and name not in exempt:
            problems.append(
                f"{header}: a kernel takes {name} (by value or through a pointer) but tests/layout/device_types.hpp "
                "has no entry for it: add the forms kernels use"
            )
    for header in headers(args.include):
        if "no_unique_address" in code_of(header):
            problems.append(
                f"{header.relative_to(args.include)}: [[no_unique_address]] gives a member no bytes on the host and "
                "bytes in nvcc's kernel parameters: hold an empty part with carve::detail::CompressedPair"
            )
    for name in sorted(set(exempt) - set(capable)):
        problems.append(f"not_listed names {name}, which is no device-capable class in {args.include}")

    print(f"{len(entries)} types, {len(args.ptx)} architectures ({', '.join(p.name for p in args.ptx)}):")
    for index, host in sorted(entries.items()):
        print(
            f"  {host['size']:6} B  align {host['align']:3}  {'by value  ' if host['by_value'] else 'by pointer'}  "
            f"{host['name'][:110]}"
        )
    for line in problems:
        print("MISMATCH: " + line)
    if problems:
        print(f"{len(problems)} problems")
        return 1
    print("host and device layouts agree for every type")
    return 0


if __name__ == "__main__":
    sys.exit(main())
