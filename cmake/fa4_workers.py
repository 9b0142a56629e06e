"""FA4's worker pool: ``compile --jobs N`` over N supervised processes of this interpreter.

Each worker is ``fa4_precompile.py compile-worker`` on its share of the calls (fa4_compile in
a process of its own: each imports the DSL, about 1.4 GB). Supervised: the first worker to
fail stops the others, and so does anything that ends the wait (Ctrl-C, SIGTERM from the
build tool); a worker dies with the process that started it; each worker's stderr is kept
and shown under a header; when compile_in_workers returns or raises, no worker is left to
write into the output folder.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import fa4_compile
from vendored_flash_attn.fa4_plan import KernelCall

# The build step's entry: each worker runs its `compile-worker` subcommand.
ENTRY = Path(__file__).resolve().with_name("fa4_precompile.py")

# How long a worker asked to stop (SIGTERM) may take before it is killed: the DSL's compile
# of one kernel does not look at signals, so a stop can wait for the kernel in hand.
WORKER_STOP_SECONDS = 10.0


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
    import signal

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
        data = json.loads(report.read_text())
    except (OSError, ValueError) as exc:
        return f"no readable report ({type(exc).__name__})"
    missing = [key for key in REPORT_KEYS if key not in data] if isinstance(data, dict) else list(REPORT_KEYS)
    return f"its report lacks {', '.join(missing)}" if missing else None


class WorkerFailed(RuntimeError):
    """A compile worker failed; the others were stopped before this was raised."""


def _stop(processes) -> None:
    """Stop every process still running (SIGTERM, then SIGKILL after WORKER_STOP_SECONDS) and
    reap them all: when this returns, none of them runs or writes anything any more."""
    for process in processes:
        if process.poll() is None:
            process.terminate()
    deadline = time.monotonic() + WORKER_STOP_SECONDS
    for process in processes:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:  # it ignored SIGTERM
            process.kill()
            process.wait()


def compile_in_workers(stage_root: Path, out: Path, arch: str, calls: list[KernelCall], jobs: int) -> dict:
    """``compile_selection`` over ``jobs`` worker processes of this interpreter (each imports
    the DSL: about 1.4 GB), the calls dealt round-robin; one report, calls in plan order.
    Kernels are keyed files, so workers share the output folder; a kernel two workers reach
    (the split-KV combine) is written under upstream's lock, with the same bytes.

    Supervised: the first worker to fail stops the others (SIGTERM, then SIGKILL) before this
    raises, and so does anything that ends this process's wait (Ctrl-C, SIGTERM from the
    build tool): when this returns or raises, no worker is left to write into ``out``, so a
    clean-up after it sees every file there is going to be. Each worker's stderr is kept in
    a file and copied to this process's stderr, under a header, when it has ended; the error
    raised names the first failing worker's error line (WorkerFailed)."""
    import tempfile

    shards = [shard for shard in (calls[i::jobs] for i in range(max(1, jobs))) if shard]
    if len(shards) <= 1:
        return fa4_compile.compile_selection(stage_root, out, arch, calls)
    # Ctrl-C and SIGTERM end the wait below (stop_requested), never a worker's start: every
    # worker started is in `workers`, so the stop in `finally` reaches it; leaving the block
    # raises KeyboardInterrupt.
    with tempfile.TemporaryDirectory(prefix="vfa-fa4-workers-") as tmp, stop_signals(raising=False):
        workers = []  # (index, process, report file, stderr file)
        try:
            for index, shard in enumerate(shards):
                if stop_requested():
                    break
                todo, report = Path(tmp, f"{index}.calls.json"), Path(tmp, f"{index}.report.json")
                todo.write_text(json.dumps([dataclasses.asdict(c) for c in shard]), encoding="utf-8")
                command = [sys.executable, *_interpreter_flags(), str(ENTRY), "compile-worker",
                           "--stage", str(stage_root), "--out", str(out), "--arch", arch,
                           "--calls", str(todo), "--report", str(report)]
                stderr = open(Path(tmp, f"{index}.stderr"), "w+b")  # noqa: SIM115 - closed below
                workers.append((index, subprocess.Popen(command, stderr=stderr, preexec_fn=_die_with_parent),
                                report, stderr))
            failed = None  # (index, exit status, what its report lacks)
            running = {index for index, *_ in workers}
            while running and failed is None and not stop_requested():
                for index, process, report, _ in workers:
                    if index in running and process.poll() is not None:
                        running.discard(index)
                        problem = _report_problem(report) if process.returncode == 0 else None
                        if process.returncode != 0 or problem:
                            failed = (index, process.returncode, problem)
                            break
                else:
                    time.sleep(0.1)
        finally:
            _stop([process for _, process, _, _ in workers])
            errors = {}
            for index, process, _, stderr in workers:
                stderr.seek(0)
                text = stderr.read().decode(errors="replace")
                stderr.close()
                if text.strip():
                    errors[index] = text
                    sys.stderr.write(f"--- FA4 compile worker {index + 1} of {len(workers)} "
                                     f"(exit {process.returncode}), its stderr:\n{text.rstrip()}\n")
            sys.stderr.flush()
        if stop_requested():  # whatever the workers did: the step stops
            raise KeyboardInterrupt
        if failed is not None:
            index, code, problem = failed
            why = f" but {problem}" if problem else f": {_first_error(errors.get(index, ''))}"
            raise WorkerFailed(f"FA4 compile worker {index + 1} of {len(workers)} exited with {code}{why} (the "
                               f"other {len(workers) - 1} stopped; each worker's stderr is above)")
        reports = [json.loads(report.read_text(encoding="utf-8")) for _, _, report, _ in workers]
    order = {call.name: i for i, call in enumerate(calls)}
    merged = {**reports[0], "jobs": len(shards),
              "import_seconds": max(r["import_seconds"] for r in reports),
              "peak_rss_mb": max(r["peak_rss_mb"] for r in reports),
              "calls": sorted((c for r in reports for c in r["calls"]), key=lambda c: order[c["call"]])}
    return merged
