"""The progress of the compiles, printed while they run.

    build_monitor.py --dir BUILD_DIR --targets TARGET... --jobs N --interval S
                     [--unit-kind "TARGET|KIND|SECONDS|PATH TEXT" ...]
    build_monitor.py --replay EVENTS.tsv --jobs N [--unit-kind ...]   (the estimate over a past build)

The command of the `build_progress` target (cmake/BuildProgress.cmake), which runs in
ninja's console pool: the one way to print while other commands run, since ninja
buffers each command's output until it ends. It follows the events that compile_unit.py
writes for every unit and prints a line per unit that compiled (one the compiler cache
answered gets none: the status lines count them), what the units hand it (their
warnings, a launcher's note: printed at once, in order), and, S seconds after the last
line (then twice as long each time nothing else came, up to 5 minutes), the units
running, how many are done and an estimate of what is left (Estimate).

While it runs ninja holds back its own lines, so it ends as soon as it has nothing to
add: when every unit ninja planned for the targets (a dry run, `ninja -n`, at its start)
has compiled,
when one fails (ninja then prints that unit's error at once), or when ninja runs nothing
but the monitor. It also steps aside when ninja's -j leaves no room beside the compile
jobs (it would take a compile's place). It exits 0 whatever happens (progress must never
fail or hold up a build) except on an interrupt (SIGINT, SIGTERM, SIGHUP): then it says in
one line what the compile launchers stopped and exits 128 + the signal. Linux only (it reads /proc); elsewhere it prints one line and
ends. At the end it writes BUILD_DIR/vfa-estimate.json: what it estimated at 10, 25, 50, 75
and 90 % of the build against what was actually left then.

Example (the minimal preset on a 2-core machine, through `pip install -v`):

    [vfa 0:03] compiling 22 units, 2 at a time: about 24 min if the compiler cache holds none of them. ...
    [vfa 0:33] 0/22 done; running flash_fwd_hdim128_bf16_paged_sm90.cu 0:30, ...; about 24 min left
    [vfa 4:31] compiled flash_fwd_hdim128_bf16_paged_sm90.cu (FA3 CUDA) in 4:28 [3/22]; about 21 min left
    [vfa 32:40] 22/22 compiled in 32:37; 90 compiler warnings and 38 ptxas notes in upstream code ...
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compile_unit import (COMPILE_LOG, EVENTS, PROGRESS_LOG, RELAY, STOP_WAIT_S, _comm, _stat,  # noqa: E402
                          append_line, start_build_logs, this_build)

ESTIMATE = "vfa-estimate.json"  # the estimate against the actual time left, at RECORD_AT of the build
RECORD_AT = (0.10, 0.25, 0.50, 0.75, 0.90)

# Wall seconds per translation unit by kind, cold, one unit per core: measured on the
# 16-core H200 build machine (docs/PERFORMANCE.md, "Build"). Used only until units of this
# build finish: then the kind's own mean here, or the reference scaled by this machine's
# pace (BuildState.pace). The kinds of each module's CUDA units, and theirs, come from its
# family's target file (vfa_unit_kind in cmake/BuildProgress.cmake, passed as --unit-kind):
# this file names no kernel family. "C++" (.cpp files 2-5 s there) and "CUDA" (a CUDA unit
# of no declared kind, at the heaviest kind's mean) are every build's.
REFERENCE_SECONDS = {"C++": 5.0, "CUDA": 153.0}
# (the target's object folder, the kind, a text its path holds or "" for any), first match wins.
UNIT_KINDS: list[tuple[str, str, str]] = []
UNIT_LINE = re.compile(r"Building (?:CUDA|CXX|C) object (\S+)")


# Seconds a unit of each kind takes when the compiler cache answers it (sccache still runs
# nvcc's host-side steps, which take longer on the heavier headers), for reference: measured on
# the 2-core CPU machine, scaled by what this build's cached units take (BuildState.cached_seconds).
CACHED_SECONDS = {"C++": 1.0, "CUDA": 10.0}


def add_unit_kind(spec: str) -> None:
    """Declare a kind of CUDA unit: "TARGET|KIND|SECONDS|PATH TEXT[|CACHED SECONDS]" (what
    --unit-kind takes): the units of TARGET whose path holds PATH TEXT (any, when empty), at
    SECONDS compiled and CACHED SECONDS answered by the compiler cache, for reference.
      add_unit_kind("_vendored_fa3_C|FA3 CUDA|153|/instantiations/|11.5")"""
    target, kind, seconds, contains, *cached = spec.split("|")
    UNIT_KINDS.append((f"{target}.dir", kind, contains))
    REFERENCE_SECONDS[kind] = float(seconds)
    CACHED_SECONDS[kind] = float(cached[0]) if cached and cached[0] else CACHED_SECONDS["CUDA"]


def unit_kind(unit: str) -> str:
    """The kind of a ninja output path: CMake puts a target's objects in
    CMakeFiles/<target>.dir/ and names them <source>.o."""
    if unit.endswith(".cu.o"):
        path = unit.replace("\\", "/")
        for folder, kind, contains in UNIT_KINDS:
            if f"/{folder}/" in f"/{path}" and contains in path:
                return kind
        return "CUDA"
    return "C++"


def unit_name(unit: str) -> str:
    name = unit.replace("\\", "/").rsplit("/", 1)[-1]
    return name[:-2] if name.endswith(".o") else name


def clock(seconds: float) -> str:
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def about(seconds: float) -> str:
    if seconds >= 90:
        return f"about {round(seconds / 60)} min"
    return f"about {max(5, round(seconds / 5) * 5)} s"


# --- what ninja is doing (Linux /proc) -------------------------------------------------------


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
        with open(f"/proc/{pid}/task/{pid}/children") as f:
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


# --- the estimate ----------------------------------------------------------------------------

# A CUDA unit that ends in under this share of its kind's reference time (and under HIT_MIN_S
# at least) was answered by the compiler cache: sccache's hits of a CUDA unit still run nvcc's
# host-side steps, 3-20 s, where compiling the smallest unit takes 47 s on the H200 machine and
# longer on a small one. C++ units are quick either way and are taken as they come.
HIT_FRACTION = 0.25
HIT_MIN_S = 15.0
# A unit that runs past what its kind is expected to take is expected to run at least this
# share of its time so far again: never "about 15 s left" for the minutes it then takes.
TAIL_FRACTION = 0.2
# The machine's load: on a shared machine a unit takes longer while other work runs (on the
# 2-core machine a cached FA2 unit took 5 s alone and 20-32 s beside other builds). The monitor
# samples how many processes are runnable (/proc/loadavg) and writes, every LOAD_EVERY_S, a
# "load" event with the slowdown max(1, runnable / cores); units' times are taken as work done
# at the slowdown of their time, and what is left is expected at the slowdown of the last
# LOAD_WINDOW_S. No samples (a replay of an older build's events): a slowdown of 1.
LOAD_EVERY_S = 5.0
LOAD_WINDOW_S = 60.0


@dataclass
class Done:
    kind: str
    seconds: float
    rc: int
    hidden: int
    notes: int = 0  # ptxas notes kept off the console (hidden: compiler warnings)
    hit: bool | None = None  # answered by the compiler cache, as its server's count says (classify)
    slowdown: float = 1.0  # the machine's mean slowdown while it ran (LOAD_EVERY_S)

    @property
    def work(self) -> float:
        """Its seconds on an otherwise idle machine."""
        return self.seconds / self.slowdown

    @property
    def cached(self) -> bool:
        """Answered by the compiler cache: as its server says (hit), else by the unit's time."""
        if self.rc != 0 or self.kind == "C++":
            return False
        return self.hit if self.hit is not None else self.seconds < cached_limit(self.kind)


def cached_limit(kind: str) -> float:
    return max(HIT_MIN_S, HIT_FRACTION * REFERENCE_SECONDS[kind])


@dataclass
class BuildState:
    """What the events of this build say, and the estimate of what is left of it: each unit
    still to run at its kind's expected time -- the share of CUDA units the compiler cache
    answered so far at the time a cached unit took, the rest at the kind's reference time
    scaled by this machine's pace (the kind's own compiled units here, else all CUDA units
    compiled here, and no less than what the units running show) -- scheduled longest first
    on the compile jobs after what the running units still need."""
    t0: float
    jobs: int
    planned: set[str] = field(default_factory=set)
    running: dict[str, float] = field(default_factory=dict)  # unit -> start time
    done: dict[str, Done] = field(default_factory=dict)
    stopped: dict[str, tuple[int, int]] = field(default_factory=dict)  # unit -> (processes, in a server)
    # CUDA units the compiler cache answered and missed so far, as its server counts them (a miss
    # is counted when the unit starts compiling); None: no server to ask (the units' times tell).
    cache_counts: tuple[int, int] | None = None
    loads: list[tuple[float, float]] = field(default_factory=list)  # (time, slowdown): "load" events

    def slowdown(self, start: float, end: float) -> float:
        """The mean slowdown from `start` to `end` (the last one before, when none is between)."""
        between = [v for t, v in self.loads if start <= t <= end]
        if between:
            return sum(between) / len(between)
        before = [v for t, v in self.loads if t < start]
        return before[-1] if before else 1.0

    def slowdown_now(self, now: float) -> float:
        return self.slowdown(now - LOAD_WINDOW_S, now)

    def classify(self) -> None:
        """With the server's count of hits: the finished CUDA units quickest against their kind's
        cached time are the hits, as many as it counts."""
        if self.cache_counts is None:
            return
        finished = sorted((d for d in self.done.values() if d.rc == 0 and d.kind != "C++"),
                          key=lambda d: d.seconds / CACHED_SECONDS[d.kind])
        for rank, d in enumerate(finished):
            d.hit = rank < self.cache_counts[0]

    def apply(self, event: list[str]) -> str | None:
        """Take one event (the fields of a line of compile_unit.py's events) in; return the
        unit of an end event."""
        try:
            kind, t, unit = event[0], float(event[1]), event[2]
            if t < self.t0:
                return None  # an earlier build's
            if kind == "start":
                self.running[unit] = t
            elif kind == "load":
                self.loads.append((t, max(1.0, float(event[3]))))
            elif kind == "cache":  # the compiler cache server's CUDA hits and misses (Monitor.ask_cache)
                self.cache_counts = (int(event[3]), int(event[4]))
                self.classify()
            elif kind == "end":
                rc, seconds, hidden = int(event[3]), float(event[4]), int(event[5])
                notes = int(event[6]) if len(event) > 6 else 0
                self.running.pop(unit, None)
                self.done[unit] = Done(unit_kind(unit), seconds, rc, hidden, notes,
                                       slowdown=self.slowdown(t - seconds, t))
                self.classify()
                return unit
            elif kind == "stopped":
                self.running.pop(unit, None)
                self.stopped[unit] = (int(event[4]), int(event[5]))
        except (IndexError, ValueError):
            pass  # not an event line
        return None

    @property
    def total(self) -> int:
        return len(self.planned | set(self.running) | set(self.done))

    @property
    def waiting(self) -> list[str]:
        return sorted(self.planned - set(self.running) - set(self.done))

    def compiled(self, kind: str | None = None) -> list[Done]:
        """Finished units that ran the compiler (not answered by the cache), of `kind` or of
        every CUDA kind."""
        return [d for d in self.done.values() if d.rc == 0 and not d.cached
                and (d.kind == kind if kind else d.kind != "C++")]

    def cache_share(self, now: float) -> tuple[int, int]:
        """(CUDA units the compiler cache answered, CUDA units whose answer is known): as its
        server counts them; else finished ones, and running ones already past the time a cached
        unit takes (they compile)."""
        if self.cache_counts is not None:
            return self.cache_counts[0], sum(self.cache_counts)
        finished = [d for d in self.done.values() if d.rc == 0 and d.kind != "C++"]
        compiling = [u for u, start in self.running.items()
                     if unit_kind(u) != "C++" and now - start >= cached_limit(unit_kind(u))]
        return sum(d.cached for d in finished), len(finished) + len(compiling)

    def pace(self, kind: str, now: float) -> float:
        """How much longer than its reference a unit of `kind` compiles here (1: as long): its
        kind's compiled units, else every compiled CUDA unit, weighted by reference time; and no
        less than what the units of the kind still running past that show (their time so far is
        a lower bound of theirs). 1 before anything has compiled."""
        own = self.compiled(kind) or (self.compiled() if kind != "C++" else [])
        work = sum(d.work for d in own)
        reference = sum(REFERENCE_SECONDS[d.kind] for d in own)
        pace = work / reference if reference else 1.0
        for unit, start in self.running.items():
            if unit_kind(unit) == kind:
                pace = max(pace, self.work_of(start, now) / REFERENCE_SECONDS[kind])
        return pace

    def work_of(self, start: float, now: float) -> float:
        """The work a unit running since `start` has done: its time at the machine's slowdown."""
        return (now - start) / self.slowdown(start, now)

    def cached_seconds(self, kind: str, now: float) -> float:
        """Expected seconds for a unit of `kind` the cache answers: its reference, at the pace of
        this build's cached units (of its kind when there are any), at the slowdown of now."""
        hits = [d for d in self.done.values() if d.cached]
        same = [d for d in hits if d.kind == kind] or hits
        reference = sum(CACHED_SECONDS[d.kind] for d in same)
        pace = sum(d.work for d in same) / reference if reference else 1.0
        return CACHED_SECONDS[kind] * pace * self.slowdown_now(now)

    def compile_seconds(self, kind: str, now: float) -> float:
        """Expected seconds for a unit of `kind` that compiles, at the slowdown of now."""
        if kind == "C++":
            same = [d.work for d in self.done.values() if d.rc == 0 and d.kind == kind]
            if same:
                return sum(same) / len(same) * self.slowdown_now(now)
        return REFERENCE_SECONDS[kind] * self.pace(kind, now) * self.slowdown_now(now)

    def cost(self, kind: str, now: float) -> float:
        """Expected seconds for a unit of `kind` that has not started."""
        compiled = self.compile_seconds(kind, now)
        if kind == "C++":
            return compiled
        cached, known = self.cache_share(now)
        share = cached / known if known else 0.0
        return share * self.cached_seconds(kind, now) + (1 - share) * compiled

    def left_of(self, unit: str, start: float, now: float) -> float:
        """What a running unit still needs: its expected time (the cache's share of it only
        while it may still be a cache hit) less what it has done, at the slowdown of now, and
        never less than TAIL_FRACTION of its time so far again."""
        kind, elapsed = unit_kind(unit), now - start
        expected = self.cost(kind, now) if elapsed < cached_limit(kind) else self.compile_seconds(kind, now)
        done = self.work_of(start, now) * self.slowdown_now(now)
        return max(expected - done, TAIL_FRACTION * elapsed, 0.5)

    def seconds_left(self, now: float) -> float:
        """Longest-first list schedule of what is left on the compile jobs, the running units
        first with what they still need: never less than the longest of those."""
        loads = [self.left_of(unit, start, now) for unit, start in self.running.items()]
        workers = max(self.jobs, len(loads), 1)
        loads += [0.0] * (workers - len(loads))
        for cost in sorted((self.cost(unit_kind(u), now) for u in self.waiting), reverse=True):
            loads.sort()
            loads[0] += cost
        return max(loads)

    def basis(self, now: float) -> str:
        """What the estimate stands on, for the line that gives it."""
        cached, known = self.cache_share(now)
        if known and cached == known:
            return f"as the {known} CUDA unit{'s' if known != 1 else ''} so far: seconds each, the compiler cache's"
        n = len(self.compiled())
        pace = f"at this machine's pace from {n} unit{'s' if n != 1 else ''} compiled here" if n else \
            "at reference times"
        return f"{cached} of {known} CUDA units so far took seconds, the rest {pace}" if cached else pace


RECORD_EVERY_S = 1.0  # the estimate is recorded this often (and with every line), printed or not


class EstimateRecord:
    """The estimates during a build, against what was actually left at each."""

    def __init__(self):
        self.given: list[tuple[float, float]] = []  # (seconds into the build, estimated seconds left)
        self.last = float("-inf")

    def add(self, at: float, left: float) -> None:
        self.given.append((at, left))
        self.last = time.time()

    def table(self, seconds: float) -> list[dict]:
        """At each share of RECORD_AT of a build that took `seconds`: the last estimate given by
        then, what was left then, and the error (estimate over actual, less one)."""
        points = []
        for share in RECORD_AT:
            at = share * seconds
            before = [(t, left) for t, left in self.given if t <= at]
            if not before:
                continue
            t, left = before[-1]
            actual = seconds - t
            points.append({"at": share, "t": round(t, 1), "estimated_left": round(left, 1),
                           "actual_left": round(actual, 1),
                           "error": round(left / actual - 1, 3) if actual > 0 else None})
        return points

    def write(self, path: str, state: BuildState, seconds: float, how: str) -> dict:
        ok = [d for d in state.done.values() if d.rc == 0]
        record = {"how": how, "seconds": round(seconds, 1), "units": state.total, "jobs": state.jobs,
                  "cached_units": sum(d.cached for d in ok), "compiled_units": sum(not d.cached for d in ok),
                  "points": self.table(seconds)}
        try:
            with open(path + ".tmp", "w", encoding="utf-8") as f:
                json.dump(record, f, indent=1)
                f.write("\n")
            os.replace(path + ".tmp", path)
        except OSError:
            pass
        return record


def replay(events: list[list[str]], jobs: int, step: float = RECORD_EVERY_S) -> tuple[BuildState, EstimateRecord, float]:
    """The estimate over a past build's events (vfa-progress.tsv): computed at each event and
    every `step` seconds, as the monitor records it; returns the state at the end,
    the estimates and the build's length (first start to last end)."""
    timed = sorted((float(e[1]), e) for e in events if len(e) > 2 and e[0] in ("start", "end", "load", "cache")
                   and e[1].replace(".", "", 1).isdigit())
    units = [(t, e) for t, e in timed if e[0] in ("start", "end")]
    if not units:
        raise ValueError("no start/end events")
    t0 = units[0][0]
    timed = [(t, e) for t, e in timed if t >= t0 - LOAD_WINDOW_S]
    state = BuildState(t0=t0 - LOAD_WINDOW_S, jobs=jobs)
    state.planned = {e[2] for _, e in units}
    record = EstimateRecord()
    end = units[-1][0]
    times = sorted({t for t, _ in units} | {t0 + k * step for k in range(int((end - t0) / step) + 1)})
    queue = list(timed)
    for now in times:
        while queue and queue[0][0] <= now:
            state.apply(queue.pop(0)[1])
        if state.running or state.waiting:
            record.add(now - t0, state.seconds_left(now))
    state.t0 = t0
    return state, record, end - t0


# --- what the compiler cache answered ---------------------------------------------------------
# The units' times tell the estimate which of them the cache answered (Done.cached); what the
# lines say comes from the cache's server itself: a build of tiny kernels (the tests') compiles
# in seconds too.

# sccache's languages of the units: a CUDA unit is one "CUDA" compile, a C++ one "C/C++"
# (compiler_cache_probe.py's UNIT_LANGUAGES).
UNIT_LANGUAGES = ("CUDA", "C/C++")


def cache_counts(settings_path: str) -> dict[str, tuple[int, int]] | None:
    """Per language of UNIT_LANGUAGES: (units the cache answered, units it missed) so far in
    this build, from the statistics of the build's sccache server; None when it cannot say."""
    try:
        with open(settings_path, encoding="utf-8") as f:
            settings = json.load(f)
        from sccache_launcher import claim_servers, server_env  # the server as the compiles reach it
        build = this_build()
        claim_servers(settings, settings_path, build)
        out = subprocess.run([settings["sccache"], "--show-stats", "--stats-format=json"],
                             env=server_env(settings, settings["server"], build), capture_output=True, text=True,
                             timeout=30, stdin=subprocess.DEVNULL)
        stats = json.loads(out.stdout)["stats"]
        return {lang: (stats["cache_hits"]["counts"].get(lang, 0), stats["cache_misses"]["counts"].get(lang, 0))
                for lang in UNIT_LANGUAGES}
    except (OSError, ValueError, KeyError, TypeError, subprocess.SubprocessError):
        return None


# --- the monitor -----------------------------------------------------------------------------

MAX_INTERVAL_S = 300.0


def runnable_now() -> int | None:
    """The processes runnable on this machine now, the caller aside (/proc/loadavg's 4th field)."""
    try:
        with open("/proc/loadavg") as f:
            return max(0, int(f.read().split()[3].split("/")[0]) - 1)
    except (OSError, ValueError, IndexError):
        return None


class Monitor:
    def __init__(self, build_dir: str, targets: list[str], jobs: int, interval: float, poll: float = 0.5,
                 sccache_settings: str = ""):
        self.sccache_settings = sccache_settings
        self.build_dir = os.path.abspath(build_dir)
        self.targets = targets
        self.jobs, self.interval, self.poll = jobs, interval, poll
        self.events = os.path.join(self.build_dir, EVENTS)
        self.log = os.path.join(self.build_dir, COMPILE_LOG)
        self.progress_log = os.path.join(self.build_dir, PROGRESS_LOG)
        self.relay_path = os.path.join(self.build_dir, RELAY)
        self.offset = 0
        self.inode = None
        self.partial = ""
        self.last_line = 0.0
        self.quiet_lines = 0  # status lines since the last other line (each waits twice as long)
        self.build = this_build()
        self.state: BuildState | None = None
        self.record = EstimateRecord()
        self.pending: dict[str, str] = {}  # unit -> what it handed over, printed with its line
        self.relaying = False
        self.runnable: list[int] = []  # processes runnable at each poll since the last load event
        self.last_load = 0.0
        self.cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)

    def say(self, state: BuildState, text: str, status: bool = False) -> None:
        if self.last_line == 0.0:
            start_build_logs(self.build_dir, self.build)  # this build's first line: a fresh log
        now = time.time()
        line = f"[vfa {clock(now - state.t0)}] {text}"
        print(line, flush=True)
        append_line(self.progress_log, line + "\n")
        self.last_line = now
        self.quiet_lines = self.quiet_lines + 1 if status else 0

    def show(self, text: str) -> None:
        """What a unit handed over (its warnings), as it printed it."""
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        sys.stdout.flush()

    def left(self, state: BuildState, now: float) -> str:
        seconds = state.seconds_left(now)
        self.record.add(now - state.t0, seconds)
        return about(seconds)

    def sample_load(self, now: float) -> None:
        """Counts the runnable processes (this one aside); every LOAD_EVERY_S their mean, as a
        slowdown, goes into the events (the estimate's, and a replay's)."""
        count = runnable_now()
        if count is None:
            return
        self.runnable.append(count)
        if now - self.last_load >= LOAD_EVERY_S:
            slowdown = max(1.0, sum(self.runnable) / len(self.runnable) / self.cores)
            append_line(self.events, f"load\t{now:.3f}\t\t{slowdown:.2f}\n")
            self.runnable, self.last_load = [], now

    def read_events(self) -> list[list[str]]:
        try:
            with open(self.events, encoding="utf-8", errors="surrogateescape") as f:
                inode = os.fstat(f.fileno()).st_ino
                if inode != self.inode:  # a new build's events (compile_unit.start_build_logs)
                    self.inode, self.offset, self.partial = inode, 0, ""
                f.seek(self.offset)
                chunk = f.read()
                self.offset = f.tell()
        except OSError:
            return []
        lines = (self.partial + chunk).split("\n")
        self.partial = lines.pop()  # an event still being written
        return [line.split("\t") for line in lines if line]

    # -- what units hand over (compile_unit.relay) --------------------------------------------

    def open_relay(self) -> None:
        try:
            with open(self.relay_path + ".tmp", "w", encoding="ascii") as f:
                f.write(self.build or "")
            os.replace(self.relay_path + ".tmp", self.relay_path)
            self.relaying = True
        except OSError:
            pass

    def close_relay(self, state: BuildState) -> None:
        """No unit hands anything over from now on; what was handed over is printed."""
        if not self.relaying:
            return
        self.relaying = False
        try:
            fd = os.open(self.relay_path, os.O_RDONLY)
        except OSError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.unlink(self.relay_path)
        except OSError:
            pass
        finally:
            os.close(fd)
        for event in self.read_events():
            self.take(state, event, quiet=True)
        for text in self.pending.values():
            self.show(text)
        self.pending.clear()

    def take(self, state: BuildState, event: list[str], quiet: bool = False) -> str | None:
        """One event: a unit's output is kept for its line, a note printed; returns the unit
        of an end event (after state.apply)."""
        if event[:1] == ["output"] and len(event) > 3:
            try:
                self.pending[event[2]] = self.pending.get(event[2], "") + json.loads(event[3])
            except ValueError:
                pass
            return None
        if event[:1] == ["note"] and len(event) > 3:
            try:
                self.say(state, json.loads(event[3]))
            except ValueError:
                pass
            return None
        unit = state.apply(event)
        if unit is not None and quiet and unit in self.pending:
            self.show(self.pending.pop(unit))
        return unit

    # -- lines -------------------------------------------------------------------------------

    def ask_cache(self, state: BuildState) -> dict[str, tuple[int, int]] | None:
        """What the compiler cache's server has answered so far; its CUDA count goes to the
        estimate. A build without a compiler cache has no hits."""
        if not self.sccache_settings:
            state.cache_counts = (0, sum(1 for u in state.running if unit_kind(u) != "C++")
                                  + sum(1 for d in state.done.values() if d.kind != "C++"))
            state.classify()
            return None
        counts = cache_counts(self.sccache_settings)
        if counts is not None:
            if state.cache_counts != counts["CUDA"]:  # for a replay of this build's events too
                append_line(self.events, f"cache\t{time.time():.3f}\t\t{counts['CUDA'][0]}\t{counts['CUDA'][1]}\n")
            state.cache_counts = counts["CUDA"]
            state.classify()
        return counts

    def from_cache(self, state: BuildState) -> str:
        """", N from the compiler cache" as its server counts them; "" when it cannot say."""
        counts = self.ask_cache(state)
        hits = sum(h for h, _ in counts.values()) if counts else 0
        return f", {hits} from the compiler cache" if counts and hits + sum(m for _, m in counts.values()) else ""

    def status(self, state: BuildState, now: float) -> str:
        done = sum(1 for d in state.done.values() if d.rc == 0)
        running = sorted(state.running.items(), key=lambda kv: kv[1])
        shown = ", ".join(f"{unit_name(u)} {clock(now - t)}" for u, t in running[:3])
        if len(running) > 3:
            shown += f" and {len(running) - 3} more"
        text = f"{done}/{state.total} done{self.from_cache(state)}"
        if running:
            text += f"; running {shown}"
        return text + f"; {self.left(state, now)} left ({state.basis(now)})"

    def status_due(self, now: float) -> bool:
        wait = min(self.interval * 2 ** self.quiet_lines, max(self.interval, MAX_INTERVAL_S))
        return now - self.last_line >= wait

    def run(self) -> None:
        me = ninja_ancestor(os.getpid())
        if me is None:
            print("[vfa] progress: cannot see ninja's jobs here (it needs Linux /proc); ninja prints each "
                  "unit as it ends", flush=True)
            return
        ninja, own_child = me
        state = self.state = BuildState(t0=started_at(ninja) or time.time(), jobs=self.jobs)
        # Units that end from now on hand their output over (printed when the monitor ends,
        # whichever way it ends).
        self.open_relay()
        try:
            self.watch(state, ninja, own_child)
        finally:
            self.close_relay(state)

    def watch(self, state: BuildState, ninja: int, own_child: int) -> None:
        try:
            planned = planned_units(os.readlink(f"/proc/{ninja}/exe"), self.build_dir, self.targets)
        except OSError:
            planned = None
        state.planned = planned or set()
        for event in self.read_events():
            self.take(state, event, quiet=True)
        failed = [unit for unit, d in state.done.items() if d.rc != 0]
        if failed:
            self.failed(state, failed[0])
            return
        if not state.running and not state.waiting:
            if state.done:  # ninja started this monitor after the compiles
                self.summary(state)
            return
        limit = ninja_job_limit(ninja)
        if limit <= min(self.jobs, len(state.waiting) + len(state.running)):
            # ninja counts this monitor against -j: it would take the place of a compile.
            print(f"[vfa] progress: off for this build: ninja runs {limit} jobs at a time, the build "
                  f"{self.jobs} compiles; run ninja with -j {self.jobs + 1} or more for progress lines",
                  flush=True)
            return
        self.follow(state, ninja, own_child, planned is not None)

    def follow(self, state: BuildState, ninja: int, own_child: int, planned: bool) -> None:
        now = time.time()
        cached, known = state.cache_share(now)
        self.say(state, f"compiling {state.total} units, {self.jobs} at a time: {self.left(state, now)}"
                        + (f" ({state.basis(now)})" if known else
                           " if the compiler cache holds none of them (its hits show within a minute)")
                        + f". A line per unit that compiles, and the units running every {self.interval:g} s "
                        f"or less often; all compiler output, upstream warnings included, goes to {self.log}")
        idle_polls = 0
        while True:
            time.sleep(self.poll)
            self.sample_load(time.time())
            for event in self.read_events():
                unit = self.take(state, event)
                if unit is None:
                    continue
                if state.done[unit].rc != 0:
                    self.failed(state, unit)
                    return
                self.finished(state, unit)
            now = time.time()
            if planned and not state.running and not state.waiting:
                break
            if now - self.record.last >= RECORD_EVERY_S:
                self.record.add(now - state.t0, state.seconds_left(now))  # what a line would say now
            others = [pid for pid in children(ninja) if pid != own_child]
            idle_polls = 0 if others else idle_polls + 1
            if idle_polls >= 2 or _stat(ninja) is None:
                break  # ninja runs nothing else: done, interrupted, or nothing to watch
            if state.running and self.status_due(now):
                self.say(state, self.status(state, now), status=True)
        self.summary(state)

    def finished(self, state: BuildState, unit: str) -> None:
        """A line for a unit that compiled; one the compiler cache answered, or a quick C++ one,
        is counted by the next status line. What the unit handed over follows its line."""
        if state.done[unit].kind != "C++":
            self.ask_cache(state)
        d = state.done[unit]
        output = self.pending.pop(unit, "")
        quick = d.cached or (d.kind == "C++" and d.seconds < HIT_MIN_S)
        if not quick or output:
            count = sum(1 for x in state.done.values() if x.rc == 0)
            now = time.time()
            left = state.running or state.waiting
            self.say(state, f"compiled {unit_name(unit)} ({d.kind}) in {clock(d.seconds)} [{count}/{state.total}]"
                     + (f"; {self.left(state, now)} left" if left else ""))
        if output:
            self.show(output)

    def failed(self, state: BuildState, unit: str) -> None:
        """Said once, then the monitor ends: ninja prints the unit's errors as soon as it has."""
        d, others = state.done[unit], len(state.running)
        running = "the compile still running ends" if others == 1 else f"the {others} compiles still running end"
        self.say(state, f"FAILED {unit_name(unit)} ({d.kind}) after {clock(d.seconds)}, exit {d.rc}: its "
                        f"errors follow" + (f"; ninja stops once {running}" if others else ""))

    def interrupted(self, signum: int) -> None:
        """One line for an interrupt: what the launchers stopped (compile_unit.py stops
        every process of its compile, in the compiler cache's server too), once the units
        running have said so or STOP_WAIT_S has passed."""
        state = self.state
        if state is None:
            return
        self.close_relay(state)
        deadline = time.time() + STOP_WAIT_S + 5
        while True:
            for event in self.read_events():
                self.take(state, event, quiet=True)
            if not state.running or time.time() > deadline:
                break
            time.sleep(0.2)
        name = signal.Signals(signum).name
        stopped = [unit for unit in state.stopped]
        processes = sum(p for p, _ in state.stopped.values())
        in_server = sum(s for _, s in state.stopped.values())
        if not stopped and not state.running:
            self.say(state, f"interrupted ({name}); no compile was running")
            return
        text = f"interrupted ({name}): stopped the {len(stopped)} compile{'s' if len(stopped) != 1 else ''} " \
               f"that were running ({processes} process{'es' if processes != 1 else ''}"
        text += f", {in_server} of them in the compiler cache's server)" if in_server else ")"
        if state.running:
            text += (f"; {len(state.running)} did not say so within {STOP_WAIT_S + 5} s: "
                     + ", ".join(unit_name(u) for u in sorted(state.running)))
        else:
            text += "; nothing of this build compiles any more"
        self.say(state, text)

    def summary(self, state: BuildState) -> None:
        ok = [d for d in state.done.values() if d.rc == 0]
        warnings = sum(d.hidden for d in state.done.values())
        notes = sum(d.notes for d in state.done.values())
        seconds = time.time() - state.t0
        hidden = " and ".join(x for x in (f"{warnings} compiler warning{'s' if warnings != 1 else ''}" if warnings else "",
                                          f"{notes} ptxas note{'s' if notes != 1 else ''}" if notes else "") if x)
        self.say(state, f"{len(ok)}/{state.total} compiled in {clock(seconds)}{self.from_cache(state)}"
                        + (f"; {hidden} in upstream code not shown here, all compiler output is in {self.log}"
                           if hidden else ""))
        if self.record.given and not state.running and not state.waiting:
            self.record.write(os.path.join(self.build_dir, ESTIMATE), state, seconds, "live")


def main(argv: list[str] | None = None) -> int:
    options = argparse.ArgumentParser(prog="build_monitor.py", description=__doc__.split("\n\n")[0])
    options.add_argument("--dir")
    options.add_argument("--targets", nargs="+", help="the targets whose compiles to follow")
    options.add_argument("--jobs", type=int, required=True)
    options.add_argument("--interval", type=float, default=30.0)
    options.add_argument("--unit-kind", action="append", default=[], metavar="TARGET|KIND|SECONDS|PATH TEXT",
                         help="a kind of CUDA unit, its reference seconds and the units it covers (add_unit_kind)")
    options.add_argument("--sccache-settings", default="", metavar="BUILD_DIR/vfa-sccache.json",
                         help="the build's compiler cache (compiler_cache_probe.py): the lines count its hits")
    options.add_argument("--replay", metavar="EVENTS.tsv",
                         help="print the estimate over a past build's events as JSON (what vfa-estimate.json holds)")
    args = options.parse_args(argv)
    for spec in args.unit_kind:
        add_unit_kind(spec)
    if args.replay:
        with open(args.replay, encoding="utf-8", errors="surrogateescape") as f:
            events = [line.rstrip("\n").split("\t") for line in f if line.strip()]
        state, record, seconds = replay(events, args.jobs)
        ok = [d for d in state.done.values() if d.rc == 0]
        print(json.dumps({"how": "replay", "seconds": round(seconds, 1), "units": state.total, "jobs": args.jobs,
                          "cached_units": sum(d.cached for d in ok), "compiled_units": sum(not d.cached for d in ok),
                          "points": record.table(seconds)}, indent=1))
        return 0
    if not args.dir or not args.targets:
        options.error("--dir and --targets are required (or --replay)")
    monitor = Monitor(args.dir, args.targets, args.jobs, args.interval, sccache_settings=args.sccache_settings)

    class Interrupted(Exception):
        pass

    received: list[int] = []

    def on_signal(signum, _frame):
        if not received:
            received.append(signum)
            raise Interrupted()

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, on_signal)
    try:
        monitor.run()
    except Interrupted:
        pass
    except Exception:  # noqa: BLE001 - a /proc surprise, a bug: progress never fails a build
        pass
    if received:
        # An interrupt is the user's: say what it stopped and pass it on as the exit status
        # (ninja, interrupted too, reports the build as stopped).
        try:
            monitor.interrupted(received[0])
        except Exception:  # noqa: BLE001
            pass
        return 128 + received[0]
    return 0


if __name__ == "__main__":
    sys.exit(main())
