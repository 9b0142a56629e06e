"""The build's off-switch for the sccache-dist cluster, and when it is tried again.

After `max_cluster_failures` units of a build failed on the cluster (cmake/vfa_build/compiler_cache/sccache_launcher.py
counts them), the next units compile here without asking it. Not for the rest of the build:
a short outage (a scheduler restarted, a network blip of seconds) would otherwise cost a long
build its cluster for good. The switch holds a time: once it has passed, the first unit that
starts tries the cluster again (the others keep compiling here meanwhile); an answer turns the
cluster back on, a failure turns it off again for twice as long, up to RETRY_MAX_S.

BUILD_DIR/vfa-dist-off, 0600, written whole (a temporary renamed onto it) under a lock
(BUILD_DIR/vfa-dist-off.lock):

    {"off_until": TIME or null, "backoff_s": SECONDS, "trying": UNIT (while one unit tries)}

`off_until` null: the cluster is on again after a successful try (the back-off is kept, so a
cluster that keeps coming and going is tried less and less often). The file exists once the
cluster was turned off in this build (the build's report says so, cmake/vfa_build/compiler_cache/sccache_build_report.py,
and removes it at the build's end; the configure removes a stale one).

Standard library only (the launcher runs once per unit, as `python -E -s -S`).
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path

DIST_OFF = "vfa-dist-off"
LOCK = "vfa-dist-off.lock"
# The back-off: the cluster is first tried again RETRY_FIRST_S after it was turned off, long
# enough for a scheduler to restart and short beside a build of many minutes (one failed try
# costs one unit's wait on the cluster, bounded by cmake/vfa_build/cluster/dist_bound.py); each failed try doubles
# it, up to RETRY_MAX_S, so a cluster that stays down costs about one unit every 16 minutes.
RETRY_FIRST_S = 60.0
RETRY_MAX_S = 960.0


def read_state(build_dir: str) -> dict | None:
    """The switch, or None when the cluster was never turned off in this build. A switch that
    cannot be read (an older build's empty file) is off, RETRY_FIRST_S from when it was written."""
    path = Path(build_dir) / DIST_OFF
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError:
        return {"off_until": float("inf"), "backoff_s": RETRY_FIRST_S}
    try:
        state = json.loads(text)
        off_until = state["off_until"]
        return {"off_until": None if off_until is None else float(off_until),
                "backoff_s": float(state["backoff_s"]), "trying": state.get("trying")}
    except (ValueError, KeyError, TypeError):
        try:
            written = path.stat().st_mtime
        except OSError:
            written = time.time()
        return {"off_until": written + RETRY_FIRST_S, "backoff_s": RETRY_FIRST_S}


def _write(build_dir: str, state: dict) -> None:
    path = Path(build_dir) / DIST_OFF
    tmp = path.with_name(f"{DIST_OFF}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(state, f)
    os.replace(tmp, path)


class _Locked:
    def __init__(self, build_dir: str):
        self.path = os.path.join(build_dir, LOCK)

    def __enter__(self):
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        os.close(self.fd)


def route(build_dir: str, unit: str, try_for_s: float) -> str:
    """Where <unit> goes: "cluster", "here" (the switch is off), or "try" (the back-off has
    passed and this unit is the one that tries the cluster again; the others stay here for
    <try_for_s>, its bound, after which another unit may try)."""
    state = read_state(build_dir)
    if state is None or state["off_until"] is None:
        return "cluster"
    if time.time() < state["off_until"]:
        return "here"
    try:
        with _Locked(build_dir):
            state = read_state(build_dir)
            if state is None or state["off_until"] is None:
                return "cluster"
            now = time.time()
            if now < state["off_until"]:
                return "here"
            _write(build_dir, {"off_until": now + try_for_s, "backoff_s": state["backoff_s"], "trying": unit})
            return "try"
    except OSError:
        return "here"


def turn_off(build_dir: str, unit: str) -> tuple[float, bool] | None:
    """The cluster off after <unit> failed there: (the back-off, whether this is the first
    time in this build), or None when it is already off (a unit that was on its way there)."""
    try:
        with _Locked(build_dir):
            state = read_state(build_dir)
            now = time.time()
            if state is None:
                backoff, first = RETRY_FIRST_S, True
            elif (state["off_until"] is None or state["off_until"] <= now or state.get("trying") == unit):
                # Back on and failing again, or the try failed: twice as long.
                backoff, first = min(2 * state["backoff_s"], RETRY_MAX_S), False
            else:
                return None
            _write(build_dir, {"off_until": now + backoff, "backoff_s": backoff})
            return backoff, first
    except OSError:
        return None


def turn_on(build_dir: str, unit: str) -> bool:
    """The try of <unit> succeeded: the cluster is on again. False when <unit> was not the try."""
    try:
        with _Locked(build_dir):
            state = read_state(build_dir)
            if state is None or state.get("trying") != unit:
                return False
            _write(build_dir, {"off_until": None, "backoff_s": state["backoff_s"]})
            return True
    except OSError:
        return False
