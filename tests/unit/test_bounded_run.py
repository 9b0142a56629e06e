"""cmake/vfa_build/sources/bounded_run.py: a command and everything it started end together, at the timeout or when
the command ends (every git call of a fetch runs through it)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

SCRIPT = [str(Path(__file__).resolve().parents[2] / "cmake" / "vfa_build"), "sources.bounded_run"]


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def _run(tmp_path, script: str, timeout: str) -> tuple[subprocess.CompletedProcess, list[int]]:
    pids = tmp_path / "pids"
    done = subprocess.run([sys.executable, *SCRIPT, "--timeout", timeout, "--", "sh", "-c",
                           script.replace("PIDS", str(pids))], capture_output=True, text=True, timeout=120)
    return done, [int(p) for p in pids.read_text().split()]


def test_a_timeout_ends_the_command_and_what_it_started(tmp_path):
    start = time.monotonic()
    done, pids = _run(tmp_path, "sleep 300 & echo $! >> PIDS; echo $$ >> PIDS; wait", "1")
    assert done.returncode == 124 and "did not finish within 1 s" in done.stderr
    assert time.monotonic() - start < 30
    assert [p for p in pids if _alive(p)] == []


def test_what_a_finished_command_left_running_is_ended(tmp_path):
    done, pids = _run(tmp_path, "sleep 300 & echo $! >> PIDS; exit 3", "60")
    assert done.returncode == 3
    assert [p for p in pids if _alive(p)] == []
