"""The estimate of what is left of a build, from the events of its units (build_monitor.py prints it).

The kinds of units (a target's CUDA units by path, C++ units) with their reference times,
cold and answered by the compiler cache; what the events say (BuildState: planned, running,
done, the cache's counts, the machine's load) and the time left it gives: each unit still to
run at its kind's expected time, scheduled longest first on the compile jobs; the record of
the estimate against what was actually left (EstimateRecord, written to vfa-estimate.json);
and the same over a past build's events (replay: benchmarks/build_estimate.py). Standard
library only; names no kernel family (the kinds come from the families' targets).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Optional

from vfa_build.units.kinds import UnitKindSpec, parse_unit_kind  # noqa: F401  (the one parser; the estimate's callers use it here)

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


# Seconds a unit of each kind takes when the compiler cache answers it (sccache still runs
# nvcc's host-side steps, which take longer on the heavier headers), for reference: measured on
# the 2-core CPU machine, scaled by what this build's cached units take (BuildState.cached_seconds).
CACHED_SECONDS = {"C++": 1.0, "CUDA": 10.0}


def add_unit_kind(spec: str) -> None:
    """Declare a kind of CUDA unit (parse_unit_kind's spec) for the estimate."""
    unit = parse_unit_kind(spec)
    UNIT_KINDS.append((f"{unit.target}.dir", unit.kind, unit.contains))
    REFERENCE_SECONDS[unit.kind] = unit.seconds
    CACHED_SECONDS[unit.kind] = unit.cached_seconds if unit.cached_seconds is not None else CACHED_SECONDS["CUDA"]


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
