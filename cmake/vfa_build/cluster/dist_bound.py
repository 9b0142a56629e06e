"""A bound on the time the sccache-dist cluster may take for one unit, and the falls back to a
local compile that sccache makes without a word.

sccache waits for the cluster as long as the cluster keeps a connection open: a scheduler
that hung after the configure held a unit for 6.5 minutes and counting, and the build said
nothing. So a compile sent to the cluster gets a bound, from the unit's expected time (the
kinds of units each module declares, cmake/BuildProgress.cmake's vfa_unit_kind, with their
reference seconds; the same table the progress monitor reads): BOUND_FACTOR times it, at
least BOUND_FLOOR_S, or VFA_DIST_UNIT_TIMEOUT seconds when set. Past it the launcher stops
waiting and compiles the unit here (sccache_launcher.py), as for any other failure of the
cluster: one line, and after max_cluster_failures the rest of the build skips the cluster.

A build server that hangs is another case: sccache gives up on it by itself (about 30 s)
and compiles the unit here, successfully and silently, unit after unit. Its server logs
"[<object>]: Could not perform distributed compile, falling back to local" (a warning) into
the build dir's log of the cluster's sccache server (DIST_LOG, 0600, written by the
configure: cmake/vfa_build/compiler_cache/compiler_cache_probe.py), naming the unit or one of nvcc's steps of it;
silent_fallback() finds that line while the unit compiles, and the launcher stops waiting
(sccache would wait again for each step: about 2 minutes for an nvcc unit) and compiles it
here: a failure of the cluster too.

Standard library only (the launcher runs once per unit, as `python -E -s -S`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable

from vfa_build.units.kinds import parse_unit_kind  # the unit-kind spec, one parser (standard library only)
from vfa_build.url_secrets import without_env_secrets  # the one URL scrubber: sccache's words are shown and recorded

BOUNDS_FILE = "vfa-dist-bounds.json"  # written at configure (cmake/DistBounds.cmake)
DIST_LOG = "vfa-sccache-dist.log"     # the cluster's sccache server's log (warnings)
POLL_S = 0.5  # how often a running compile's log is read for sccache's fallback
# While a unit waits on the cluster: a line every WAIT_LINE_S, and the scheduler asked directly (its
# status over HTTP, sccache_config.scheduler_hang: not through the build's sccache server, which may be
# busy packaging toolchains) whether it answers, so a hung scheduler is named within a minute.
WAIT_LINE_S = 60.0
STATUS_TIMEOUT_S = 10.0
BOUND_FACTOR = 4.0
BOUND_FLOOR_S = 120.0
# Kinds every build has (cmake/vfa_build/progress/build_monitor.py's REFERENCE_SECONDS): C++ units, CUDA of no kind.
DEFAULT_SECONDS = {"C++": 5.0, "CUDA": 153.0}
FELL_BACK = "Could not perform distributed compile, falling back to local"
# A cluster whose every slot is busy: sccache compiles here, and nothing is wrong.
BUSY = "Insufficient capacity"
# What sccache_launcher.py's lines say to do, by the kind of failure recorded.
BOUND_FIXES = {
    "timeout": ("The cluster did not finish a unit in time: a scheduler or build server that accepts connections and "
                "does not answer looks like this (`sccache --dist-status` with this SCCACHE_CONF says whether the "
                "scheduler answers and how many servers it has; the servers' logs say more): restart or fix it, or "
                "raise VFA_DIST_UNIT_TIMEOUT if the units are only slow there"),
    "no-scheduler": ("The cluster's scheduler stopped answering while units waited on it (one that accepts "
                     "connections and answers nothing looks like this; `sccache --dist-status` with this SCCACHE_CONF "
                     "asks it): restart or fix it"),
    "fell-back": ("sccache gave up on a build server and compiled the unit here (a server that does not answer, or "
                  "one whose disk is full: `sccache --dist-status` with this SCCACHE_CONF lists the servers; their "
                  "logs say more): fix or stop that server"),
}


def read_bounds(build_dir: str) -> dict:
    try:
        return json.loads((Path(build_dir) / BOUNDS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def expected_seconds(bounds: dict, unit: str) -> float:
    """The unit's reference compile time: its declared kind's (progress_estimate.parse_unit_kind's
    spec), else C++ or CUDA. CMake puts a target's objects in CMakeFiles/<target>.dir/."""
    path = unit.replace("\\", "/")
    if not path.endswith(".cu.o"):
        return DEFAULT_SECONDS["C++"]
    for spec in bounds.get("kinds", []):
        kind = parse_unit_kind(spec)
        if f"/{kind.target}.dir/" in f"/{path}" and kind.contains in path:
            return kind.seconds
    return DEFAULT_SECONDS["CUDA"]


def bound_seconds(build_dir: str, unit: str) -> tuple[float, float]:
    """(the bound, the expected time) for <unit>."""
    bounds = read_bounds(build_dir)
    expected = expected_seconds(bounds, unit)
    fixed = float(bounds.get("timeout") or 0)
    return (fixed if fixed > 0 else max(BOUND_FLOOR_S, BOUND_FACTOR * expected)), expected


def run_bounded(command: list[str], env: dict[str, str], seconds: float,
                fell_back: Callable[[], str | None] = lambda: None,
                waiting: Callable[[float], tuple[str, str] | None] = lambda waited: None) \
        -> tuple[int, bytes, bytes, int | None, tuple[str, str] | None]:
    """(exit status, stdout, stderr, signal received, why it was stopped): <command>, stopped
    after <seconds> ("timeout", ...) or as soon as <fell_back>() names a reason ("fell-back",
    ...: sccache gave up on the cluster for this unit and goes on here, after its own wait per
    step), or <waiting>(seconds waited), called every WAIT_LINE_S, does (it says a line and
    asks the scheduler: sccache_launcher.py). A signal sent to the launcher reaches the compile
    too (as run_captured)."""
    received: list[int] = []
    proc: subprocess.Popen | None = None

    def forward(signum, _frame):
        received.append(signum)
        if proc is not None and proc.poll() is None:
            proc.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        try:
            proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except OSError as error:
            return 127, b"", f"{command[0]}: {error}\n".encode(), (received or [None])[0], None
        if received and proc.poll() is None:
            proc.send_signal(received[0])
        started = time.monotonic()
        deadline = started + seconds
        next_line = started + WAIT_LINE_S
        while True:
            try:
                out, err = proc.communicate(timeout=POLL_S)
                return proc.returncode, out, err, (received or [None])[0], None
            except subprocess.TimeoutExpired:
                pass
            stopped = None
            reason = fell_back()
            if reason:
                stopped = ("fell-back", reason)
            elif time.monotonic() > deadline:
                stopped = ("timeout", "")
            elif time.monotonic() > next_line and not received:
                next_line += WAIT_LINE_S
                stopped = waiting(time.monotonic() - started)
            if stopped and not received:
                proc.kill()
                out, err = proc.communicate()
                return proc.returncode, out, err, None, stopped
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def unit_stem(obj: str) -> str:
    """What sccache's log calls a unit and its steps by: "x.cu.o" -> "x" (x.module_id, x.ptx,
    x.cubin, x.cu.o). Two units of one name in two folders are not told apart."""
    name = obj.replace("\\", "/").rsplit("/", 1)[-1]
    name = name[:-2] if name.endswith(".o") else name
    return name.rsplit(".", 1)[0] if "." in name else name


def log_size(build_dir: str) -> int:
    try:
        return os.path.getsize(Path(build_dir) / DIST_LOG)
    except OSError:
        return 0


def silent_fallback(build_dir: str, obj: str, since: int) -> str | None:
    """sccache's own reason for compiling <obj> here instead of on the cluster, from what its
    server logged after offset <since>; None when it logged none."""
    try:
        with open(Path(build_dir) / DIST_LOG, "rb") as log:
            log.seek(since)
            text = log.read().decode("utf-8", "replace")
    except OSError:
        return None
    stem = unit_stem(obj)
    for line in text.splitlines():
        if FELL_BACK in line and f"[{stem}." in line and BUSY not in line:
            # Scrubbed before it is cut: a cut must not leave half a password behind.
            reason = without_env_secrets(line.split(FELL_BACK, 1)[1])
            return " ".join(reason.lstrip(": ").split())[:200] or "no reason given"
    return None
