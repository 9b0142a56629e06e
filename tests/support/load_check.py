"""`--load-check[=N]`: the tests with N busy processes beside them (2 x this machine's CPUs
when N is not given), started when the session starts and stopped when it ends, to show that
no test's verdict depends on how fast the machine is (docs/testing.md). The
closing lines give the run's time and the load average (1 min) seen during it.

Wired in tests/conftest.py. The hogs are plain `while True: pass` loops of this
interpreter; each dies with the session (PR_SET_PDEATHSIG) if pytest is killed."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

HOG = "while True: pass"


def cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def hogs_wanted(value: str) -> int:
    """The option's value: a count, or "auto" for 2 x CPUs."""
    if value == "auto":
        return 2 * cpus()
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"--load-check={value!r}: give a number of busy processes (1 or more), or no value "
                         f"for 2 x the {cpus()} CPUs")
    return int(value)


def _die_with_parent() -> None:
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def load_average() -> float | None:
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


class LoadCheck:
    SAMPLE_EVERY_S = 10.0

    def __init__(self, count: int):
        self.count = count
        self.hogs: list[subprocess.Popen] = []
        self.samples: list[float] = []
        self.done = threading.Event()
        self.started = self.seconds = 0.0

    def _sample(self) -> None:
        while not self.done.wait(self.SAMPLE_EVERY_S):
            load = load_average()
            if load is not None:
                self.samples.append(load)

    def pytest_sessionstart(self, session):
        # Not marked as the session's (tests/support/leftovers.py): they are stopped below.
        env = {k: v for k, v in os.environ.items() if k != "VENDORED_FA_TEST_SESSION"}
        self.hogs = [subprocess.Popen([sys.executable, "-S", "-c", HOG], env=env, stdin=subprocess.DEVNULL,
                                      preexec_fn=_die_with_parent) for _ in range(self.count)]
        self.started = time.monotonic()
        threading.Thread(target=self._sample, daemon=True).start()

    def pytest_sessionfinish(self, session):
        self.seconds = time.monotonic() - self.started
        self.done.set()
        for hog in self.hogs:
            hog.terminate()
        for hog in self.hogs:
            hog.wait()

    def pytest_terminal_summary(self, terminalreporter):
        loads = self.samples
        said = (f"load average (1 min, every {self.SAMPLE_EVERY_S:g} s) mean {sum(loads) / len(loads):.1f}, "
                f"max {max(loads):.1f}" if loads else "the run was shorter than one load sample")
        terminalreporter.write_sep("=", "load check (--load-check)")
        terminalreporter.write_line(f"{self.count} busy processes beside the tests ({cpus()} CPUs) for "
                                    f"{self.seconds:.0f} s; {said}")
