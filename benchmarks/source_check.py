#!/usr/bin/env python3
"""What the build-time source check costs a no-op rebuild.

Every build runs the target vfa_verified_sources (cmake/UpstreamBuildCheck.cmake): the
configure's comparison of the pinned folders with their commits, again, before anything is
compiled. A no-op rebuild had no such step before; this measures the step as ninja runs it
in configured build dirs (no objects needed: the step depends on nothing):

    python benchmarks/source_check.py --build-dir build-minimal --build-dir build-full --runs 15

For each build dir: its preset (from its build_info.json), the files and bytes the check
covers (the pinned paths of each repository it holds to the pin), and the wall time of
`ninja -C DIR vfa_verified_sources` (ninja loading the build file included) and of the
script alone (`cmake -DVFA_VERIFY_SPEC=DIR/vfa_verified_sources.json -P
cmake/verify_sources.cmake`): median, min, max over --runs runs, with the load average
before and after. Prints a table and writes JSON (--out).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

SPEC = "vfa_verified_sources.json"


def tool(name: str) -> str:
    local = Path(sys.executable).parent / name
    found = str(local) if local.exists() else shutil.which(name)
    if not found:
        sys.exit(f"{name} is not installed")
    return found


def covered(spec: dict) -> tuple[int, int]:
    """Files and bytes under the pinned paths of the repositories the check holds to the pin."""
    files = size = 0
    for component in spec["components"]:
        listed = subprocess.run(["git", "-C", component["dir"], "ls-tree", "-r", "-l", component["commit"], "--",
                                 *component["paths"]], capture_output=True, text=True, check=True).stdout
        for line in listed.splitlines():
            meta = line.split("\t", 1)[0].split()
            files += 1
            size += int(meta[3]) if meta[3].isdigit() else 0
    return files, size


def timed(cmd: list[str], runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True)
        times.append(time.perf_counter() - start)
        if done.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed:\n{done.stdout}{done.stderr}")
    return times


def summary(times: list[float]) -> dict:
    return {"median_ms": round(statistics.median(times) * 1000, 1), "min_ms": round(min(times) * 1000, 1),
            "max_ms": round(max(times) * 1000, 1), "runs": len(times)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build-dir", type=Path, action="append", required=True,
                        help="a configured build dir (repeat for several)")
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--out", type=Path, default=Path("bench-results/source_check.json"))
    args = parser.parse_args(argv)
    ninja, cmake = tool("ninja"), tool("cmake")
    script = common.ROOT / "cmake" / "verify_sources.cmake"
    rows, results = [], []
    for build in args.build_dir:
        build = build.resolve()
        spec_file = build / SPEC
        if not spec_file.exists():
            sys.exit(f"{spec_file} does not exist: configure {build} with this project first")
        spec = json.loads(spec_file.read_text())
        info = json.loads((build / "build_info.json").read_text())
        preset = info.get("preset", "?")
        files, size = covered(spec)
        load_before = os.getloadavg()[0]
        step = summary(timed([ninja, "-C", str(build), "vfa_verified_sources"], args.runs))
        alone = summary(timed([cmake, f"-DVFA_VERIFY_SPEC={spec_file}", "-P", str(script)], args.runs))
        load_after = os.getloadavg()[0]
        results.append({"build_dir": str(build), "preset": preset, "files": files, "bytes": size,
                        "ninja_step": step, "script": alone, "load_before": load_before, "load_after": load_after})
        rows.append([build.name, preset, str(files), f"{size / 1e6:.1f} MB",
                     f"{step['median_ms']:.0f} ({step['min_ms']:.0f}-{step['max_ms']:.0f})",
                     f"{alone['median_ms']:.0f} ({alone['min_ms']:.0f}-{alone['max_ms']:.0f})",
                     f"{load_before:.1f} / {load_after:.1f}"])
    common.print_table(f"Build-time source check, {args.runs} runs each (ms: median (min-max))",
                       ["build dir", "preset", "files", "size", "ninja vfa_verified_sources", "cmake -P alone",
                        "load before / after"], rows, plain=True)
    path = common.write_json(args.out, {"machine": common.machine_info(gpu=False), "results": results})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
