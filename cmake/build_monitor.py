"""The progress of the compiles, printed while they run.

    build_monitor.py --dir BUILD_DIR --targets TARGET... --jobs N --interval S
                     [--unit-kind "TARGET|KIND|SECONDS|PATH TEXT" ...]

The command of the `build_progress` target (cmake/BuildProgress.cmake), which runs in
ninja's console pool: the one way to print while other commands run, since ninja
buffers each command's output until it ends. It follows the events that compile_unit.py
writes for every unit and prints a line per finished unit and, every S seconds, the
units running, how many are done, the elapsed time and an estimate of what is left (a
longest-first schedule of the units still to compile on the N compile jobs, each at the
mean time of this build's finished units of its kind: C++, or a kind of CUDA unit that a
module's family declares (FA3 CUDA, FA2 CUDA, FA2 split-KV, ...: --unit-kind); or, for a
kind none of which has finished, reference times at this machine's pace so far, which
units running past their reference time raise).

While it runs ninja holds back its own lines, so it ends as soon as it has nothing to
add: when every unit ninja planned for the targets (a dry run, `ninja -n`, at its start)
has compiled,
when one fails (ninja then prints that unit's error at once), or when ninja runs nothing
but the monitor. It also steps aside when ninja's -j leaves no room beside the compile
jobs (it would take a compile's place). It exits 0 whatever happens (progress must never
fail or hold up a build) except on an interrupt (SIGINT, SIGTERM, SIGHUP): then it says in
one line what the compile launchers stopped and exits 128 + the signal. Linux only (it reads /proc); elsewhere it prints one line and
ends.

Example (the minimal preset on a 2-core machine, through `pip install -v`):

    [vfa 0:03] compiling 22 units, 2 at a time: about 24 min (from reference times). ...
    [vfa 0:33] 0/22 compiled; running flash_fwd_hdim128_bf16_paged_sm90.cu 0:30, ...
    [vfa 4:31] compiled flash_fwd_hdim128_bf16_paged_sm90.cu (FA3 CUDA) in 4:28 [1/22]; ...
    [vfa 32:40] 22/22 compiled in 32:37; 97 warnings in upstream code not shown here, ...
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compile_unit import (COMPILE_LOG, EVENTS, PROGRESS_LOG, STOP_WAIT_S, _comm, _stat,  # noqa: E402
                          append_line, start_build_logs, this_build)

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


def add_unit_kind(spec: str) -> None:
    """Declare a kind of CUDA unit: "TARGET|KIND|SECONDS|PATH TEXT" (what --unit-kind takes):
    the units of TARGET whose path holds PATH TEXT (any, when empty), at SECONDS for reference.
      add_unit_kind("_vendored_fa3_C|FA3 CUDA|153|/instantiations/")"""
    target, kind, seconds, contains = spec.split("|")
    UNIT_KINDS.append((f"{target}.dir", kind, contains))
    REFERENCE_SECONDS[kind] = float(seconds)


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


# --- the monitor -----------------------------------------------------------------------------


@dataclass
class Done:
    kind: str
    seconds: float
    rc: int
    hidden: int


@dataclass
class BuildState:
    """What the events of this build say, and what is left of it."""
    t0: float
    jobs: int
    planned: set[str] = field(default_factory=set)
    running: dict[str, float] = field(default_factory=dict)  # unit -> start time
    done: dict[str, Done] = field(default_factory=dict)
    stopped: dict[str, tuple[int, int]] = field(default_factory=dict)  # unit -> (processes, in a server)

    def apply(self, event: list[str]) -> str | None:
        """Take one event (the fields of a line of compile_unit.py's events) in; return the
        unit of an end event."""
        try:
            kind, t, unit = event[0], float(event[1]), event[2]
            if t < self.t0:
                return None  # an earlier build's
            if kind == "start":
                self.running[unit] = t
            elif kind == "end":
                rc, seconds, hidden = int(event[3]), float(event[4]), int(event[5])
                self.running.pop(unit, None)
                self.done[unit] = Done(unit_kind(unit), seconds, rc, hidden)
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

    def pace(self, now: float) -> float:
        """How much longer than the reference times this machine takes (1: as fast): the
        finished units' seconds over their reference seconds, so a 150-s kind weighs 30
        times a 5-s C++ unit; and no less than what the units still running past their
        reference time show (their time so far is a lower bound of theirs). 1 before any
        unit finishes or runs past its reference."""
        ok = [d for d in self.done.values() if d.rc == 0]
        seconds = sum(d.seconds for d in ok)
        reference = sum(REFERENCE_SECONDS[d.kind] for d in ok)
        pace = seconds / reference if reference else 1.0
        overdue = [(now - start, REFERENCE_SECONDS[unit_kind(unit)]) for unit, start in self.running.items()
                   if now - start > REFERENCE_SECONDS[unit_kind(unit)] * pace]
        if overdue:
            pace = max(pace, (seconds + sum(e for e, _ in overdue)) / (reference + sum(r for _, r in overdue)))
        return pace

    def cost(self, kind: str, now: float) -> float:
        """Expected seconds for a unit of `kind`: the mean of this build's finished units of
        that kind, else the reference at this machine's pace."""
        same = [d.seconds for d in self.done.values() if d.rc == 0 and d.kind == kind]
        if same:
            return sum(same) / len(same)
        return REFERENCE_SECONDS[kind] * self.pace(now)

    def basis(self) -> str:
        n = sum(1 for d in self.done.values() if d.rc == 0)
        return f"from {n} finished unit{'s' if n != 1 else ''}" if n else "from reference times"

    def seconds_left(self, now: float) -> float:
        """Longest-first list schedule of what is left on the compile jobs, the running
        units first with what their own expected time leaves of them: a unit past it is
        expected to run a tenth as long again (at least), never to be as good as done."""
        loads = []
        for unit, start in self.running.items():
            cost, elapsed = self.cost(unit_kind(unit), now), now - start
            loads.append(max(cost - elapsed, 0.1 * max(cost, elapsed)))
        workers = max(self.jobs, len(loads), 1)
        loads += [0.0] * (workers - len(loads))
        for cost in sorted((self.cost(unit_kind(u), now) for u in self.waiting), reverse=True):
            loads.sort()
            loads[0] += cost
        return max(loads)


class Monitor:
    def __init__(self, build_dir: str, targets: list[str], jobs: int, interval: float, poll: float = 0.5):
        self.build_dir = os.path.abspath(build_dir)
        self.targets = targets
        self.jobs, self.interval, self.poll = jobs, interval, poll
        self.events = os.path.join(self.build_dir, EVENTS)
        self.log = os.path.join(self.build_dir, COMPILE_LOG)
        self.progress_log = os.path.join(self.build_dir, PROGRESS_LOG)
        self.offset = 0
        self.inode = None
        self.partial = ""
        self.last_line = 0.0
        self.build = this_build()
        self.state: BuildState | None = None

    def say(self, state: BuildState, text: str) -> None:
        if self.last_line == 0.0:
            start_build_logs(self.build_dir, self.build)  # this build's first line: a fresh log
        now = time.time()
        line = f"[vfa {clock(now - state.t0)}] {text}"
        print(line, flush=True)
        append_line(self.progress_log, line + "\n")
        self.last_line = now

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

    def status(self, state: BuildState, now: float) -> str:
        done = sum(1 for d in state.done.values() if d.rc == 0)
        running = sorted(state.running.items(), key=lambda kv: kv[1])
        shown = ", ".join(f"{unit_name(u)} {clock(now - t)}" for u, t in running[:3])
        if len(running) > 3:
            shown += f" and {len(running) - 3} more"
        text = f"{done}/{state.total} compiled"
        if running:
            text += f"; running {shown}"
        return text + f"; {about(state.seconds_left(now))} left"

    def run(self) -> None:
        me = ninja_ancestor(os.getpid())
        if me is None:
            print("[vfa] progress: cannot see ninja's jobs here (it needs Linux /proc); ninja prints each "
                  "unit as it ends", flush=True)
            return
        ninja, own_child = me
        state = self.state = BuildState(t0=started_at(ninja) or time.time(), jobs=self.jobs)
        try:
            planned = planned_units(os.readlink(f"/proc/{ninja}/exe"), self.build_dir, self.targets)
        except OSError:
            planned = None
        state.planned = planned or set()
        for event in self.read_events():
            state.apply(event)
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
        self.say(state, f"compiling {state.total} units, {self.jobs} at a time: "
                        f"{about(state.seconds_left(time.time()))} ({state.basis()}). A line per finished "
                        f"unit and every {self.interval:g} s; all compiler output, upstream warnings "
                        f"included, goes to {self.log}")
        idle_polls = 0
        while True:
            time.sleep(self.poll)
            for event in self.read_events():
                unit = state.apply(event)
                if unit is None:
                    continue
                if state.done[unit].rc != 0:
                    self.failed(state, unit)
                    return
                self.finished(state, unit)
            now = time.time()
            if planned is not None and not state.running and not state.waiting:
                break
            others = [pid for pid in children(ninja) if pid != own_child]
            idle_polls = 0 if others else idle_polls + 1
            if idle_polls >= 2 or _stat(ninja) is None:
                break  # ninja runs nothing else: done, interrupted, or nothing to watch
            if state.running and now - self.last_line >= self.interval:
                self.say(state, self.status(state, now))
        self.summary(state)

    def finished(self, state: BuildState, unit: str) -> None:
        d = state.done[unit]
        count = sum(1 for x in state.done.values() if x.rc == 0)
        left = state.running or state.waiting
        self.say(state, f"compiled {unit_name(unit)} ({d.kind}) in {clock(d.seconds)} [{count}/{state.total}]"
                 + (f"; {about(state.seconds_left(time.time()))} left ({state.basis()})" if left else ""))

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
        deadline = time.time() + STOP_WAIT_S + 5
        while True:
            for event in self.read_events():
                state.apply(event)
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
        hidden = sum(d.hidden for d in state.done.values())
        compiled = sum(1 for d in state.done.values() if d.rc == 0)
        self.say(state, f"{compiled}/{state.total} compiled in {clock(time.time() - state.t0)}"
                        + (f"; {hidden} warnings in upstream code not shown here, all compiler output is in "
                           f"{self.log}" if hidden else ""))


def main(argv: list[str] | None = None) -> int:
    options = argparse.ArgumentParser(prog="build_monitor.py", description=__doc__.split("\n\n")[0])
    options.add_argument("--dir", required=True)
    options.add_argument("--targets", nargs="+", required=True, help="the targets whose compiles to follow")
    options.add_argument("--jobs", type=int, required=True)
    options.add_argument("--interval", type=float, default=30.0)
    options.add_argument("--unit-kind", action="append", default=[], metavar="TARGET|KIND|SECONDS|PATH TEXT",
                         help="a kind of CUDA unit, its reference seconds and the units it covers (add_unit_kind)")
    args = options.parse_args(argv)
    for spec in args.unit_kind:
        add_unit_kind(spec)
    monitor = Monitor(args.dir, args.targets, args.jobs, args.interval)

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
