#!/usr/bin/env python3
"""Peak memory of a build's compiler processes, per translation unit and per kind of unit,
sampled from /proc beside a build that runs in another process (benchmarks/build.py's
sampler, which its own experiment runs in-process).

    python tests/gpu/rss_sample.py --until BUILD_RC_FILE --out rss.json [--ninja-log BUILD/.ninja_log]

Samples until BUILD_RC_FILE exists (the build wrote its exit code), rewriting --out every
--flush-s seconds so a cut run still leaves its figures. Kinds: fa3_inst (an FA3
instantiation, *_sm90), fa2_cuda (an FA2 instantiation, *_sm80), fa3_other (the FA3
combine and scheduler units), cxx (the rest: the C++ API files, FA2's stubs). With
--ninja-log, the kinds hold only the units that build compiled (other compiles on the
machine, and the configure's probes, are sampled but left out of them).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from build import RssSampler  # noqa: E402


def unit_kind(unit: str) -> str | None:
    """The kind of a sampled unit key (a source stem such as flash_fwd_hdim96_bf16_sm90)."""
    if unit.startswith("("):
        return None  # links and processes no unit could be found for
    if unit.endswith("_sm90"):
        return "fa3_inst"
    if unit.endswith("_sm80"):
        return "fa2_cuda"
    if unit in ("flash_fwd_combine", "flash_prepare_scheduler"):
        return "fa3_other"
    return "cxx"


def build_units(ninja_log: Path | None) -> set[str] | None:
    """The source stems of a build's ninja log (".../flash_api.cpp.o" -> "flash_api"), or None."""
    if ninja_log is None or not ninja_log.is_file():
        return None
    stems = set()
    for line in ninja_log.read_text(errors="replace").splitlines():
        parts = line.split("\t")
        if len(parts) >= 4 and parts[3].endswith(".o"):
            stems.add(parts[3].rsplit("/", 1)[-1].rsplit(".", 2)[0])
    return stems


def summary(result: dict, units: set[str] | None = None) -> dict:
    kinds: dict[str, dict] = {}
    for unit, peaks in result["units"].items():
        kind = unit_kind(unit)
        if kind is None or (units is not None and unit not in units):
            continue
        k = kinds.setdefault(kind, {"units": 0, "peak_tree_mb": 0.0, "peak_single_mb": 0.0, "heaviest": ""})
        k["units"] += 1
        if peaks["peak_tree_mb"] > k["peak_tree_mb"]:
            k["peak_tree_mb"], k["heaviest"] = round(peaks["peak_tree_mb"], 1), unit
        k["peak_single_mb"] = round(max(k["peak_single_mb"], peaks["peak_single_mb"]), 1)
    return {**result, "kinds": kinds}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--until", type=Path, required=True, help="stop once this file exists")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--ninja-log", type=Path, help="the build's .ninja_log: the units to summarise")
    p.add_argument("--interval", type=float, default=0.5)
    p.add_argument("--flush-s", type=float, default=15.0)
    p.add_argument("--max-s", type=float, default=4 * 3600, help="stop after this long in any case")
    args = p.parse_args(argv)
    sampler = RssSampler(args.interval)
    sampler.start()
    start = last = time.monotonic()
    try:
        while not args.until.exists() and time.monotonic() - start < args.max_s:
            time.sleep(1.0)
            if time.monotonic() - last >= args.flush_s:
                args.out.write_text(json.dumps(summary(sampler.result(), build_units(args.ninja_log)), indent=1) + "\n")
                last = time.monotonic()
    finally:
        sampler.stop()
        args.out.write_text(json.dumps(summary(sampler.result(), build_units(args.ninja_log)), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
