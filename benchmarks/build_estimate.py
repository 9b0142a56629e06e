#!/usr/bin/env python3
"""How far the build's time-left estimate (`about N min left`, cmake/vfa_build/progress/build_monitor.py) was from
what was actually left, at 10, 25, 50, 75 and 90 % of each build.

Each source is one build, LABEL=WHAT:

    record:BUILD_DIR    the estimates the monitor gave live, as it recorded them at the build's
                        end (BUILD_DIR/vfa-estimate.json)
    replay:BUILD_DIR    this checkout's estimator over that build's recorded unit times (the
                        events in BUILD_DIR/vfa-progress.tsv, or .tsv.1 when that one holds no
                        build; the job count and unit kinds from the monitor's command line in
                        BUILD_DIR/build.ninja, or the kinds of --kinds-from DIR): what this
                        estimator would have said, labelled as a replay
    log:PROGRESS_LOG    the estimates a monitor printed (`[vfa m:ss] ... about N min left`,
                        vfa-progress.log or a console log), by whichever version ran

The error is the estimate over the actual time left, less one: +0.25 is 25 % too long.

    python benchmarks/build_estimate.py "cold minimal=replay:build/cp310-abi3-linux_x86_64" \\
        "warm minimal=record:/tmp/b" [--out bench-results]
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

sys.path.insert(0, str(common.ROOT / "cmake"))
from vfa_build.progress import progress_estimate  # noqa: E402  (the estimate build_monitor.py prints)
from vfa_build.units.compile_unit import EVENTS  # noqa: E402  (the units' events the monitor follows)

LINE = re.compile(r"\[vfa (?P<clock>\d+(?::\d\d){1,2})\] (?P<text>.*)")
ABOUT = re.compile(r"about (\d+) (min|s)\b")
DONE = re.compile(r"\d+/\d+ compiled in (\d+(?::\d\d){1,2})")


def seconds_of(clock: str) -> float:
    total = 0
    for part in clock.split(":"):
        total = total * 60 + int(part)
    return float(total)


def from_log(path: Path) -> dict:
    """The estimates a monitor printed, and the build's length from its last line."""
    record = progress_estimate.EstimateRecord()
    seconds = None
    for line in path.read_text(errors="replace").splitlines():
        m = LINE.search(line)
        if not m:
            continue
        done = DONE.search(m["text"])
        if done:
            seconds = seconds_of(done.group(1))
            continue
        about = ABOUT.search(m["text"])
        if about:
            record.add(seconds_of(m["clock"]), int(about.group(1)) * (60 if about.group(2) == "min" else 1))
    if seconds is None:
        raise SystemExit(f"{path}: no line says the build ended (`N/N compiled in m:ss`)")
    return {"how": "log", "seconds": seconds, "points": record.table(seconds)}


def monitor_args(build_dir: Path) -> list[str]:
    """The monitor's arguments as build.ninja runs it (its build_progress target)."""
    text = (build_dir / "build.ninja").read_text()
    for line in text.splitlines():
        if "progress.build_monitor" in line and "--jobs" in line:
            words = shlex.split(line.split("progress.build_monitor", 1)[1].split("&&")[0])
            return words
    raise SystemExit(f"{build_dir}/build.ninja: no progress.build_monitor command (VFA_BUILD_PROGRESS=off?)")


KINDS_FROM: list[Path] = []  # --kinds-from: another build dir's unit kinds (today's declarations)


def from_replay(build_dir: Path) -> dict:
    args = monitor_args(build_dir)
    jobs = int(args[args.index("--jobs") + 1])
    kinds = monitor_args(KINDS_FROM[0]) if KINDS_FROM else args
    progress_estimate.UNIT_KINDS.clear()
    for i, word in enumerate(kinds):
        if word == "--unit-kind":
            progress_estimate.add_unit_kind(kinds[i + 1])
    for name in (EVENTS, EVENTS + ".1"):
        events = [line.split("\t") for line in (build_dir / name).read_text(errors="replace").splitlines()
                  if line.startswith(("start\t", "end\t", "load\t", "cache\t"))] if (build_dir / name).exists() else []
        if events:
            break
    else:
        raise SystemExit(f"{build_dir}: no events of a build ({EVENTS})")
    state, record, seconds = progress_estimate.replay(events, jobs)
    ok = [d for d in state.done.values() if d.rc == 0]
    return {"how": "replay", "seconds": round(seconds, 1), "units": state.total, "jobs": jobs,
            "cached_units": sum(d.cached for d in ok), "compiled_units": sum(not d.cached for d in ok),
            "points": record.table(seconds)}


def from_record(build_dir: Path) -> dict:
    return json.loads((build_dir / progress_estimate.ESTIMATE).read_text())


def load(source: str) -> tuple[str, dict]:
    label, _, what = source.partition("=")
    kind, _, where = what.partition(":")
    readers = {"record": from_record, "replay": from_replay, "log": from_log}
    if kind not in readers or not where:
        raise SystemExit(f"{source!r}: expected LABEL=record:DIR, LABEL=replay:DIR or LABEL=log:FILE")
    return label, readers[kind](Path(where))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sources", nargs="+", metavar="LABEL=record:DIR|replay:DIR|log:FILE")
    p.add_argument("--out", type=Path, default=Path("bench-results"))
    p.add_argument("--plain", action="store_true")
    p.add_argument("--kinds-from", type=Path, metavar="BUILD_DIR",
                   help="replays take the unit kinds of this build dir's monitor (a build configured by this "
                        "checkout) instead of the replayed build's own")
    args = p.parse_args(argv)
    if args.kinds_from:
        KINDS_FROM.append(args.kinds_from)
    builds = dict(load(source) for source in args.sources)
    shares = progress_estimate.RECORD_AT
    rows = []
    for label, build in builds.items():
        errors = {point["at"]: point["error"] for point in build["points"]}
        rows.append([label, build["how"], common.fmt(build["seconds"] / 60, 1, " min"),
                     f"{build['cached_units']} of {build['units']}" if "cached_units" in build else "-",
                     *[f"{errors[s]:+.0%}" if errors.get(s) is not None else "-" for s in shares],
                     f"{max(abs(errors[s]) for s in shares if s >= 0.25 and errors.get(s) is not None):.0%}"
                     if any(s >= 0.25 and errors.get(s) is not None for s in shares) else "-"])
    common.print_table("Time-left estimate against the time actually left (estimate / actual - 1)",
                       ["build", "how", "length", "units cached", *[f"at {s:.0%}" for s in shares], "worst from 25 %"],
                       rows, plain=args.plain)
    path = common.write_json(args.out / "build_estimate.json", {"machine": common.machine_info(gpu=False),
                                                                 "builds": builds})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
