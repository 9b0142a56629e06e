#!/usr/bin/env python3
"""Which compiled units did the GPU tests run? Per translation unit, not per head dim.

The slices of `full` (docs/full-preset-slices.md) must show every unit exercised by a
passing test. The GPU suite checks results per (family, dtype, head dim, scenario), but a
head dim's 8-10 FA3 files (paged, split, softcap, packgqa and their mixes) are picked by
upstream's dispatch from the call, so a scenario list alone does not say which file ran.
This tells it from the kernels themselves, in two steps:

    python tests/gpu/kernel_coverage.py table --build <build dir> --out kernels-table.json
        every CUDA unit's kernels, read from its object file: nvcc gives each __global__
        function it instantiates a host stub, ``__device_stub__<mangled kernel name>``;
        ``nm`` lists them and ``c++filt`` demangles them, as the profiler names kernels.
    VFA_KERNEL_LOG=kernels.jsonl python -m pytest tests/gpu -m gpu -o pythonpath=
        tests/gpu/kernel_log.py: one line per test (its outcome and the CUDA kernels the
        profiler saw it launch).
    python tests/gpu/kernel_coverage.py report --table kernels-table.json --log kernels.jsonl \\
        [--out coverage.json]
        per unit, the passing tests that launched one of its kernels; exit 1 when a unit
        with kernels has none (the units are listed), 0 when every one ran. A test that
        names the unit it must run (its record's "expects") is checked too: that unit holds
        a kernel it launched, and no kernel it launched belongs only to another unit some
        test expects (the dispatch went elsewhere); exit 1 listing the tests that did not.

Example (tests/gpu/slice_h200.sh test runs these): "kernel coverage: 66 of 66 CUDA units ran
in a passing test" or "... 46 of 66 ...; not run: flash_fwd_hdim64_256_bf16_softcap_sm90.cu, ...".
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterable

# nvcc's stub is a local function, mangled as a length-prefixed source name:
# _ZL<n>__device_stub__<the kernel's mangled name without its leading "_"> (n counts from the
# first "__"); locals inside the stub (``_ZZL<n>__device_stub__...E5__tmp``) carry the same.
STUB = re.compile(r"L(\d+)(__device_stub__Z)")


def normalize(name: str) -> str:
    """Kernel names compared without white space (``> >`` and ``>>`` are the same name)."""
    return re.sub(r"\s+", "", name)


def unit_name(obj: Path) -> str:
    """``.../flash_fwd_hdim64_bf16_sm90.cu.o`` -> ``flash_fwd_hdim64_bf16_sm90.cu``."""
    return obj.name[:-2] if obj.name.endswith(".o") else obj.name


def cuda_objects(build: Path) -> list[Path]:
    """The CUDA units' objects of the build's targets (CMake keeps each target's objects in
    ``CMakeFiles/<target>.dir``; only the compiled modules have CUDA units)."""
    return sorted(build.glob("CMakeFiles/*.dir/**/*.cu.o"))


def _tool(name: str) -> str:
    path = shutil.which(name)
    if not path:
        raise SystemExit(f"kernel_coverage: '{name}' (binutils) is not on PATH; install binutils")
    return path


def stub_kernels(obj: Path) -> list[str]:
    """The mangled names of the kernels ``obj`` instantiates (its nvcc host stubs)."""
    out = subprocess.run([_tool("nm"), "--defined-only", str(obj)], check=True, capture_output=True,
                         text=True).stdout
    names = set()
    for m in STUB.finditer(out):
        start = m.start(2)
        name = out[start:start + int(m.group(1))]
        names.add("_" + name[len("__device_stub__"):])
    return sorted(names)


def demangle(names: list[str]) -> list[str]:
    if not names:
        return []
    out = subprocess.run([_tool("c++filt")], input="\n".join(names) + "\n", check=True,
                         capture_output=True, text=True).stdout.splitlines()
    if len(out) != len(names):
        raise SystemExit(f"kernel_coverage: c++filt gave {len(out)} names for {len(names)}")
    return out


def kernel_table(objects: Iterable[Path]) -> dict[str, list[str]]:
    """{unit: [its kernels, demangled and normalized]} for every object (units without a
    kernel, such as C++ API files compiled as CUDA, get an empty list)."""
    table = {}
    for obj in objects:
        table[unit_name(obj)] = sorted({normalize(n) for n in demangle(stub_kernels(obj))})
    return table


def read_log(lines: Iterable[str]) -> list[dict]:
    """tests/gpu/kernel_log.py's records; a line that is not a record is an error."""
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SystemExit(f"kernel_coverage: log line {number} is not JSON: {exc}") from None
        if not isinstance(record, dict) or not {"test", "outcome", "kernels"} <= set(record):
            raise SystemExit(f"kernel_coverage: log line {number} is not a test record: {line[:80]}")
        records.append(record)
    return records


def coverage(table: dict[str, list[str]], records: list[dict]) -> dict:
    """Per unit with kernels: the passing tests that launched one of them. A kernel that
    only failed or skipped tests launched does not count. A kernel several units
    instantiate (FA2's split-KV combine kernels are in the causal and the non-causal
    file) says nothing about which of them ran, so a unit is judged by its own kernels
    when it has any."""
    ran_in: dict[str, list[str]] = {}
    for record in records:
        if record["outcome"] != "passed":
            continue
        for kernel in record["kernels"]:
            ran_in.setdefault(normalize(kernel), []).append(record["test"])
    owners: dict[str, int] = {}
    for kernels in table.values():
        for kernel in kernels:
            owners[kernel] = owners.get(kernel, 0) + 1
    units = {}
    for unit, kernels in sorted(table.items()):
        if not kernels:
            continue
        own = [k for k in kernels if owners[k] == 1] or kernels
        tests = sorted({t for k in own for t in ran_in.get(k, ())})
        units[unit] = {"kernels": len(kernels), "own_kernels": len(own),
                       "own_kernels_run": sum(1 for k in own if k in ran_in),
                       "tests": len(tests), "example": tests[0] if tests else None}
    not_run = [u for u, v in units.items() if not v["tests"]]
    return {"units": units, "units_with_kernels": len(units), "not_run": not_run,
            "tests_logged": len(records), "tests_passed": sum(r["outcome"] == "passed" for r in records),
            **expectations(table, records)}


def expectations(table: dict[str, list[str]], records: list[dict]) -> dict:
    """The passing tests that name the unit they must run ("expects"): did they? The
    expected unit must hold one of the kernels the test launched, and none of them may
    belong only to another expected unit (a module unit such as FA3's combine or scheduler,
    which no test expects, may run beside). A kernel two units share (FA2's head dim 256
    split and split_align files instantiate the same one) counts for both."""
    owners: dict[str, set[str]] = {}
    for unit, kernels in table.items():
        for kernel in kernels:
            owners.setdefault(kernel, set()).add(unit)
    checked = [r for r in records if r["outcome"] == "passed" and r.get("expects")]
    targets = {r["expects"] for r in checked}
    wrong = []
    for record in checked:
        ran = [owners.get(normalize(k), set()) for k in record["kernels"]]
        elsewhere = sorted({u for units in ran if len(units) == 1 for u in units
                            if u in targets and u != record["expects"]})
        if not any(record["expects"] in units for units in ran) or elsewhere:
            wrong.append({"test": record["test"], "expects": record["expects"], "ran": elsewhere})
    return {"expected_checked": len(checked), "expected_wrong": wrong}


def summary(result: dict) -> str:
    ran = result["units_with_kernels"] - len(result["not_run"])
    line = (f"kernel coverage: {ran} of {result['units_with_kernels']} CUDA units ran in a passing test "
            f"({result['tests_passed']} of {result['tests_logged']} logged tests passed)")
    if result["not_run"]:
        line += "; not run: " + ", ".join(result["not_run"])
    if result["expected_checked"]:
        wrong = result["expected_wrong"]
        line += (f"\n{result['expected_checked'] - len(wrong)} of {result['expected_checked']} tests that name "
                 "their unit ran it")
        for w in wrong:
            line += f"\n  {w['test']}: expects {w['expects']}, ran {', '.join(w['ran']) or 'none of its kernels'}"
    return line


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("table", help="every CUDA unit's kernels, from a build dir's objects")
    t.add_argument("--build", type=Path, required=True)
    t.add_argument("--out", type=Path, required=True)
    r = sub.add_parser("report", help="which units ran in a passing test")
    r.add_argument("--table", type=Path, required=True)
    r.add_argument("--log", type=Path, required=True)
    r.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.command == "table":
        objects = cuda_objects(args.build)
        if not objects:
            print(f"kernel_coverage: no CUDA object under {args.build}/CMakeFiles/*.dir",
                  file=sys.stderr)
            return 2
        table = kernel_table(objects)
        args.out.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
        print(f"kernel table: {len(table)} CUDA units, {sum(map(len, table.values()))} kernels -> {args.out}")
        return 0
    table = json.loads(args.table.read_text())
    if not args.log.is_file():
        print(f"kernel_coverage: {args.log} does not exist: the tests ran without VFA_KERNEL_LOG",
              file=sys.stderr)
        return 2
    result = coverage(table, read_log(args.log.read_text().splitlines()))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(summary(result))
    return 1 if result["not_run"] or result["expected_wrong"] or not result["units_with_kernels"] else 0


if __name__ == "__main__":
    sys.exit(main())
