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

The estimate is cmake/vfa_build/progress/progress_estimate.py's, what ninja is doing is read through
cmake/vfa_build/units/ninja_processes.py; this file follows the events and prints.

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
import signal
import subprocess
import sys
import time

from vfa_build.units.compile_unit import (COMPILE_LOG, EVENTS, PROGRESS_LOG, RELAY, STOP_WAIT_S, _stat,
                          append_line, closed_relay_text, start_build_logs, this_build)
from vfa_build.units.ninja_processes import children, ninja_ancestor, ninja_job_limit, planned_units, started_at
from vfa_build.progress.progress_estimate import (ESTIMATE, HIT_MIN_S, LOAD_EVERY_S, RECORD_EVERY_S, BuildState,
                               EstimateRecord, about, add_unit_kind, clock, replay, unit_kind, unit_name)


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
        from vfa_build.compiler_cache.sccache_servers import claim_servers, server_env  # the server as the compiles reach it
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
        with open("/proc/loadavg", encoding="utf-8") as f:
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
            # Closed, not removed: a unit ending now prints itself at once rather than wait
            # for this monitor as for one that has not opened it yet (compile_unit.hand_over).
            with open(self.relay_path + ".tmp", "w", encoding="ascii") as f:
                f.write(closed_relay_text(self.build))
            os.replace(self.relay_path + ".tmp", self.relay_path)
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
