#!/usr/bin/env python3
"""What cmake/vfa_build/units/compile_unit.py (the compile launcher that records progress and keeps
upstream warnings off the console) adds to each translation unit.

Runs a stand-in compiler N times directly and N times through the launcher, as the
build runs it (`python -E -s -S cmake/vfa_build units.compile_unit BUILD_DIR --quiet-under TREE -- ...`),
and reports the added wall time (median and minimum) and CPU time (user + system of the
launcher and its Python, per unit). Two stand-ins: one that prints nothing, and one that
prints what every unit of the pinned upstream prints with CUDA 13 (gcc's five
`'long4' is deprecated` warnings located in CUTLASS, ~3 KB), which the launcher then
logs and filters. Compare with a unit's compile time: minutes cold, 5-10 s on a warm
compiler cache (docs/PERFORMANCE.md).

    python benchmarks/launcher_overhead.py [--runs 100] [--out bench-results]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

LAUNCHER = [str(common.ROOT / "cmake" / "vfa_build"), "units.compile_unit"]  # as the build runs it
TREE = "/upstream/cutlass"
WARNING = (f"{TREE}/include/cutlass/platform/platform.h:{{line}}:33: warning: \u2018{{t}}\u2019 is deprecated: "
           f"use {{t}}_16a or {{t}}_32a [-Wdeprecated-declarations]\n"
           "  {line} | struct alignment_of<{t}> {{\n      |                                 ^\n"
           "/usr/local/cuda/include/vector_types.h:532:98: note: declared here\n"
           "  532 | typedef __device_builtin__ struct {t} __VECTOR_TYPE_DEPRECATED__(\"use {t}_16a\") {t};\n"
           "      |                                                                ^~~~~\n")
NOISE = "".join(WARNING.format(line=line, t=t) for line, t in
                ((599, "long4"), (603, "ulong4"), (619, "longlong4"), (623, "ulonglong4"), (627, "double4")))


def measure(command: list[str], runs: int) -> dict:
    walls = []
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(command, stdout=subprocess.DEVNULL, check=True)
        walls.append(time.perf_counter() - start)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) / runs
    return {"wall_median_ms": 1e3 * statistics.median(walls), "wall_min_ms": 1e3 * min(walls), "cpu_ms": 1e3 * cpu}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=100)
    p.add_argument("--out", type=Path, default=Path("bench-results"))
    p.add_argument("--plain", action="store_true")
    args = p.parse_args(argv)

    rows, result = [], {"benchmark": "launcher_overhead", "machine": common.machine_info(gpu=False),
                        "runs": args.runs, "cases": {}}
    with tempfile.TemporaryDirectory() as build_dir:
        noise_file = Path(build_dir) / "noise.txt"
        noise_file.write_text(NOISE)
        for case, stand_in in (("silent", ["true"]), ("upstream noise", ["cat", str(noise_file)])):
            direct = measure(stand_in, args.runs)
            launched = measure([sys.executable, "-E", "-s", "-S", *LAUNCHER, build_dir, "--quiet-under", TREE,
                                "--", *stand_in], args.runs)
            added = {k: launched[k] - direct[k] for k in direct}
            result["cases"][case] = {"direct": direct, "launched": launched, "added": added}
            rows.append([case, "", common.fmt(added["wall_median_ms"], 1), common.fmt(added["wall_min_ms"], 1),
                         common.fmt(added["cpu_ms"], 1)])
    path = common.write_json(args.out / "launcher_overhead.json", result)
    print(f"[launcher_overhead] wrote {path}", file=sys.stderr)
    common.print_table(f"compile_unit.py: added per unit ({args.runs} runs, ms)",
                       ["stand-in compiler", "", "wall median", "wall min", "CPU"], rows,
                       [f"python {sys.version.split()[0]}, {result['machine']['cpu_count']} cores"], plain=args.plain)
    return 0


if __name__ == "__main__":
    sys.exit(main())
