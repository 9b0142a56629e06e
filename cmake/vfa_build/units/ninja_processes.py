"""What ninja is doing, read from Linux's /proc: the ninja above a process, its -j, its processes, its plan.

For build_monitor.py, which runs as one of ninja's commands (its console pool): the ninja
that runs it and the child of ninja that leads to it, a process's children and start time,
the job limit of a ninja command line, and the compiles a dry run (``ninja -n``) still plans
for some targets.
"""

from __future__ import annotations

import os
import re
import subprocess
import time

from vfa_build.units.proc import _comm, _stat  # /proc/<pid>/stat and comm, read the launcher's way

UNIT_LINE = re.compile(r"Building (?:CUDA|CXX|C) object (\S+)")


def ninja_ancestor(pid: int) -> tuple[int, int] | None:
    """(ninja's pid, the child of ninja that leads to `pid`), or None when no ninja runs us."""
    child = pid
    for _ in range(8):
        stat = _stat(child)
        if not stat:
            return None
        parent = int(stat[1])
        if parent <= 1:
            return None
        if _comm(parent).startswith("ninja"):
            return parent, child
        child = parent
    return None


def children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="utf-8") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                stat = _stat(int(entry))
                if stat and int(stat[1]) == pid:
                    found.append(int(entry))
        return found


def started_at(pid: int) -> float | None:
    """When a process started, in time.time() terms (to the kernel's clock tick)."""
    stat = _stat(pid)
    if not stat:
        return None
    since_boot = int(stat[19]) / os.sysconf("SC_CLK_TCK")
    return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - since_boot)


def job_limit(args: list[str], cores: int) -> int:
    """The -j of a ninja command line, or ninja's default for `cores` when it has none."""
    for i, arg in enumerate(args):
        value = arg[2:] if arg.startswith("-j") and len(arg) > 2 else (
            args[i + 1] if arg == "-j" and i + 1 < len(args) else None)
        if value is not None and value.isdigit():
            return int(value) or 1 << 30  # -j0: no limit
    return 2 if cores <= 1 else 3 if cores == 2 else cores + 2


def ninja_job_limit(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().decode(errors="replace").split("\0")
    except OSError:
        args = []
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return job_limit(args, cores)


def planned_units(ninja: str, build_dir: str, targets: list[str]) -> set[str] | None:
    """The compiles `ninja` (the executable) still has to run for `targets`, from a dry run
    (`ninja -n` writes nothing). Not the default target: that holds this monitor, and
    while a console-pool edge runs, even a dry one, ninja keeps only the last of the
    other edges' lines."""
    try:
        env = dict(os.environ, NINJA_STATUS="")
        env.pop("MAKEFLAGS", None)
        out = subprocess.run([ninja, "-n", "-C", build_dir, *targets], capture_output=True, text=True, env=env,
                             timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return {m.group(1) for m in map(UNIT_LINE.search, out.stdout.splitlines()) if m}
