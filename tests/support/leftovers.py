"""Processes a test run leaves behind: every process the run starts (through any number of
forks, daemons such as sccache servers included) inherits MARKER in its environment; at the
end of the session any still running is named (with the test that started it), stopped, and
fails the run. Linux (/proc); elsewhere the check says it cannot look.

Wired in tests/conftest.py; the session's own CPU hogs (tests/support/load_check.py) are
started without the marker and stopped before the check."""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import pytest

# Not VFA_*: support.cmake_runner.clean_env() drops our knobs, and this must reach every process.
MARKER = "VENDORED_FA_TEST_SESSION"
# How long processes that are ending anyway (a server told to stop) get before they are named
# (--leftover-grace).
GRACE_S = 30.0
STAT = "leftover process(es)"


def marked(marker: str) -> dict[int, dict[str, str]]:
    """The processes whose environment holds MARKER=marker, this one aside: pid -> what names
    it (its command line, the test that started it)."""
    found = {}
    needle = f"{MARKER}={marker}".encode()
    for proc in Path("/proc").glob("[0-9]*"):
        pid = int(proc.name)
        if pid == os.getpid():
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
            if needle not in environ:
                continue
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError):
            continue
        if state in ("Z", "X"):
            continue
        test = next((e.split(b"=", 1)[1].decode(errors="replace") for e in environ
                     if e.startswith(b"PYTEST_CURRENT_TEST=")), "before any test")
        found[pid] = {"command": " ".join(a.decode(errors="replace") for a in argv if a)[:300], "test": test}
    return found


class Leftovers:
    def __init__(self, grace: float = GRACE_S):
        self.grace = grace
        self.marker = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.left: dict[int, dict[str, str]] = {}
        os.environ[MARKER] = self.marker

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session):
        # Inside the terminal reporter's sessionfinish wrapper: before its summary.
        if not Path("/proc/self/environ").exists():
            return
        deadline = time.monotonic() + self.grace
        while (left := marked(self.marker)) and time.monotonic() < deadline:
            time.sleep(0.5)
        self.left = left
        if not left:
            return
        for pid in left:
            try:
                os.kill(pid, signal.SIGTERM)
            except OSError:
                pass
        deadline = time.monotonic() + 10
        while marked(self.marker) and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in marked(self.marker):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:  # the closing line counts them: "..., 1 leftover process(es)"
            reporter.stats.setdefault(STAT, []).extend(left)

    def pytest_terminal_summary(self, terminalreporter):
        if not self.left:
            return
        terminalreporter.write_sep("=", "processes the tests left running (stopped now)")
        for pid, what in sorted(self.left.items()):
            terminalreporter.write_line(f"FAILED pid {pid}, started in {what['test']}: {what['command']}", red=True)
