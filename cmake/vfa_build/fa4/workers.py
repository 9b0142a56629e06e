"""FA4's worker pool: ``compile --jobs N`` over N supervised processes of this interpreter.

Each worker is ``fa4/precompile.py compile-worker`` on its share of the calls (fa4_compile in
a process of its own: each imports the DSL, about 1.4 GB), in a process group of its own.
Supervised to the end: the first worker to fail stops the others, and so does anything that
ends the wait (Ctrl-C, SIGTERM from the build tool); a worker that compiles no kernel within
the per-kernel bound (``--kernel-timeout``, the build's VFA_FA4_PRECOMPILE_KERNEL_TIMEOUT) is a
failure naming the kernel in hand; a line of progress comes at least every
``Bounds.progress_seconds`` (60) while the workers run; a worker killed by SIGKILL is named as
the out-of-memory killer's likely victim, with the memory available when it died; stopping a
worker stops its whole process group (what it started too); a worker dies with the process
that started it; each worker's stderr is kept and shown under a header; when
compile_in_workers returns or raises, no worker or child of one is left to write into the
output folder.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from vfa_build.fa4 import compile as fa4_compile
from vendored_flash_attn.families.fa4.plan import KernelCall

# The build step's entry (fa4.precompile through the build package's entry point): each worker
# runs its `compile-worker` subcommand.
ENTRY = [str(Path(__file__).resolve().parents[1]), "fa4.precompile"]

# How long a worker asked to stop (SIGTERM) may take before it is killed: the DSL's compile
# of one kernel does not look at signals, so a stop can wait for the kernel in hand.
WORKER_STOP_SECONDS = 10.0


@dataclasses.dataclass(frozen=True)
class Bounds:
    """How the workers are held. ``kernel_seconds``: the longest a worker may go without
    finishing a kernel (its first one includes its import of the DSL), None for no bound —
    then a single job runs in this process, as a developer's `compile` without the build's
    bound does; with a bound every job runs in a worker, so that it can be stopped.
    ``progress_seconds``: the longest the supervisor stays silent while workers run."""

    kernel_seconds: float | None = None
    progress_seconds: float = 60.0


def _interpreter_flags() -> list[str]:
    """This interpreter's own flags for a worker, so it sees what this process sees (the
    build runs FA4's steps in the environment its probe checked: cmake/FA4Package.cmake)."""
    flags = sys.flags
    return [flag for flag, on in (("-I", flags.isolated), ("-E", flags.ignore_environment and not flags.isolated),
                                  ("-s", flags.no_user_site and not flags.isolated), ("-S", flags.no_site)) if on]


def _die_with_parent() -> None:
    """In a worker, before it runs: killed when the process that started it dies (Linux),
    so no worker outlives the build step, whatever ended the step."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the supervisor's own stop still applies
        pass


def _first_error(text: str) -> str:
    """The line that says what went wrong in a worker's stderr: a traceback's last line (the
    exception), else its last non-empty line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        if re.match(r"^[\w.]+(Error|Exception|Interrupt|Exit)\b", line):
            return line
    return lines[-1] if lines else "(nothing on stderr)"


def _meminfo_mb() -> dict[str, int]:
    """MemTotal and MemAvailable of this machine in MB (Linux; empty elsewhere)."""
    found = {}
    try:
        for line in Path("/proc/meminfo").read_text(encoding="utf-8").splitlines():
            name, _, value = line.partition(":")
            if name in ("MemTotal", "MemAvailable"):
                found[name] = int(value.split()[0]) // 1024
    except (OSError, ValueError, IndexError):
        pass
    return found


def _rss_mb(pid: int) -> int | None:
    """A running process's resident memory in MB (Linux), None when it cannot be read."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text(encoding="utf-8").splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _exit_words(code: int, rss_mb: int | None, memory: dict[str, int]) -> str:
    """How a worker ended, in words: its exit status, or the signal that ended it; SIGKILL
    (which nothing of ours sends before a stop) named as the out-of-memory killer's, with the
    memory figures at the time."""
    if code >= 0:
        return f"exited with {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = "an unknown signal"
    words = f"was killed by signal {-code} ({name})"
    if -code == signal.SIGKILL:
        figures = []
        if rss_mb is not None:
            figures.append(f"it used {rss_mb} MB when last seen")
        if "MemAvailable" in memory:
            figures.append(f"{memory['MemAvailable']} MB of {memory.get('MemTotal', '?')} MB were available when it "
                           "died")
        words += (", most likely by the kernel's out-of-memory killer (" + "; ".join(figures or ["no memory figure"])
                  + "; each worker needs about 1.4 GB: build with fewer jobs, MAX_JOBS=N)")
    return words


# What stops the step: Ctrl-C, and SIGTERM (what ninja and CI runners send).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# The stop signals seen while stop_signals() is active, and whether its handler raises.
_stop_state = {"seen": [], "raise": True}


def _on_stop_signal(signum, frame) -> None:
    _stop_state["seen"].append(signum)
    if _stop_state["raise"]:
        raise KeyboardInterrupt


@contextlib.contextmanager
def stop_signals(*, raising: bool = True):
    """While active, Ctrl-C and SIGTERM stop the step: each is remembered, and raises
    KeyboardInterrupt where it lands if ``raising``, else only when ``stop_requested()`` is
    asked (the supervisor's wait: no interrupt lands inside a worker's start or stop).
    Remembered because Python can lose the exception: a signal whose handler raises while a
    finalizer runs (``__del__``, a weakref callback: the garbage collector runs them at any
    point) is printed as "Exception ignored" and the program goes on; leaving this block
    raises it again, so a stop is never lost. Main thread only (Python's signal handlers)."""
    outermost = signal.getsignal(signal.SIGINT) is not _on_stop_signal
    if outermost:
        _stop_state["seen"].clear()
    was_raising = _stop_state["raise"]
    previous = {signum: signal.signal(signum, _on_stop_signal) for signum in STOP_SIGNALS}
    _stop_state["raise"] = raising
    try:
        yield
    finally:
        _stop_state["raise"] = was_raising
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if _stop_state["seen"]:  # reached only when no exception left the block: a stop Python lost
        raise KeyboardInterrupt


def stop_requested() -> bool:
    return bool(_stop_state["seen"])


# What a worker's report must hold (fa4_compile.compile_selection's): a worker that exits 0
# without one of these failed, so nothing after the workers reads a key that is not there.
REPORT_KEYS = ("flavour", "python", "cutlass", "tvm_ffi", "fingerprint", "import_seconds", "peak_rss_mb", "calls")


def _report_problem(report: Path) -> str | None:
    """Why a worker that exited 0 has not reported (None when its report is whole)."""
    try:
        data = json.loads(report.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return f"no readable report ({type(exc).__name__})"
    missing = [key for key in REPORT_KEYS if key not in data] if isinstance(data, dict) else list(REPORT_KEYS)
    return f"its report lacks {', '.join(missing)}" if missing else None


class WorkerFailed(RuntimeError):
    """A compile worker failed; the others were stopped before this was raised."""


def _signal_group(process, sig) -> None:
    """``sig`` to the worker's process group (it leads its own: start_new_session), so what
    it started gets it too."""
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):  # the group is gone
        pass


def _stop(processes) -> None:
    """Stop every worker's process group (SIGTERM, then SIGKILL after WORKER_STOP_SECONDS) and
    reap the workers: when this returns, none of them, and nothing they started, runs or
    writes anything any more."""
    for process in processes:
        _signal_group(process, signal.SIGTERM)
    deadline = time.monotonic() + WORKER_STOP_SECONDS
    for process in processes:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:  # it ignored SIGTERM
            process.kill()
            process.wait()
    for process in processes:  # a child that outlived its worker, or ignored SIGTERM
        _signal_group(process, signal.SIGKILL)


@dataclasses.dataclass
class _Worker:
    index: int
    shard: list
    process: subprocess.Popen
    report: Path
    progress: Path
    stderr: object
    done: int = 0
    since: float = 0.0  # when its last kernel ended (or it started)
    rss_mb: int | None = None

    def read_progress(self, now: float) -> int:
        """How many kernels it has ended since the last look (one line each in its progress file)."""
        try:
            done = len(self.progress.read_bytes().splitlines())
        except OSError:
            done = self.done
        new, self.done = done - self.done, max(done, self.done)
        if new > 0:
            self.since = now
        return max(new, 0)

    @property
    def in_hand(self) -> str:
        return self.shard[self.done].name if self.done < len(self.shard) else "(its report)"


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes} min {secs} s" if minutes else f"{secs} s"


def compile_in_workers(stage_root: Path, out: Path, arch: str, calls: list[KernelCall], jobs: int,
                       bounds: Bounds = Bounds()) -> dict:
    """``compile_selection`` over ``jobs`` worker processes of this interpreter (each imports
    the DSL: about 1.4 GB), the calls dealt round-robin; one report, calls in plan order.
    Kernels are keyed files, so workers share the output folder; a kernel two workers reach
    (the split-KV combine) is written under upstream's lock, with the same bytes.

    Supervised (``bounds``): the first worker to fail — an exit status other than 0, a signal,
    no kernel within ``bounds.kernel_seconds`` — stops the others (their whole process groups:
    SIGTERM, then SIGKILL) before this raises, and so does anything that ends this process's
    wait (Ctrl-C, SIGTERM from the build tool): when this returns or raises, nothing a worker
    started is left to write into ``out``, so a clean-up after it sees every file there is
    going to be. A line of progress at least every ``bounds.progress_seconds``. Each worker's
    stderr is kept in a file and copied to this process's stderr, under a header, when it has
    ended; the error raised names the first failing worker's error line (WorkerFailed)."""
    import tempfile

    shards = [shard for shard in (calls[i::jobs] for i in range(max(1, jobs))) if shard]
    if len(shards) <= 1 and bounds.kernel_seconds is None:
        return fa4_compile.compile_selection(stage_root, out, arch, calls)
    # Ctrl-C and SIGTERM end the wait below (stop_requested), never a worker's start: every
    # worker started is in `workers`, so the stop in `finally` reaches it; leaving the block
    # raises KeyboardInterrupt.
    with tempfile.TemporaryDirectory(prefix="vfa-fa4-workers-") as tmp, stop_signals(raising=False):
        workers: list[_Worker] = []
        started = time.monotonic()
        try:
            for index, shard in enumerate(shards):
                if stop_requested():
                    break
                todo, report = Path(tmp, f"{index}.calls.json"), Path(tmp, f"{index}.report.json")
                progress = Path(tmp, f"{index}.progress")
                todo.write_text(json.dumps([dataclasses.asdict(c) for c in shard]), encoding="utf-8")
                command = [sys.executable, *_interpreter_flags(), *ENTRY, "compile-worker",
                           "--stage", str(stage_root), "--out", str(out), "--arch", arch,
                           "--calls", str(todo), "--report", str(report), "--progress", str(progress)]
                stderr = open(Path(tmp, f"{index}.stderr"), "w+b")  # noqa: SIM115 - closed below
                process = subprocess.Popen(command, stderr=stderr, preexec_fn=_die_with_parent,
                                           start_new_session=True)
                workers.append(_Worker(index, shard, process, report, progress, stderr, since=time.monotonic()))
            failed = None  # (worker, what happened in words, whether its stderr's error line says more)
            running = {w.index for w in workers}
            said = time.monotonic()
            while running and failed is None and not stop_requested():
                now = time.monotonic()
                for worker in workers:
                    if worker.index not in running:
                        continue
                    worker.read_progress(now)
                    code = worker.process.poll()
                    if code is None:
                        worker.rss_mb = _rss_mb(worker.process.pid) or worker.rss_mb
                        if bounds.kernel_seconds is not None and now - worker.since > bounds.kernel_seconds:
                            failed = (worker, f"finished no kernel in {bounds.kernel_seconds:g} s (the bound, "
                                              f"VFA_FA4_PRECOMPILE_KERNEL_TIMEOUT), stuck on {worker.in_hand}", True)
                            break
                        continue
                    running.discard(worker.index)
                    problem = _report_problem(worker.report) if code == 0 else None
                    if code != 0:
                        failed = (worker, _exit_words(code, worker.rss_mb, _meminfo_mb()), True)
                        break
                    if problem:
                        failed = (worker, f"exited with 0 but {problem}", False)
                        break
                else:
                    if now - said >= bounds.progress_seconds:
                        done = sum(w.done for w in workers)
                        hands = ", ".join(f"worker {w.index + 1}: {w.in_hand} for {_duration(now - w.since)}"
                                          for w in workers if w.index in running)
                        print(f"FA4 precompile {arch}: {done} of {len(calls)} kernels compiled in "
                              f"{_duration(now - started)}; {len(running)} of {len(workers)} workers running "
                              f"({hands})", flush=True)
                        said = now
                    time.sleep(0.1)
        finally:
            _stop([w.process for w in workers])
            errors = {}
            for worker in workers:
                worker.stderr.seek(0)
                text = worker.stderr.read().decode(errors="replace")
                worker.stderr.close()
                if text.strip():
                    errors[worker.index] = text
                    sys.stderr.write(f"--- FA4 compile worker {worker.index + 1} of {len(workers)} "
                                     f"(exit {worker.process.returncode}), its stderr:\n{text.rstrip()}\n")
            sys.stderr.flush()
        if stop_requested():  # whatever the workers did: the step stops
            raise KeyboardInterrupt
        if failed is not None:
            worker, what, with_error = failed
            stopped = len(workers) - 1
            said = errors.get(worker.index, "")
            error = f": {_first_error(said)}" if with_error and (said.strip() or what.startswith("exited")) else ""
            raise WorkerFailed(f"FA4 compile worker {worker.index + 1} of {len(workers)} {what}{error} (the other "
                               f"{stopped} stopped; each worker's stderr is above)")
        reports = [json.loads(w.report.read_text(encoding="utf-8")) for w in workers]
    order = {call.name: i for i, call in enumerate(calls)}
    merged = {**reports[0], "jobs": len(shards),
              "import_seconds": max(r["import_seconds"] for r in reports),
              "peak_rss_mb": max(r["peak_rss_mb"] for r in reports),
              "calls": sorted((c for r in reports for c in r["calls"]), key=lambda c: order[c["call"]])}
    return merged
