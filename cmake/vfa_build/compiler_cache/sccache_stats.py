"""What an sccache server says, read the same way by the probe, the end-of-build report and the launcher.

One sccache call, bounded (``run``; ProbeFailure when it does not answer); its statistics
(``show_stats``: JSON) and cluster status (``dist_status``), the counters read from them
(per unit: ``unit_counts``), and the counts a build's own servers had when they were stopped
(``COUNTS`` in the build dir, added to the live ones by ``with_saved``). Where the cache is
(``backend_of``, ``public_location``: no local path, no credential). Used by
cmake/vfa_build/compiler_cache/compiler_cache_probe.py (and its modules) and cmake/vfa_build/compiler_cache/sccache_launcher.py.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from vfa_build.url_secrets import without_secrets  # the project's one URL scrubber (cmake/vfa_build/url_secrets.py)

START_NOTE = "sccache could not start (check the SCCACHE_* settings)"
TIMEOUT_S = 300  # one sccache call; a first distributed compile packages the toolchain
# What the build dir's own servers had counted when the builds that ran them stopped them
# (sccache_launcher.py stops them when ninja ends), since the last end-of-build report: added
# to the live servers' counts by `stats`, which then clears it.
COUNTS = "vfa-sccache-counts.json"


class ProbeFailure(Exception):
    """failure: a class name; message: for the console (with sccache's own words);
    note: for the build info (no output of this machine: no paths)."""

    def __init__(self, failure: str, message: str, note: str = ""):
        super().__init__(message)
        self.failure = failure
        self.message = message
        self.note = note or message


def run(cmd: list[str], env: dict[str, str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ProbeFailure("timeout", f"'{' '.join(cmd[:3])} ...' did not answer within {TIMEOUT_S} s") from None


def output_of(proc: subprocess.CompletedProcess) -> str:
    return " ".join((proc.stderr + proc.stdout).split())[:1500]


def backend_of(location: str) -> str:
    """sccache's cache_location -> a backend name: 'Local disk: "/x"' -> disk, 'redis, name: ...' -> redis."""
    if location.startswith("Local disk"):
        return "disk"
    return location.split(",", 1)[0].strip().lower() or "unknown"


def public_location(location: str) -> str:
    """What may go into the wheel: no local paths, no credentials."""
    if location.startswith("Local disk"):
        return "Local disk"
    return without_secrets(location)


def show_stats(sccache: str, env: dict[str, str], failure: ProbeFailure | None = None) -> dict:
    proc = run([sccache, "--show-stats", "--stats-format=json"], env)
    if proc.returncode != 0:
        raise failure or ProbeFailure("start", f"sccache could not start ({output_of(proc)})", START_NOTE)
    return json.loads(proc.stdout)


def dist_status(sccache: str, env: dict[str, str]) -> dict:
    """{"scheduler": URL or None, "state": disabled|connected|not-connected, servers, cpus, detail}."""
    proc = run([sccache, "--dist-status"], env)
    try:
        status = json.loads(proc.stdout)
    except json.JSONDecodeError:
        return {"scheduler": None, "state": "unknown", "detail": output_of(proc)}
    if "SchedulerStatus" in status:
        url, info = status["SchedulerStatus"]
        return {"scheduler": without_secrets(url), "state": "connected", "servers": info.get("num_servers", 0),
                "cpus": info.get("num_cpus", 0), "in_progress": info.get("in_progress", 0)}
    if "NotConnected" in status:
        url, detail = status["NotConnected"]
        return {"scheduler": without_secrets(url), "state": "not-connected", "detail": detail}
    return {"scheduler": None, "state": "disabled"}


def counters(stats: dict) -> dict[str, int]:
    s = stats["stats"]
    return {"hits": sum(s["cache_hits"]["counts"].values()), "misses": sum(s["cache_misses"]["counts"].values()),
            "errors": sum(s["cache_errors"]["counts"].values()), "read_errors": s["cache_read_errors"],
            "writes": s["cache_writes"], "write_errors": s["cache_write_errors"],
            "remote": sum(s.get("dist_compiles", {}).values()), "dist_errors": s.get("dist_errors", 0),
            "compilations": s.get("compilations", 0), "requests": s.get("compile_requests", 0)}


UNIT_LANGUAGES = {"CUDA": "CUDA", "C/C++": "C++"}  # sccache's language of a CUDA unit, a C++ unit


def unit_counts(stats: dict) -> dict[str, int]:
    """counters() plus the hits and misses of whole units (hits:CUDA, misses:C/C++, ...)."""
    found = counters(stats)
    for kind in ("hits", "misses"):
        for language in UNIT_LANGUAGES:
            found[f"{kind}:{language}"] = stats["stats"][f"cache_{kind}"]["counts"].get(language, 0)
    return found


def saved_counts(build_dir: Path) -> dict[str, dict[str, int]]:
    try:
        return json.loads((build_dir / COUNTS).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def save_counts(sccache: str, env: dict[str, str], build_dir: Path, role: str) -> None:
    """Adds what a server of the build's has counted to COUNTS (role: "server", "local"), before
    it is stopped."""
    try:
        now = unit_counts(show_stats(sccache, env))
    except (ProbeFailure, ValueError, KeyError):
        return
    saved = saved_counts(build_dir)
    saved[role] = {k: saved.get(role, {}).get(k, 0) + v for k, v in now.items()}
    tmp = build_dir / (COUNTS + ".tmp")
    tmp.write_text(json.dumps(saved) + "\n", encoding="utf-8")
    os.replace(tmp, build_dir / COUNTS)


def with_saved(live: dict[str, int], build_dir: Path, role: str) -> dict[str, int]:
    saved = saved_counts(build_dir).get(role, {})
    return {k: live.get(k, 0) + saved.get(k, 0) for k in live.keys() | saved.keys()}


def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in after}
