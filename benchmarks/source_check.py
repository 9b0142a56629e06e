#!/usr/bin/env python3
"""What staging and verifying the pinned sources cost a configure and a no-op rebuild.

A configure copies the anchored files of each repository into the user's staged store
(cmake/vfa_build/sources/source_anchor.py stage: hashed while written, compared with the pin's anchor, renamed
into place), or, when the copy is there, hashes it again before reusing it. Every build then
runs the target vfa_verified_sources (the staged copies hashed again, a snapshot taken), and
each module's link and the install prove the snapshot unchanged (source_anchor.py unchanged).
This measures each step on configured build dirs (no objects needed):

    python benchmarks/source_check.py --build-dir build-minimal --build-dir build-full --runs 15

Per build dir: its preset (build_info.json), the files and bytes the check covers, and the wall
time of `ninja -C DIR vfa_verified_sources` (a no-op rebuild's share, ninja loading the build
file included), of `source_anchor.py verify` alone and of `source_anchor.py unchanged` (before
each link and before packing). Once (the same for every preset: the pinned folders are staged
whole): a configure's staging into an empty store (cold, each run a fresh store) and its reuse
of a staged copy (warm). Median, min, max over --runs runs, with the load average before and
after. Prints a table and writes JSON (--out).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

SPEC = "vfa_verified_sources.json"
ANCHOR = [sys.executable, "-E", "-s", "-S", str(common.ROOT / "cmake" / "vfa_build"), "sources.source_anchor"]
NAMES = {"flash_attention": "flash-attention", "cutlass": "cutlass"}


def tool(name: str) -> str:
    local = Path(sys.executable).parent / name
    found = str(local) if local.exists() else shutil.which(name)
    if not found:
        sys.exit(f"{name} is not installed")
    return found


def covered(spec: dict) -> tuple[int, int]:
    """Files and bytes of the staged copies the check holds to the anchor."""
    files = size = 0
    for component in spec["components"]:
        for path in Path(component["staged"]).rglob("*"):
            if path.is_file():
                files += 1
                size += path.stat().st_size
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


def shown(s: dict) -> str:
    return f"{s['median_ms']:.0f} ({s['min_ms']:.0f}-{s['max_ms']:.0f})"


def staging(spec: dict, runs: int) -> dict:
    """A configure's staging of every repository of <spec>: into a fresh store, then reused."""
    store = Path(tempfile.mkdtemp(prefix="vfa-stage-bench-"))
    commands = [[*ANCHOR, "stage", "--pin", spec["pin"], "--component", c["name"], "--source", c["source"],
                 "--store", str(store), "--name", NAMES[c["name"]]] for c in spec["components"]]

    def run_all():
        for cmd in commands:
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                sys.exit(f"{' '.join(cmd)} failed:\n{done.stdout}{done.stderr}")

    def empty_store():
        for entry in store.iterdir():
            shutil.rmtree(entry)

    cold, warm = [], []
    for _ in range(runs):
        empty_store()
        start = time.perf_counter()
        run_all()
        cold.append(time.perf_counter() - start)
        start = time.perf_counter()
        run_all()
        warm.append(time.perf_counter() - start)
    empty_store()
    store.rmdir()
    return {"cold": summary(cold), "warm": summary(warm)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build-dir", type=Path, action="append", required=True,
                        help="a configured build dir (repeat for several)")
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--out", type=Path, default=Path("bench-results/source_check.json"))
    args = parser.parse_args(argv)
    ninja = tool("ninja")
    rows, results = [], []
    stage = None
    for build in args.build_dir:
        build = build.resolve()
        spec_file = build / SPEC
        if not spec_file.exists():
            sys.exit(f"{spec_file} does not exist: configure {build} with this project first")
        # Once first: a build file older than the project's CMake files is regenerated by it.
        subprocess.run([ninja, "-C", str(build), "vfa_verified_sources"], capture_output=True, check=True)
        spec = json.loads(spec_file.read_text())
        sha = hashlib.sha256(spec_file.read_bytes()).hexdigest()
        info = json.loads((build / "build_info.json").read_text())
        preset = info.get("preset", "?")
        files, size = covered(spec)
        load_before = os.getloadavg()[0]
        step = summary(timed([ninja, "-C", str(build), "vfa_verified_sources"], args.runs))
        alone = summary(timed([*ANCHOR, "verify", "--spec", str(spec_file), "--spec-sha256", sha], args.runs))
        proof = summary(timed([*ANCHOR, "unchanged", "--spec", str(spec_file), "--spec-sha256", sha], args.runs))
        if stage is None:
            stage = staging(spec, args.runs)
        load_after = os.getloadavg()[0]
        results.append({"build_dir": str(build), "preset": preset, "files": files, "bytes": size,
                        "ninja_step": step, "verify": alone, "unchanged": proof, "load_before": load_before,
                        "load_after": load_after})
        rows.append([build.name, preset, str(files), f"{size / 1e6:.1f} MB", shown(step), shown(alone),
                     shown(proof), f"{load_before:.1f} / {load_after:.1f}"])
    common.print_table(f"Build-time source check, {args.runs} runs each (ms: median (min-max))",
                       ["build dir", "preset", "files", "size", "ninja vfa_verified_sources", "verify alone",
                        "unchanged (link, pack)", "load before / after"], rows, plain=True)
    print(f"configure's staging, every repository (the same for every preset): into an empty store "
          f"{shown(stage['cold'])} ms; reusing the staged copy {shown(stage['warm'])} ms")
    path = common.write_json(args.out, {"machine": common.machine_info(gpu=False), "results": results,
                                        "staging": stage})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
